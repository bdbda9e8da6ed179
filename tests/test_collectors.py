"""Multi-process collection: the same batches as single-process collection, fresh weights on every batch,
distinct seeds per worker, a dead worker reported, and recipes that run on it (or say why they cannot)."""

import os
import signal
import time
import warnings

import pytest
import torch

from agents.networks import make_actor
from envs import make_env
from errors import InputError
from recipes import a2c, ddpg, dqn, ppo, reinforce, sac, td3
from training import Callback, RunConfig, make_collector, quiet
from training.distributed import WORKER_START_TIMEOUT_S, WorkerCollector


def first_batch(backend, num_envs=4, steps=8):
    run = RunConfig(num_envs=num_envs, collector_backend=backend, num_workers=2)
    env = make_env("CartPole-v1", num_envs, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    collector = make_collector(run, env, actor, torch.device("cpu"), num_envs * steps, 10 * num_envs * steps)
    batch = next(iter(collector))
    collector.shutdown()
    env.close()
    return batch


def test_multiprocess_batches_have_the_keys_and_shapes_of_single_process_batches():
    single, multi = first_batch("single"), first_batch("multiprocess")
    assert multi.shape == single.shape == (4, 8)
    assert set(multi.keys(True, True)) == set(single.keys(True, True))
    for key in single.keys(True, True):
        assert multi.get(key).shape == single.get(key).shape, key
        assert multi.get(key).dtype == single.get(key).dtype, key


def test_multiprocess_workers_are_seeded_apart():
    batch = first_batch("multiprocess")
    first_observations = batch.get("observation")[:, 0]
    assert not torch.equal(first_observations[:2], first_observations[2:])  # worker 0's envs vs worker 1's


def test_multiprocess_workers_draw_different_random_numbers():
    """Random warm-up actions (and any policy noise) come from each worker's own seeded generator."""
    run = RunConfig(num_envs=4, collector_backend="multiprocess", num_workers=2)
    env = make_env("CartPole-v1", 4, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    collector = make_collector(
        run, env, actor, torch.device("cpu"), 4 * 16, 4 * 16 * 4, init_random_frames=64
    )
    actions = next(iter(collector)).get("action")
    collector.shutdown()
    env.close()
    assert not torch.equal(actions[0], actions[2])  # env 0 of worker 0 vs env 0 of worker 1


def constant_action_actor(env, action):
    actor = make_actor(env.observation_spec["observation"], env.action_spec, hidden_sizes=(4,))
    set_constant_action(actor, action)
    return actor


def set_constant_action(actor, action):
    last = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)][-1]
    with torch.no_grad():
        last.weight.zero_()
        last.bias.copy_(torch.tensor([20.0, -20.0] if action == 0 else [-20.0, 20.0]))


@pytest.mark.parametrize(
    "backend", ["multiprocess", pytest.param("ray", marks=pytest.mark.xdist_group("ray"))]
)
def test_workers_act_with_the_weights_of_the_latest_update(backend, request):
    if backend == "ray":
        request.getfixturevalue("ray_cluster")
    run = RunConfig(num_envs=4, collector_backend=backend, num_workers=2)
    env = make_env("CartPole-v1", 4, seed=0)
    actor = constant_action_actor(env, 0)
    collector = make_collector(run, env, actor, torch.device("cpu"), 32, 32 * 10)
    actions = []
    for index, batch in enumerate(collector):
        actions.append(batch.get("action").float().mean().item())
        set_constant_action(actor, (index + 1) % 2)  # an in-place update, as an optimizer step makes
        if index == 2:
            break
    collector.shutdown()
    env.close()
    assert actions == [0.0, 1.0, 0.0]
    if backend == "ray":  # the learner waits as long for the workers' weight sync as for their start
        from torchrl.weight_update import _ray as ray_weight_sync

        assert ray_weight_sync._DIST_TIMEOUT.total_seconds() >= WORKER_START_TIMEOUT_S


def test_killed_worker_process_stops_the_run_with_an_error():
    run = RunConfig(num_envs=4, collector_backend="multiprocess", num_workers=2)
    env = make_env("CartPole-v1", 4, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    collector = make_collector(run, env, actor, torch.device("cpu"), 32, 32 * 1000)
    iterator = iter(collector)
    next(iterator)
    worker = collector.collector.procs[0]
    os.kill(worker.pid, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="failed"):
        for _ in iterator:
            pass
    assert time.monotonic() - start < 60
    collector.shutdown()
    env.close()


def test_a_worker_still_exiting_when_torchrl_closes_it_is_the_same_clear_error():
    """TorchRL closes each other worker 0.1 s after terminating it; on a loaded machine one may still be exiting."""

    class Collector:
        procs = ()

        def __iter__(self):
            yield from ()
            raise ValueError(
                "Cannot close a process while it is still running. You should first call join()."
            )

        def shutdown(self):
            self.stopped = True

        def update_policy_weights_(self):
            pass

    inner = Collector()
    collector = WorkerCollector(inner, "multiprocess", torch.nn.Linear(1, 1))
    with pytest.raises(RuntimeError, match="A collector worker process failed"):
        list(collector)
    assert inner.stopped and collector.collector is None


@pytest.mark.parametrize(
    "recipe,config_class,env_id",
    [
        (dqn, dqn.DQNConfig, "CartPole-v1"),
        (sac, sac.SACConfig, "Pendulum-v1"),
        (reinforce, reinforce.ReinforceConfig, "CartPole-v1"),
    ],
    ids=["dqn", "sac", "reinforce"],
)
def test_recipes_train_on_worker_processes(recipe, config_class, env_id, output_dir):
    config = quiet(
        config_class(),
        output_dir,
        collector_backend="multiprocess",
        env_id=env_id,
        total_frames=600,
        eval_every=600,
        eval_episodes=2,
    )
    config.run.num_envs = 2
    if hasattr(config.collector, "learning_starts"):
        config.collector.learning_starts = 200
    summary = recipe.main(config)
    # REINFORCE counts the steps of the complete episodes it trained on, not those still running at the end
    assert summary["frames"] >= (300 if recipe is reinforce else 600)


@pytest.mark.parametrize(
    "recipe,config_class,change,message",
    [
        (
            ppo,
            ppo.PPOConfig,
            lambda c: setattr(c.run, "num_envs", 3),
            "must split evenly over --num-workers 2",
        ),
        (ppo, ppo.PPOConfig, lambda c: setattr(c.run, "num_workers", 0), "--num-workers must be a positive"),
        (
            a2c,
            a2c.A2CConfig,
            lambda c: (setattr(c.run, "env_id", "Pendulum-v1"), setattr(c.network, "use_sde", True)),
            "--use-sde keeps exploration state",
        ),
        (
            ddpg,
            ddpg.DDPGConfig,
            lambda c: (setattr(c.network, "noise", "ou"), setattr(c.run, "num_envs", 2)),
            "--noise ou keeps exploration state",
        ),
        (
            td3,
            td3.TD3Config,
            lambda c: (setattr(c.network, "noise", "ou"), setattr(c.run, "num_envs", 2)),
            "--noise ou keeps exploration state",
        ),
        (
            reinforce,
            reinforce.ReinforceConfig,
            lambda c: setattr(c.run, "collector_backend", "ray"),
            "cannot assemble complete episodes",
        ),
    ],
)
def test_worker_collection_bad_input(recipe, config_class, change, message, output_dir):
    config = quiet(config_class(), output_dir, collector_backend="multiprocess")
    change(config)
    with pytest.raises(InputError, match=message):
        recipe.main(config)


def test_worker_collectors_refuse_an_accelerator_device():
    with pytest.raises(
        InputError, match="--device cuda with --collector-backend multiprocess is not supported"
    ):
        RunConfig(collector_backend="multiprocess", device="cuda").validate()


@pytest.mark.parametrize("recipe", [ppo, dqn], ids=["ppo", "dqn"])
def test_a_budget_below_one_batch_says_how_many_frames_it_collects(recipe, tmp_path):
    config = quiet(
        {ppo: ppo.PPOConfig, dqn: dqn.DQNConfig}[recipe](), tmp_path, total_frames=30, eval_episodes=1
    )
    config.run.num_envs, config.collector.steps_per_env = 2, 32
    if recipe is ppo:
        config.optim.minibatch_size = 32
    if recipe is dqn:
        config.collector.learning_starts = 0
        config.buffer.batch_size = 16
    with pytest.warns(
        UserWarning,
        match=r"--total-frames 30 is less than one batch.*64 frames \(--num-envs 2 x --steps-per-env 32\)",
    ):
        summary = recipe.main(config)
    assert summary["frames"] == 64


def test_more_envs_than_frames_is_refused_before_any_env_is_built():
    with pytest.raises(InputError, match="--num-envs 100000000 is more than --total-frames 50000"):
        RunConfig(num_envs=100_000_000, total_frames=50_000).validate()
    RunConfig(num_envs=8, total_frames=8).validate()


def test_more_evaluation_episodes_than_an_evaluation_keeps_is_refused_before_training():
    with pytest.raises(InputError, match="--eval-episodes must be at most 1,000,000,000, got 1,000,000,001"):
        RunConfig(eval_episodes=10**9 + 1).validate()
    RunConfig(eval_episodes=10**9).validate()


def test_a_budget_of_whole_batches_runs_without_the_warning(tmp_path):
    config = quiet(ppo.PPOConfig(), tmp_path, total_frames=64, eval_episodes=1)
    config.run.num_envs, config.collector.steps_per_env = 2, 32
    config.optim.minibatch_size = 32
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ppo.main(config)
    assert not [warning for warning in caught if "less than one batch" in str(warning.message)]


@pytest.mark.parametrize("recipe", [sac, td3, ddpg], ids=["sac", "td3", "ddpg"])
def test_learning_starts_between_batches_rounds_up_without_torchrls_warning(recipe, tmp_path):
    config = {sac: sac.SACConfig, td3: td3.TD3Config, ddpg: ddpg.DDPGConfig}[recipe]()
    quiet(config, tmp_path, env_id="Pendulum-v1", total_frames=48, eval_episodes=1)
    config.collector.steps_per_env, config.collector.learning_starts = 8, 33  # random until frame 40
    config.buffer.batch_size = 8
    updates = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = recipe.main(config, callbacks=[_CountUpdates(updates)])
    assert not [warning for warning in caught if "init_random_frames" in str(warning.message)]
    assert summary["frames"] == 48
    assert updates == [(40, 1), (8, 1)]  # the random frames in one batch: 33 rounded up to whole batches of 8


class _CountUpdates(Callback):
    """Records, per batch, its frames and whether a gradient step followed it (a loss logged)."""

    def __init__(self, record: list[int]):
        self.record = record

    def on_batch(self, run, batch, metrics):
        self.record.append((batch.numel(), int(any(name.startswith("train/loss") for name in metrics))))


def test_a_batch_larger_than_the_memory_is_refused_before_the_collector_reserves_it(tmp_path, monkeypatch):
    from training.collectors import batch_memory

    monkeypatch.setattr("training.replay.physical_memory", lambda: 2**30)  # 1 GiB
    config = quiet(ppo.PPOConfig(), tmp_path / "run", num_envs=4, total_frames=2**25)
    # 33.6 million CartPole frames of at least 64 bytes each: two observations and an action
    config.collector.steps_per_env = 2**23
    with pytest.raises(
        InputError,
        match=r"Batches of 33,554,432 frames \(--num-envs 4 x --steps-per-env 8,388,608\) need at least 2.0 "
        r"GiB, more than this machine's 1.0 GiB of memory: lower --steps-per-env or --num-envs",
    ):
        ppo.main(config)
    assert not (tmp_path / "run").exists()
    # the figure is a lower bound on what a batch really holds (observations, Box and Discrete actions)
    for env_id in ("CartPole-v1", "Pendulum-v1"):
        env = make_env(env_id, 2)
        collector = make_collector(RunConfig(env_id=env_id, num_envs=2), env, None, "cpu", 64, 64)
        batch = next(iter(collector))
        assert 64 * 4 * 2 <= batch_memory(env, 64) <= batch.bytes()
        collector.shutdown()
        env.close()
