"""rlhf-supervised: the supervised trainers' shared machinery (a library, not a plugin).

The trainer base (:mod:`rlhf_supervised.trainer`), its chosen/rejected variant (:mod:`rlhf_supervised.pairs`),
batches (:mod:`rlhf_supervised.batch`), models (:mod:`rlhf_supervised.models`) and the config tree
(:mod:`rlhf_supervised.config`) that the ``rlhf train sft|rm|dpo|kto|prm|kd`` plugins build on.
"""
