"""Load ``reward_func`` from a Python file and call it with OpenRLHF's arguments.

Every way the file can be unusable — missing, a directory, a syntax error, an exception at
import, no callable ``reward_func`` — and an exception raised by ``reward_func`` itself is a
:class:`~rlhf.errors.RewardSourceError` naming the file (and the line) and what to do.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import sys
import traceback
from pathlib import Path
from typing import Any

from rlhf.errors import ConfigError, RewardSourceError

FUNCTION = "reward_func"
SIGNATURE = f"{FUNCTION}(queries, prompts, labels, **kwargs)"


class RewardFuncFile:
    """``reward_func`` of one file; ``needs_labels`` says whether it reads its ``labels`` argument."""

    def __init__(self, path: str) -> None:
        file = Path(path).expanduser().resolve()
        source = _read(file, path)
        tree = _parse(file, source)
        self.function = _load_function(file)
        self.path = str(file)
        declared = getattr(self.function, "needs_labels", None)
        # an attribute the user set on reward_func wins over the guess read from the source
        self.needs_labels = bool(declared) if declared is not None else reads_labels(tree)

    @classmethod
    def from_config(cls, config: Any) -> RewardFuncFile:
        if not config.reward.remote_url:
            raise ConfigError(f"reward_func_file needs --reward.remote_url path/to/reward.py (a file defining {SIGNATURE})")
        return cls(config.reward.remote_url)

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> Any:
        """The file's own result; the core normalises it (see :mod:`rlhf.reward_output`)."""
        try:
            return self.function(queries, prompts, labels, **kwargs)
        except Exception as exc:
            raise RewardSourceError(f"{FUNCTION} in {self.path}{_line_in(self.path, exc)} raised "
                                    f"{type(exc).__name__}: {exc}") from exc  # the core adds what to do


def reads_labels(tree: ast.Module) -> bool:
    """Whether the module's ``reward_func`` uses its third positional parameter (``labels``) in its body.

    Only a plain ``def``/``async def`` at module level can be read; anything else (an
    assigned or imported function, ``*args``) counts as not needing labels, so a run is
    never refused on a guess."""
    definitions = [node for node in tree.body
                   if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == FUNCTION]
    if not definitions:
        return False
    function = definitions[-1]  # the last definition is the one the module binds
    positional = function.args.posonlyargs + function.args.args
    if len(positional) < 3:
        return False
    labels = positional[2].arg
    return any(isinstance(node, ast.Name) and node.id == labels and isinstance(node.ctx, ast.Load)
               for statement in function.body for node in ast.walk(statement))


def _read(file: Path, given: str) -> str:
    where = f"--reward.remote_url {given}"
    if file.is_dir():
        raise RewardSourceError(f"{where}: {file} is a directory; give the .py file inside it that defines {SIGNATURE}")
    if not file.exists():
        raise RewardSourceError(f"{where}: no such file ({file}); give the path of a .py file that defines {SIGNATURE}")
    try:
        return file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RewardSourceError(f"{where}: cannot read {file}: {exc}; check the file and its permissions") from exc


def _parse(file: Path, source: str) -> ast.Module:
    try:
        return ast.parse(source, filename=str(file))
    except SyntaxError as exc:
        raise RewardSourceError(f"reward file {file} line {exc.lineno}: syntax error: {exc.msg}; "
                                f"fix the file and run again") from exc


def _load_function(file: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"rlhf_reward_file_{file.stem}", file)
    assert spec is not None and spec.loader is not None, "spec_from_file_location accepts any .py path"
    module = importlib.util.module_from_spec(spec)
    # registered before running, as an import would, so dataclasses and pickling inside the file work
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[spec.name]
        raise RewardSourceError(f"reward file {file}{_line_in(str(file), exc)} raised {type(exc).__name__} "
                                f"while being imported: {exc}; fix the file (or install what it imports) "
                                f"and run again") from exc
    function = getattr(module, FUNCTION, None)
    if callable(function):
        return function
    if function is not None:
        raise RewardSourceError(f"reward file {file}: {FUNCTION} is a {type(function).__name__}, not a function; "
                                f"define {SIGNATURE}")
    defined = sorted(name for name, value in vars(module).items()
                     if callable(value) and getattr(value, "__module__", None) == spec.name)
    close = difflib.get_close_matches(FUNCTION, defined, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}? Rename it to {FUNCTION}." if close else ""
    raise RewardSourceError(f"reward file {file} defines no {FUNCTION}; it defines "
                            f"{', '.join(defined) if defined else 'no functions'}.{hint} "
                            f"The file must define {SIGNATURE}")


def _line_in(path: str, exc: BaseException) -> str:
    """`` line N``: the innermost frame of ``exc``'s traceback inside ``path`` (empty if none is)."""
    lines = [frame.lineno for frame in traceback.extract_tb(exc.__traceback__) if frame.filename == path]
    return f" line {lines[-1]}" if lines else ""
