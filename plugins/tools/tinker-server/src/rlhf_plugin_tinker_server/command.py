"""``rlhf serve tinker``: the command's flags, the models' load and the server's start."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger("rlhf.serving")

#: Where the server finds its API key when no flag gives it (the SDK's own variable, so one shell serves both ends)
API_KEY_ENV = "TINKER_API_KEY"


def model_entry(text: str) -> tuple[str, str]:
    """``--model`` value: ``PATH`` (clients name the model by that path) or ``NAME=PATH`` (by ``NAME``, e.g. the
    hub name a recipe asks for)."""
    name, _, path = text.rpartition("=")
    if not path:
        raise argparse.ArgumentTypeError(f"expected PATH or NAME=PATH, got {text!r}")
    return (name or path), path


def _positive(text: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, got {text!r}")
    return int(text)


class ServeTinkerCommand:
    """Serve the Tinker training API over HTTP for the ``tinker`` SDK (``ServiceClient(base_url=...)``)."""

    help: ClassVar[str] = "serve the Tinker training API to the tinker SDK: rlhf serve tinker --model PATH --port N"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument(
            "--model",
            type=model_entry,
            action="append",
            required=True,
            metavar="[NAME=]PATH",
            help="a base model directory to serve (repeat for several); clients name it by PATH, or "
            "by NAME when given (e.g. Qwen/Qwen3-8B=/models/tiny)",
        )
        parser.add_argument("--host", default="127.0.0.1", help="bind address; 127.0.0.1 answers this machine only")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument(
            "--api-key",
            "--api_key",
            dest="api_key",
            default=None,
            help=f"the key every request must carry in X-API-Key (the SDK's api_key, which must start "
            f"with 'tml-'); None: ${API_KEY_ENV}, else any key is accepted",
        )
        parser.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="the base weights' dtype")
        parser.add_argument(
            "--sampler-snapshots",
            "--sampler_snapshots",
            dest="sampler_snapshots",
            type=_positive,
            default=8,
            help="how many of a run's latest save_weights_and_get_sampling_client snapshots stay loaded; "
            "sampling from an older one is refused with a message that says so",
        )
        parser.add_argument(
            "--session-timeout",
            "--session_timeout",
            dest="session_timeout",
            type=_positive,
            default=300,
            help="seconds without a heartbeat (the SDK sends one every 10 s) after which a session ends and its "
            "training runs are freed",
        )
        parser.add_argument(
            "--checkpoint-dir",
            "--checkpoint_dir",
            dest="checkpoint_dir",
            default="tinker-checkpoints",
            help="where save_state writes each run's checkpoints and load_state reads them; a server "
            "started again on the same directory resumes any run from its last save_state",
        )

    def run(self, host: Any, args: Any) -> int:
        import uvicorn

        from rlhf.errors import ConfigError
        from rlhf.registry import ComponentKind
        from rlhf_plugin_tinker_server.app import build_app
        from rlhf_plugin_tinker_server.models import load_served_model
        from rlhf_plugin_tinker_server.service import TinkerService

        names = [name for name, _ in args.model]
        if len(set(names)) != len(names):
            raise ConfigError(f"--model: the names {names} repeat; give each model a name of its own (NAME=PATH)")
        ppo_loss = host.registry.get(ComponentKind.POLICY_LOSS, "ppo", flag="the ppo loss of rlhf serve tinker")
        models = {name: load_served_model(name, path, args.dtype) for name, path in args.model}
        api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning(
                "rlhf serve tinker on %s trains for anyone who reaches it: set --api-key (or %s)", args.host, API_KEY_ENV
            )
        service = TinkerService(
            models, ppo_loss, Path(args.checkpoint_dir).resolve(), args.sampler_snapshots, args.session_timeout
        )
        try:
            uvicorn.run(build_app(service, api_key), host=args.host, port=args.port, log_level="warning")
        finally:
            service.close()
        return 0
