"""The model workers: actor (policy, trained), critic (values, trained), reference and reward model.

Every method here runs inside a Ray actor, once per rollout batch (``logprobs``,
``values``, ``rewards``, ``train``) or once per sync/checkpoint. Payloads are plain
lists per sample (token ids, per-token floats) so they cross Ray cheaply; tensors
are built inside the worker. Per-token tensors are ``(B, T)`` over response tokens.
"""

from __future__ import annotations

from typing import Any

from rlhf.runtime.worker_group import BaseWorker


def _micro_batches(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


class _CausalLMWorker(BaseWorker):
    """Shared by the actor and the reference: per-token log-probs of responses."""

    engine: Any

    def logprobs(self, payload: dict[str, list]) -> list[list[float]]:
        import torch

        from rlhf.runtime.batch import action_logprobs, pack

        out: list[list[float]] = []
        prompts, responses = payload["prompt_ids"], payload["response_ids"]
        self.engine.eval()
        with torch.no_grad():
            for idx in _micro_batches(len(prompts), self.config.rollout.micro_batch_size):
                batch = pack([prompts[i] for i in idx], [responses[i] for i in idx], self.pad_id)
                logits = self.engine(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                logp = action_logprobs(logits, batch, self.config.rollout.temperature)
                out += [logp[j, : len(responses[i])].tolist() for j, i in enumerate(idx)]
        return out


class ReferenceWorker(_CausalLMWorker):
    role = "ref"

    def setup(self, master_addr: str, master_port: int) -> None:
        import deepspeed

        from rlhf.engines.deepspeed_strategy import dtype_of, eval_config, zero3_context
        from rlhf.engines.hf_models import load_causal_lm

        self._init_common(master_addr, master_port)
        ds_config = eval_config(self.config, self.config.ref.offload)
        self._zero3 = zero3_context(ds_config)
        model = load_causal_lm(self.config.actor.model_name_or_path, dtype_of(self.config), self.config.ds.attn_implementation)
        self.pad_id = model.config.pad_token_id or 0
        self.engine, *_ = deepspeed.initialize(model=model, config=ds_config)


class PolicyWorker(_CausalLMWorker):
    """The actor: DeepSpeed training with the selected policy loss, optimizer and scheduler."""

    role = "actor"

    def setup(self, master_addr: str, master_port: int, num_training_steps: int) -> None:
        import deepspeed

        from rlhf.components import build
        from rlhf.engines.deepspeed_strategy import dtype_of, train_config, zero3_context
        from rlhf.engines.hf_models import load_causal_lm
        from rlhf.registry import ComponentKind as K

        self._init_common(master_addr, master_port)
        cfg = self.config
        registry = self.plugins.registry
        optimizer = build(registry.get(K.OPTIMIZER, cfg.actor.optim, flag="--actor.optim"), cfg)
        scheduler = build(registry.get(K.SCHEDULER, cfg.actor.lr_scheduler, flag="--actor.lr_scheduler"), cfg)
        self.loss = build(registry.get(K.POLICY_LOSS, cfg.actor.policy_loss_type, flag="--actor.policy_loss_type"), cfg)
        ds_config = train_config(cfg, optimizer.deepspeed_config(cfg.actor), self.world_size, cfg.actor.max_norm)
        self._zero3 = zero3_context(ds_config)
        model = load_causal_lm(cfg.actor.model_name_or_path, dtype_of(cfg), cfg.ds.attn_implementation)
        if cfg.actor.gradient_checkpointing_enable:
            model.gradient_checkpointing_enable({"use_reentrant": cfg.actor.gradient_checkpointing_reentrant})
        self.pad_id = model.config.pad_token_id or 0
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=ds_config,
            lr_scheduler=lambda opt: scheduler.build(opt, max(1, num_training_steps), cfg.actor),
        )

    def train(self, payload: dict[str, list], step: int, kl_coef: float) -> dict[str, float]:
        """``max_epochs`` passes of the policy loss over this rank's share of the rollout batch."""
        import torch

        from rlhf.ops import compute_approx_kl
        from rlhf.runtime.batch import action_logprobs, pack, pad_list

        cfg = self.config
        n = len(payload["prompt_ids"])
        micro = cfg.train.micro_batch_size
        accumulation = self.engine.gradient_accumulation_steps()
        per_step = micro * accumulation
        self.engine.train()
        sums: dict[str, float] = {}
        count = 0
        for epoch in range(cfg.train.max_epochs):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.train.seed * 100003 + step * 101 + epoch)).tolist()
            for start in range(0, n, per_step):
                group = order[start : start + per_step]
                tokens = torch.tensor(float(sum(len(payload["response_ids"][i]) for i in group)))
                if torch.distributed.is_initialized() and self.world_size > 1:
                    torch.distributed.all_reduce(tokens)
                for idx in _micro_batches(len(group), micro):
                    rows = [group[k] for k in idx]
                    responses = [payload["response_ids"][i] for i in rows]
                    batch = pack([payload["prompt_ids"][i] for i in rows], responses, self.pad_id)
                    width = batch.action_mask.shape[1]
                    advantages = pad_list([payload["advantages"][i] for i in rows], width)
                    logits = self.engine(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
                    logp = action_logprobs(logits, batch, cfg.rollout.temperature)
                    if payload["old_logprobs"] is None:
                        # one on-policy optimizer step: the weights that sampled are the weights
                        # being differentiated, so π_old is exactly this forward's value
                        old = logp.detach()
                    else:
                        old = pad_list([payload["old_logprobs"][i] for i in rows], width)
                    token_loss, metrics = self.loss(logp, old, advantages, batch.action_mask)
                    # one exact token mean per optimizer step: DeepSpeed divides by the
                    # accumulation steps and averages over ranks, so undo both
                    scale = accumulation * self.world_size / tokens.clamp(min=1.0)
                    loss = (token_loss * batch.action_mask).sum() * scale
                    if cfg.algo.kl.use_loss and "ref_logprobs" in payload:
                        ref = pad_list([payload["ref_logprobs"][i] for i in rows], width)
                        kl = compute_approx_kl(logp, ref, cfg.algo.kl.estimator) * batch.action_mask
                        loss = loss + kl_coef * kl.sum() * scale
                        metrics["kl_loss"] = (kl.sum() / batch.action_mask.sum().clamp(min=1)).detach()
                    self.engine.backward(loss)
                    self.engine.step()
                    metrics["policy_loss"] = ((token_loss * batch.action_mask).sum() / batch.action_mask.sum().clamp(min=1)).detach()
                    for key, value in metrics.items():
                        sums[key] = sums.get(key, 0.0) + float(value)
                    count += 1
        result = {key: value / max(count, 1) for key, value in sums.items()}
        result["actor_lr"] = float(self.engine.get_lr()[0])
        return result

    def full_state(self) -> Any:
        """All ranks call this; rank 0 returns a Ray reference to the full CPU state dict."""
        import ray

        from rlhf.engines.deepspeed_strategy import full_state_dict

        state = full_state_dict(self.engine.module)
        return ray.put(state) if self.rank == 0 else None

    def save_checkpoint(self, directory: str) -> None:
        self.engine.save_checkpoint(directory, tag="actor")

    def load_checkpoint(self, directory: str) -> None:
        self.engine.load_checkpoint(directory, tag="actor", load_optimizer_states=True, load_lr_scheduler_states=True)

    def save_hf(self, directory: str) -> None:
        from transformers import AutoTokenizer

        from rlhf.engines.deepspeed_strategy import full_state_dict

        state = full_state_dict(self.engine.module)
        if self.rank == 0:
            self.engine.module.save_pretrained(directory, state_dict=state)
            AutoTokenizer.from_pretrained(self.config.actor.model_name_or_path).save_pretrained(directory)


class _ValueWorker(BaseWorker):
    """Shared by the critic and the reward model: a backbone plus a one-output head."""

    head = "score"

    def _values(self, prompts: list[list[int]], responses: list[list[int]]) -> Any:
        from rlhf.engines.hf_models import token_values
        from rlhf.runtime.batch import pack

        batch = pack(prompts, responses, self.pad_id)
        values = token_values(self.engine.module, batch.input_ids, batch.attention_mask, self.head)
        return batch, values


class RewardModelWorker(_ValueWorker):
    role = "reward"

    def setup(self, master_addr: str, master_port: int, path: str) -> None:
        import deepspeed

        from rlhf.engines.deepspeed_strategy import dtype_of, eval_config, zero3_context
        from rlhf.engines.hf_models import load_value_model

        self._init_common(master_addr, master_port)
        self.head = self.config.ds.value_head_prefix
        ds_config = eval_config(self.config, self.config.reward.offload)
        self._zero3 = zero3_context(ds_config)
        model = load_value_model(path, dtype_of(self.config), self.config.ds.attn_implementation, self.head)
        self.pad_id = model.config.pad_token_id or 0
        self.engine, *_ = deepspeed.initialize(model=model, config=ds_config)

    def rewards(self, payload: dict[str, list]) -> list[float]:
        """The head's value at the last token of each prompt+response: one reward per sample."""
        import torch

        out: list[float] = []
        prompts, responses = payload["prompt_ids"], payload["response_ids"]
        with torch.no_grad():
            for idx in _micro_batches(len(prompts), self.config.rollout.micro_batch_size):
                batch, values = self._values([prompts[i] for i in idx], [responses[i] for i in idx])
                last = batch.attention_mask.sum(dim=1) - 1
                out += values.gather(1, last[:, None]).squeeze(1).tolist()
        return out


class CriticWorker(_ValueWorker):
    """Values of the prefix before each action token; trained with the clipped value loss."""

    role = "critic"

    def setup(self, master_addr: str, master_port: int, num_training_steps: int) -> None:
        import deepspeed

        from rlhf.components import build
        from rlhf.engines.deepspeed_strategy import dtype_of, train_config, zero3_context
        from rlhf.engines.hf_models import load_value_model
        from rlhf.registry import ComponentKind as K

        self._init_common(master_addr, master_port)
        cfg = self.config
        self.head = cfg.ds.value_head_prefix
        optimizer = build(self.plugins.registry.get(K.OPTIMIZER, cfg.critic.optim, flag="--critic.optim"), cfg)
        scheduler = build(self.plugins.registry.get(K.SCHEDULER, cfg.critic.lr_scheduler, flag="--critic.lr_scheduler"), cfg)
        ds_config = train_config(cfg, optimizer.deepspeed_config(cfg.critic), self.world_size, cfg.critic.max_norm)
        self._zero3 = zero3_context(ds_config)
        model = load_value_model(cfg.critic.model_name_or_path, dtype_of(cfg), cfg.ds.attn_implementation, self.head)
        self.pad_id = model.config.pad_token_id or 0
        self.engine, *_ = deepspeed.initialize(
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            config=ds_config,
            lr_scheduler=lambda opt: scheduler.build(opt, max(1, num_training_steps), cfg.critic),
        )

    def _action_values(self, prompts: list[list[int]], responses: list[list[int]]) -> tuple[Any, Any]:
        batch, values = self._values(prompts, responses)
        return batch, values.gather(1, batch.action_index) * batch.action_mask

    def values(self, payload: dict[str, list]) -> list[list[float]]:
        import torch

        out: list[list[float]] = []
        prompts, responses = payload["prompt_ids"], payload["response_ids"]
        self.engine.eval()
        with torch.no_grad():
            for idx in _micro_batches(len(prompts), self.config.rollout.micro_batch_size):
                _, values = self._action_values([prompts[i] for i in idx], [responses[i] for i in idx])
                out += [values[j, : len(responses[i])].tolist() for j, i in enumerate(idx)]
        return out

    def train(self, payload: dict[str, list], step: int) -> dict[str, float]:
        """Clipped value loss 0.5·max((V−R)², (V_clip−R)²), one token mean per optimizer step."""
        import torch

        from rlhf.runtime.batch import pad_list

        cfg = self.config
        n = len(payload["prompt_ids"])
        micro = cfg.train.micro_batch_size
        accumulation = self.engine.gradient_accumulation_steps()
        self.engine.train()
        total, count = 0.0, 0
        for epoch in range(cfg.train.max_epochs):
            order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.train.seed * 7919 + step * 101 + epoch)).tolist()
            for start in range(0, n, micro * accumulation):
                group = order[start : start + micro * accumulation]
                tokens = torch.tensor(float(sum(len(payload["response_ids"][i]) for i in group)))
                if self.world_size > 1:
                    torch.distributed.all_reduce(tokens)
                for idx in _micro_batches(len(group), micro):
                    rows = [group[k] for k in idx]
                    batch, values = self._action_values([payload["prompt_ids"][i] for i in rows],
                                                        [payload["response_ids"][i] for i in rows])
                    width = batch.action_mask.shape[1]
                    old = pad_list([payload["values"][i] for i in rows], width)
                    returns = pad_list([payload["returns"][i] for i in rows], width)
                    clipped = old + (values - old).clamp(-cfg.critic.value_clip, cfg.critic.value_clip)
                    token_loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2)
                    loss = (token_loss * batch.action_mask).sum() * accumulation * self.world_size / tokens.clamp(min=1.0)
                    self.engine.backward(loss)
                    self.engine.step()
                    total += float((token_loss.detach() * batch.action_mask).sum() / batch.action_mask.sum().clamp(min=1))
                    count += 1
        return {"critic_loss": total / max(count, 1), "critic_lr": float(self.engine.get_lr()[0])}

    def save_checkpoint(self, directory: str) -> None:
        self.engine.save_checkpoint(directory, tag="critic")

    def load_checkpoint(self, directory: str) -> None:
        self.engine.load_checkpoint(directory, tag="critic", load_optimizer_states=True, load_lr_scheduler_states=True)
