"""``rlhf train dpo``: direct preference optimisation (OpenRLHF's ``train_dpo``).

DPO −log σ(βz), cDPO with label smoothing ε, IPO (z − 1/(2β))², where
z = (log π_c − log π_r) − (log π_ref,c − log π_ref,r) over summed response log-probs;
an optional NLL term on the chosen responses; a frozen reference model (offloadable).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("dpo", "rlhf_plugin_dpo.trainer:DPOTrainer", description="DPO / cDPO / IPO (OpenRLHF train_dpo)")
