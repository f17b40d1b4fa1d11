"""The single controller of ``rlhf train ppo``: drives the Ray groups through each step.

generate (agent executor) → reward → experience (old/ref log-probs, values, KL)
→ advantages (estimator) → train actor and critic → weight sync → log, eval, checkpoint.
"""

from __future__ import annotations

import contextlib
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.ppo_rules import active_correction
from rlhf.errors import Preempted, WorkerError
from rlhf.records import checkpoints as checkpoint
from rlhf.records import preemption
from rlhf.records.metrics import MetricsTracker, record_status
from rlhf.records.rollouts import SCHEMA, RolloutDump, tokenizer_fingerprint
from rlhf.registry import ComponentKind as K
from rlhf.runtime.cluster.capacity import node_gpus
from rlhf.runtime.cluster.draining import DrainWatch, run_nodes
from rlhf.runtime.cluster.liveness import RESUME_ADVICE, wait, write_whereabouts
from rlhf.runtime.cluster.local import in_process_ranks, ranks_in_process, ray_actor_count
from rlhf.runtime.cluster.placement import Placement, ranks_of
from rlhf.runtime.cluster.ray_start import start_ray, stop_ray
from rlhf.runtime.control.checkpointing import PPOCheckpoints, trained_models
from rlhf.runtime.control.experience import compute_advantages
from rlhf.runtime.control.kl_control import KLController, observed_kl
from rlhf.runtime.control.preflight import PPOPreflight
from rlhf.runtime.control.rewarding import RewardStage
from rlhf.runtime.control.sample_records import sample_records
from rlhf.runtime.control.steering import prompt_mix_metrics, steer
from rlhf.runtime.control.step_metrics import flatten, mean_dicts, sample_means, timed
from rlhf.runtime.rollout.agents import generate_samples
from rlhf.runtime.rollout.engines import InRankEngines, NoEngines, RolloutEngines
from rlhf.runtime.sync.weights import WeightSync, backend_for
from rlhf.runtime.workers.batch import Sample, worker_payload
from rlhf.runtime.workers.group import WorkerGroup
from rlhf.runtime.workers.policy import PolicyWorker, ReferenceWorker
from rlhf.runtime.workers.value import CriticWorker, RewardModelWorker

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

log = logging.getLogger("rlhf.runtime")


class PPOController:
    """One run of ``rlhf train ppo``, in the CLI process: checks its inputs (its :class:`PPOPreflight`), starts the
    engines and ranks, trains step by step, and writes and resumes checkpoints (its :class:`PPOCheckpoints`, made
    once the trained groups are)."""

    def __init__(self, config: PPOConfig, plugins: Any, run_dir: Path) -> None:
        self.config, self.plugins, self.run_dir = config, plugins, Path(run_dir)
        registry = plugins.registry
        self.estimator = build(registry.get(K.ADVANTAGE_ESTIMATOR, config.algo.advantage.estimator), config)
        self.kl_estimator = build(registry.get(K.KL_ESTIMATOR, config.algo.kl.estimator, flag="--algo.kl.estimator"), config)
        self.executor = build(registry.get(K.AGENT_EXECUTOR, config.train.agent_executor, flag="--train.agent_executor"), config)
        self.rewards = RewardStage(config, registry, agent_rewards=getattr(self.executor, "provides_rewards", False))
        self.correcting = active_correction(config, registry) is not None  # the actor needs the sampling log-probs
        self.kl = KLController(config.algo.kl.init_coef, config.algo.kl.target, config.algo.kl.horizon)
        self.sample_filter = None
        if config.algo.sample_filter or config.algo.dynamic_filtering_enable:
            chosen, flag = ((config.algo.sample_filter, "--algo.sample_filter") if config.algo.sample_filter
                            else ("dynamic_filtering", "--algo.dynamic_filtering_enable"))
            self.sample_filter = build(registry.get(K.SAMPLE_FILTER, chosen, flag=flag), config)
        self.step = 0
        self.steered: dict[str, float] = {}  # coefficients a steering plugin set, but β: entropy, lr_scale
        self.scheduler = build(registry.get(K.ROLLOUT_SCHEDULER, config.train.rollout_scheduler,
                                            flag="--train.rollout_scheduler"), config)
        # what a rollout scheduler reads and sets (rlhf.components.RolloutLoop): weight syncs so far, the engines'
        # lock, the data position of the batch being trained when it was drawn before batches generated ahead
        self.policy_version, self.engine_lock, self.trained_data = 0, contextlib.nullcontext(), None
        self.trained_samples: list[dict[str, Any]] = []  # the last step's samples as records (sample_records.py)
        self.rollout_logs: dict[str, Any] = {}  # the last step's rollout-stage metrics and reward logs (its dump's META)
        self.trained_models = trained_models(config, registry, critic=self.estimator.needs_critic)
        self.preflight = PPOPreflight(config, registry, critic=self.estimator.needs_critic,
                                      reward_model_paths=self.rewards.reward_model_paths, models=self.trained_models)
        self.checkpoints: PPOCheckpoints | None = None  # made with the trained groups (_launch)

    # ----------------------------------------------------------------- checks

    def _check_inputs(self) -> None:
        """Everything the user gave that can be checked without workers (:meth:`run` splits it around the Ray
        start-up: sources before, data while the workers boot)."""
        self._check_sources()
        self._check_data()

    def _check_sources(self) -> None:
        sources = self.preflight.check_sources()
        self.engine_class, self.engine_in_rank = sources.engine_class, sources.engine_in_rank
        self.transport, self.in_process = sources.transport, sources.in_process  # _run may revise both once Ray is up

    def _check_data(self) -> None:
        data = self.preflight.read_data()
        self.tokenizer, self.schedule = data.tokenizer, data.schedule
        self.prompt_sources, self.eval_prompts = data.prompt_sources, data.eval_prompts

    # ----------------------------------------------------------------- set-up

    def _launch(self) -> None:
        """Create the rollout engines and every rank; they boot (start, import, load the engines' models)
        in their own processes while the controller goes on. Needs only the checked sources."""

        cfg = self.config
        dumped = cfg.model_dump(mode="json")
        with_ref, with_critic, reward_paths = cfg.algo.kl.init_coef > 0, self.estimator.needs_critic, self.rewards.reward_model_paths
        if self.in_process:  # engine processes, if any, beside ranks in this process
            self.placement = None if self.engine_in_rank else Placement.for_engines(cfg)
        else:
            self.placement = Placement.for_run(cfg, with_ref=with_ref, with_critic=with_critic,
                                               reward_models=len(reward_paths), engines_in_rank=self.engine_in_rank)
        if not self.engine_in_rank:  # first: vLLM boots longest
            self.engines: RolloutEngines | InRankEngines = RolloutEngines(cfg, cfg.actor.model_name_or_path, self.placement,
                                                                          self.plugins.registry)

        # the ranks (and, async, the engines) share the cores
        together = None if self.placement is None else self.placement.cpu_sharers(cfg, engine=False)

        def group(worker: type, role: str, section: Any, tensor_parallel: int = 1) -> WorkerGroup:
            return WorkerGroup(worker, role, ranks_of(section), dumped, placement=None if self.in_process else self.placement,
                               cpu_sharers=together, tensor_parallel=tensor_parallel,
                               beside_ray_actors=self.in_process and not self.engine_in_rank)

        trained_tp = cfg.ds.tensor_parallel_size  # AutoTP splits the trained models; evaluated ones stay whole
        self.actor = group(PolicyWorker, "actor", cfg.actor, trained_tp)
        if self.engine_class is None:
            self.engines = NoEngines()
        elif self.engine_in_rank:
            self.engines = InRankEngines(cfg, self.actor, self.engine_class)
        self.ref = group(ReferenceWorker, "ref", cfg.ref) if with_ref else None
        self.critic = group(CriticWorker, "critic", cfg.critic, trained_tp) if with_critic else None
        self.rewards.reward_models = [group(RewardModelWorker, "reward", cfg.reward) for _ in reward_paths]
        self.checkpoints = PPOCheckpoints(cfg, self.plugins, self.trained_models, self.actor, self.critic, self.scheduler)

    def save_checkpoint(self, root: Path | None = None, keep: int | None = None) -> Path:
        """A checkpoint of this step under ``root`` (``--ckpt.path``), keeping the newest ``keep`` (``--ckpt.max_num``)."""
        return self.checkpoints.save(self, root, keep)

    def _setup(self) -> None:
        """Every rank's model and DeepSpeed engine (the ranks of a group rendezvous), once the data is read."""

        if not hasattr(self, "actor"):
            self._launch()
        cfg = self.config
        per_rollout = max(1, cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt // cfg.train.batch_size)
        training_steps = self.schedule.total_batches * per_rollout * cfg.train.max_epochs
        pending = self.actor.setup_async(training_steps)
        if self.ref is not None:
            pending += self.ref.setup_async()
        if self.critic is not None:
            pending += self.critic.setup_async(training_steps)
        for path, reward_group in zip(self.rewards.reward_model_paths, self.rewards.reward_models):
            pending += reward_group.setup_async(path)
        wait(pending)

    # ------------------------------------------------------------------ steps

    def sync_weights(self) -> None:
        """Actor rank 0's weights into every rollout engine, by --vllm.sync_backend (runtime/sync/weights.py); engines
        in the actor's ranks read their own rank's weights instead."""

        in_rank = self.engine_in_rank
        if not in_rank and getattr(self, "weight_sync", None) is None:  # formed on first use: every group is set up by then
            self.weight_sync = WeightSync(self.config, self.actor, self.engines, self.plugins.registry, self.transport)
        with self.engine_lock, self.engines.sleep.awake(tags=["weights"]):  # --vllm.enable_sleep: weights only
            if in_rank:  # no transport: each rank's engine reads that rank's own weights (if it keeps a copy at all)
                self.engines.refresh()
            else:
                self.weight_sync.sync()
            self.policy_version += 1

    def _generate(self, prompts: list[dict[str, Any]], n: int, temperature: float, seed_base: int) -> list[Sample]:
        version = self.policy_version
        with self.engines.sleep.awake():  # --vllm.enable_sleep: awake for this batch only
            samples = generate_samples(self.config, self.executor, self.engines, self.tokenizer, prompts, n, temperature,
                                       seed_base)
        for sample in samples:
            sample.policy_version = version
        return samples

    def rollout(self, prompts: list[dict[str, Any]], metrics: dict[str, float],
                 step: int | None = None) -> tuple[list[Sample], dict[str, float]]:
        """Generate and reward for ``step`` (default: the current one); with a sample filter, rejected
        groups are replaced one prompt each. Accepted groups are never dropped, even when the prompt
        loader runs out mid-refill."""
        import torch

        cfg = self.config
        n = cfg.rollout.n_samples_per_prompt
        accepted: list[Sample] = []
        extra: dict[str, float] = {}
        consumed, attempt = 0, 0
        while prompts:
            seed = cfg.train.seed + (self.step if step is None else step) + 7919 * attempt
            with timed(metrics, "timing/generation"):
                samples = self._generate(prompts, n, cfg.rollout.temperature, seed)
            with timed(metrics, "timing/make_experience"):
                extra, skipped_groups = self.rewards.reward(samples)
            self.schedule.observe([s for s in samples if s.group not in skipped_groups])  # a curriculum moves here
            if skipped_groups:
                metrics["reward_skipped_groups"] = metrics.get("reward_skipped_groups", 0.0) + len(skipped_groups)
                samples = [s for s in samples if s.group not in skipped_groups]
            consumed += len(prompts)
            attempt += 1
            if self.sample_filter is None:
                return samples, extra
            groups = sorted({s.group for s in samples})
            keep_groups = self.sample_filter.keep(torch.tensor([s.score for s in samples]).view(-1, n)).tolist()
            kept = {g for g, keep in zip(groups, keep_groups) if keep}
            accepted += [s for s in samples if s.group in kept]
            rejected = len(prompts) - len(kept)
            wanted = cfg.rollout.batch_size - len(accepted) // n
            prompts = self.schedule.take(min(rejected, wanted))
        metrics["dynamic_filtering_pass_rate"] = 100.0 * (len(accepted) // n) / max(consumed, 1)
        return accepted, extra

    def train_step(self, prompts: list[dict[str, Any]], rolled: Any = None) -> dict[str, float]:
        """One step on ``prompts``; ``rolled``: their samples, already generated (async mode)."""

        cfg = self.config
        n = cfg.rollout.n_samples_per_prompt
        metrics: dict[str, float] = prompt_mix_metrics(prompts, len(self.prompt_sources))
        self.trained_samples = []
        start = time.perf_counter()
        samples, extra = self.rollout(prompts, metrics) if rolled is None else (rolled.samples, rolled.extra)
        metrics.update(rolled.metrics if rolled is not None else {})
        # what a replay of this step must log again (rlhf.records.rollouts.META): the rollout stage's, timings aside
        self.rollout_logs = {"metrics": {k: v for k, v in metrics.items() if not k.startswith("timing/")}, "extra": extra}
        if not samples:
            log.warning("step %d: every group was filtered out and no prompt is left to refill; nothing to train", self.step)
            metrics["timing/step_total"] = time.perf_counter() - start
            return metrics
        with timed(metrics, "timing/make_experience"):
            if rolled is None or not rolled.shaped:
                self.rewards.shape(samples)
        if cfg.rollout.generate_only:  # the samples as rewarded, recorded and logged; no advantage, nothing trains
            with timed(metrics, "timing/samples"):
                self.trained_samples = sample_records(samples, self.step)
            metrics.update(extra)
            metrics.update(sample_means(samples))
            metrics["timing/step_total"] = time.perf_counter() - start
            return metrics
        with timed(metrics, "timing/make_experience"):
            payload = worker_payload(samples)
            kl_in_reward = self.ref is not None and not cfg.algo.kl.use_loss
            correcting = self.correcting
            needs_old = cfg.train.max_epochs > 1 or len(samples) > cfg.train.batch_size or kl_in_reward or correcting
            old_ref = self.actor.call_split_async("logprobs", payload) if needs_old else None
            ref_ref = self.ref.call_split_async("logprobs", payload) if self.ref is not None else None
            val_ref = self.critic.call_split_async("values", payload) if self.critic is not None else None
            old, ref, values = (flatten(wait(r)) if r is not None else None for r in (old_ref, ref_ref, val_ref))
            advantages, returns, adv_metrics = compute_advantages(samples, n, cfg, self.estimator, self.kl.value, old, ref, values,
                                                                  self.kl_estimator)
        with timed(metrics, "timing/samples"):  # what --rollout.dump_dir writes and rlhf_rollout_samples hands over
            self.trained_samples = sample_records(samples, self.step, advantages, returns, old)
        with timed(metrics, "timing/ppo_train"):
            train_payload = {**payload, "advantages": advantages, "old_logprobs": old}
            if correcting:
                train_payload["rollout_logprobs"] = [s.rollout_logprobs for s in samples]
            if ref is not None:
                train_payload["ref_logprobs"] = ref
            # --critic.freezing_steps: the critic warms up alone for the first N steps (OpenRLHF)
            actor_trains = self.step > cfg.critic.freezing_steps
            critic_pending = []
            if self.critic is not None:
                critic_pending = self.critic.call_split_async("train", {**payload, "values": values, "returns": returns},
                                                              step=self.step)
                if cfg.ds.enable_sleep:  # one model's states awake at a time: the critic fits first (OpenRLHF)
                    metrics.update(mean_dicts(wait(critic_pending)))
                    critic_pending = []
            pending = (self.actor.call_split_async("train", train_payload, step=self.step, kl_coef=self.kl.value,
                                                 coefficients=self.steered)
                       if actor_trains else [])
            actor_metrics = mean_dicts(wait(pending))
            if critic_pending:
                metrics.update(mean_dicts(wait(critic_pending)))
        with timed(metrics, "timing/broadcast"):
            if actor_trains:
                self.sync_weights()
        metrics.update(actor_metrics, **adv_metrics, **extra)
        metrics.update(sample_means(samples))
        metrics["kl_coef"] = self.kl.value
        self.kl.update(observed_kl(metrics, cfg.algo.kl.use_loss), cfg.rollout.batch_size * n)
        metrics["timing/step_total"] = time.perf_counter() - start
        return metrics

    def evaluate(self) -> dict[str, float]:
        """Sample ``--eval.n_samples_per_prompt`` responses per eval prompt; a response passes when its score > 0."""
        import torch

        n = self.config.eval.n_samples_per_prompt
        with self.engine_lock:  # async mode: not while the producer's batch generates
            samples = self._generate(self.eval_prompts, n, self.config.eval.temperature, seed_base=10**6 + self.step)
        self.rewards.reward(samples)  # a skip-sample failure still yields a 0 score here
        self.plugins.rollout_samples(self.step, "eval", sample_records(samples, self.step))
        scores = torch.tensor([s.score for s in samples]).view(-1, n)
        return {"eval/reward": float(torch.tensor([s.reward for s in samples]).mean()),
                "eval/pass1": float((scores > 0).float().mean()), f"eval/pass{n}": float((scores > 0).any(dim=1).float().mean())}

    # -------------------------------------------------------------------- run

    def run(self) -> None:
        self._check_sources()
        with contextlib.ExitStack() as in_process:
            self._run(in_process)

    def _run(self, in_process: contextlib.ExitStack) -> None:
        import yaml

        cfg = self.config
        # with ranks in Ray workers, they boot while the controller reads the data (start-up in parallel, not in turn)
        needs_ray = not self.in_process or not self.engine_in_rank
        started_ray = needs_ray and start_ray(import_meanwhile=("transformers.models.auto.tokenization_auto", "torch"),
                                              actors=ray_actor_count(cfg, self.in_process, self.engine_in_rank,
                                                                     self.estimator.needs_critic,
                                                                     len(self.rewards.reward_model_paths)))
        try:
            if not self.engine_in_rank:  # the cluster's GPUs decide the transport, not this process's torch
                gpus = sum(node_gpus()) > 0
                self.transport = backend_for(cfg, cuda=gpus, registry=self.plugins.registry)
                if self.in_process and gpus:
                    # a GPU rank needs the device Ray gives its worker: Ray workers (or `--train.in_process on`'s refusal)
                    self.in_process = ranks_in_process(cfg, False, critic=self.estimator.needs_critic,
                                                       reward_models=bool(self.rewards.reward_model_paths))
            if self.in_process:
                in_process.enter_context(in_process_ranks())
            self._launch()
            self._check_data()
        except BaseException:
            if started_ray:
                stop_ray()
            raise
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "rlhf_config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
        status, reason, tracker, drain_watch = "failed", None, None, None
        try:
            self._setup()
            rows = write_whereabouts(self.run_dir / "workers.json",
                                     [self.actor, self.ref, self.critic, *self.rewards.reward_models], self.engines.engines)
            if started_ray:  # Ray draining a node of the run is a preemption warning (docs/preemption.md)
                drain_watch = DrainWatch(run_nodes(rows))
            self.checkpoints.resume(self)
            tracker = MetricsTracker(cfg, self.run_dir, self.schedule.total_batches, self.step)
            dump = RolloutDump(cfg.rollout.dump_dir, self.step) if cfg.rollout.dump_dir else None
            dumped_by = {"schema": SCHEMA, "actor": cfg.actor.model_name_or_path,
                         "n_samples_per_prompt": cfg.rollout.n_samples_per_prompt, "batch_size": cfg.rollout.batch_size,
                         "tokenizer": tokenizer_fingerprint(self.tokenizer)} if dump is not None else {}
            self.plugins.train_start(cfg, self.run_dir)
            for prompts, rolled in self.scheduler.batches(self):
                self.step += 1
                metrics = self.train_step(prompts, rolled)
                if self.trained_samples:
                    with timed(metrics, "timing/samples"):
                        if dump is not None:
                            dump.write(self.step, self.trained_samples, {**dumped_by, **self.rollout_logs,
                                                                         "data": self.trained_data or self.schedule.state()})
                        self.plugins.rollout_samples(self.step, "train", self.trained_samples)
                evaluating = self.eval_prompts and cfg.eval.steps > 0 and self.step % cfg.eval.steps == 0
                if evaluating:
                    metrics.update(self.evaluate())
                requests = steer(self, metrics)
                if requests.evaluate and not evaluating:  # steer() drops the request without --eval.dataset
                    metrics.update(self.evaluate())
                tracker.log(self.step, metrics)
                for note in requests.notes:
                    tracker.note(note)
                saved = None
                if (cfg.ckpt.save_steps > 0 and self.step % cfg.ckpt.save_steps == 0) or requests.checkpoint:
                    saved = self.save_checkpoint()
                for folder, keep in requests.apart.items():  # e.g. rlhf-plugin-best-checkpoint's best/
                    self.save_checkpoint(Path(cfg.ckpt.path) / folder, keep)
                self.plugins.step_end(self.step, metrics)
                # a preemption signal (--ckpt.preemption_signals) during this step: its checkpoint, then Preempted
                preemption.step_done(self.step, lambda saved=saved: saved or self.save_checkpoint())
                if requests.stop:
                    reason = requests.stop
                    break
            if not cfg.rollout.generate_only:  # untrained models are no run's output
                self.actor.call("save_hf", str(self.run_dir))
                if self.critic is not None and cfg.critic.save_value_network:  # OpenRLHF's <save_path>_critic
                    self.critic.call("save_hf", str(self.run_dir.with_name(self.run_dir.name + "_critic")))
            status = "completed" if reason is None else "stopped"
        except Preempted:  # its checkpoint is written: the CLI names it
            status = "preempted"
            raise
        except WorkerError as exc:  # a rank or engine died: the line names it and the checkpoint to resume from
            if RESUME_ADVICE not in str(exc):
                raise
            raise WorkerError(str(exc).replace(RESUME_ADVICE, checkpoint.resume_advice(Path(cfg.ckpt.path)))) from exc
        except KeyboardInterrupt as exc:  # Ctrl-C, or a signal that stops at once (rlhf.records.preemption)
            status = "interrupted"
            raise checkpoint.interrupted(Path(cfg.ckpt.path)) from exc
        except SystemExit:  # SIGTERM through Ray's own handler (a run started outside the CLI)
            status = "interrupted"
            raise
        finally:
            if drain_watch is not None:
                drain_watch.stop()
            if tracker is not None:  # the progress bar ends its line before anything else is printed
                tracker.close()
            record_status(self.run_dir, {"status": status, "reason": reason, "step": self.step})
            self.plugins.train_end(cfg, self.run_dir, status)
            if started_ray:
                stop_ray()

