"""The mistakes a user can fix, and how the ``rlhf`` command shows them.

Code anywhere in rlhf or a plugin (the CLI process, a Ray worker, a reward server) raises
one of these when the user's flags, files, data, plugins or environment are at fault. The
message names the thing at fault — flag, file and row, plugin and hook, URL, checkpoint
file, worker group and rank — and says what to do. :func:`render_exit` turns any of them,
however deeply wrapped (``raise … from``, Ray's ``RayTaskError``), into one line
``rlhf: error: …`` on stderr and exit status 2; the traceback is printed only with
``--debug`` or ``RLHF_DEBUG=1``. Anything else is a bug: one ``rlhf: internal error`` line,
exit status 1, and the traceback with ``--debug``.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from collections.abc import Iterator
from typing import NoReturn

DEBUG_ENV = "RLHF_DEBUG"
USER_ERROR_EXIT = 2
INTERNAL_ERROR_EXIT = 1
#: a preemption signal stopped the run after a checkpoint (sysexits' EX_TEMPFAIL: "try again later"); the
#: same command with --ckpt.load_enable resumes it (rlhf.records.preemption, docs/preemption.md)
PREEMPTED_EXIT = 75


class UserError(Exception):
    """Base of every error the user can fix; the message is the one line the CLI prints."""


class ConfigError(UserError, ValueError):
    """A flag, YAML key or combination of flags is invalid (names the flag and the fix)."""


class DataError(UserError, ValueError):
    """A dataset file, row or value is unusable (names the file, the row and the flag)."""


#: what a user can do about a checkpoint that does not load (the end of every such CheckpointError)
CHECKPOINT_WAY_OUT = "to resume from the checkpoint before it (or start fresh), or drop --ckpt.load_enable"


class CheckpointError(UserError):
    """A checkpoint is missing, truncated or does not fit the run (names the file)."""


class RewardSourceError(UserError):
    """A reward file, server or function cannot be used (names the file or URL)."""


class RewardSourceDown(RewardSourceError):
    """The reward source gave no answer at all (down, unreachable, timing out): retrying sample by
    sample cannot help, so the batch fails at once whatever ``--reward.on_error`` says."""


class PluginError(UserError):
    """A plugin failed to load or raised in a hook (names the plugin and the hook)."""


class RemovedNameError(PluginError, ImportError):
    """An import of a name the plugin API has removed; the message names the release that removed it and its
    replacement (``rlhf.deprecation`` raises it, the plugin host reports a plugin that does it as incompatible)."""


class RlhfDeprecationWarning(DeprecationWarning):
    """A plugin uses a deprecated name of the plugin API: it still works, and the message names its new path and
    the release that removes it. A plugin's test suite turns it into an error with pytest's
    ``-W error::rlhf.errors.RlhfDeprecationWarning`` (or its ``filterwarnings`` setting)."""


class ComponentRefusedError(UserError):
    """The library under a rollout engine or training backend refused the run while the component was built or
    first used (a model or config it cannot serve, a dtype the device lacks, memory that ran out): names the
    component and its distribution, quotes the library and gives the way out (``rlhf.components.first_use``)."""


class WorkerError(UserError):
    """A Ray worker died or stopped answering (names the group and the rank)."""


class StorageError(UserError):
    """Writing a file failed: disk full, no permission (names the path; nothing half-written is left)."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a training run; the message says whether a checkpoint was written and
    how to resume from it, or that none was (the CLI puts it on its ``rlhf: interrupted`` line)."""


class Preempted(RunInterrupted):
    """A preemption signal stopped a training run after the checkpoint of its last step was written; the
    message (the CLI's ``rlhf: preempted`` line) names the checkpoint and how to resume. Exit status
    :data:`PREEMPTED_EXIT`."""

    def __init__(self, message: str, checkpoint: object = None, step: int = 0) -> None:
        super().__init__(message)
        self.checkpoint, self.step = checkpoint, step


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse whose usage errors are :class:`ConfigError` (one ``rlhf: error:`` line, exit 2)
    instead of a usage block; ``--help`` still prints the full usage."""

    def error(self, message: str) -> NoReturn:
        where = "" if self.prog == "rlhf" else f"{self.prog}: "
        raise ConfigError(f"{where}{message} (see {self.prog} --help)")


def debug_requested(argv: list[str] | None = None) -> bool:
    return "--debug" in (argv or []) or os.environ.get(DEBUG_ENV, "") not in {"", "0", "false"}


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what caused it (``__cause__``, ``__context__``), depth first, each once. A Ray
    ``RayTaskError`` — a subclass of the remote exception's class whose str() is the remote
    traceback — is replaced by its ``cause``, the original, clean exception."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        current = pending.pop(0)
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        cause = getattr(current, "cause", None)
        if isinstance(cause, BaseException):
            pending.insert(0, cause)
            continue
        yield current
        pending += [current.__cause__, current.__context__]


def find_user_error(exc: BaseException) -> UserError | None:
    """The first :class:`UserError` in ``exc``'s chain (causes, contexts, Ray's wrapped causes)."""
    return next((e for e in exception_chain(exc) if isinstance(e, UserError)), None)


def one_line(message: str) -> str:
    return " ".join(str(message).split())


#: The errors of a write that the user fixes on the machine, with what to do.
STORAGE_HINTS = {errno.ENOSPC: "free some disk space", errno.EDQUOT: "free some disk space (quota)",
                 errno.EFBIG: "raise the file-size limit (ulimit -f)", errno.EACCES: "check the directory's permissions",
                 errno.EPERM: "check the directory's permissions", errno.EROFS: "choose a writable directory"}
STORAGE_ERRNOS = frozenset(STORAGE_HINTS)


def storage_error(path: object, exc: OSError, what: str) -> StorageError:
    """An OSError while writing ``path`` as a :class:`StorageError` that says what to do."""
    return StorageError(f"writing {what} {path} failed: {exc.strerror or exc}; "
                        f"{STORAGE_HINTS.get(exc.errno or 0, 'check the path')} and run again (nothing half-written was kept)")


def render_exit(exc: BaseException, debug: bool) -> int:
    """Print ``exc`` as the CLI does and return the exit status."""
    if debug:
        traceback.print_exception(exc)
    user = find_user_error(exc)
    if user is not None:
        print(f"rlhf: error: {one_line(str(user))}", file=sys.stderr)
        return USER_ERROR_EXIT
    hint = "" if debug else "; rerun with --debug for the traceback"
    root = next(exception_chain(exc))  # a Ray wrapper's str() is the whole remote traceback; its cause is not
    print(f"rlhf: internal error: {type(root).__name__}: {one_line(str(root))} "
          f"(a bug in rlhf or a plugin{hint})", file=sys.stderr)
    return INTERNAL_ERROR_EXIT
