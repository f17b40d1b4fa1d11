"""Length penalties, applied to scalar rewards before the group step (overlong first).

DAPO overlong (``--reward.overlong_buffer_len B``, ``--reward.overlong_penalty_factor f``):
with L_exp = L_max − B (L_max = ``--rollout.max_new_tokens``, else ``--data.max_len``),
a response longer than L_exp gets r += −min(|y| − L_exp, B)/B · f, in [−f, 0).

ProRL stop-properly (``--reward.stop_properly_penalty_coef c``), for truncated responses
(finish reason ``length``): c ∈ [0, 1] scales, r ← c·r; c < 0 replaces, r ← c.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class OverlongPenalty:
    order = 10

    def __init__(self, buffer_len: float | None, factor: float, max_length: int) -> None:
        self.buffer_len, self.factor, self.max_length = buffer_len, factor, max_length
        self.active = buffer_len is not None

    @classmethod
    def from_config(cls, config):
        return cls(config.reward.overlong_buffer_len, config.reward.overlong_penalty_factor,
                   config.rollout.max_new_tokens or config.data.max_len)

    def apply(self, rewards, info):
        expected = self.max_length - self.buffer_len
        excess = (info["response_lengths"].float() - expected).clamp(min=0.0, max=self.buffer_len)
        return rewards - excess / self.buffer_len * self.factor


class StopProperlyPenalty:
    order = 20

    def __init__(self, coef: float | None) -> None:
        self.coef = coef
        self.active = coef is not None

    @classmethod
    def from_config(cls, config):
        return cls(config.reward.stop_properly_penalty_coef)

    def apply(self, rewards, info):
        import torch

        truncated = info["truncated"]
        replaced = rewards * self.coef if self.coef >= 0 else torch.full_like(rewards, self.coef)
        return torch.where(truncated, replaced, rewards)


@rlhf.hookimpl
def rlhf_register_reward_shapers(register):
    register("overlong_penalty", OverlongPenalty, description="DAPO overlong buffer penalty")
    register("stop_properly_penalty", StopProperlyPenalty, description="ProRL penalty for truncated responses")
