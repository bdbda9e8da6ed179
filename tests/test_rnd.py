"""Random Network Distillation: the loss module (unit), the RND-PPO recipe (smoke) and its exploration (learning)."""

import subprocess
import sys
from pathlib import Path

import pytest
import space_envs  # noqa: F401 - registers Sign-v0, Look-v0 and Bandit-v0
import torch
from run_helpers import interrupt_at
from tensordict import TensorDict

from agents import Agent, RandomNetworkDistillation, make_rnd_networks, trainable_parameters
from agents.networks import OneHot
from agents.rnd import normalizes_observations
from envs import make_env
from errors import InputError, NonFiniteError
from recipes import ppo, rnd_ppo
from training import Callback, RunConfig, evaluation_seed


def make_rnd(env_id="rlkit/DeepSea-v0", env_kwargs=None, **kwargs):
    env = make_env(env_id, num_envs=4, seed=0, env_kwargs=env_kwargs)
    spec = env.observation_spec["observation"]
    torch.manual_seed(0)
    target, predictor = make_rnd_networks(spec, hidden_sizes=(32, 32), embedding_dim=16)
    return env, RandomNetworkDistillation(target, predictor, observation_shape=spec.shape[1:], **kwargs)


def one_hot_batch(cells, size=100):
    """A ``[1, len(cells)]`` batch whose next observations are the given one-hot cells."""
    observation = torch.nn.functional.one_hot(torch.tensor(cells), size).float().unsqueeze(0)
    return TensorDict({"next": {"observation": observation}}, batch_size=[1, len(cells)])


def test_target_network_is_frozen_and_never_changes_while_the_predictor_learns():
    env, rnd = make_rnd()
    target_before = {name: value.clone() for name, value in rnd.target_network.state_dict().items()}
    predictor_before = {name: value.clone() for name, value in rnd.predictor_network.state_dict().items()}
    assert all(not parameter.requires_grad for parameter in rnd.target_network.parameters())
    parameters = trainable_parameters(rnd)
    assert {id(p) for p in parameters} == {id(p) for p in rnd.predictor_network.parameters()}
    optimizer = torch.optim.Adam(parameters, lr=1e-2)
    data = env.rollout(30, break_when_any_done=False)
    for _ in range(10):
        rnd.add_intrinsic_reward(data)
        loss = rnd(data)["loss_predictor"]
        optimizer.zero_grad()
        loss.backward()
        assert all(parameter.grad is None for parameter in rnd.target_network.parameters())
        optimizer.step()
    for name, value in rnd.target_network.state_dict().items():
        assert torch.equal(value, target_before[name]), name
    assert all(
        not torch.equal(value, predictor_before[name])
        for name, value in rnd.predictor_network.state_dict().items()
    )


def mean_intrinsic_reward(rnd, batch):
    """The batch's mean intrinsic reward under the current statistics (which stay as they are)."""
    return rnd.add_intrinsic_reward(batch, update_statistics=False)["next", "intrinsic_reward"].mean().item()


def train_predictor(rnd, batch, steps):
    """``steps`` Adam steps (lr 1e-3) of RND's predictor on ``batch``."""
    optimizer = torch.optim.Adam(trainable_parameters(rnd), lr=1e-3)
    for _ in range(steps):
        optimizer.zero_grad()
        rnd(batch)["loss_predictor"].backward()
        optimizer.step()


def test_intrinsic_reward_falls_for_a_state_visited_over_and_over():
    _, rnd = make_rnd(normalize_reward=False, update_fraction=1.0)
    familiar, novel = one_hot_batch([7] * 8), one_hot_batch([93] * 8)
    rnd.obs_rms.update(
        one_hot_batch(list(range(100)))["next", "observation"]
    )  # fixed statistics from here on

    def reward(batch):
        return mean_intrinsic_reward(rnd, batch)

    familiar_before, novel_before = reward(familiar), reward(novel)
    train_predictor(rnd, familiar, steps=200)
    assert reward(familiar) < 0.01 * familiar_before
    # part of the initial error is shared by every input and is learnt too, but the unseen state still pays
    assert reward(novel) > 0.05 * novel_before and reward(novel) > 100 * reward(familiar)


def test_rewards_are_normalised_by_the_std_of_non_episodic_discounted_returns(monkeypatch):
    _, rnd = make_rnd(gamma=0.5)
    errors = iter([torch.tensor([[[1.0], [2.0], [3.0]]]), torch.tensor([[[4.0], [0.0], [0.0]]])])
    monkeypatch.setattr(rnd, "prediction_error", lambda observation: next(errors))
    rewards = rnd.add_intrinsic_reward(one_hot_batch([0, 1, 2]))["next", "intrinsic_reward"]
    returns = torch.tensor([1.0, 2.5, 4.25])  # 1; 0.5 * 1 + 2; 0.5 * 2.5 + 3
    torch.testing.assert_close(
        rewards.flatten(), torch.tensor([1.0, 2.0, 3.0]) / returns.var(correction=0).sqrt(), rtol=1e-3, atol=0
    )
    rnd.add_intrinsic_reward(one_hot_batch([0, 1, 2]))
    # the second batch continues the first one's returns (episode ends do not reset them)
    assert rnd.running_return.item() == pytest.approx(((0.5 * 4.25 + 4) * 0.5) * 0.5)


def test_keys_shapes_and_observation_statistics():
    env, rnd = make_rnd()
    rnd.set_keys(intrinsic_reward=("next", "bonus"))
    data = rnd.add_intrinsic_reward(env.rollout(12, break_when_any_done=False))
    assert data["next", "bonus"].shape == data["next", "reward"].shape == (4, 12, 1)
    assert (data["next", "bonus"] >= 0).all()
    assert rnd.obs_rms.count.item() == pytest.approx(48, abs=1e-3)
    assert set(rnd(data).keys()) == {"loss_predictor"}


@pytest.mark.parametrize("layout", ["hwc", "shwc"])
def test_images_are_normalised_per_pixel_and_a_repeated_image_stops_paying(layout):
    env, rnd = make_rnd("space_envs:Look-v0", env_kwargs={"layout": layout}, normalize_reward=False)
    rnd.update_fraction = 1.0
    shape = env.observation_spec["observation"].shape[1:]
    assert rnd.obs_rms.mean.shape == shape  # statistics per pixel, as the paper keeps them
    generator = torch.Generator().manual_seed(0)
    noise = torch.randint(0, 256, (1, 64, *shape), dtype=torch.uint8, generator=generator)
    rnd.obs_rms.update(noise)  # fixed statistics from here on

    def batch(images):
        return TensorDict({"next": {"observation": images}}, batch_size=images.shape[:2])

    familiar, novel = batch(noise[:, :1].expand(1, 8, *shape)), batch(noise[:, 1:2].expand(1, 8, *shape))

    def reward(data):
        return mean_intrinsic_reward(rnd, data)

    familiar_before, novel_before = reward(familiar), reward(novel)
    assert familiar_before > 0 and novel_before > 0
    train_predictor(rnd, familiar, steps=50)
    assert reward(familiar) < 0.05 * familiar_before
    assert reward(novel) > 10 * reward(familiar)


def test_observations_too_large_for_the_running_variance_stop_with_a_message_not_nan_weights():
    _, rnd = make_rnd("Pendulum-v1")
    huge = TensorDict({"next": {"observation": torch.full((2, 4, 3), 3e38)}}, batch_size=[2, 4])
    with pytest.raises(NonFiniteError, match="running variance overflows float32"):
        rnd.add_intrinsic_reward(huge)


def test_integer_box_observations_are_normalised_as_floats():
    env, rnd = make_rnd("space_envs:Sign-v0", {"kind": "int"})
    data = env.rollout(12, break_when_any_done=False)
    assert data["next", "observation"].dtype == torch.int64
    data = rnd.add_intrinsic_reward(data)
    assert data["next", "intrinsic_reward"].dtype == torch.float32
    target, _ = make_rnd_networks(make_env("Blackjack-v1").observation_spec["observation"])  # MultiDiscrete
    assert target(torch.zeros(2, 3)).shape == (2, 64)
    assert torch.isfinite(data["next", "intrinsic_reward"]).all()
    assert torch.isfinite(rnd(data)["loss_predictor"])


def test_discrete_observations_are_one_hot_encoded_without_statistics_and_a_repeated_state_stops_paying():
    env = make_env("FrozenLake-v1", num_envs=4, seed=0)
    spec = env.observation_spec["observation"]
    assert not normalizes_observations(spec) and normalizes_observations(
        make_env("CartPole-v1").observation_spec["observation"]
    )
    torch.manual_seed(0)
    target, predictor = make_rnd_networks(spec, hidden_sizes=(32, 32), embedding_dim=16)
    assert isinstance(target[0], OneHot) and target(torch.tensor([3, 15])).shape == (2, 16)
    rnd = RandomNetworkDistillation(
        target,
        predictor,
        spec.shape[1:],
        normalize_reward=False,
        update_fraction=1.0,
        normalize_observations=False,
    )
    assert rnd.obs_rms is None
    data = rnd.add_intrinsic_reward(env.rollout(12, break_when_any_done=False))
    assert data["next", "intrinsic_reward"].shape == (4, 12, 1)

    def batch(state):
        return TensorDict({"next": {"observation": torch.full((1, 8), state)}}, batch_size=[1, 8])

    def reward(state):
        return rnd.add_intrinsic_reward(batch(state))["next", "intrinsic_reward"].mean().item()

    familiar_before, novel_before = reward(5), reward(14)
    optimizer = torch.optim.Adam(trainable_parameters(rnd), lr=1e-3)
    for _ in range(200):
        optimizer.zero_grad()
        rnd(batch(5))["loss_predictor"].backward()
        optimizer.step()
    assert reward(5) < 0.01 * familiar_before
    assert reward(14) > 0.05 * novel_before and reward(14) > 100 * reward(5)


def tiny_rnd_ppo(output_dir, env_id="rlkit/DeepSea-v0", **run_overrides):
    options = {
        "env_id": env_id,
        "num_envs": 4,
        "total_frames": 512,
        "eval_every": 256,
        "eval_episodes": 2,
        "output_dir": output_dir,
        "logger": "csv",
        "video": False,
        "progress": False,
        "stop_at_return": float("inf"),
    }
    return rnd_ppo.RNDPPOConfig(
        run=RunConfig(**{**options, **run_overrides}),
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=2),
    )


@pytest.mark.parametrize("env_id", ["CartPole-v1", "rlkit/DeepSea-v0"])
def test_rnd_ppo_smoke_writes_outputs_and_the_agent_reloads(env_id, output_dir):
    summary = rnd_ppo.main(tiny_rnd_ppo(output_dir, env_id=env_id, video=env_id != "CartPole-v1"))
    assert summary["algorithm"] == "rnd_ppo" and summary["env_id"] == env_id and summary["frames"] == 512
    for name in ("summary.json", "evaluations.csv", "learning_curve.png", "agent.ckpt", "config.json"):
        assert (output_dir / name).stat().st_size > 0, name
    assert (output_dir / "video.mp4").exists() == (env_id != "CartPole-v1")
    metrics = (output_dir / "csv" / "scalars").glob("train/*.csv")
    assert {"loss_predictor", "loss_critic_int", "intrinsic_reward"} <= {path.stem for path in metrics}
    agent = Agent.load(output_dir)
    assert agent.algorithm == "rnd_ppo" and agent.config["intrinsic"]["int_coef"] == 1.0
    assert agent.evaluate(episodes=2, seed=evaluation_seed(summary["seed"])).mean == pytest.approx(
        summary["eval_return_mean"]
    )


def test_rnd_ppo_with_sde_builds_a_gsde_policy(output_dir):
    config = tiny_rnd_ppo(output_dir, env_id="Pendulum-v1")
    config.network.use_sde, config.network.sde_sample_freq = True, 4
    summary = rnd_ppo.main(config)
    assert summary["frames"] == 512
    assert Agent.load(output_dir).policy_builder == "gsde_actor"


def test_rnd_ppo_rejects_bad_options(output_dir):
    config = tiny_rnd_ppo(output_dir)
    config.intrinsic.gamma_int = 1.5
    with pytest.raises(InputError, match="--gamma-int"):
        rnd_ppo.main(config)
    config = tiny_rnd_ppo(output_dir, env_id="space_envs:Bandit-v0")
    with pytest.raises(InputError, match="RND needs at least one observation value"):
        rnd_ppo.main(config)
    for section, name, value, message in [
        ("intrinsic", "rnd_hidden_sizes", (0,), r"--rnd-hidden-sizes must be positive integers .* got \[0\]"),
        ("intrinsic", "rnd_update_fraction", 0.0, r"--rnd-update-fraction must be in \(0, 1\]"),
        (
            "optim",
            "sequence_length",
            8,
            "--sequence-length is a PPO option that recipes.rnd_ppo does not support",
        ),
        ("network", "recurrent_size", 32, "--recurrent-size is a PPO option that recipes.rnd_ppo does not"),
    ]:
        config = tiny_rnd_ppo(output_dir)
        setattr(getattr(config, section), name, value)
        with pytest.raises(InputError, match=message):
            rnd_ppo.main(config)


class RNDStatistics(Callback):
    """RND's observation statistics at the start of the run (after any warm-up) and the first batch."""

    def on_start(self, run):
        rnd = run.checkpoints.training.modules["rnd"]
        self.count, self.mean = rnd.obs_rms.count.item(), rnd.obs_rms.mean.clone()

    def on_batch(self, run, batch, metrics):
        if not hasattr(self, "first_batch"):
            self.first_batch = batch.get("observation").clone()


def test_rnd_obs_warmup_starts_the_statistics_from_random_steps_once(tmp_path, monkeypatch):
    seen = {}
    for warmup in (0, 1_000):
        seen[warmup] = RNDStatistics()
        config = tiny_rnd_ppo(tmp_path / f"warmup-{warmup}", env_id="CartPole-v1")
        config.intrinsic.rnd_obs_warmup = warmup
        rnd_ppo.main(config, callbacks=[seen[warmup]])
    assert seen[0].count == pytest.approx(1e-4) and torch.equal(seen[0].mean, torch.zeros(4))
    assert seen[1_000].count == pytest.approx(1_000 + 1e-4)  # 250 random steps of each of the 4 envs
    assert seen[1_000].mean.abs().sum() > 0
    # the training envs start where they would have: the warm-up stepped copies of them
    torch.testing.assert_close(seen[0].first_batch[:, 0], seen[1_000].first_batch[:, 0])
    # a resumed run keeps the statistics it saved: no second warm-up
    output_dir = tmp_path / "resumed"
    config = tiny_rnd_ppo(output_dir, env_id="CartPole-v1")
    config.intrinsic.rnd_obs_warmup = 1_000
    interrupt_at(monkeypatch, 256)
    rnd_ppo.main(config)
    config = tiny_rnd_ppo(output_dir, env_id="CartPole-v1", resume=output_dir)
    config.intrinsic.rnd_obs_warmup, resumed = 1_000, RNDStatistics()
    rnd_ppo.main(config, callbacks=[resumed])
    assert resumed.count == pytest.approx(1_000 + 256 + 1e-4)  # the warm-up and the first batch, once each


def test_rnd_obs_warmup_is_refused_where_rnd_keeps_no_statistics(output_dir):
    config = tiny_rnd_ppo(output_dir, env_id="space_envs:Sign-v0", env_kwargs=["kind=discrete"])
    config.intrinsic.rnd_obs_warmup = 100
    with pytest.raises(InputError, match="--rnd-obs-warmup starts RND's observation statistics, and "):
        rnd_ppo.main(config)
    config.intrinsic.rnd_obs_warmup = -1
    with pytest.raises(InputError, match="--rnd-obs-warmup must be 0 or positive, got -1"):
        rnd_ppo.main(config)


def test_rnd_ppo_learns_on_integer_box_observations(output_dir):
    # a random policy scores 5 of 10
    config = tiny_rnd_ppo(output_dir, env_id="space_envs:Sign-v0", env_kwargs=["kind=int"], seed=0)
    config.run.total_frames = 1_024
    assert rnd_ppo.main(config)["eval_return_mean"] >= 9.0


def test_rnd_ppo_learns_on_images(output_dir):
    # a random policy scores 5 of 10; the policy, both critics and RND's two networks each read the image with a CNN
    config = tiny_rnd_ppo(output_dir, env_id="space_envs:Look-v0", env_kwargs=["layout=hwc"], seed=0)
    config.run.total_frames = 2_048
    assert rnd_ppo.main(config)["eval_return_mean"] >= 9.0


def test_rnd_ppo_learns_on_discrete_observations(output_dir):
    # a random policy scores 5 of 10
    config = tiny_rnd_ppo(output_dir, env_id="space_envs:Sign-v0", env_kwargs=["kind=discrete"], seed=0)
    config.run.total_frames = 1_024
    assert rnd_ppo.main(config)["eval_return_mean"] >= 9.0
    assert Agent.load(output_dir).predict(1) == 1


def test_rnd_ppo_cli_help_lists_the_intrinsic_options():
    result = subprocess.run(
        [sys.executable, "-m", "recipes.rnd_ppo", "--help"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 0, result.stderr
    for flag in (
        "--gamma-int",
        "--ext-coef",
        "--int-coef",
        "--intrinsic-episodic",
        "--rnd-obs-warmup",
        "--rnd-update-fraction",
        "--gamma",
    ):
        assert flag in result.stdout, flag


@pytest.mark.learning
def test_rnd_ppo_finds_the_deepsea_treasure_where_ppo_with_the_same_budget_does_not(tmp_path):
    # DeepSea14: the treasure needs 14 right moves in a row, a random policy finds it once in 16384 episodes.
    # RND-PPO's defaults found it within 12k-17k frames on seeds 0-5; plain PPO on none of them (README.md).
    def configure(config, name):
        config.run.env_id, config.run.seed, config.run.total_frames = "rlkit/DeepSea14-v0", 0, 24_576
        config.run.output_dir, config.run.logger, config.run.video, config.run.progress = (
            tmp_path / name,
            "none",
            False,
            False,
        )
        return config

    rnd_config = configure(rnd_ppo.RNDPPOConfig(), "rnd_ppo")
    # the same run, env, collector, loss, optimizer and network settings, without the intrinsic reward
    ppo_config = ppo.PPOConfig(
        run=configure(rnd_ppo.RNDPPOConfig(), "ppo").run,
        collector=rnd_config.collector,
        loss=rnd_config.loss,
        optim=rnd_config.optim,
        network=rnd_config.network,
    )
    rnd_summary = rnd_ppo.main(rnd_config)
    assert rnd_summary["solved_at_frames"] is not None  # deterministic evaluation return >= 0.9
    assert rnd_summary["eval_return_mean"] == pytest.approx(0.99)  # the optimal return
    ppo_summary = ppo.main(ppo_config)
    assert ppo_summary["frames"] >= 24_576 and ppo_summary["best_eval_return_mean"] <= 0.0
