"""``rlhf checkpoint inspect PATH [FLAGS]`` and ``rlhf checkpoint export PATH --model actor|critic|ema --out DIR``.

``inspect`` reads only ``state.json`` and the file tree: what a checkpoint holds, whether it is complete, and how the
flags given after PATH differ from the run that wrote it. ``export`` turns one trained model of any step into a plain
Hugging Face model directory: the training backend that wrote it joins its shards (its optional
``full_state_from_checkpoint``, docs/plugins/training-backend.md), so the core imports no backend library.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rlhf.console import attach_run_log, library_output_to_run_log
from rlhf.errors import CheckpointError, ConfigError, OneLineArgumentParser
from rlhf.models.loading import check_model_source
from rlhf.records.checkpoints import checkpoints, load_state

USAGE = """\
usage: rlhf checkpoint inspect PATH [--json] [FLAGS]   what a checkpoint holds; FLAGS (--section.field VALUE ...) are
                                                compared with the flags of the run that wrote it
       rlhf checkpoint export PATH --model actor|critic|ema --out DIR [--lora merged|adapter] [--base MODEL_DIR]
                                                a plain Hugging Face model of that step
PATH is a global_step<N> directory or a --ckpt.path (its newest checkpoint)."""

#: the model group (its states are in ``<group>/``) each ``--model`` exports
_GROUPS = {"actor": "actor", "ema": "actor", "critic": "critic"}


def run_checkpoint(host: Any, argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in ("inspect", "export"):
        if argv and argv[0] not in ("-h", "--help"):
            raise ConfigError(f"rlhf checkpoint: unknown action {argv[0]!r}; use inspect or export")
        print(USAGE)
        return 0
    if argv[0] == "inspect":
        parser = OneLineArgumentParser(prog="rlhf checkpoint inspect", allow_abbrev=False)
        parser.add_argument("path")
        parser.add_argument("--json", dest="as_json", action="store_true")
        args, flags = parser.parse_known_args(argv[1:])
        report = inspect(_checkpoint_dir(Path(args.path)), flags)
        print(json.dumps(report, indent=1) if args.as_json else _table(report))
        return 0
    parser = OneLineArgumentParser(prog="rlhf checkpoint export", allow_abbrev=False)
    parser.add_argument("path")
    parser.add_argument("--model", choices=sorted(_GROUPS), required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--lora", choices=("merged", "adapter"), default="merged")
    parser.add_argument("--base", help="the model the run started from (default: the one the checkpoint records)")
    args = parser.parse_args(argv[1:])
    directory = _checkpoint_dir(Path(args.path))
    attach_run_log(_run_dir(directory))
    with library_output_to_run_log():  # DeepSpeed's "Loading checkpoint shards" bar and prints, as a run keeps them
        export(host.registry, directory, args.model, Path(args.out), merged=args.lora == "merged", base=args.base)
    print(f"rlhf: exported the {args.model} of {directory} to {args.out}")
    return 0


def _run_dir(directory: Path) -> Path:
    """Where the libraries' output of an export goes (``rlhf.log``): the run's --ckpt.output_dir as the checkpoint
    records it, where that still exists, else the --ckpt.path holding the checkpoint."""
    try:
        recorded = json.loads((directory / "state.json").read_text())["config"]["ckpt"]["output_dir"]
    except (OSError, ValueError, KeyError, TypeError):  # no state.json (export refuses it), or one without a config
        recorded = None
    return Path(recorded) if recorded and Path(recorded).is_dir() else directory.parent


def _checkpoint_dir(path: Path) -> Path:
    """The checkpoint PATH names: itself, or the newest under a --ckpt.path. A step that is not there names the steps
    that are (a missing ``state.json`` means a damaged checkpoint only where the step's directory exists)."""
    if (path / "state.json").is_file() or (path.name.startswith("global_step") and path.is_dir()):
        return path
    if path.name.startswith("global_step"):
        steps = ", ".join(str(step) for step, _ in checkpoints(path.parent))
        if not steps:
            raise CheckpointError(f"{path}: no such checkpoint, and {path.parent} holds none; give a global_step<N> "
                                  "directory or the --ckpt.path of a run that wrote one")
        raise CheckpointError(f"{path}: no such checkpoint ({path.parent} holds steps {steps}); name one of them, or "
                              f"{path.parent} for the newest")
    found = checkpoints(path)
    if not found:
        what = "is neither a checkpoint (global_step<N>/) nor a --ckpt.path with one" if path.is_dir() else "does not exist"
        raise CheckpointError(f"{path} {what}; give a global_step<N> directory or the --ckpt.path of a run that "
                              "wrote one")
    return found[-1][1]


def _base_model(directory: Path, recorded: str, given: str | None) -> str:
    """The model the export loads the weights into: ``--base``, else the one the checkpoint records, which must still
    be where the run read it (a model moved or deleted since is one line, not the hub's complaint about its path)."""
    try:
        check_model_source(given or recorded, "--base")
    except ConfigError as exc:
        if given:
            raise
        raise CheckpointError(f"{exc} (the model {directory / 'state.json'} records); give the model the run started "
                              "from with --base") from None
    return given or recorded


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def inspect(directory: Path, flags: list[str]) -> dict[str, Any]:
    """What ``rlhf checkpoint inspect`` prints, as a dict (``--json``)."""
    report: dict[str, Any] = {"checkpoint": str(directory), "size_bytes": _size(directory)}
    try:
        state = load_state(directory)
    except CheckpointError as exc:
        return {**report, "complete": False, "problems": [str(exc)]}
    models = state.get("models") or {role: {} for role in ("actor", "critic", "model") if (directory / role).is_dir()}
    problems = [f"{role}/ is missing or empty" for role, record in models.items()
                if record.get("states", True) and not any((directory / role).glob("*"))]
    for role, record in models.items():
        record["size_bytes"] = _size(directory / role) if (directory / role).is_dir() else 0
        if record.get("ema"):
            saved = len(list((directory / f"{role}_ema").glob("ema_rank*.pt")))
            if saved != record.get("world_size"):
                problems.append(f"{role}_ema/ has {saved} EMA files, {record.get('world_size')} were written")
        if (directory / f"{role}_universal").is_dir():
            record["converted"] = f"{role}_universal/ (DeepSpeed's universal form, made by a resume)"
    report.update({"step": state["step"], "complete": not problems, "problems": problems, "models": models,
                   "data": state.get("data"), "plugins": [p.get("name") for p in state.get("plugin_set", [])]})
    if flags:
        report["differences"] = differences(state.get("config"), flags)
    return report


def differences(config: dict[str, Any] | None, flags: list[str]) -> list[str]:
    """How ``--section.field VALUE`` flags (a bare flag: true) differ from the config the checkpoint recorded."""
    if config is None:
        return ["the checkpoint records no flags (written before rlhf recorded them)"]
    out, i = [], 0
    while i < len(flags):
        flag = flags[i]
        if not flag.startswith("--"):
            raise ConfigError(f"rlhf checkpoint inspect: {flag!r} is not a --section.field flag")
        takes_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        given = flags[i + 1] if takes_value else "true"
        i += 2 if takes_value else 1
        value: Any = config
        for part in flag[2:].split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT:
            out.append(f"{flag}: not a flag of the run that wrote it")
        elif not _same(value, given):
            out.append(f"{flag}: {json.dumps(value)} in the checkpoint, {given} here")
    return out


_ABSENT = object()


def _same(recorded: Any, given: str) -> bool:
    """Whether a flag's text means the recorded value (``1e-3`` is ``0.001``, ``True`` is ``true``)."""
    if isinstance(recorded, bool) or recorded is None:
        return given.lower() == str(recorded).lower()
    if isinstance(recorded, (int, float)):
        try:
            return float(given) == float(recorded)
        except ValueError:
            return False
    return given == str(recorded)


def _table(report: dict[str, Any]) -> str:
    lines = [f"checkpoint  {report['checkpoint']}",
             f"complete    {'yes' if report['complete'] else 'no: ' + '; '.join(report['problems'])}",
             f"size        {report['size_bytes'] / 2**20:.1f} MiB"]
    if "step" not in report:
        return "\n".join(lines)
    data = "-" if report["data"] is None else json.dumps(report["data"])  # supervised runs: the step says it
    lines += [f"step        {report['step']}", f"data        {data}"]
    for role, record in report["models"].items():
        if not record.get("backend"):
            lines.append(f"{role:<11} {record['size_bytes'] / 2**20:.1f} MiB (written before rlhf recorded its layout)")
            continue
        layout = ", ".join(f"{key} {value}" for key, value in record.get("layout", {}).items())
        kind = f"LoRA rank {record['lora_rank']}" if record.get("lora_rank") else "full model"
        lines.append(f"{role:<11} --train.backend {record['backend']}, {record['world_size']} ranks"
                     f"{', ' + layout if layout else ''}, {kind}{', EMA' if record.get('ema') else ''}, "
                     f"{record['size_bytes'] / 2**20:.1f} MiB{'' if record.get('states', True) else ' (no states: --ckpt.disable_ds)'}"
                     f" from {record.get('model')}{'; ' + record['converted'] if 'converted' in record else ''}")
    lines.append(f"plugins     {', '.join(report['plugins']) or '-'}")
    if "differences" in report:
        lines += ["differences " + (report["differences"][0] if report["differences"] else "none"),
                  *(f"            {d}" for d in report["differences"][1:])]
    return "\n".join(lines)


def export(registry: Any, directory: Path, which: str, out: Path, *, merged: bool = True, base: str | None = None) -> None:
    """Write ``which`` (actor, critic or the actor's EMA) of the checkpoint in ``directory`` as an HF model in ``out``."""
    import torch

    from rlhf.config.sections import DeepSpeedSection
    from rlhf.models.loading import load_causal_lm, load_tokenizer, load_value_model
    from rlhf.models.lora import apply_lora
    from rlhf.records.checkpoints import published
    from rlhf.registry import ComponentKind

    state = load_state(directory)
    records = state.get("models") or {}
    tag = "model" if which != "critic" and "model" in records else _GROUPS[which]  # a supervised trainer's model
    record = records.get(tag)
    if record is None:
        raise CheckpointError(f"checkpoint {directory} records no {tag} (a checkpoint written before rlhf recorded its "
                              f"models, or a run without one): rlhf checkpoint inspect {directory} lists what it holds")
    base = _base_model(directory, record["model"], base)
    backend = registry.get(ComponentKind.TRAINING_BACKEND, record["backend"], flag="--train.backend")
    read = getattr(backend, "full_state_from_checkpoint", None)
    if read is None:
        raise CheckpointError(f"the training backend {record['backend']!r} cannot export its checkpoints (it has no "
                              "full_state_from_checkpoint); export from a run of that backend with its own tools")
    ds = DeepSpeedSection.model_validate((state.get("config") or {}).get("ds", {}))
    head = ds.value_head_prefix if which == "critic" else None
    if which == "critic":
        module = load_value_model(base, torch.float32, "eager", head)
    else:
        module = load_causal_lm(base, torch.float32, "eager")
    if record.get("lora_rank"):
        module = apply_lora(module, ds, value_head=head)
    weights = read(str(directory), tag, module, ema=which == "ema")
    missing, unexpected = module.load_state_dict(weights, strict=False)
    tied = {name for name in missing if name.endswith("lm_head.weight")}  # tied to the embeddings, saved once
    if set(missing) - tied or unexpected:
        raise CheckpointError(f"checkpoint {directory / tag} does not fit {base}: {len(missing)} tensors missing "
                              f"({', '.join(sorted(missing)[:3])}…), {len(unexpected)} unexpected; give the model it "
                              "started from with --base")
    if record.get("lora_rank") and merged:
        module = module.merge_and_unload()
    tokenizer = load_tokenizer(base, "--base")
    with published(out, "model") as staging:
        module.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
