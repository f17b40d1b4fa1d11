"""``rlhf serve reward``: any registered reward function, or a reward model, behind OpenRLHF's protocol.

``POST /get_reward`` with ``{"query": [str], "prompts": [str], "labels": [...]}`` answers
``{"rewards": [...], "scores": [...], "extra_logs": {...}}``; ``GET /health`` answers
``{"status": "ok", "reward": NAME}``. Binds 127.0.0.1 unless ``--host`` says otherwise.
"""

from __future__ import annotations

import argparse
from typing import Any

from pydantic import BaseModel

from rlhf.plugins import PluginHost


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    serve = sub.add_parser("serve", help="serve a reward over HTTP: rlhf serve reward --function NAME | --model PATH")
    serve.add_argument("what", choices=["reward"])
    source = serve.add_mutually_exclusive_group(required=True)
    source.add_argument("--function", help="a registered reward function (see `rlhf plugins`)")
    source.add_argument("--model", help="a reward model dir (sequence regression with a `score` head)")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: this machine only)")
    serve.add_argument("--port", type=int, default=5000)


def model_reward(path: str) -> Any:
    """A batched reward function backed by a reward model: the head's value at the last token."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1).eval()

    def reward(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> list[float]:
        encoded = tokenizer(queries, padding=True, return_tensors="pt")
        with torch.no_grad():
            return model(**encoded).logits[:, 0].float().tolist()

    return reward


class RewardRequest(BaseModel):
    """OpenRLHF's request body; ``prompts`` and ``labels`` may be left out."""

    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


def build_app(reward: Any, name: str) -> Any:
    from fastapi import FastAPI, HTTPException

    from rlhf.reward_terms import call_reward

    app = FastAPI(title=f"rlhf reward server: {name}")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "reward": name}

    @app.post("/get_reward")
    def get_reward(request: RewardRequest) -> dict[str, Any]:
        count = len(request.query)
        prompts = request.prompts or [""] * count
        labels = request.labels or [""] * count
        if len(prompts) != count or len(labels) != count:
            raise HTTPException(422, f"query, prompts and labels must have the same length ({count})")
        out = call_reward(reward, request.query, prompts, labels, source=f"reward {name!r}")
        return {"rewards": out.rewards, "scores": out.scores, "extra_logs": out.extra_logs}

    return app


def serve(host: PluginHost, args: argparse.Namespace) -> int:
    import uvicorn

    from rlhf.components import build
    from rlhf.registry import ComponentKind

    if args.function:
        reward = build(host.registry.get(ComponentKind.REWARD_FUNCTION, args.function, flag="--function"), _default_config(host))
        name = args.function
    else:
        reward, name = model_reward(args.model), args.model
    uvicorn.run(build_app(reward, name), host=args.host, port=args.port, log_level="warning")
    return 0


def _default_config(host: PluginHost) -> Any:
    """Reward functions with ``from_config`` get the default run config with the plugins' option defaults."""
    from rlhf.config.loading import validate
    from rlhf.config.ppo import PPOConfig

    return validate(PPOConfig, {}, host)
