"""``rlhf serve reward``: the command's flags, and the server's start (see :mod:`rlhf_plugin_reward_server.server`)."""

from __future__ import annotations

import argparse
import logging
import os
from typing import Any, ClassVar

from rlhf_plugin_reward_server.server import DEFAULT_MAX_REQUEST_BYTES, build_app, model_reward

log = logging.getLogger("rlhf.serving")

#: Where the server (and an rlhf run's remote reward client) find the shared secret when no flag gives it.
API_KEY_ENV = "RLHF_REWARD_API_KEY"


def _positive_int(text: str) -> int:
    if not text.strip().isdigit() or int(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive whole number of bytes, got {text!r}")
    return int(text)


class ServeCommand:
    """Serve a reward over HTTP with OpenRLHF's protocol (``--reward.remote_url`` of another run can use it)."""

    help: ClassVar[str] = "serve a reward over HTTP: rlhf serve reward --function NAME | --model PATH"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--function", help="a registered reward function (see `rlhf plugins`)")
        source.add_argument("--model", help="a reward model dir (sequence regression with a `score` head)")
        parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
        parser.add_argument("--port", type=int, default=5000)
        parser.add_argument("--api_key", default=None, help="a shared secret every POST /get_reward must carry "
                            f"(Authorization: Bearer KEY or X-Api-Key: KEY); None: ${API_KEY_ENV}, else no key")
        model = parser.add_argument_group("with --model")
        model.add_argument("--dtype", choices=["fp32", "bf16", "fp16"], default="fp32", help="the model's weights' dtype")
        model.add_argument("--max_len", type=int, default=None, help="cut each query to this many tokens (None: whole)")
        model.add_argument("--batch_size", type=int, default=None, help="queries per forward pass (None: the whole request)")
        model.add_argument("--normalize", action="store_true", help="(value - mean) / std with the statistics rlhf train rm "
                           "records in the model's config.json")
        parser.add_argument("--max_request_bytes", type=_positive_int, default=DEFAULT_MAX_REQUEST_BYTES,
                            help="largest request body accepted, in bytes; a bigger one is answered HTTP 413 "
                                 f"(default {DEFAULT_MAX_REQUEST_BYTES} = 16 MiB, about 16k samples of 1 kB)")

    def run(self, host: Any, args: Any) -> int:
        import uvicorn

        from rlhf.components import build
        from rlhf.launch import trainer_run
        from rlhf.registry import ComponentKind

        if args.function:
            # a reward function with ``from_config`` gets the default run config, with the plugins' option defaults
            default_config = trainer_run(host, "ppo", [], refusing=False).config
            reward = build(host.registry.get(ComponentKind.REWARD_FUNCTION, args.function, flag="--function"), default_config)
            name, source = args.function, f"reward function {args.function!r}"
        else:
            reward = model_reward(args.model, dtype=args.dtype, max_len=args.max_len, batch_size=args.batch_size,
                                  normalize=args.normalize)
            name, source = args.model, f"reward model {args.model}"
        api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
        if api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
            log.warning("rlhf serve reward on %s answers anyone who reaches it: set --api_key (or %s)", args.host, API_KEY_ENV)
        uvicorn.run(build_app(reward, name, source, args.max_request_bytes, api_key), host=args.host, port=args.port,
                    log_level="warning")
        return 0
