"""The conformance kits catch broken components, each with a one-line reason naming the property
and the smallest input that shows it (the first-party plugins' own tests show that correct ones pass)."""

from __future__ import annotations

import math
import re
import textwrap
from pathlib import Path

import pytest
from rlhf_plugin_kl import K3
from rlhf_plugin_length_penalties import OverlongPenalty
from rlhf_plugin_ppo.loss import PPOClipLoss

from rlhf.components import RewardResult
from rlhf.estimators import GroupMeanBaselineEstimator
from rlhf.ops import as_float
from rlhf.runtime.control.in_turn import InTurn
from rlhf.testing.conformance import (
    ConformanceFailure,
    RewardFunctionKit,
    RolloutSchedulerKit,
    check_advantage_estimator,
    check_agent_executor,
    check_import_is_light,
    check_kl_estimator,
    check_policy_loss,
    check_prompt_source,
    check_reward_function,
    check_reward_manager,
    check_reward_shaper,
    check_rollout_correction,
    check_rollout_scheduler,
    check_sample_filter,
    kit_reward_sources,
    ppo_config,
)


def failure(check, *args) -> str:
    with pytest.raises(ConformanceFailure) as caught:
        check(*args)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


class MaskBlindEstimator(GroupMeanBaselineEstimator):
    """Return-to-go summed over every position, padding included."""

    def advantages(self, token_rewards, action_mask, values, gamma, lambd):
        returns = as_float(token_rewards).flip(1).cumsum(1).flip(1)
        return returns, returns


class StdNormalisedLoss(PPOClipLoss):
    """Normalises advantages by their std: 0/0 on an all-equal group."""

    def __call__(self, log_probs, old_log_probs, advantages, action_mask):
        return super().__call__(log_probs, old_log_probs, advantages / advantages.std(), action_mask)


def reward_one_short(queries, prompts, labels, **kwargs):
    return [1.0] * (len(queries) - 1) if len(queries) > 1 else [1.0]


class Smoothing:
    """KL averaged with the following tokens: not elementwise."""

    def __call__(self, log_ratio):
        return K3()(log_ratio).flip(-1).cumsum(-1).flip(-1)


class Offset:
    """Not 0 where the policies agree."""

    def __call__(self, log_ratio):
        return log_ratio + 0.1


class InPlaceShaper(OverlongPenalty):
    def apply(self, rewards, info):
        return rewards.sub_(1.0)


class FloatKeep:
    def keep(self, scores):
        return scores.mean(dim=1)


class DropsLastTrajectory:
    def run(self, requests, engines, sampling):
        return engines.generate(requests, **sampling)[:-1]


class RewardingExecutor:
    """An executor whose environment rewards every episode (``provides_rewards``), within the contract;
    the subclasses below each break one part of it."""

    provides_rewards = True

    def run(self, requests, engines, sampling):
        out = engines.generate(requests, **sampling)
        return [{**t, "action_mask": self.mask(len(t["response_ids"])), "agent": self.result()} for t in out]

    def mask(self, length):
        return [1] * length

    def result(self):
        return {"reward": 1.0, "score": 1.0, "extra_logs": {"turns": 1}}


class StringReward(RewardingExecutor):
    def result(self):
        return {"reward": "1.0"}


class NaNReward(RewardingExecutor):
    def result(self):
        return {"reward": math.nan, "score": 0.0}


class NaNExtraLog(RewardingExecutor):
    def result(self):
        return {"reward": 1.0, "extra_logs": {"turns": math.nan}}


class ShortMask(RewardingExecutor):
    def mask(self, length):
        return [1] * (length - 1)


class NonBinaryMask(RewardingExecutor):
    def mask(self, length):
        return [2] * length


class NoEnvironmentResult(RewardingExecutor):
    def result(self):
        return None

    def run(self, requests, engines, sampling):
        return [{k: v for k, v in t.items() if k != "agent"} for t in super().run(requests, engines, sampling)]


class Bf16Loss(PPOClipLoss):
    """Casts the loss back to the input dtype."""

    def __call__(self, log_probs, old_log_probs, advantages, action_mask):
        loss, metrics = super().__call__(log_probs, old_log_probs, advantages, action_mask)
        return loss.to(log_probs.dtype), metrics


def test_more_broken_components_each_name_their_property() -> None:
    assert "elementwise failed" in failure(check_kl_estimator, Smoothing())
    assert "is not 0 where the policies agree" in failure(check_kl_estimator, Offset())
    assert "modified its input rewards in place" in failure(check_reward_shaper, InPlaceShaper(4, 1.0, 16))
    assert "expected bool of shape (1,)" in failure(check_sample_filter, FloatKeep())
    assert "returned 0 trajectories for 1 requests" in failure(check_agent_executor, DropsLastTrajectory())
    message = failure(check_policy_loss, Bf16Loss())
    assert "loss is torch.bfloat16 for torch.bfloat16 inputs, expected torch.float32" in message


@pytest.mark.parametrize(("executor", "message"), [
    (StringReward(), "trajectory 0: agent['reward'] must be a number, got str '1.0'"),
    (NaNReward(), "trajectory 0: agent['reward'] is NaN"),
    (NaNExtraLog(), "trajectory 0: agent['extra_logs']['turns'] is NaN"),
    (ShortMask(), "trajectory 0: action_mask must be a list with one 0/1 per response token"),
    (NonBinaryMask(), "trajectory 0: action_mask must hold only 0 and 1"),
    (NoEnvironmentResult(), "trajectory 0: the executor declares provides_rewards but returned no 'agent' result"),
])
def test_an_executor_breaking_the_mask_or_reward_contract_fails_naming_it(executor, message) -> None:
    found = failure(check_agent_executor, executor)
    assert message in found and "on 1 request(s)" in found
    assert "not deterministic" not in found


def test_an_executor_within_the_contract_passes() -> None:
    check_agent_executor(RewardingExecutor())


def test_an_estimator_that_ignores_the_mask_fails_on_the_smallest_padded_batch() -> None:
    message = failure(check_advantage_estimator, MaskBlindEstimator())
    assert message.startswith("advantage estimator conformance: mask respected failed on token_rewards=")
    assert "action_mask=[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]" in message  # P=1, n=2, T=3: the first size with padding
    assert "multiply inputs by action_mask" in message


def test_a_loss_that_is_nan_on_all_equal_groups_fails_on_one_token() -> None:
    message = failure(check_policy_loss, StdNormalisedLoss())
    assert message.startswith("policy loss conformance: loss shape/dtype/finite/padding failed on all-equal groups")
    assert "action_mask=[[1.0], [0.0]]" in message and "loss is not finite" in message


def test_a_reward_of_the_wrong_length_fails_on_two_samples() -> None:
    message = failure(check_reward_function, reward_one_short)
    assert message == ("reward function conformance: one finite reward per sample failed on 2 sample(s) "
                       "[('what is 2+3?', ' 5', '5'), (\"reverse 'ab'\", ' ba</s>', 'ba')]: returned 1 rewards for 2 samples")


def test_a_plugin_importing_torch_at_module_top_fails_registration_cheapness(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "heavy_plugin.py").write_text(textwrap.dedent("""
        import torch
        import rlhf

        rlhf_plugin_api = rlhf.PLUGIN_API_VERSION
    """))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    message = failure(check_import_is_light, "reward function", "heavy_plugin")
    assert "importing heavy_plugin imports torch at module top" in message
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "light_plugin.py").write_text("import rlhf\n")
    check_import_is_light("reward function", "light_plugin")


BATCH_SIZED_REWARD_TESTS = '''
from rlhf.testing.conformance import RewardFunctionKit, RewardShaperKit


def batch_sized(queries, prompts, labels, **kwargs):  # finite everywhere, but a sample's reward is its batch's size
    return [float(len(queries))] * len(queries)


class TestBatchSized(RewardFunctionKit):
    component = staticmethod(batch_sized)


class Orderless:  # no `order` trait: the contract stops at its first property
    active = True

    def apply(self, rewards, info):
        return rewards


class TestOrderless(RewardShaperKit):
    component = Orderless
'''


@pytest.mark.slow  # an inner pytest run
def test_a_kit_reports_each_property_as_its_own_test(tmp_path: Path) -> None:
    """pytest shows which properties hold: one test_property[...] per property, the broken one failing with its
    one-line finding and the others passing; the one-pass test_contract is kept for callers but not collected."""
    import subprocess
    import sys

    (tmp_path / "test_batch_sized.py").write_text(BATCH_SIZED_REWARD_TESTS)
    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-n", "0", "-p", "no:cacheprovider",
                             "-k", "property or contract", "test_batch_sized.py"],
                            capture_output=True, text=True, cwd=tmp_path, timeout=300)
    outcomes = {m[2]: m[1] for m in re.finditer(r"^(PASSED|FAILED) \S+?::(\w+::test_\w+\[[^\]]+\])", result.stdout, re.M)}
    assert outcomes == {"TestBatchSized::test_property[one finite reward per sample]": "PASSED",
                        "TestBatchSized::test_property[empty responses]": "PASSED",
                        "TestBatchSized::test_property[batch equals per-sample and deterministic]": "FAILED",
                        "TestBatchSized::test_property[picklable for Ray]": "PASSED",
                        # a check that stops the pass: that property fails, and the later ones were never checked
                        "TestOrderless::test_property[declares its traits]": "FAILED",
                        "TestOrderless::test_property[shape/dtype/finite]": "FAILED",
                        "TestOrderless::test_property[picklable for Ray]": "FAILED"}, result.stdout[-3000:]
    assert "shape/dtype/finite: not checked, the contract stopped first: reward shaper conformance: declares its " \
           "traits failed: order must be an int, got None" in result.stdout
    assert ("reward function conformance: batch equals per-sample and deterministic failed on 5 samples: the batch gives "
            "[5.0, 5.0, 5.0, 5.0, 5.0] but the samples one by one give [1.0, 1.0, 1.0, 1.0, 1.0]") in result.stdout
    with pytest.raises(ConformanceFailure, match="batch equals per-sample"):  # still there for a plugin that calls it
        RewardFunctionKit.test_contract(type("Kit", (RewardFunctionKit,), {"component": staticmethod(_batch_sized)})())


def _batch_sized(queries, prompts, labels, **kwargs):
    return [float(len(queries))] * len(queries)


class TestInTurn(RolloutSchedulerKit):  # the core's own `sync` scheduler
    component = InTurn
    plugin_module = "rlhf.host.builtin"
    registered_name = "sync"


class DropsLastBatch(InTurn):
    def batches(self, loop):
        batches = list(super().batches(loop))
        yield from batches[:-1]


class SkipsHalfAGroup:
    def __init__(self, sources):
        self.length = sources.function("kit_length", "--reward.functions")

    def __call__(self, batch):
        out = self.length(batch.queries, batch.prompts, batch.labels, **batch.columns)
        return RewardResult(out.rewards, out.scores, skipped={0})


class NonZeroOnPadding:
    active = True

    def __call__(self, old_log_probs, rollout_log_probs, action_mask):
        return (old_log_probs - rollout_log_probs).exp(), {}


def test_the_step_kits_name_what_a_broken_component_breaks() -> None:
    assert "one item per batch, in order failed" in failure(check_rollout_scheduler, DropsLastBatch())
    assert "sample 0 is skipped without the rest of its group" in \
        failure(check_reward_manager, SkipsHalfAGroup(kit_reward_sources(ppo_config())))
    assert "is not 0 on padding" in failure(check_rollout_correction, NonZeroOnPadding())


class Numbered:
    """A prompt source within the contract: row p asks for p + the offset its observe raised."""

    def __init__(self) -> None:
        self.offset = 0

    def rows(self, start, count):
        return [{"input": f"{p + self.offset} + 1 =", "label": p + self.offset + 1} for p in range(start, start + count)]

    def observe(self, outcomes):
        self.offset += len(outcomes)

    def state(self):
        return {"offset": self.offset}

    def restore(self, state):
        self.offset = state["offset"]


class Batched(Numbered):
    def rows(self, start, count):  # numbers rows within the call: a refill would repeat a batch's first rows
        return super().rows(0, count)


class Forgetful(Numbered):
    def restore(self, state):
        pass


class Unlabelled(Numbered):
    def rows(self, start, count):
        return [{"input": row["input"], "answer": {1, 2}} for row in super().rows(start, count)]


def test_a_prompt_source_breaking_its_contract_fails_naming_the_property() -> None:
    check_prompt_source(Numbered(), Numbered(), label_key="label")
    assert "a row must depend on its position only" in failure(check_prompt_source, Batched())
    assert "restored from state() {'offset': 4} makes other rows" in failure(
        lambda source: check_prompt_source(source, Forgetful()), Forgetful())
    assert "row 0 has no 'label' (--data.label_key)" in failure(
        lambda source: check_prompt_source(source, label_key="label"), Unlabelled())
    assert "row 0 is not JSON" in failure(check_prompt_source, Unlabelled())
