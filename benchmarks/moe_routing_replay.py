"""GRPO on a tiny random Qwen3-MoE with MoE routing replay on (``--actor.routing_replay rollout``) and off (``record``:
the engine's routes recorded and compared, the trainer routing by its own top-k).

    python benchmarks/moe_routing_replay.py --steps 20 --results benchmarks/results/moe_routing_replay_cpu.json \
        --chart docs/images/moe_routing_replay.png
    python benchmarks/moe_routing_replay.py --steps 2            # a quick look

Each run is ``rlhf train ppo`` in this process (``--train.in_process``: the actor's rank here, HF generate in the rank
on the trained weights, ``hf-inprocess``) in bf16, so that the engine's forward (left-padded, one token at a time
against its KV cache) and the trainer's (right-padded, the whole sequence at once) round differently and some top-k
choices flip, as between vLLM and a trainer. The reward is the tests' digit reward (share of digits, a bonus for the
sum). Per step it keeps ``moe/routing_mismatch`` (share of (token, layer) whose experts differ from the engine's: 0
with replay), ``moe/router_disagreement`` (the trainer's own top-k against the engine's), the expert load, the
reward, and the engine/trainer log-prob gap (``rollout_logprob_gap``: mean |engine − trainer old log-prob| over the
step's response tokens, read from ``--rollout.dump_dir``; two optimizer steps per rollout batch make the trainer
compute its old log-probs).

A benchmark, not a test: figures depend on the machine, its load and the library versions.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

REWARD_FILE = '''
def reward_func(queries, prompts, labels, **kwargs):
    out = []
    for query, prompt, label in zip(queries, prompts, labels):
        response = query[len(prompt):]
        out.append(sum(ch.isdigit() for ch in response) / max(len(response), 1) + float(str(label) in response))
    return {"rewards": out, "scores": out}
'''

KEYS = ("reward", "moe/routing_mismatch", "moe/router_disagreement", "moe/load_max_over_mean", "moe/load_entropy",
        "moe/aux_loss", "rollout_logprob_gap", "policy_loss")


def task(root: Path, prompts: int) -> tuple[Path, Path]:
    rng = random.Random(0)
    with (root / "prompts.jsonl").open("w") as handle:
        for _ in range(prompts):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"input": f"what is {a}+{b}?", "label": str(a + b)}) + "\n")
    (root / "reward.py").write_text(REWARD_FILE)
    return root / "prompts.jsonl", root / "reward.py"


def run(root: Path, model: Path, mode: str, steps: int) -> list[dict]:
    from rlhf.cli.main import main
    from rlhf.records.metrics import read_metrics
    from rlhf.records.rollouts import read_step

    prompts, reward = task(root, 4 * steps)
    out = root / mode
    flags = ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(prompts), "--data.label_key", "label",
             "--data.apply_chat_template", "--data.max_len", "96", "--data.max_samples", str(4 * steps),
             "--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4", "--rollout.max_new_tokens", "16",
             "--rollout.micro_batch_size", "16", "--train.micro_batch_size", "8", "--train.batch_size", "8",
             "--actor.adam.lr", "3e-3", "--actor.lr_warmup_ratio", "0", "--ds.param_dtype", "bf16",
             "--reward.remote_url", str(reward), "--algo.advantage.estimator", "group_norm",
             "--vllm.num_engines", "0", "--rollout.engine", "hf-inprocess", "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
             "--train.in_process", "on", "--actor.routing_replay", mode, "--rollout.dump_dir", str(out / "rollouts"),
             "--ckpt.output_dir", str(out / "out"), "--ckpt.path", str(out / "ckpt")]
    if main(["train", "ppo", *flags]) != 0:
        raise SystemExit(f"the {mode} run failed")
    steps = [{key: m[key] for key in ("step", *KEYS) if key in m} for m in read_metrics(out / "out")]
    for step in steps:
        step["rollout_logprob_gap"] = logprob_gap(read_step(out / "rollouts", step["step"]))
    return steps


def logprob_gap(samples: list[dict]) -> float:
    """Mean |engine - trainer| log-prob over every response token of a step (the trainer's before the update)."""
    gaps = [abs(t - r) for s in samples for t, r in zip(s["trainer_logprobs"], s["rollout_logprobs"])]
    return sum(gaps) / len(gaps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--results", type=Path)
    parser.add_argument("--chart", type=Path)
    args = parser.parse_args()
    from rlhf.testing.tiny import build_moe_causal_lm, build_tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = build_moe_causal_lm(root / "model", build_tokenizer(root / "tok"), layers=2, experts=8, top_k=2)
        results = {mode: run(root, model, mode, args.steps) for mode in ("record", "rollout")}
    json.dump(results, sys.stdout, indent=1)
    if args.results:
        args.results.write_text(json.dumps(results, indent=1) + "\n")
    if args.chart:
        chart(results, args.chart)


def chart(results: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = (("moe/routing_mismatch", "routing mismatch (share of token x layer)"),
             ("rollout_logprob_gap", "mean |engine - trainer log-prob|"),
             ("moe/load_max_over_mean", "expert load: busiest / mean"), ("reward", "reward"))
    figure, axes = plt.subplots(1, len(shown), figsize=(4 * len(shown), 3.2))
    for axis, (key, title) in zip(axes, shown):
        for mode, label in (("record", "replay off"), ("rollout", "replay on")):
            points = [(m["step"], m[key]) for m in results[mode] if key in m]
            axis.plot([p[0] for p in points], [p[1] for p in points], marker=".", label=label)
        axis.set_title(title, fontsize=9)
        axis.set_xlabel("step")
    axes[0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
