"""Whole programs: a trainer (``rlhf train NAME``) and a command (``rlhf NAME``).

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pydantic import BaseModel

    from rlhf.config.run import RunConfig
    from rlhf.host.plugin_host import PluginHost


@runtime_checkable
class Trainer(Protocol):
    """A top-level training program run by ``rlhf train NAME``.

    ``config_class`` is the pydantic model of its whole configuration tree (its fields
    become the dotted flags). ``run`` executes in the CLI process (the controller), once.

    Optional classmethod for ``rlhf plan`` (docs/plan.md): ``plan_groups(config, registry) -> rlhf.planning.RunGroups``,
    the model groups the run creates (role, model path, ranks, trained or not) and its rollout engine; in the CLI
    process, before anything starts. Absent: the trainer cannot be planned, and ``rlhf train`` does not plan it.
    """

    config_class: ClassVar[type[BaseModel]]

    def __init__(self, config: RunConfig, plugins: PluginHost, run_dir: Path) -> None: ...

    def run(self) -> None: ...


class Command(Protocol):
    """A top-level ``rlhf NAME`` subcommand from a plugin (e.g. ``rlhf generate``).

    ``NAME`` may have several words (``serve reward``, ``serve tinker``): plugins then share the first word, and
    the CLI runs the longest registered name the command line's leading words spell; words that only begin names
    (``rlhf serve --help``) list the targets (docs/plugins/command.md). ``add_arguments`` fills the subcommand's
    argparse parser (``prog`` is ``rlhf NAME``, the words after ``NAME`` its arguments); ``run`` executes in the
    CLI process, once, after every plugin was loaded, and returns the exit status.
    """

    help: ClassVar[str]

    @classmethod
    def add_arguments(cls, parser: Any) -> None: ...

    def run(self, host: PluginHost, args: Any) -> int: ...
