"""Where an RL run's prompts come from when they are not files: prompt sources.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class PromptOutcome:
    """What one prompt a source made earned: handed to :meth:`PromptSource.observe`."""

    #: the run-wide position the source numbered the row with (``rows(start, count)`` made ``start + k``)
    position: int
    #: the row as the source made it
    row: dict[str, Any]
    #: the rewards of its samples, ``--rollout.n_samples_per_prompt`` of them (fewer where a reward source skipped
    #: the group)
    rewards: tuple[float, ...]


@runtime_checkable
class PromptSource(Protocol):
    """Prompt rows made on demand instead of read from ``--data.prompt_dataset`` files: procedurally generated
    tasks (reasoning-gym), a library's taskset (verifiers), a curriculum that moves with the reward.

    Selected with ``--data.prompt_source NAME``; built with :func:`rlhf.components.build` (``from_config(config)``
    reads the run's seed, ``--data.input_key``/``--data.label_key`` and the plugin's own options) in the controller
    process, once per run. Every method runs in the controller.

    ``rows(start, count)`` makes the rows at run-wide positions ``start … start + count - 1``, each a dict like a
    line of a JSONL prompt file: ``--data.input_key`` (a string or chat messages), ``--data.label_key`` when the run
    has one, and any other fields, which reach the reward functions' keyword arguments and the environments
    (``Sample.fields``). Called whenever the run needs prompts: once per step, and again for dynamic filtering's
    refills. A row must depend only on its position, the run's seed and the source's :meth:`state` at the call, so
    that a resumed run makes the very rows the uninterrupted one would have. Rows the data rules refuse (empty, no
    room for a response within ``--data.max_len``) are skipped and counted in one warning per batch.

    Optional members, used where the source defines them:

    * ``size: int | None``: rows in one episode (``--train.num_episodes`` walks it that many times);
      None or absent: ``--data.max_samples`` rows per episode.
    * ``observe(outcomes: list[PromptOutcome]) -> None``: the rewards of the rows just rolled out, once per rollout
      batch (each refill too), after the rewards and before any filter; a curriculum moves here.
    * ``state() -> dict`` and ``restore(state: dict) -> None``: what :meth:`observe` changed, as JSON; saved with
      every checkpoint and restored on ``--ckpt.load_enable`` before the first ``rows`` call.
    """

    def rows(self, start: int, count: int) -> list[dict[str, Any]]: ...
