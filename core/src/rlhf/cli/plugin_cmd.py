"""``rlhf NAME …`` for the commands plugins register (``rlhf_register_commands``).

A command's name may have several words (``serve reward``, ``serve tinker``), so several plugins can share a
first word without one of them owning it and dispatching on the others' targets. The command line runs the
longest registered name its leading words spell. Words that only begin registered names (``rlhf serve``) form a
group: ``--help`` lists its targets, anything else is one error line naming them.
"""

from __future__ import annotations

import argparse

from rlhf.errors import ConfigError, OneLineArgumentParser
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentError, ComponentKind, ComponentRegistry


def longest_command(names: list[str], argv: list[str], first: int) -> tuple[str, int] | None:
    """The longest of ``names`` whose words are ``argv[first:]``'s leading words, and how many words it took."""
    best: tuple[str, int] | None = None
    for name in names:
        words = name.split()
        if argv[first : first + len(words)] == words and (best is None or len(words) > best[1]):
            best = (name, len(words))
    return best


def run_plugin_command(selection: PluginSelection, argv: list[str], first: int) -> int:
    """Run the plugin command named from ``argv[first]`` on; the other arguments, before and after the name, are its own."""
    host = PluginHost.load(selection)
    registry = host.registry
    found = longest_command(registry.names(ComponentKind.COMMAND), argv, first)
    if found is None:
        return _group(registry, argv, first)
    name, taken = found
    command = registry.get(ComponentKind.COMMAND, name, flag="rlhf")
    parser = OneLineArgumentParser(prog=f"rlhf {name}", description=command.help, allow_abbrev=False,
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    command.add_arguments(parser)
    rest = argv[:first] + argv[first + taken :]
    rest = host.translate_argv(name, rest, list(parser._option_string_actions), None)
    return command().run(host, parser.parse_args(rest))


def _group(registry: ComponentRegistry, argv: list[str], first: int) -> int:
    """``rlhf serve [--help]``: the leading words begin registered names without spelling one."""
    names = registry.names(ComponentKind.COMMAND)
    words: list[str] = []
    for word in argv[first:]:  # the longest run of words that still begins some registered name
        if not any(name.split()[: len(words) + 1] == [*words, word] for name in names):
            break
        words.append(word)
    if not words:  # not even the first word: the registry's error lists what is installed, and who provides it
        raise ComponentError(registry.unknown_message(ComponentKind.COMMAND, _typed_name(registry, argv, first), flag="rlhf"))
    group = " ".join(words)
    targets = sorted(registry.registrations(ComponentKind.COMMAND), key=lambda reg: reg.name)
    targets = [reg for reg in targets if reg.name.split()[: len(words)] == words]
    following = argv[first + len(words)] if first + len(words) < len(argv) else None
    if following is not None and not following.startswith("-"):  # `rlhf serve nonsense`: its install hint, if any
        raise ComponentError(registry.unknown_message(ComponentKind.COMMAND, f"{group} {following}", flag="rlhf"))
    if "-h" in argv or "--help" in argv:
        parser = OneLineArgumentParser(prog=f"rlhf {group}", allow_abbrev=False,
                                         description=f"rlhf {group} TARGET: the targets installed plugins register")
        sub = parser.add_subparsers(metavar="TARGET")
        for reg in targets:
            sub.add_parser(" ".join(reg.name.split()[len(words) :]), help=reg.description, add_help=False)
        parser.print_help()
        return 0
    listed = ", ".join(" ".join(reg.name.split()[len(words) :]) for reg in targets)
    raise ConfigError(f"rlhf {group} needs a target: one of {listed} (rlhf {group} --help)")


def _typed_name(registry: ComponentRegistry, argv: list[str], first: int) -> str:
    """The command name the user typed, as long as a first-party distribution provides it (``serve reward`` when
    rlhf-plugin-reward-server is not installed: the error then says what to install); else its first word."""
    for end in range(len(argv), first, -1):
        if (ComponentKind.COMMAND, " ".join(argv[first:end])) in registry.known_providers:
            return " ".join(argv[first:end])
    return argv[first]
