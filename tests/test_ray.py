"""Scale-out on a local Ray cluster: ES learns with its population on two workers, a killed worker is restarted
or reported (never a hang), and a missing Ray install is a clear error."""

import os
import signal
import sys
import time

import pytest
import torch

from agents.es import make_es_policy
from agents.networks import make_actor
from envs import make_env
from errors import InputError
from recipes import es, ppo
from training import RunConfig, make_collector
from training.distributed import RayPopulationEvaluator, require_ray

pytestmark = pytest.mark.xdist_group("ray")  # one local cluster per test process, tests in one worker

ray = pytest.importorskip("ray")


@pytest.fixture(autouse=True)
def local_cluster(ray_cluster):
    return ray_cluster


def cartpole_evaluator(max_restarts, timeout_s=120.0):
    return RayPopulationEvaluator(
        2,
        None,
        timeout_s,
        env_id="CartPole-v1",
        num_envs=8,
        backend="torch",
        seed=0,
        policy_kwargs={"hidden_sizes": [8]},
        steps_per_env=50,
        max_steps=500,
        max_restarts=max_restarts,
    )


def population(size):
    env = make_env("CartPole-v1", num_envs=1)
    policy = make_es_policy(env.observation_spec["observation"], env.action_spec, hidden_sizes=(8,))
    env.close()
    theta = torch.nn.utils.parameters_to_vector(policy.parameters())
    return theta + 0.1 * torch.randn(size, theta.numel())


@pytest.mark.learning
def test_es_on_two_ray_workers_solves_cartpole(output_dir):
    config = es.ESConfig()
    config.run.output_dir, config.run.logger, config.run.video, config.run.progress = (
        output_dir,
        "none",
        False,
        False,
    )
    config.run.env_backend, config.run.total_frames = "torch", 300_000
    config.run.collector_backend, config.run.num_workers = "ray", 2
    summary = es.main(config)
    assert summary["solved_at_frames"] is not None and summary["eval_return_mean"] >= 475


@pytest.mark.learning
def test_ppo_on_two_ray_collector_workers_solves_cartpole(output_dir):
    config = ppo.PPOConfig()
    config.run.output_dir, config.run.logger, config.run.video, config.run.progress = (
        output_dir,
        "none",
        False,
        False,
    )
    config.run.collector_backend, config.run.num_workers = "ray", 2
    summary = ppo.main(config)
    assert summary["solved_at_frames"] is not None and summary["eval_return_mean"] >= 475


def test_killed_ray_collector_worker_stops_the_run_with_an_error():
    run = RunConfig(num_envs=4, collector_backend="ray", num_workers=2)
    env = make_env("CartPole-v1", 4, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    collector = make_collector(run, env, actor, torch.device("cpu"), 32, 32 * 1000)
    iterator = iter(collector)
    next(iterator)
    worker = collector.collector.remote_collectors[0]
    os.kill(ray.get(worker.__ray_call__.remote(lambda self: os.getpid())), signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="A Ray collector worker died"):
        for _ in iterator:
            pass
    assert time.monotonic() - start < 60
    collector.shutdown()
    env.close()


def test_killed_ray_worker_is_restarted_and_its_share_rerun():
    evaluator = cartpole_evaluator(max_restarts=1)
    members = population(8)
    _, returns, lengths = evaluator.evaluate(members)
    assert returns.shape == (8,) and (lengths > 0).all()
    os.kill(evaluator.worker_pids()[1], signal.SIGKILL)
    start = time.monotonic()
    _, returns, lengths = evaluator.evaluate(members)
    assert returns.shape == (8,) and (lengths > 0).all()
    assert time.monotonic() - start < 120
    evaluator.close()


def test_killed_ray_worker_without_restarts_is_a_clear_error():
    evaluator = cartpole_evaluator(max_restarts=0)
    members = population(8)
    evaluator.evaluate(members)
    os.kill(evaluator.worker_pids()[0], signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="Ray worker 0 died"):
        evaluator.evaluate(members)
    assert time.monotonic() - start < 120
    evaluator.close()


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now raises ImportError
    with pytest.raises(InputError, match=r"pip install -e '\.\[ray\]'"):
        require_ray()


def test_ray_address_is_not_silently_ignored_when_ray_is_already_running():
    from training.distributed import init_ray

    with pytest.warns(
        UserWarning, match="Ray is already initialised in this process .*--ray-address head:6379 is not used"
    ):
        init_ray("head:6379", num_workers=1)
