"""What reaches the console: rlhf's own lines, its progress, and every error. Library warnings and
logs (vLLM, DeepSpeed, torch, Ray, transformers) go to the run's log file, ``rlhf.log`` in the run
dir; ``--verbose`` (or ``RLHF_VERBOSE=1``) shows them on the console as well.

Done where the noise starts, not by filtering text:

- the driver (:func:`configure_console`, first thing in ``main``) sets environment variables that the
  libraries read as they import, captures Python warnings into logging, and gives the root logger
  one console handler that passes only ``rlhf.*`` records and errors; everything else is held in
  memory until :func:`attach_run_log` names the run's file (the run dir is a flag);
- loggers that bring their own console handler are handed back to the root logger's handlers; transformers' (its
  ``[transformers]`` lines, the "LOAD REPORT" of a critic made from a causal LM) is registered before transformers
  imports as a logger that keeps no console handler (:class:`KeepsNoConsoleHandler`);
- the run log holds plain text: colour codes (transformers' bold report title, Ray's ``(pid=…)`` prefixes, colorama's
  dashboard address) are taken out of every line written to it;
- Ray workers inherit the variables and run :func:`configure_worker` as they start (Ray's
  ``worker_process_setup_hook``): a worker's stdout and stderr, C++ output included (torch's NUMA
  binding warning), go to the run's log file, and its ``rlhf.*`` records and errors to the stream
  Ray forwards to the driver. A worker's failure still reaches the driver as the exception of the
  call that failed;
- model ranks in the driver's own process (``--train.in_process``) run each call inside
  :func:`library_output_to_run_log`, and so does ``rlhf checkpoint export``: what the libraries ``print()`` or write
  to stderr there (DeepSpeed's memory reports, the tqdm bars of its universal conversion and of ``zero_to_fp32``)
  goes to the run's log file as a worker's stdout and stderr would, while the driver's other threads keep the console.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import threading
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

RUN_LOG_NAME = "rlhf.log"
ENV_VERBOSE = "RLHF_VERBOSE"
#: the run's log file, for Ray workers (set by :func:`attach_run_log`, inherited by the local cluster)
ENV_RUN_LOG = "RLHF_RUN_LOG"

#: read by the libraries as they import; a value the user set wins
QUIET_LIBRARY_ENV = {
    "VLLM_CONFIGURE_LOGGING": "0",  # vLLM's records go to the root logger's handlers, not its own stdout handler
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # transformers' "Loading weights"/"Writing model shards" bars
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",  # "Generating train split"
}
#: what a Ray worker needs from the driver's environment: the run log, --verbose, the libraries' quiet settings
WORKER_ENV = (ENV_RUN_LOG, ENV_VERBOSE, *QUIET_LIBRARY_ENV)
#: Ray's ``worker_process_setup_hook`` (a module path): run by every Ray worker process as it starts
WORKER_SETUP_HOOK = "rlhf.console.configure_worker"
#: loggers given a console handler of their own (propagate=False) by their library as it imports: records
#: logged on this very logger are re-routed by a filter set before the import (DeepSpeed warns as it imports)
FILTERED_LOGGERS = ("DeepSpeed",)
#: the same, for libraries that log on child loggers (a logger's filter misses those): handed back after the import
HANDED_BACK_LOGGERS = ("ray",)
#: libraries that add a console handler to their top logger the first time they log, and turn its propagation off:
#: registered before they import as a :class:`KeepsNoConsoleHandler` (handed back as above if already there)
NO_CONSOLE_HANDLER_LOGGERS = ("transformers",)
#: a terminal's colour and style codes (ECMA-48 CSI sequences): never written to a log file
_TERMINAL_CODES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")

_HANDLER_NAME = "rlhf.console"
_FORMAT = "%(levelname)s %(name)s: %(message)s"
_FILE_FORMAT = "%(asctime)s %(process)d " + _FORMAT


def verbose_requested() -> bool:
    return os.environ.get(ENV_VERBOSE) == "1"


class ConsoleFilter(logging.Filter):
    """rlhf's own warnings and every error; with ``--verbose``, every warning."""

    def __init__(self, verbose: bool) -> None:
        super().__init__()
        self.verbose = verbose

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        return record.levelno >= logging.WARNING and (self.verbose or record.name.split(".")[0] == "rlhf")


class ToRootHandlers(logging.Filter):
    """On a self-handled library logger: hand each record to the root logger's handlers instead of the
    library's own (errors excepted), so it lands in the run log, and on the console only if verbose."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        logging.getLogger().handle(record)
        return False


def without_terminal_codes(text: str) -> str:
    """``text`` as a log file should hold it: without colour or style codes."""
    return _TERMINAL_CODES.sub("", text)


class PlainTextFormatter(logging.Formatter):
    """The run log's format, with terminal codes taken out of the message (and of a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        return without_terminal_codes(super().format(record))


class KeepsNoConsoleHandler(logging.Logger):
    """A library's top logger that ignores the stream handler the library adds as it configures its logging, and
    always propagates: its records reach the root logger's handlers (the run log; the console with ``--verbose``)."""

    def addHandler(self, handler: logging.Handler) -> None:  # noqa: N802 - logging's name
        if type(handler) is not logging.StreamHandler:  # a file or capture handler a user adds stays
            super().addHandler(handler)

    @property
    def propagate(self) -> bool:  # type: ignore[override]
        return True

    @propagate.setter
    def propagate(self, value: bool) -> None:
        """transformers sets False after adding its handler: its records would then reach no handler of ours."""


class RunLog(logging.Handler):
    """The run's log file; until it is known (the run dir is a flag), the last 10,000 records are held."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.held: deque[logging.LogRecord] = deque(maxlen=10_000)
        self.file: logging.FileHandler | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is None:
            self.held.append(record)
        else:
            self.file.handle(record)

    def open(self, path: Path) -> None:
        if self.file is not None:
            self.file.close()
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = logging.FileHandler(path, mode="a", encoding="utf-8")  # O_APPEND: Ray workers write it too
        self.file.setFormatter(PlainTextFormatter(_FILE_FORMAT))
        while self.held:
            self.file.handle(self.held.popleft())

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        super().close()


def configure_console(verbose: bool) -> None:
    """The driver's logging: called before any library is imported."""
    if verbose:
        os.environ[ENV_VERBOSE] = "1"  # Ray workers inherit it
    verbose = verbose_requested()
    if not verbose:
        for key, value in QUIET_LIBRARY_ENV.items():
            os.environ.setdefault(key, value)
    _route(console=sys.stderr, verbose=verbose, run_log=RunLog())


def attach_run_log(run_dir: Path) -> Path:
    """From now on, library warnings and logs (with those held so far) go to ``run_dir/rlhf.log``, in this
    process and in the Ray workers it starts; returns its path. Called once the flags are parsed."""
    path = Path(run_dir).resolve() / RUN_LOG_NAME
    for handler in _ours(logging.getLogger()):
        if isinstance(handler, RunLog):
            handler.open(path)
    os.environ[ENV_RUN_LOG] = str(path)
    return path


def configure_worker() -> None:
    """Run by Ray in each worker process as it starts (``worker_process_setup_hook``)."""
    run_log = os.environ.get(ENV_RUN_LOG)
    verbose = verbose_requested()
    log_fd = None if verbose or not run_log else _open_for_append(Path(run_log))
    if log_fd is None:  # verbose, or no run log to write here: everything goes where Ray sends it, the driver's console
        _route(console=sys.stderr, verbose=True, run_log=None)
        return
    sys.stdout.flush()
    sys.stderr.flush()
    forwarded = os.fdopen(os.dup(2), "w", buffering=1)  # the stream Ray forwards to the driver's console
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    run_log_handler = RunLog()
    run_log_handler.open(Path(run_log))  # type: ignore[arg-type]
    _route(console=forwarded, verbose=False, run_log=run_log_handler)


#: the run log a thread of the driver writes to while it does library work (see :func:`library_output_to_run_log`)
_library_work = threading.local()


class _ThreadRoutedStream:
    """The driver's ``sys.stdout`` or ``sys.stderr`` once it did library work: a thread inside that work writes to
    the run log (without terminal codes), every other thread (rlhf's own output) to the stream it replaced,
    ``console``."""

    def __init__(self, console: TextIO) -> None:
        self.console = console

    def write(self, text: str) -> int:
        log = getattr(_library_work, "log", None)
        if log is None:
            return self.console.write(text)
        log.write(without_terminal_codes(text))
        return len(text)

    def flush(self) -> None:
        (getattr(_library_work, "log", None) or self.console).flush()

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding…: the console's
        return getattr(self.console, name)


def console_stream(stream: TextIO) -> TextIO:
    """The console under ``stream`` (``sys.stderr``): where rlhf's own lines go, from any thread."""
    return stream.console if isinstance(stream, _ThreadRoutedStream) else stream


@contextlib.contextmanager
def library_output_to_run_log() -> Iterator[None]:
    """Around library work in the driver's process (a call of a model rank that lives there, ``rlhf checkpoint
    export``): what this thread writes to ``sys.stdout`` and ``sys.stderr`` (``print()``, tqdm bars) goes to the run
    log, as a Ray worker's output does. Unchanged with ``--verbose``, before the run log is known, and inside a call
    already routed."""
    run_log = os.environ.get(ENV_RUN_LOG)
    if verbose_requested() or not run_log or getattr(_library_work, "log", None) is not None:
        yield
        return
    if not isinstance(sys.stdout, _ThreadRoutedStream):
        sys.stdout = _ThreadRoutedStream(sys.stdout)
    if not isinstance(sys.stderr, _ThreadRoutedStream):
        sys.stderr = _ThreadRoutedStream(sys.stderr)
    with open(run_log, "a", encoding="utf-8") as log:  # O_APPEND, as the log handler and the workers write it
        _library_work.log = log
        try:
            yield
        finally:
            _library_work.log = None


def _open_for_append(path: Path) -> int | None:
    """On another node, the run dir may not exist yet: a local dir of the same path then."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return None


def hand_back_library_loggers() -> None:
    """Strip the console handlers a library installed on its logger as it imported (Ray's, at ``import
    ray``) so its records reach the root logger's handlers; call after importing such a library."""
    for name in HANDED_BACK_LOGGERS:
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                logger.removeHandler(handler)
        logger.propagate = True


def _ours(logger: logging.Logger) -> list[logging.Handler]:
    return [handler for handler in logger.handlers if handler.get_name() == _HANDLER_NAME]


class _CurrentStderr(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (it may be replaced after set-up, as by pytest)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self)

    @property
    def stream(self) -> object:  # type: ignore[override]
        return console_stream(sys.stderr)  # rlhf's lines from inside a rank's call too


def _route(*, console: object, verbose: bool, run_log: RunLog | None) -> None:
    logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger -> the handlers below
    root = logging.getLogger()
    for handler in _ours(root):  # a second main() in one process replaces them; a test's capture handlers stay
        root.removeHandler(handler)
        handler.close()
    root.setLevel(logging.INFO)
    shown = _CurrentStderr() if console is sys.stderr else logging.StreamHandler(console)  # type: ignore[arg-type]
    shown.setFormatter(logging.Formatter(_FORMAT))
    shown.addFilter(ConsoleFilter(verbose))
    for handler in (shown, run_log):
        if handler is not None:
            handler.set_name(_HANDLER_NAME)
            root.addHandler(handler)
    for name in FILTERED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, ToRootHandlers) for f in logger.filters):
            logger.addFilter(ToRootHandlers())
    for name in NO_CONSOLE_HANDLER_LOGGERS:
        _keep_no_console_handler(name)


def _keep_no_console_handler(name: str) -> None:
    """Logger ``name`` as a :class:`KeepsNoConsoleHandler`; one the library made already (imported before
    :func:`configure_console`, as in a test process) loses its console handlers and propagates."""
    manager = logging.Logger.manager
    if isinstance(manager.loggerDict.get(name), logging.Logger):
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
        logger.propagate = True
        return
    made_as, manager.loggerClass = manager.loggerClass, KeepsNoConsoleHandler
    try:
        logging.getLogger(name)
    finally:
        manager.loggerClass = made_as
