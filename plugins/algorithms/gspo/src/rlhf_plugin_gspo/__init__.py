"""GSPO (Zheng et al., 2025): a sequence-level importance ratio.

    s_i = exp( (1/|y_i|) Σ_t m_t (log π_θ − log π_old) ),  broadcast to every token of y_i
    ℓ_t = −min(s_i·A_t, clip(s_i, 1 − ε_lo, 1 + ε_hi)·A_t)

Aggregation is per sequence (``token_level = False``: seq-mean-token-mean whatever
``--actor.loss_agg_mode`` says). The paper's ε are tiny, e.g. ``--actor.eps_clip_low_high 3e-4 4e-4``.
With IS correction on, the runtime passes π_rollout in place of π_old and applies no
separate coefficient.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class GSPOLoss:
    token_level = False

    def __init__(self, eps_low: float = 3e-4, eps_high: float = 4e-4) -> None:
        self.eps_low, self.eps_high = eps_low, eps_high

    @classmethod
    def from_config(cls, config):
        low, high = config.actor.eps_clip_low_high or (config.actor.eps_clip, config.actor.eps_clip)
        return cls(low, high)

    def __call__(self, log_probs, old_log_probs, advantages, action_mask):
        import torch

        from rlhf.ops import as_float, masked_mean

        log_ratio = (as_float(log_probs) - as_float(old_log_probs)) * action_mask
        sequence_ratio = torch.exp(masked_mean(log_ratio, action_mask, dim=1))[:, None].expand_as(log_ratio)
        advantages = as_float(advantages)
        unclipped = sequence_ratio * advantages
        clipped = sequence_ratio.clamp(1 - self.eps_low, 1 + self.eps_high) * advantages
        loss = -torch.min(unclipped, clipped) * action_mask
        metrics = {
            "ppo_clip_ratio": masked_mean((clipped < unclipped).float(), action_mask).detach(),
            "ppo_kl": masked_mean(-log_ratio, action_mask).detach(),
        }
        return loss, metrics


@rlhf.hookimpl
def rlhf_register_policy_losses(register):
    register("gspo", GSPOLoss, description="sequence-level ratio, per-sequence aggregation")


@rlhf.hookimpl
def rlhf_register_presets(register):
    register("gspo", {"actor.policy_loss_type": "gspo", "actor.eps_clip_low_high": [3e-4, 4e-4],
                      "algo.advantage.estimator": "group_norm", "rollout.n_samples_per_prompt": 8,
                      "algo.kl.init_coef": 0.0}, description="GSPO with group-normalised advantages")
