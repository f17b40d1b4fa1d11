"""Every rollout of a run on disk (``--rollout.dump_dir DIR``): one Parquet file per training step.

``DIR/step_00000012.parquet`` holds step 12's samples, one row each, with the columns :data:`COLUMNS` names
(docs/rollouts.md#rollouts-on-disk has the table) plus one column per reward term (``reward/<term>``) and per
column a reward function or agent executor added (``extra/<term>/<name>``). A file is written beside its final
name and renamed into place, so a killed run leaves no half-written file; a run resumed from step S drops the
files after S as it starts, so no step is there twice. Written by the controller, once per step; read by
``rlhf rollouts`` (rlhf-plugin-rollouts) or by anyone with pandas: ``pd.read_parquet(DIR)``, and trained on again by
``--rollout.replay_dir DIR``, which reads each file's Parquet metadata ``rlhf`` (:func:`step_meta`, a JSON object:
:data:`META`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhf.errors import DataError
from rlhf.records.checkpoints import published

log = logging.getLogger("rlhf.records")

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["COLUMNS", "TERM_PREFIX", "EXTRA_PREFIX", "RolloutDump", "dumped_steps", "read_step", "shown_samples",
           "samples_shown_every", "META", "SCHEMA", "step_meta", "tokenizer_fingerprint", "step_ranges"]

#: Every sample's columns, in order: name -> what it holds (``None`` where a run has no such value).
COLUMNS: dict[str, str] = {
    "step": "the training step that trained on the sample",
    "sample_id": "the sample's index in its step's rollout batch",
    "group": "its prompt's index in the batch (the n samples of one prompt share it)",
    "policy_version": "weight syncs before it was generated (async runs train on older versions)",
    "prompt": "the prompt text as the engine saw it (chat template applied)",
    "prompt_ids": "the prompt's token ids",
    "response": "the response text, special tokens kept",
    "response_ids": "the response's token ids (multi-turn: environment tokens too)",
    "label": "the dataset's label (--data.label_key), as text",
    "reward": "the reward trained on: the sum of the weighted terms, after shaping",
    "score": "the score filters and eval read",
    "advantage": "the advantage, averaged over the model's tokens",
    "return": "the return at the first response token",
    "advantages": "the per-token advantages",
    "returns": "the per-token returns",
    "rollout_logprobs": "the engine's per-token log-probs",
    "trainer_logprobs": "the trainer's per-token log-probs before the update (None when the step did not compute them)",
    "logprob_mismatch": "mean |trainer - engine| log-prob over the model's tokens (None without trainer log-probs)",
    "finish_reason": "stop (EOS) or length (cut at the token limit)",
    "response_length": "response tokens",
    "turns": "model turns of a multi-turn response (1 for a single turn)",
    "action_mask": "1 per model token, 0 per environment token (None: every token is the model's)",
    "images": "images of a VLM prompt (0 without)",
}
#: ``reward/<term>``: one column per reward term, its unweighted value for the sample
TERM_PREFIX = "reward/"
#: ``extra/<term>/<name>``: columns a reward function or agent executor added (e.g. a code reward's test output)
EXTRA_PREFIX = "extra/"

#: What each file's Parquet metadata ``rlhf`` holds besides its samples: what a replay (``--rollout.replay_dir``) checks
#: and gives back to the step it trains, so that the step logs what the dumped one did.
META: dict[str, str] = {
    "schema": "the layout's version (SCHEMA); a replay refuses another",
    "actor": "--actor.model_name_or_path of the run that generated the samples",
    "tokenizer": "tokenizer_fingerprint() of its tokenizer: the token ids mean the same only under an equal one",
    "metrics": "the step's metrics of the rollout stage (filtering, the scheduler's async/..., prompt mix), no timing",
    "extra": "the reward manager's logs of the step",
    "data": "the prompt schedule's position after the step, as its checkpoint records it",
    "n_samples_per_prompt": "--rollout.n_samples_per_prompt of the run: the groups the advantages normalise over",
    "batch_size": "--rollout.batch_size of the run: the prompts of one step",
}
#: The version of :data:`COLUMNS` and :data:`META` that a dump is written with.
SCHEMA = 1

_FILE = re.compile(r"^step_(\d+)\.parquet$")


def _name(step: int) -> str:
    return f"step_{step:08d}.parquet"


class RolloutDump:
    """Writes each step's samples under ``directory``; a run starting at step ``initial_step`` (after a resume)
    owns every step after it, so the files a crashed run wrote after its checkpoint are dropped here."""

    def __init__(self, directory: str | Path, initial_step: int = 0) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        for stale in self.directory.glob(".staging-rollouts-*"):  # a killed writer's: never a step's file
            shutil.rmtree(stale, ignore_errors=True)
        later = [step for step in dumped_steps(self.directory) if step > initial_step]
        if later:
            log.warning("%s: dropped the rollouts of %d step(s) after step %d, where this run starts",
                        self.directory, len(later), initial_step)
        for step in later:
            (self.directory / _name(step)).unlink()

    def write(self, step: int, samples: list[dict[str, Any]], meta: dict[str, Any] | None = None) -> Path:
        """Step ``step``'s samples as one file, in place only once it is whole; ``meta``: the file's :data:`META`."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.Table.from_pylist(samples)
        if meta is not None:
            table = table.replace_schema_metadata({**(table.schema.metadata or {}), b"rlhf": json.dumps(meta)})
        with published(self.directory, "rollouts") as staging:
            # no dictionary encoding: on float and token-id lists it cost 3x the write for 13 % less size
            pq.write_table(table, staging / _name(step), use_dictionary=False)
        return self.directory / _name(step)


def dumped_steps(directory: str | Path) -> list[int]:
    """The steps with a file under ``directory``, in order."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(int(m.group(1)) for p in directory.iterdir() if (m := _FILE.match(p.name)))


def step_ranges(steps: list[int]) -> str:
    """``1-4, 7``: sorted steps (:func:`dumped_steps`) as runs of consecutive numbers, for a message naming them."""
    runs: list[list[int]] = []
    for step in steps:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)


def read_step(directory: str | Path, step: int) -> list[dict[str, Any]]:
    """Step ``step``'s samples as dicts (the columns above); a file Parquet cannot read, or one without those
    columns, is a :class:`DataError` naming it."""
    import pyarrow.parquet as pq

    with _readable(Path(directory) / _name(step)) as path:
        table = pq.read_table(path)
    if missing := [column for column in COLUMNS if column not in table.column_names]:
        raise DataError(f"{path}: a Parquet file, but not a rollout dump (no column {', '.join(missing[:4])}"
                        f"{'…' if len(missing) > 4 else ''}); move it out of the directory")
    return table.to_pylist()


def step_meta(directory: str | Path, step: int) -> dict[str, Any] | None:
    """Step ``step``'s :data:`META` (None: a file written without it); an unreadable file is a :class:`DataError`."""
    import pyarrow.parquet as pq

    with _readable(Path(directory) / _name(step)) as path:
        found = (pq.read_schema(path).metadata or {}).get(b"rlhf")
        return json.loads(found) if found is not None else None


@contextlib.contextmanager
def _readable(path: Path) -> Iterator[Path]:
    """Around a read of one dumped step: a truncated or foreign file (Parquet's magic bytes missing, a footer cut
    off, metadata that is not JSON) is one error naming the file, not a library's traceback."""
    import pyarrow

    try:
        yield path
    except (pyarrow.ArrowException, OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DataError(f"{path}: not a rollout dump Parquet can read ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:160]}); dump the step again, or move the file out of the "
                        "directory") from None


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """A digest of what every token id means to ``tokenizer`` (its vocabulary and special tokens)."""
    vocabulary = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    special = [tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id]
    return hashlib.sha256(json.dumps([vocabulary, special]).encode()).hexdigest()[:16]


def samples_shown_every(logger: Any) -> int:
    """Every how many steps a run shows its samples (``logger``: its ``--logger.*`` section): ``--logger.samples_steps``,
    else ``--logger.logging_steps``."""
    return max(1, logger.samples_steps or logger.logging_steps)


def shown_samples(samples: list[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    """``count`` samples spread evenly over the batch (so several prompts show, not one prompt's n responses)."""
    if count <= 0 or not samples:
        return []
    if count >= len(samples):
        return list(samples)
    return [samples[i * len(samples) // count] for i in range(count)]
