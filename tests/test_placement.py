"""Placement groups and the colocation flags: which placement group and bundle each rank got."""

from __future__ import annotations

import pytest
from rlhf_test_support import base_flags

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("flags,together", [
    ([], [{"actor"}, {"ref"}, {"critic"}]),
    (["--train.colocate_actor_ref"], [{"actor", "ref"}, {"critic"}]),
    (["--train.colocate_all"], [{"actor", "ref", "critic"}]),
], ids=["separate", "actor-ref", "all"])
def test_each_rank_gets_its_bundle_and_colocated_groups_share_them(flags, together, ray_cluster, task_files,
                                                                   tiny_causal_lm_path, tmp_path) -> None:
    """Each group has one placement group, the same one exactly for the groups a colocation flag puts together
    and a different one for each set; every rank of a set sits on a bundle of its own, and each bundle's CPU is
    shared by the ranks on it (with --train.colocate_all, also by the engine, on bundle 0)."""
    import ray

    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.cluster.placement import CPU_BUNDLE, fraction
    from rlhf.runtime.control.controller import PPOController
    from rlhf.runtime.control.trainer import PPOTrainer

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(
        base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1)
        + ["--reward.remote_url", str(task_files["reward"]), "--algo.kl.init_coef", "0.01", "--actor.num_gpus_per_node", "2",
           "--ref.num_gpus_per_node", "2", "--critic.num_gpus_per_node", "2", "--train.batch_size", "8",
           "--train.micro_batch_size", "4", "--rollout.micro_batch_size", "2", "--rollout.n_samples_per_prompt", "2",
           "--critic.model_name_or_path", str(tiny_causal_lm_path),
           # an engine actor where it shares the ranks' bundles; elsewhere it would sit in a placement group of its own,
           # which nothing here reads, so it generates in the actor's ranks
           "--rollout.engine", "hf" if "--train.colocate_all" in flags else "hf-inprocess", *flags])
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    controller = PPOController(config, host, tmp_path / "out")
    controller._check_inputs()
    controller._launch()
    groups = {"actor": controller.actor, "ref": controller.ref, "critic": controller.critic}
    try:
        groups_of = {role: {w["placement_group"] for w in group.call("where")} for role, group in groups.items()}
        assert all(len(ids) == 1 for ids in groups_of.values())  # one placement group per group
        pg_of = {role: next(iter(ids)) for role, ids in groups_of.items()}
        for roles in together:  # the same placement group exactly within each colocated set
            assert len({pg_of[r] for r in roles}) == 1
        assert len({pg_of[next(iter(roles))] for roles in together}) == len(together)
        # what each bundle has left says who sits on it: every rank of a set on its own bundle
        # (rank i on bundle i), and with --train.colocate_all the one engine on bundle 0 too
        free = ray.available_resources()
        for roles in together:
            sharers = len(roles) + ("--train.colocate_all" in flags)
            share = fraction(CPU_BUNDLE, sharers)
            pg = pg_of[next(iter(roles))]
            for bundle in (0, 1):
                users = len(roles) + ("--train.colocate_all" in flags and bundle == 0)
                assert free.get(f"CPU_group_{bundle}_{pg}", 0.0) == pytest.approx(CPU_BUNDLE - users * share, abs=1e-6)
    finally:
        for group in groups.values():
            for worker in group.workers:
                ray.kill(worker)
        for engine in controller.engines.engines:
            ray.kill(engine)
        controller.placement.remove()


@pytest.mark.parametrize("flags,engine", [([], "hf"), (["--train.async_enable"], "hf"), (["--train.async_enable"], "hf-inprocess")],
                         ids=["sync", "async", "async-inprocess"])
def test_engines_and_ranks_split_the_cores_when_async_overlaps_them(flags, engine, ray_cluster, task_files,
                                                                    tiny_causal_lm_path, tmp_path) -> None:
    """Sync: the engine generates while the actor waits, so each takes every core; async: they compute at the same
    time and split them (two 2-thread OpenMP pools on 2 cores made an async step 3-7x slower). An engine inside
    the actor's rank is no process of its own: the rank keeps every core."""
    import os

    import ray

    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.control.controller import PPOController
    from rlhf.runtime.control.trainer import PPOTrainer

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(
        base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1)
        + ["--reward.remote_url", str(task_files["reward"]), "--algo.kl.init_coef", "0", "--algo.advantage.estimator", "group_norm",
           "--rollout.micro_batch_size", "2", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
           "--train.micro_batch_size", "4", "--rollout.engine", engine, "--train.in_process", "off", *flags])
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    controller = PPOController(config, host, tmp_path / "out")
    controller._check_inputs()
    controller._launch()

    def threads(actor: object) -> int:
        return ray.get(actor.__ray_call__.remote(lambda self: __import__("torch").get_num_threads()))

    try:
        cores = len(os.sched_getaffinity(0))
        in_rank = engine == "hf-inprocess"
        sharers = 2 if flags and not in_rank else 1  # one engine, one actor rank (no reference, no critic)
        assert threads(controller.actor.workers[0]) == max(1, cores // sharers)
        assert [threads(e) for e in controller.engines.engines] == ([] if in_rank else [max(1, cores // sharers)])
    finally:
        for worker in controller.actor.workers:
            ray.kill(worker)
        for engine in controller.engines.engines:
            ray.kill(engine)
        controller.placement.remove()
