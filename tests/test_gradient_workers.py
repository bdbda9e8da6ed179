"""Learning on gradient workers: the learner interface (compute_gradients / apply_gradients, weights,
update_algorithm_parameter), one synchronous step over two workers against one step on their data together,
asynchronous staleness, a killed worker, resume, a simulated two-node Ray cluster, and the refusals."""

import csv
import os
import signal
import subprocess
import sys
import textwrap
from functools import partial
from pathlib import Path

import pytest
import torch
from run_helpers import interrupt_at, tiny_a2c, tiny_dqn, tiny_reinforce, tiny_rnd_ppo, tiny_vpg
from tensordict import TensorDict

from agents import KLPenalty
from agents.policy_gradient import ReturnBaseline
from errors import InputError
from recipes import a2c, dqn, ppo, reinforce, rnd_ppo, sac, vpg
from training import Learner, average_gradients, config_to_dict, quiet
from training import gradient_workers as gradient_workers_module
from training.gradient_workers import GradientWorkerPool, WorkerSession, joined, worker_config
from training.resume import config_from_dict, load_resume_checkpoint

REPO = Path(__file__).resolve().parents[1]


def linear_learner(seed=0, lr=0.1, max_grad_norm=None):
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def loss(batch):
        error = (model(batch["x"]) - batch["y"]).square().mean()
        return error, TensorDict(loss=error.detach())

    def schedule(learner):
        for group in optimizer.param_groups:
            group["lr"] = learner.hyperparameters["lr"]

    return Learner(
        loss,
        optimizer,
        {"model": model},
        max_grad_norm=max_grad_norm,
        hyperparameters={"lr": lr},
        schedule=schedule,
    )


def regression_batch(size, seed):
    generator = torch.Generator().manual_seed(seed)
    return TensorDict(
        x=torch.randn(size, 3, generator=generator),
        y=torch.randn(size, 2, generator=generator),
        batch_size=[size],
    )


def test_compute_then_apply_gradients_is_one_step():
    stepped, split = linear_learner(), linear_learner()
    for seed in range(3):
        batch = regression_batch(16, seed)
        stepped.step(batch)
        gradients, metrics = split.compute_gradients(batch)
        assert all(gradient.device.type == "cpu" for gradient in gradients) and "loss" in metrics
        assert all(parameter.grad is None for parameter in split.parameters)  # nothing applied yet
        split.apply_gradients(gradients)
    for one, other in zip(stepped.parameters, split.parameters, strict=True):
        torch.testing.assert_close(one, other)
    assert stepped.steps == split.steps == 3


def test_averaged_gradients_of_halves_are_the_gradient_of_the_whole_batch_clipping_included():
    whole, workers = linear_learner(max_grad_norm=0.1), linear_learner(max_grad_norm=0.1)
    batch = regression_batch(32, 0)
    whole_norm = whole.step(batch)[1]
    gradients = [workers.compute_gradients(half)[0] for half in batch.split(16)]
    worker_norm = workers.apply_gradients(average_gradients(gradients))
    torch.testing.assert_close(whole_norm, worker_norm)
    for one, other in zip(whole.parameters, workers.parameters, strict=True):
        torch.testing.assert_close(one, other)


def test_gradients_of_unequal_shares_averaged_by_their_samples_are_the_gradient_of_the_whole_batch():
    # REINFORCE's and VPG's workers send gradients of whole episodes, as many steps as their episodes took
    whole, workers = linear_learner(), linear_learner()
    batch = regression_batch(110, 0)
    whole.step(batch)
    shares = [batch[:10], batch[10:]]
    gradients = [workers.compute_gradients(share)[0] for share in shares]
    workers.apply_gradients(average_gradients(gradients, [share.numel() for share in shares]))
    for one, other in zip(whole.parameters, workers.parameters, strict=True):
        torch.testing.assert_close(one, other)
    unweighted = average_gradients(gradients)
    weighted = average_gradients(gradients, [10, 100])
    assert not torch.allclose(unweighted[0], weighted[0])
    with pytest.raises(ValueError, match="one positive sample count per gradient list"):
        average_gradients(gradients, [10])


def test_the_learners_work_after_a_step_sees_the_workers_batches_as_one():
    # VPG's running-mean baseline moves once per step on all of its episodes, as in one process
    first, second = regression_batch(7, 0), regression_batch(12, 1)
    union = joined([first, second])
    assert union.numel() == 19
    torch.testing.assert_close(union["x"], torch.cat([first["x"], second["x"]]))
    assert joined([first]) is first
    baseline = ReturnBaseline(rate=0.5)
    baseline.update(union["y"][:, :1])
    torch.testing.assert_close(baseline.mean, union["y"][:, 0].mean())


def test_weights_carry_parameters_steps_and_hyperparameters():
    learner, worker = linear_learner(seed=0), linear_learner(seed=1)
    learner.step(regression_batch(8, 0))
    learner.update_algorithm_parameter("lr", 0.5)
    worker.set_weights(learner.get_weights())
    for one, other in zip(learner.parameters, worker.parameters, strict=True):
        torch.testing.assert_close(one, other)
    assert worker.steps == 1 and worker.hyperparameters["lr"] == 0.5


def test_update_algorithm_parameter_changes_the_next_update_and_refuses_unknown_names():
    learner = linear_learner()
    before = [parameter.detach().clone() for parameter in learner.parameters]
    learner.update_algorithm_parameter("lr", 0.0)
    learner.step(regression_batch(8, 0))
    for parameter, old in zip(learner.parameters, before, strict=True):
        torch.testing.assert_close(parameter, old)  # a zero step size moved nothing
    learner.update_algorithm_parameter("lr", 0.1)
    learner.step(regression_batch(8, 0))
    assert any(
        not torch.equal(parameter, old) for parameter, old in zip(learner.parameters, before, strict=True)
    )
    with pytest.raises(InputError, match="no algorithm parameter 'entropy_coef'; it has: lr"):
        learner.update_algorithm_parameter("entropy_coef", 0.1)
    with pytest.raises(InputError, match="finite number >= 0"):
        learner.update_algorithm_parameter("lr", float("nan"))


def worker_sessions(config, num_workers):
    """The recipe's gradient-worker sessions of ``config`` for ``num_workers`` workers, built in this process."""
    data = config_to_dict(config)
    module = sys.modules[type(config).__module__]
    split = type(config).GRADIENT_SPLIT
    return [
        module.main(config_from_dict(type(config), worker_config(data, index, num_workers, split)))
        for index in range(num_workers)
    ]


def first_minibatch(session):
    batch = next(iter(session.collector))
    return next(iter(session.minibatches(batch)))


def small_ppo(output_dir, **run):
    config = ppo.PPOConfig()
    quiet(config, output_dir, env_id="CartPole-v1", num_envs=4, total_frames=4096, preset="none", **run)
    config.collector.steps_per_env = 16
    config.optim.minibatch_size, config.optim.num_epochs = 32, 2
    config.loss.entropy_coef = 0.01
    return config


def test_ppo_sync_step_over_two_workers_equals_one_step_on_their_minibatches_together(output_dir):
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray")
    config.loss.normalize_advantage = False  # per-minibatch statistics would differ between the halves
    config.loss.anneal_clip = True
    first, second = worker_sessions(config, 2)
    (whole,) = worker_sessions(config, 1)  # one process, the whole minibatch
    assert isinstance(first, WorkerSession) and first.learner.modules.keys() == whole.learner.modules.keys()
    weights = first.learner.get_weights()
    for session in (second, whole):
        session.learner.set_weights(weights)
    minibatches = [first_minibatch(first), first_minibatch(second)]
    assert minibatches[0].shape == minibatches[1].shape == (16,)  # the 32-sample minibatch shared out
    gradients = [
        session.learner.compute_gradients(minibatch)[0]
        for session, minibatch in zip((first, second), minibatches, strict=True)
    ]
    sync_norm = first.learner.apply_gradients(average_gradients(gradients))
    whole_norm = whole.learner.step(torch.cat(minibatches))[1]
    torch.testing.assert_close(sync_norm, whole_norm)
    for one, other in zip(first.learner.parameters, whole.learner.parameters, strict=True):
        torch.testing.assert_close(one, other, rtol=1e-5, atol=1e-6)
    # the clip range the next step uses is the learner's, annealed over the frames it counted
    first.learner.set_frames(1024)
    second.learner.set_weights(first.learner.get_weights())
    assert second.learner.frames == 1024
    clip = first.learner.modules["loss"].clip_epsilon
    assert clip < config.loss.clip_epsilon
    torch.testing.assert_close(second.learner.modules["loss"].clip_epsilon, clip)


def test_worker_sessions_take_their_share_and_their_own_seeds(output_dir):
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray")
    first, second = worker_sessions(config, 2)
    batches = [next(iter(session.collector)) for session in (first, second)]
    assert batches[0].shape == batches[1].shape == (2, 16)  # 4 envs shared out, 16 steps each
    assert not torch.equal(batches[0]["observation"], batches[1]["observation"])  # envs seeded apart


def test_worker_seeds_differ_by_worker_replacement_and_resumed_frames():
    data = config_to_dict(small_ppo(None, gradient_workers=2, collector_backend="ray", seed=3))
    seeds = {
        worker_config(data, index, 2, (), generation, start)["run"]["seed"]
        for index in (0, 1)
        for generation in (0, 1)
        for start in (0, 4096)
    }
    assert len(seeds) == 8  # a resumed run's workers play new episodes, not the first run's again
    assert worker_config(data, 0, 2, ())["run"]["seed"] == worker_config(data, 0, 2, (), 0, 0)["run"]["seed"]


def test_algorithm_parameters_of_each_recipe_reach_its_loss(output_dir):
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray")
    (session,) = worker_sessions(config, 1)
    learner = session.learner
    assert set(learner.hyperparameters) == {"lr", "critic_lr", "clip_epsilon", "entropy_coef"}
    learner.update_algorithm_parameter("entropy_coef", 0.2)
    learner.update_algorithm_parameter("clip_epsilon", 0.3)
    learner.update_algorithm_parameter("critic_lr", 1e-2)
    loss_module = learner.modules["loss"]
    assert loss_module.entropy_coeff.item() == pytest.approx(0.2)
    assert loss_module.clip_epsilon.item() == pytest.approx(0.3)
    assert learner.optimizer.param_groups[1]["lr"] == pytest.approx(1e-2)
    with pytest.raises(InputError, match="no algorithm parameter 'epsilon'"):
        learner.update_algorithm_parameter("epsilon", 0.1)


# ---------------------------------------------------------------------------------------------- on Ray

ray_group = pytest.mark.xdist_group("ray")  # one local cluster per test process, these tests in one worker


def read_metric(output_dir, name):
    with open(Path(output_dir) / "csv" / "scalars" / "train" / f"{name}.csv") as file:
        return [float(row[-1]) for row in csv.reader(file)]


@ray_group
@pytest.mark.learning
def test_ppo_on_two_synchronous_gradient_workers_solves_cartpole(ray_cluster, output_dir):
    config = ppo.PPOConfig()
    quiet(config, output_dir, seed=1, gradient_workers=2, collector_backend="ray", total_frames=60_000)
    summary = ppo.main(config)
    assert summary["solved_at_frames"] is not None and summary["eval_return_mean"] >= 475


@ray_group
def test_asynchronous_workers_drop_stale_gradients_and_count_them(ray_cluster, output_dir):
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray", sync=False, max_staleness=0)
    config.run.logger, config.run.total_frames = "csv", 2048
    summary = ppo.main(config)
    assert summary["frames"] >= 2048
    dropped, staleness = (
        read_metric(output_dir, "dropped_gradients"),
        read_metric(output_dir, "gradient_staleness"),
    )
    assert dropped[-1] > 0  # two workers computing at once: one of each pair is a step behind
    assert staleness[-1] == 0  # none applied that was older than --max-staleness 0


@ray_group
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
def test_a_killed_gradient_worker_is_replaced_and_the_run_goes_on(ray_cluster, output_dir, monkeypatch, sync):
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray", sync=sync)
    config.run.logger, config.run.total_frames = "csv", 2048
    requests = {"count": 0, "killed": False}
    original = GradientWorkerPool.request

    def request(pool, index, weights):
        requests["count"] += 1
        if requests["count"] >= 5 and index == 0 and not requests["killed"]:  # after the first steps
            os.kill(ray_cluster.get(pool.workers[0].pid.remote()), signal.SIGKILL)
            requests["killed"] = True
        return original(pool, index, weights)

    monkeypatch.setattr(GradientWorkerPool, "request", request)
    summary = ppo.main(config)
    assert summary["frames"] >= 2048
    assert read_metric(output_dir, "worker_restarts")[-1] == 1


@ray_group
def test_when_every_gradient_worker_is_lost_the_run_stops_with_a_clear_error(
    ray_cluster, output_dir, monkeypatch
):
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray")
    monkeypatch.setattr(gradient_workers_module, "MAX_WORKER_RESTARTS", 0)
    original = GradientWorkerPool.request

    def request(pool, index, weights):
        os.kill(ray_cluster.get(pool.workers[index].pid.remote()), signal.SIGKILL)
        return original(pool, index, weights)

    monkeypatch.setattr(GradientWorkerPool, "request", request)
    with (
        pytest.warns(UserWarning, match="given up"),
        pytest.raises(RuntimeError, match="Every gradient worker failed"),
    ):
        ppo.main(config)


@ray_group
def test_bad_input_in_a_gradient_worker_stops_the_run_at_once(ray_cluster, output_dir):
    import gymnasium as gym

    # registered in this process only: each worker builds the recipe in its own process, where it is unknown
    gym.register("LearnerOnlyCartPole-v0", entry_point="gymnasium.envs.classic_control:CartPoleEnv")
    try:
        config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray")
        config.run.env_id = "LearnerOnlyCartPole-v0"
        with pytest.raises(
            InputError, match="Gradient worker . stopped on bad input: Unknown Gymnasium env id"
        ):
            ppo.main(config)
    finally:
        gym.registry.pop("LearnerOnlyCartPole-v0", None)


@ray_group
def test_a_distributed_run_resumes_from_the_learners_saved_state(ray_cluster, output_dir, monkeypatch):
    def config(**run):
        config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray", **run)
        config.run.total_frames = 1024
        return config

    with monkeypatch.context() as patch:
        interrupt_at(patch, 512)
        interrupted = ppo.main(config())
    assert interrupted["interrupted_by"] == "SIGINT" and interrupted["frames"] == 512
    saved = load_resume_checkpoint(output_dir / "resume.ckpt")["training"]
    steps = 512 // 64 * 2 * 2  # batches x epochs x minibatches per epoch
    assert saved["extras"]["learner"]["steps"] == steps
    assert "collector" not in saved  # the workers' envs start afresh
    seen = {}
    original = GradientWorkerPool.__init__

    def start(pool, pool_config, **options):  # the learner's state when the workers start
        learner = pool_learner["learner"]
        seen["steps"], seen["start_frames"] = learner.steps, options.get("start_frames")
        seen["loss"] = {key: value.clone() for key, value in learner.modules["loss"].state_dict().items()}
        original(pool, pool_config, **options)

    pool_learner = {}
    original_train = gradient_workers_module.train_on_gradient_workers

    def train(run, run_config, learner, after_batch):
        pool_learner["learner"] = learner
        return original_train(run, run_config, learner, after_batch)

    monkeypatch.setattr(ppo, "train_on_gradient_workers", train)
    monkeypatch.setattr(GradientWorkerPool, "__init__", start)
    resumed = ppo.main(config(resume=output_dir, checkpoint_every=512))  # resume.ckpt at its end too
    assert resumed["frames"] == 1024 and resumed["resumed_from"] == str(output_dir)
    assert seen["steps"] == saved["extras"]["learner"]["steps"]
    assert seen["start_frames"] > 0  # the workers of the resumed run are seeded past its frames: new episodes
    for key, value in saved["modules"]["loss"].items():
        torch.testing.assert_close(seen["loss"][key], value)
    # resumed again once its budget is spent, the run finishes without starting a worker
    seen.clear()
    again = ppo.main(config(resume=output_dir))
    assert again["frames"] == 1024 and not seen
    assert again["eval_return_mean"] == resumed["eval_return_mean"]


@ray_group
@pytest.mark.parametrize(
    ("main", "make_config"),
    [
        (a2c.main, tiny_a2c),
        (reinforce.main, tiny_reinforce),
        (vpg.main, tiny_vpg),
        (dqn.main, tiny_dqn),
        (rnd_ppo.main, tiny_rnd_ppo),
    ],
    ids=["a2c", "reinforce", "vpg", "dqn", "rnd_ppo"],
)
def test_each_recipe_learns_on_two_gradient_workers(ray_cluster, output_dir, main, make_config):
    config = make_config(output_dir, gradient_workers=2, collector_backend="ray", logger="csv")
    summary = main(config)
    assert summary["frames"] >= config.run.total_frames
    assert read_metric(output_dir, "gradient_workers")[-1] == 2
    assert len(read_metric(output_dir, "grad_norm")) > 0  # gradients came back and were applied


@ray_group
def test_a_run_on_gradient_workers_that_never_steps_says_so(ray_cluster, output_dir):
    config = tiny_dqn(output_dir, gradient_workers=2, collector_backend="ray")
    config.collector.learning_starts = 100_000  # beyond the budget: every frame is a random warm-up frame
    with pytest.warns(UserWarning, match="The run ended without a gradient step"):
        dqn.main(config)


@ray_group
def test_readme_gradient_workers_of_your_own_learn(ray_cluster, tmp_path, monkeypatch, capsys):
    from test_readme import readme_example

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_example("own-gradient-workers"), "README.md", "exec"), namespace)  # noqa: S102
    assert "return" in capsys.readouterr().out
    assert namespace["result"].mean > 60  # a random policy scores about 20


MULTI_NODE = textwrap.dedent(
    """
    import sys
    import ray
    from ray.cluster_utils import Cluster
    from recipes import ppo
    from training import gradient_workers, quiet

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    nodes = set()
    original = gradient_workers.GradientWorkerPool.gather

    def gather(pool, requests):
        nodes.update(ray.get([worker.node.remote() for worker in pool.workers.values()]))
        return original(pool, requests)

    gradient_workers.GradientWorkerPool.gather = gather
    config = ppo.PPOConfig()
    quiet(config, sys.argv[1], num_envs=4, total_frames=512, preset="none", gradient_workers=2,
          collector_backend="ray", ray_address=cluster.address)
    config.collector.steps_per_env, config.optim.minibatch_size, config.optim.num_epochs = 16, 32, 1
    summary = ppo.main(config)
    print("frames", summary["frames"], "nodes", len(nodes))
    ray.shutdown()
    cluster.shutdown()
    """
)


def test_gradient_workers_spread_over_a_simulated_two_node_ray_cluster(tmp_path):
    pytest.importorskip("ray")
    result = subprocess.run(
        [sys.executable, "-c", MULTI_NODE, str(tmp_path / "run")],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "frames 512 nodes 2" in result.stdout


# ---------------------------------------------------------------------------------------------- refusals


def test_gradient_workers_need_ray_and_shares_that_split_evenly(output_dir):
    with pytest.raises(InputError, match="add --collector-backend ray"):
        ppo.main(small_ppo(output_dir, gradient_workers=2))
    with pytest.raises(InputError, match="--num-envs 4 must split evenly over --gradient-workers 3"):
        ppo.main(small_ppo(output_dir, gradient_workers=3, collector_backend="ray"))
    config = small_ppo(output_dir, gradient_workers=2, collector_backend="ray")
    config.optim.minibatch_size = 33
    with pytest.raises(InputError, match="--minibatch-size 33 must split evenly"):
        ppo.main(config)
    config = dqn.DQNConfig()
    quiet(config, output_dir, gradient_workers=2, collector_backend="ray")
    config.buffer.batch_size = 63
    with pytest.raises(InputError, match="--batch-size 63 must split evenly"):
        dqn.main(config)
    with pytest.raises(InputError, match="--gradient-workers must be 0 or positive"):
        ppo.main(small_ppo(output_dir, gradient_workers=-1))


@pytest.mark.parametrize(
    "options,message",
    [
        (
            {"ray_address": "head:6379"},
            "--ray-address head:6379 is for Ray workers: add --collector-backend ray",
        ),
        ({"sync": False}, "--async is for gradient workers"),
        ({"max_staleness": 2}, "--max-staleness is for gradient workers"),
        (
            {"gradient_workers": 2, "collector_backend": "ray", "max_staleness": 2},
            "--max-staleness is for --async gradient workers",
        ),
        ({"num_workers": 4}, "--num-workers 4 is for --collector-backend multiprocess or ray"),
        (
            {"gradient_workers": 2, "collector_backend": "ray", "num_workers": 4},
            "--num-workers 4 does not apply with --gradient-workers",
        ),
    ],
)
def test_ray_and_gradient_worker_options_the_run_would_not_use_are_refused(options, message, output_dir):
    with pytest.raises(InputError, match=message):
        ppo.main(small_ppo(output_dir, **options))
    assert not output_dir.exists() or not any(output_dir.iterdir())
    if "num_workers" in options:  # a run saved before the refusal keeps its options
        small_ppo(output_dir, resume=output_dir, **options).run.validate()


@ray_group
def test_more_gradient_workers_than_free_cpus_is_refused_before_the_run_claims_its_folder(
    ray_cluster, output_dir, monkeypatch
):
    monkeypatch.setattr("training.distributed.RAY_CPU_WAIT_S", 0.5)
    config = small_ppo(output_dir, gradient_workers=4, collector_backend="ray")  # the cluster has 2 CPUs
    with pytest.raises(InputError, match="--gradient-workers 4 needs one CPU per Ray worker"):
        ppo.main(config)
    assert not output_dir.exists() or not any(output_dir.iterdir())  # a corrected rerun needs no --overwrite


def test_recipes_without_gradient_workers_and_loss_addons_refuse_them(output_dir):
    config = sac.SACConfig()
    quiet(config, output_dir, gradient_workers=2, collector_backend="ray")
    with pytest.raises(InputError, match="does not spread its learning over gradient workers"):
        sac.main(config)
    reference = ppo.PPOConfig()
    with pytest.raises(InputError, match="Loss add-ons are Python objects"):
        ppo.main(
            small_ppo(output_dir, gradient_workers=2, collector_backend="ray"),
            loss_addons=[partial(KLPenalty, reference_actor=None, coef=0.1)],
        )
    assert reference.run.gradient_workers == 0
    for config_type in (a2c.A2CConfig, reinforce.ReinforceConfig, vpg.VPGConfig, dqn.DQNConfig):
        assert config_type.GRADIENT_SPLIT is not None


def test_async_flag_on_the_command_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.ppo",
            "--async",
            "--gradient-workers",
            "2",
            "--output-dir",
            str(tmp_path),
        ],
        check=False,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "add --collector-backend ray" in result.stderr  # --async parsed; the missing backend refused
