"""The public plugin API as data: every public name and its signature, for the stability test.

``surface()`` maps a qualified name (``rlhf.ops.masked_mean``) to a text that changes exactly
when what a plugin relies on changes: a function's signature, a class's public methods,
declared attributes and bases, an enum's members. docs/plugin-api.md says what is public and
what a change bumps; ``core/tests/test_plugin_api.py`` compares ``surface()`` with the snapshot
of the current :data:`rlhf.PLUGIN_API_VERSION`.

``python -m rlhf.testing.api_surface --write`` rewrites that snapshot (after an additive change, or
with a version bump).
"""

from __future__ import annotations

import enum
import importlib
import inspect
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rlhf import PLUGIN_API_VERSION
from rlhf.deprecation import MOVED_MODULES, REMOVED, Moved, Removed

#: Modules whose public names (``__all__``, else every name not starting with ``_`` defined there) are the plugin API.
PUBLIC_MODULES = (
    "rlhf",
    "rlhf.hookspecs",
    "rlhf.steering",
    "rlhf.components",
    "rlhf.components.first_use",
    "rlhf.registry",
    "rlhf.ops",
    "rlhf.estimators",
    "rlhf.run_context",
    "rlhf.environment",
    "rlhf.errors",
    "rlhf.deprecation",
    "rlhf.reward_output",
    "rlhf.reward_terms",
    "rlhf.launch",
    "rlhf.weight_buckets",
    "rlhf.media",
    "rlhf.devices",
    "rlhf.distributed",
    "rlhf.planning",
    "rlhf.payloads",
    "rlhf.config.base",
    "rlhf.config.sections",
    "rlhf.config.checks",
    "rlhf.config.training_backend",
    "rlhf.config.run",
    "rlhf.models.loading",
    "rlhf.models.extensions",
    "rlhf.models.lora",
    "rlhf.models.saving",
    "rlhf.data.sources",
    "rlhf.data.templates",
    "rlhf.data.workers",
    "rlhf.records.checkpoint_fit",
    "rlhf.records.checkpoints",
    "rlhf.records.metrics",
    "rlhf.records.preemption",
    "rlhf.records.rollouts",
    "rlhf.testing",
    "rlhf.testing.cli",
    "rlhf.testing.pytest_plugin",
    "rlhf.testing.conformance",
    "rlhf.testing.accelerator",
)

SNAPSHOT_DIR = Path(__file__).resolve().parents[3] / "tests" / "data"


def snapshot_path(version: int) -> Path:
    return SNAPSHOT_DIR / f"plugin_api_v{version}.json"


def _signature(obj: Any) -> str:
    try:
        return str(inspect.signature(obj))
    except (TypeError, ValueError):
        return "(…)"


def _describe_class(cls: type) -> dict[str, str]:
    out = {"": "class(" + ", ".join(base.__name__ for base in cls.__bases__) + ")"}
    if issubclass(cls, enum.Enum):
        out.update({f".{member.name}": repr(member.value) for member in cls})
        return out
    for name, annotation in vars(cls).get("__annotations__", {}).items():
        if not name.startswith("_"):
            out[f".{name}"] = f"attribute: {annotation}"
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            out[f".{name}"] = f"{type(member).__name__}{_signature(member.__func__)}"
        elif inspect.isfunction(member) and member.__qualname__.startswith(cls.__qualname__ + "."):
            out[f".{name}"] = _signature(member)  # (not the __init__ that typing.Protocol installs)
        elif isinstance(member, property):
            out[f".{name}"] = "property"
    return out


def _public_names(module: Any) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [name for name, value in vars(module).items() if not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__ and callable(value)]


def surface() -> dict[str, str]:
    """Every public name of :data:`PUBLIC_MODULES` -> the text of its signature."""
    out: dict[str, str] = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(_public_names(module)):
            obj = getattr(module, name)
            key = f"{module_name}.{name}"
            if inspect.isclass(obj):
                out.update({key + suffix: text for suffix, text in _describe_class(obj).items()})
            elif callable(obj):
                out[key] = _signature(obj)
            else:
                out[key] = f"value: {obj!r}" if isinstance(obj, (int, str)) and name.isupper() else f"value: {type(obj).__name__}"
    return out


def compare(snapshot: dict[str, str], current: dict[str, str]) -> tuple[list[str], list[str], list[str]]:
    """(removed, changed, added) names between a snapshot and the current surface."""
    removed = sorted(set(snapshot) - set(current))
    added = sorted(set(current) - set(snapshot))
    changed = sorted(name for name in set(snapshot) & set(current)
                     if snapshot[name] != current[name] and not _extends(snapshot[name], current[name])
                     and not _adds_bases(snapshot[name], current[name]))
    return removed, changed, added


def undeprecated_removals(old: dict[str, str], current: dict[str, str], moved: Iterable[Moved] = MOVED_MODULES,
                          removed: Iterable[Removed] = REMOVED) -> list[str]:
    """The names of an older API's snapshot that are gone from ``current`` without having been deprecated first:
    neither still served under their old path (a moved module's alias, where the name must still resolve) nor
    removed after a deprecation window (a :class:`~rlhf.deprecation.Removed` entry with ``deprecated_in`` before
    ``removed_in``)."""
    def covered(name: str, old_name: str) -> bool:
        return name == old_name or name.startswith(old_name + ".")

    def served(name: str) -> bool:
        move = next((m for m in sorted(moved, key=lambda m: -len(m.old)) if covered(name, m.old)), None)
        return move is not None and _resolves(move.new + name[len(move.old):])

    retired = [r.name for r in removed if r.deprecated_in is not None and r.deprecated_in < r.removed_in <= PLUGIN_API_VERSION]
    return sorted(name for name in set(old) - set(current)
                  if not served(name) and not any(covered(name, gone) for gone in retired))


def _resolves(name: str) -> bool:
    """Whether a dotted name (module, then attributes) can be imported and looked up, warnings aside."""
    import warnings

    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for attr in parts[split:]:
                if attr == "__init__":  # a signature key, not an attribute to look up
                    continue
                declared = any(attr in vars(k).get("__annotations__", {}) for k in getattr(obj, "__mro__", ()))
                if declared:  # a declared field (dataclass, pydantic) is no class attribute
                    return True
                obj = getattr(obj, attr, None)
                if obj is None:
                    return False
        return True
    return False


def snapshots() -> dict[int, dict[str, str]]:
    """Every recorded API snapshot, by plugin API version."""
    return {int(path.stem.rsplit("v", 1)[1]): json.loads(path.read_text())["surface"]
            for path in sorted(SNAPSHOT_DIR.glob("plugin_api_v*.json"))}


def _adds_bases(old: str, new: str) -> bool:
    """Whether class ``new`` keeps every base of ``old``, in order, and only adds some (a mixin such as the kits'
    ``ContractProperties``): every subclass and ``isinstance`` written against ``old`` still works, no bump."""
    if not (old.startswith("class(") and new.startswith("class(")):
        return False
    remaining = iter(new[len("class("):-1].split(", "))
    return all(base in remaining for base in old[len("class("):-1].split(", ") if base not in ("", "object"))


def _extends(old: str, new: str) -> bool:
    """Whether signature ``new`` only adds optional parameters to ``old`` (after its positional ones, or as
    keywords), so that every call written against ``old`` still works: no bump (docs/plugin-api.md)."""
    import ast

    def parsed(signature: str) -> ast.FunctionDef | None:
        prefix = next((p for p in ("classmethod", "staticmethod") if signature.startswith(p + "(")), "")
        try:
            node = ast.parse(f"def f{signature[len(prefix):].replace('<factory>', '...')}: pass").body[0]
        except SyntaxError:
            return None
        return node if isinstance(node, ast.FunctionDef) and prefix == signature[:len(prefix)] else None

    a, b = parsed(old), parsed(new)
    if a is None or b is None or ast.dump(a.returns or ast.Constant(None)) != ast.dump(b.returns or ast.Constant(None)):
        return False
    old_args, new_args = a.args, b.args

    def params(args: list[ast.arg], defaults: list[Any]) -> list[tuple[str, str, str | None]]:
        padded = [None] * (len(args) - len(defaults)) + list(defaults)
        return [(arg.arg, ast.dump(arg.annotation) if arg.annotation else "", ast.dump(d) if d else None)
                for arg, d in zip(args, padded)]

    old_pos = params(old_args.posonlyargs + old_args.args, old_args.defaults)
    new_pos = params(new_args.posonlyargs + new_args.args, new_args.defaults)
    old_kw = dict((p[0], p) for p in params(old_args.kwonlyargs, old_args.kw_defaults))
    new_kw = dict((p[0], p) for p in params(new_args.kwonlyargs, new_args.kw_defaults))
    same_star = [ast.dump(x) if x else "" for x in (old_args.vararg, old_args.kwarg)] == \
        [ast.dump(x) if x else "" for x in (new_args.vararg, new_args.kwarg)]
    return (same_star and new_pos[:len(old_pos)] == old_pos and all(p[2] is not None for p in new_pos[len(old_pos):])
            and all(new_kw.get(name) == p for name, p in old_kw.items())
            and all(p[2] is not None for name, p in new_kw.items() if name not in old_kw))


def main(argv: list[str]) -> int:
    if argv != ["--write"]:
        print("usage: python -m rlhf.testing.api_surface --write", file=sys.stderr)
        return 2
    path = snapshot_path(PLUGIN_API_VERSION)
    path.write_text(json.dumps({"plugin_api_version": PLUGIN_API_VERSION, "surface": surface()}, indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
