"""The distillation loss as pure tensor functions (no model, no config), run inside
:meth:`rlhf_plugin_kd.trainer.KDTrainer.compute` in every trainer process, and by the tests.

Shapes: ``R`` rows of ``L`` positions (``R = N`` padded samples, or 1 packed row), ``V``
vocabulary entries, ``T`` trained tokens (positions where the loss mask is set). As in
:func:`rlhf_supervised.batch.token_logprobs`, the logits at position ``t − 1`` predict the
token at position ``t``; per-token results are returned aligned with ``input_ids``
(position ``t`` holds the loss of token ``t``; 0 at untrained positions and at position 0).

Per trained token ``t`` (``s``: student logits, ``q``: teacher logits, both at ``t − 1``)::

    nll_t = −log softmax(s)[x_t]
    kd_t  = −Σ_v softmax(q)_v · log softmax(s)_v      (terms where s_v = ±inf count 0)
    loss_t = (1 − α)·nll_t + α·kd_t

``kd_t`` is the cross-entropy from the teacher's full distribution to the student's
(OpenRLHF's ``KDLoss``); it equals KL(teacher ‖ student) plus the teacher's entropy, so its
gradient is the KL's. It is computed as ``lse(s)·Σ_v p_v − Σ_v p_v·s_v`` over finite ``s_v``,
which never materialises ``log softmax(s)`` as a second ``(T, V)`` tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlhf.config.base import ConfigError

if TYPE_CHECKING:
    import torch


def trained_positions(loss_mask: torch.Tensor) -> torch.Tensor:
    """``(R, L) -> (R, L − 1)`` bool: entry ``t − 1`` is set when token ``t`` is trained."""
    return loss_mask[:, 1:] > 0


def response_rows(logits: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``(R, L, V) -> (T, V)``: the logits that predict each trained token (position ``t − 1``), in row-major order."""
    return logits[:, :-1][trained_positions(loss_mask)]


def response_targets(input_ids: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``(R, L) -> (T,)``: the trained tokens themselves, in the order of :func:`response_rows`."""
    return input_ids[:, 1:][trained_positions(loss_mask)]


def at_positions(values: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """``(T,) -> (R, L)``: per-trained-token values put back at their tokens' positions, 0 elsewhere."""
    import torch

    trained = trained_positions(loss_mask)
    placed = values.new_zeros(trained.shape).masked_scatter(trained, values)
    return torch.nn.functional.pad(placed, (1, 0))


def check_vocab(teacher_vocab: int, student_vocab: int, tokenizer_size: int | None) -> None:
    """Raise :class:`ConfigError` unless the teacher's and the student's vocabularies can be matched.

    Equal sizes always match. Sizes may differ only by embedding padding, i.e. when every
    token id of the tokenizer (``tokenizer_size`` ids) is below both sizes.
    """
    if teacher_vocab == student_vocab:
        return
    if tokenizer_size is None or tokenizer_size > min(teacher_vocab, student_vocab):
        raise ConfigError(
            f"the teacher's vocabulary has {teacher_vocab} tokens but the student's has {student_vocab}"
            + (f" and the tokenizer {tokenizer_size}" if tokenizer_size is not None else "")
            + "; distillation needs a teacher and a student that share the tokenizer and vocabulary "
            "(--teacher.model_name_or_path, --model.model_name_or_path)")


def match_vocab(teacher: torch.Tensor, student_vocab: int, tokenizer_size: int | None) -> torch.Tensor:
    """``(…, V_teacher) -> (…, V_student)``: the teacher's logits over the student's vocabulary.

    Equal sizes pass through. When the sizes differ by embedding padding (see
    :func:`check_vocab`, which raises otherwise), extra teacher entries are cut off (its
    softmax is then over the real tokens) and extra student entries get teacher
    probability 0 (logit −inf).
    """
    import torch

    teacher_vocab = teacher.shape[-1]
    check_vocab(teacher_vocab, student_vocab, tokenizer_size)
    if teacher_vocab == student_vocab:
        return teacher
    if teacher_vocab > student_vocab:
        return teacher[..., :student_vocab]
    return torch.nn.functional.pad(teacher, (0, student_vocab - teacher_vocab), value=float("-inf"))


def distill_terms(student: torch.Tensor, teacher: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(T, V) student logits, (T, V) teacher logits, (T,) targets -> ((T,) nll, (T,) kd)``, in fp32.

    Gradients flow into ``student`` only (the teacher's probabilities are constants).
    """
    import torch

    s = student.float()
    p = torch.softmax(teacher.detach().float(), dim=-1)
    lse = torch.logsumexp(s, dim=-1)  # (T,)
    nll = lse - torch.gather(s, -1, targets.unsqueeze(-1)).squeeze(-1)
    finite = torch.isfinite(s)
    if bool(finite.all()):
        kd = lse - torch.linalg.vecdot(p, s)  # Σ_v p_v = 1
    else:  # ±inf student logits: those vocab entries contribute 0 (not 0·inf = NaN)
        kd = lse * torch.where(finite, p, 0.0).sum(-1) - torch.linalg.vecdot(p, torch.where(finite, s, 0.0))
    return nll, kd


def mix(nll: torch.Tensor, kd: torch.Tensor, alpha: float) -> torch.Tensor:
    """Per token ``(1 − α)·nll + α·kd`` (any shape); a term with weight 0 is left out, so its inf cannot make NaN."""
    if alpha == 0:
        return nll
    if alpha == 1:
        return kd
    return (1.0 - alpha) * nll + alpha * kd


def token_losses(student_logits: torch.Tensor, teacher_logits: torch.Tensor, input_ids: torch.Tensor,
                 loss_mask: torch.Tensor, tokenizer_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(R, L, V_s), (R, L, V_t), (R, L), (R, L) -> ((R, L) nll, (R, L) kd)`` aligned with ``input_ids``.

    Only the trained positions are computed (prompt and padding logits are never softmaxed),
    so values there are exactly 0, never NaN.
    """
    teacher = match_vocab(response_rows(teacher_logits, loss_mask), student_logits.shape[-1], tokenizer_size)
    nll, kd = distill_terms(response_rows(student_logits, loss_mask), teacher, response_targets(input_ids, loss_mask))
    return at_positions(nll, loss_mask), at_positions(kd, loss_mask)
