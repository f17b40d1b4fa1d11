"""The actor objective and the KL controller against OpenRLHF 0.11.2's formulas, on random inputs.

Each expected value is written out here independently of ``rlhf.ops``: per-token loops over
rows, explicit counts, explicit KL/entropy terms.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from rlhf_plugin_kl import K3

from rlhf.ops import aggregate_loss
from rlhf.runtime.control.kl_control import KLController, observed_kl
from rlhf.runtime.workers.objective import ObjectiveSettings, StepNormalisers, policy_objective, step_counts

ROWS, WIDTH = 8, 6
ACCUMULATION, RANKS = 2, 2  # 8 rows = 2 ranks × 2 micro-batches of 2 rows per optimizer step


class RatioLoss:
    """ℓ_t = −s·A_t, with s the token ratio, or (sequence-level, like GSPO) exp of the mean log-ratio."""

    def __init__(self, token_level: bool) -> None:
        self.token_level = token_level

    def __call__(self, log_probs, old_log_probs, advantages, action_mask):
        log_ratio = (log_probs - old_log_probs) * action_mask
        if not self.token_level:
            lengths = action_mask.sum(dim=1, keepdim=True).clamp(min=1)
            log_ratio = (log_ratio.sum(dim=1, keepdim=True) / lengths).expand_as(log_ratio)
        return -torch.exp(log_ratio) * advantages * action_mask, {}


def random_batch(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, WIDTH + 1, (ROWS,), generator=gen)
    lengths[0] = lengths[5] = 0  # empty responses on two different ranks
    mask = (torch.arange(WIDTH)[None, :] < lengths[:, None]).double()

    def per_token(low: float, high: float) -> torch.Tensor:
        return (low + (high - low) * torch.rand(ROWS, WIDTH, generator=gen, dtype=torch.float64)) * mask

    return {"logp": per_token(-2.0, 0.0).requires_grad_(), "old": per_token(-2.0, 0.0), "ref": per_token(-2.0, 0.0),
            "adv": per_token(-1.5, 1.5), "entropy": per_token(0.0, 3.0).requires_grad_(), "mask": mask}


def expected_objective(b: dict[str, torch.Tensor], policy_mode: str, token_level: bool, beta: float,
                       entropy_coef: float) -> torch.Tensor:
    """OpenRLHF 0.11.2: agg(ℓ) + β·token_mean(k3) − c_H·token_mean(H), one mean over the whole step."""
    n = [int(b["mask"][i].sum()) for i in range(ROWS)]
    tokens = sum(n)
    policy = torch.zeros((), dtype=torch.float64)
    kl = torch.zeros((), dtype=torch.float64)
    entropy = torch.zeros((), dtype=torch.float64)
    for i in range(ROWS):
        log_ratios = [b["logp"][i, t] - b["old"][i, t] for t in range(n[i])]
        row = []
        for t in range(n[i]):
            ratio = torch.exp(sum(log_ratios) / n[i]) if not token_level else torch.exp(log_ratios[t])
            row.append(-ratio * b["adv"][i, t])
            r = b["logp"][i, t] - b["ref"][i, t]
            kl = kl + torch.exp(-r) - 1 + r
            entropy = entropy + b["entropy"][i, t]
        if policy_mode == "token-mean":
            policy = policy + sum(row, torch.zeros((), dtype=torch.float64)) / tokens
        elif n[i] > 0:
            policy = policy + sum(row) / (n[i] + 1e-8) / sum(1 for m in n if m > 0)  # OpenRLHF's 1e-8
    return policy + beta * kl / tokens - entropy_coef * entropy / tokens


def deepspeed_step(b: dict[str, torch.Tensor], loss_fn: RatioLoss, settings: ObjectiveSettings, beta: float):
    """What one optimizer step backpropagates: every rank sums its micro-batch losses divided by the
    accumulation count, then the gradients are averaged over the ranks."""
    tokens, sequences = step_counts([int(b["mask"][i].sum()) for i in range(ROWS)])
    normalisers = StepNormalisers(tokens, sequences, scale=float(ACCUMULATION * RANKS))
    total, kl_losses = torch.zeros((), dtype=torch.float64), []
    for start in range(0, ROWS, ROWS // (ACCUMULATION * RANKS)):
        rows = slice(start, start + ROWS // (ACCUMULATION * RANKS))
        loss, metrics = policy_objective(
            loss_fn, settings, normalisers, b["logp"][rows], b["old"][rows], b["adv"][rows], b["mask"][rows],
            ref_log_probs=b["ref"][rows], kl_coef=beta, entropy=b["entropy"][rows])
        total = total + loss / ACCUMULATION / RANKS
        kl_losses.append(metrics["kl_loss"])
    return total, kl_losses


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("agg_mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("token_level", [True, False], ids=["token-level", "sequence-level"])
def test_only_the_policy_term_follows_the_aggregation_mode(seed: int, agg_mode: str, token_level: bool) -> None:
    b = random_batch(seed)
    beta, entropy_coef = 0.37, 0.05
    settings = ObjectiveSettings(loss_agg_mode=agg_mode, kl_as_loss=True, kl_estimator=K3(), entropy_coef=entropy_coef)
    got, _ = deepspeed_step(b, RatioLoss(token_level), settings, beta)
    got_grads = torch.autograd.grad(got, [b["logp"], b["entropy"]])
    policy_mode = agg_mode if token_level else "seq-mean-token-mean"
    want = expected_objective(b, policy_mode, token_level, beta, entropy_coef)
    want_grads = torch.autograd.grad(want, [b["logp"], b["entropy"]])
    assert got.item() == pytest.approx(want.item(), rel=1e-9, abs=1e-12)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-12)
    # entropy enters as −c_H/N_tok on every action token, whatever the policy aggregation
    torch.testing.assert_close(got_grads[1], -entropy_coef * b["mask"] / b["mask"].sum())


@pytest.mark.parametrize("seed", range(3))
def test_seq_mean_counts_only_sequences_with_action_tokens(seed: int) -> None:
    b = random_batch(seed)
    loss, mask = b["adv"], b["mask"]
    nonempty = mask.sum(dim=1) > 0
    per_sequence = [sum(loss[i, t] for t in range(int(mask[i].sum()))) / (mask[i].sum() + 1e-8)
                    for i in range(ROWS) if nonempty[i]]
    want = sum(per_sequence) / len(per_sequence)
    # local fallback: empty rows neither add to the sum nor to the count
    assert aggregate_loss(loss, mask, "seq-mean-token-mean").item() == pytest.approx(want.item(), rel=1e-9)
    assert aggregate_loss(loss[nonempty], mask[nonempty], "seq-mean-token-mean").item() == pytest.approx(want.item(), rel=1e-9)
    # an all-empty batch is 0, not a division by zero
    assert aggregate_loss(loss, torch.zeros_like(mask), "seq-mean-token-mean").item() == 0.0
    # step-global count
    assert step_counts([int(n) for n in mask.sum(dim=1)]) == (mask.sum().item(), float(nonempty.sum()))


@pytest.mark.parametrize("dynamic", [False, True], ids=["fixed", "dynamic"])
def test_training_groups_count_only_nonempty_responses_per_optimizer_step(dynamic: bool) -> None:
    """The worker's per-step normalisers (``_training_groups``) with a stand-in model, one rank; with
    dynamic batching the micro-batches vary but the normalisers still cover the whole step."""
    from rlhf.runtime.workers.policy import _ModelWorker

    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(0, 4, (16,), generator=gen).tolist()
    lengths[3] = lengths[11] = 0
    payload = {"prompt_ids": [[1]] * 16, "response_ids": [[7] * n for n in lengths]}
    micro, accumulation = 2, 2
    boundaries: list[bool | None] = []
    worker = SimpleNamespace(
        config=SimpleNamespace(train=SimpleNamespace(micro_batch_size=micro, max_epochs=2, seed=5,
                                                     dynamic_batch_enable=dynamic, max_tokens_per_gpu=5)),
        model=SimpleNamespace(accumulation_steps=lambda: accumulation, train=lambda: None, device=torch.device("cpu")),
        world_size=1)
    yielded = []
    for group in _ModelWorker._training_groups(worker, payload, 1, 0):
        yielded.append(group)
        boundaries.append(worker._boundary)  # what the micro-batch's backward tells the backend
    if dynamic:  # a step ends where the backend was told it is a boundary
        assert any(len(rows) != micro for rows, *_ in yielded)
        ends = [k + 1 for k, last in enumerate(boundaries) if last]
    else:  # fixed micro-batches: the backend counts them (boundary None)
        assert set(boundaries) == {None}
        ends = list(range(accumulation, len(yielded) + 1, accumulation))
    assert sum(len(rows) for rows, *_ in yielded) == 2 * 16 and ends[-1] == len(yielded)
    for start, end in zip([0, *ends[:-1]], ends):  # consecutive micro-batches of one optimizer step
        step = yielded[start:end]
        assert sum(len(rows) for rows, *_ in step) == micro * accumulation
        step_lengths = [lengths[i] for rows, *_ in step for i in rows]
        for _, tokens, sequences, weight in step:
            assert float(tokens) == max(sum(step_lengths), 1) and weight == 1.0
            assert float(sequences) == max(sum(1 for n in step_lengths if n > 0), 1)


@pytest.mark.parametrize("target", [0.0, None])
def test_kl_target_zero_or_unset_means_the_fixed_controller(target) -> None:
    controller = KLController(0.05, target, 10000)
    assert not controller.adaptive
    for kl in (0.0, 0.3, 7.0):
        controller.update(kl, 1024)
    assert controller.value == 0.05


@pytest.mark.parametrize("seed", range(3))
def test_adaptive_controller_follows_ziegler(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    target, horizon, n_steps = 0.05 + torch.rand(1, generator=gen).item(), 10000, 256
    controller, beta = KLController(0.1, target, horizon), 0.1
    for kl in (torch.rand(5, generator=gen) * 2 * target).tolist():
        controller.update(kl, n_steps)
        beta *= 1 + min(max(kl / target - 1, -0.2), 0.2) * n_steps / horizon
        assert controller.value == pytest.approx(beta, rel=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_kl_as_loss_feeds_the_actors_kl_loss_to_the_adaptive_controller(seed: int) -> None:
    b = random_batch(seed)
    settings = ObjectiveSettings(kl_as_loss=True, kl_estimator=K3())
    _, kl_losses = deepspeed_step(b, RatioLoss(True), settings, beta=0.1)
    # OpenRLHF's actor reports masked_mean(kl, action_mask) of each micro-batch as its KL
    for k, reported in enumerate(kl_losses):
        rows = slice(2 * k, 2 * k + 2)
        r = (b["logp"][rows] - b["ref"][rows]).detach()
        mask = b["mask"][rows]
        want = ((torch.exp(-r) - 1 + r) * mask).sum() / mask.sum().clamp(min=1)
        assert reported.item() == pytest.approx(want.item(), rel=1e-9, abs=1e-12)
    actor_kl = sum(float(v) for v in kl_losses) / len(kl_losses)
    metrics = {"kl_loss": actor_kl, "kl": 123.0}  # "kl" is experience making's, not used with use_loss
    assert observed_kl(metrics, kl_as_loss=True) == actor_kl
    assert observed_kl(metrics, kl_as_loss=False) == 123.0
    assert observed_kl({}, kl_as_loss=True) == 0.0  # no reference model: no KL
    controller = KLController(0.1, 0.02, 10000)
    controller.update(observed_kl(metrics, kl_as_loss=True), 512)
    error = min(max(actor_kl / 0.02 - 1, -0.2), 0.2)
    assert controller.value == pytest.approx(0.1 * (1 + error * 512 / 10000))
    assert not math.isclose(controller.value, 0.1 * (1 - 0.2 * 512 / 10000))  # what feeding 0 would give
