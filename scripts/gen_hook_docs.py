"""Write docs/hooks.md from the hook specs' signatures and docstrings.

    python scripts/gen_hook_docs.py          # rewrite docs/hooks.md
    python scripts/gen_hook_docs.py --check  # exit 1 when docs/hooks.md is stale
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from rlhf import hookspecs

DOC = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"

HEADER = """# Hook reference

Generated from `core/src/rlhf/hookspecs.py` by `python scripts/gen_hook_docs.py`; do not edit by hand.
Import the marker with `import rlhf` and decorate with `@rlhf.hookimpl`. An implementation may take
any subset of a hook's arguments. Registration hooks receive a `register` callable:
`register(name, target, description="")`, where `target` is the component or a lazy `"module:attr"` string.
"""


EXAMPLES = DOC.parent / "plugins" / "examples"

STEERING = """## Steering a run between steps

`rlhf_steer(step, metrics, steering)` is how a plugin acts on a run rather than only watching it.
It runs in the controller once per global step, after the step (and its evaluation, if one was
due) and before the step is logged and checkpointed. `steering` is a `rlhf.steering.Steering`,
one per plugin; its methods only record a request, which the controller applies once every
plugin's hook returned:

| call | effect | kept across a resume in |
|---|---|---|
| `steering.set_coefficient("kl", v)` | β from the next step on (an adaptive `--algo.kl.target` controller goes on from `v`; the reference model exists only when the run started with `--algo.kl.init_coef` > 0) | `kl_coef` of `state.json` |
| `steering.set_coefficient("entropy", v)` | the entropy bonus c_H (`--actor.entropy_coef`) from the next step on | `steering` of `state.json` |
| `steering.set_coefficient("lr_scale", v)` | multiplies the actor's scheduled learning rate from the next step on | `steering` of `state.json` |
| `steering.set_prompt_weights([w0, w1, …])` | prompt batches drawn from then on pick each `--data.prompt_dataset` source by these weights (normalised) | `data.weights` of `state.json` |
| `steering.evaluate(reason)` | evaluates this step on `--eval.dataset` (skipped, with a note, without one) | — |
| `steering.save_checkpoint(reason, under=None, keep=None)` | writes a checkpoint of this step; with `under`, into that folder of `--ckpt.path`, apart from the rotation and from resume, keeping the newest `keep` there (rlhf-plugin-best-checkpoint's `best/`) | — |
| `steering.stop(reason)` | the run ends after this step, saves its model as a finished run does, and ends with status `stopped` | — |

Read-only: `steering.prompt_datasets`, `steering.current_prompt_weights` (the flags' until a plugin
sets them) and `steering.current_coefficients`. A request out of range (a weight count that does
not match the sources, a negative or non-finite value, an unknown coefficient) raises
`ValueError`, reported as that plugin's error. Each applied request is one console line
(`step 3: plugin 'early_stop' asked to stop: …`) and a `steer/…` key in the step's
`metrics.jsonl` record (`steer/kl`, `steer/prompt_weight/<i>`, `steer/stop`, …); with several
prompt sources every record also has `prompt_mix/<i>`, the share of the step's prompts from
source `i`. Every run writes `run_status.json` (`status`, `reason`, `step`) to its output dir at
the end. A plugin's own state (a best reward, a counter) is kept across a resume with
`rlhf_checkpoint_save` / `rlhf_checkpoint_load`, as the early stop below does. In async mode
(`--train.async_enable`) batches already queued were drawn with the old weights.

A curriculum that moves the prompt mix from easy to hard prompts as the reward rises
(`--plugins ./reward_curriculum.py --data.prompt_dataset easy.jsonl,hard.jsonl`):

```python
{curriculum}
```

An early stop when the reward plateaus (`--plugins ./early_stop.py --early_stop.patience 20`):

```python
{early_stop}
```

Both are tested end to end on the tiny task in `tests/test_steering_e2e.py`.
"""


def steering_section() -> str:
    return STEERING.format(curriculum=(EXAMPLES / "reward_curriculum.py").read_text().rstrip(),
                           early_stop=(EXAMPLES / "early_stop.py").read_text().rstrip())


def hook_names() -> list[str]:
    return sorted(name for name, obj in vars(hookspecs).items() if name.startswith("rlhf_") and inspect.isfunction(obj))


def render() -> str:
    parts = [HEADER]
    for name in hook_names():
        func = getattr(hookspecs, name)
        args = ", ".join(inspect.signature(func).parameters)
        parts.append(f"## `{name}({args})`\n\n{inspect.cleandoc(func.__doc__ or '')}\n")
    parts.append(steering_section())
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python scripts/gen_hook_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
