"""Rewrite OpenRLHF's older spellings on a command line into today's dotted flags, before parsing.

An old script runs unchanged: :func:`translate` applies one table of
:mod:`rlhf_plugin_openrlhf_compat.tables` to argv, and the command logs one warning that shows the
same command line with today's flags, so the user can modernise it once. What cannot be
translated is one ``rlhf: error:`` line: a removed feature (naming what replaced it), an old and
a new spelling of the same option on one line (naming both), or an old flag this command
does not have.
"""

from __future__ import annotations

import logging
import shlex
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlhf.errors import ConfigError
from rlhf_plugin_openrlhf_compat.tables import TABLES, Choice, Entry, Ignored, Removed, Rename, Sum, Switch

log = logging.getLogger("rlhf.openrlhf_compat")

MIGRATION_DOC = "docs/config.md#migrating-from-openrlhf-09"


@dataclass
class _Flag:
    """One flag on the command line with the values that follow it (``inline``: given as ``--name=value``)."""

    name: str
    values: list[str]
    inline: bool = False

    def tokens(self) -> list[str]:
        if self.inline:
            return [f"{self.name}={self.values[0]}"]
        return [self.name, *self.values]


@dataclass
class Translation:
    """The translated command line and what was translated (for the one deprecation line)."""

    argv: list[str]
    renamed: list[tuple[str, str]] = field(default_factory=list)  # (old spelling, today's flags)
    ignored: list[tuple[str, str]] = field(default_factory=list)  # (old flag, why it has no effect)

    @property
    def changed(self) -> bool:
        return bool(self.renamed or self.ignored)

    def message(self, prog: str) -> str:
        parts = [f"{old} -> {new}" for old, new in self.renamed]
        parts += [f"{old} ignored ({why})" for old, why in self.ignored]
        return (f"{prog}: OpenRLHF's old flags were translated ({'; '.join(parts)}). The same run with today's flags: "
                f"{prog} {shell_join(self.argv)}   (see {MIGRATION_DOC})")

    def warn(self, prog: str) -> None:
        if self.changed:
            log.warning("%s", self.message(prog))


def shell_join(argv: Iterable[str]) -> str:
    """Quote for a POSIX shell, leaving ``$VAR`` references of a converted script expandable."""
    out = []
    for token in argv:
        if any(ch in token for ch in "\n\t\r"):  # bash's $'…' keeps the command on one line
            out.append("$'" + token.encode("unicode_escape").decode("ascii").replace("'", "\\'") + "'")
            continue
        quoted = shlex.quote(token)
        if quoted != token and "$" in token and not any(ch in token for ch in '"\\`'):
            quoted = f'"{token}"'
        out.append(quoted)
    return " ".join(out)


def _split(argv: list[str]) -> list[str | _Flag]:
    """Positional tokens stay strings; a ``--flag`` takes the tokens after it up to the next ``--flag``."""
    items: list[str | _Flag] = []
    for position, token in enumerate(argv):
        if token == "--":  # the end of options: the rest is passed on untouched
            items += argv[position:]
            break
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            items.append(_Flag(name, [value] if eq else [], inline=bool(eq)))
        elif items and isinstance(items[-1], _Flag) and not items[-1].inline:
            items[-1].values.append(token)
        else:
            items.append(token)
    return items


def _chain(name: str, table: dict[str, Entry], known: set[str] | None) -> list[str]:
    """``name`` and the names single renames lead to (``--vllm_is_correction_type`` -> ``--algo…type``)."""
    names = [name]
    while (known is None or names[-1] not in known) and names[-1] in table:
        entry = table[names[-1]]
        if not (isinstance(entry, Rename) and len(entry.to) == 1) or entry.to[0] in names:
            break
        names.append(entry.to[0])
    return names


def translate(argv: list[str], table: dict[str, Entry], *, known: Iterable[str] | None = None,
              prog: str = "rlhf") -> Translation:
    """Translate ``argv`` with ``table``. ``known``: today's flags of the command (they are never
    translated, and a translation must land on one of them); None accepts any target."""
    known_set = set(known) if known is not None else None
    items = _split(argv)
    flags = [item for item in items if isinstance(item, _Flag)]
    spelled: dict[str, _Flag] = {}  # every name a flag was given as or renamed to -> that flag
    for flag in flags:
        for name in _chain(flag.name, table, known_set):
            spelled.setdefault(name, flag)

    result = Translation(argv=[])
    origin: dict[str, str] = {}  # today's flag -> the spelling on the command line that set it
    for item in items:
        if isinstance(item, str):
            result.argv.append(item)
            continue
        chain = _chain(item.name, table, known_set)
        final = chain[-1]
        entry = None if (known_set is not None and final in known_set) else table.get(final)
        if entry is None:
            produced = [_Flag(final, item.values, item.inline)]
        else:
            produced = _apply(item, entry, table, spelled, prog)
            if produced is None:
                result.ignored.append((item.name, getattr(entry, "reason", "")))
                continue
        for flag in produced:
            if known_set is not None and chain[0] != flag.name and flag.name not in known_set:
                raise ConfigError(f"{item.name} (an OpenRLHF flag, today {flag.name}) is not an option of {prog}; "
                                  f"see {prog} --help")
            first = origin.setdefault(flag.name, item.name)
            if first != item.name:
                raise ConfigError(_mixed_message(first, item.name, flag.name))
            result.argv += flag.tokens()
        if len(chain) > 1 or entry is not None:
            rendered = shell_join(t for f in produced for t in f.tokens())
            companion = getattr(entry, "unless", None) or getattr(entry, "requires", None)
            result.renamed.append((item.name, rendered or f"nothing by itself (see {companion})"))
    return result


def _apply(item: _Flag, entry: Entry, table: dict[str, Entry], spelled: dict[str, _Flag], prog: str) -> list[_Flag] | None:
    """Today's flags for one old flag (None: dropped)."""
    if isinstance(entry, Removed):
        raise ConfigError(f"{item.name} is no longer supported: {entry.replacement}")
    if isinstance(entry, Ignored):
        return None
    if isinstance(entry, Rename):
        return [_Flag(target, list(item.values), item.inline) for target in entry.to]
    if isinstance(entry, Switch):
        if item.values and not item.inline:
            raise ConfigError(f"{item.name} takes no value, got {' '.join(item.values)!r}")
        if entry.unless and entry.unless in spelled:
            return []
        return _flags_of(entry.tokens)
    value = _one_value(item, prog)
    if isinstance(entry, Choice):
        if value not in entry.values:
            raise ConfigError(f"{item.name} {value!r}: expected one of {', '.join(entry.values)}")
        if entry.requires and entry.requires not in spelled:
            log.warning("%s %s has no effect without %s (as in OpenRLHF)", item.name, value, entry.requires)
            return []
        return _flags_of(entry.values[value])
    assert isinstance(entry, Sum)
    plus_names = _chain(entry.plus, table, None)
    plus_flag = next((spelled[n] for n in plus_names if n in spelled), None)
    plus = _one_value(plus_flag, prog) if plus_flag is not None else str(entry.plus_default)
    try:
        total = int(value) + int(plus)
    except ValueError:
        raise ConfigError(f"{item.name} {value!r} and {entry.plus} {plus!r} must be whole numbers") from None
    return [_Flag(entry.to, [str(total)])]


def _one_value(item: _Flag, prog: str) -> str:
    if len(item.values) != 1:
        raise ConfigError(f"{item.name} takes one value, got {len(item.values)} ({prog})")
    return item.values[0]


def _flags_of(tokens: tuple[str, ...]) -> list[_Flag]:
    return [item for item in _split(list(tokens)) if isinstance(item, _Flag)]


def _mixed_message(first: str, second: str, target: str) -> str:
    if target in (first, second):
        old = second if first == target else first
        return f"{old} is OpenRLHF's old spelling of {target}, and both are given; keep one of them"
    first, second = sorted((first, second))
    return f"{first} and {second} both set {target} (OpenRLHF spellings of one option); keep one of them"


def table_for(command: str, config_class: type | None) -> dict[str, Entry]:
    """The table of a command: a trainer's by its config's ``trainer_family`` (``ppo``, ``supervised``), a plugin
    command's (``generate``, ``chat``) by its name; none for anything else."""
    return TABLES.get(getattr(config_class, "trainer_family", None) or command, {})


def migration_markdown() -> str:
    """docs/config.md's migration table, generated from the tables (a test keeps the page in sync)."""
    titles = {"ppo": "`rlhf train ppo` (OpenRLHF `train_ppo_ray`)",
              "supervised": "`rlhf train sft|rm|dpo|kto|prm|kd` (OpenRLHF `train_sft`, `train_rm`, `train_dpo`, …)",
              "generate": "`rlhf generate` (OpenRLHF `batch_inference`)", "chat": "`rlhf chat` (OpenRLHF `interactive_chat`)",
              "serve reward": "`rlhf serve reward` (OpenRLHF `serve_rm`)"}
    blocks = []
    for family, table in TABLES.items():
        rows = [f"| `{old}` | {_describe(entry)} |" for old, entry in sorted(table.items())]
        blocks.append("\n".join([f"#### {titles[family]}", "", "| OpenRLHF | today |", "|---|---|", *rows]))
    return "\n\n".join(blocks) + "\n"


def _describe(entry: Entry) -> str:
    def code(tokens: Iterable[str]) -> str:
        return f"`{shell_join(tokens)}`"

    if isinstance(entry, Rename):
        return " and ".join(f"`{target}`" for target in entry.to) + (" (the same values for each)" if len(entry.to) > 1 else "")
    if isinstance(entry, Switch):
        return code(entry.tokens) + (f" (nothing when `{entry.unless}` is given)" if entry.unless else "")
    if isinstance(entry, Choice):
        choices = "; ".join(f"{value}: {code(tokens)}" for value, tokens in entry.values.items())
        return choices + (f" (no effect without `{entry.requires}`)" if entry.requires else "")
    if isinstance(entry, Sum):
        return f"`{entry.to}` = its value + `{entry.plus}` (default {entry.plus_default})"
    if isinstance(entry, Ignored):
        return f"ignored: {entry.reason}"
    return f"error: {entry.replacement}"
