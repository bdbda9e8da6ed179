"""REINFORCE, VPG and A2C: complete-episode returns, baselines, gradient routing, n-step targets, smoke runs,
bad input."""

import math
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.collectors import Collector
from torchrl.modules import ValueOperator
from torchrl.objectives import A2CLoss

from agents import Agent, make_actor, make_critic, orthogonal_init
from agents.gsde import make_gsde_actor
from agents.networks import initial_scale_kwargs
from agents.policy_gradient import ReturnBaseline, make_shared_critic, returns_to_go, truncation_values
from envs import make_env
from errors import InputError
from recipes import a2c, reinforce, vpg
from training import RunConfig, evaluation_seed, run_cli

GAMMA = 0.5


class StepCounter(gym.Env):
    """Observation t, reward t + 1 at step t, terminated after ``length`` steps (actions are ignored)."""

    observation_space = gym.spaces.Box(0.0, 1e3, shape=(1,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int):
        self.length = length
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        reward = float(self.t + 1)
        self.t += 1
        return np.array([self.t], dtype=np.float32), reward, self.t == self.length, False, {}


def episode_collector(frames_per_batch, episodes_per_batch, total_frames):
    """The collector REINFORCE and VPG build, on two StepCounter envs: one terminating after 5 steps, one
    cut by a 4-step time limit (truncated). Both episodes span several collector batches."""
    vector_env = gym.vector.SyncVectorEnv(
        [lambda: StepCounter(5), lambda: gym.wrappers.TimeLimit(StepCounter(100), max_episode_steps=4)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    env = make_env(vector_env, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    return Collector(
        env,
        actor,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        trajs_per_batch=episodes_per_batch,
        traj_format="cat",
        track_traj_ids=True,
        auto_register_policy_transforms=False,
    )


# G_t = r_t + 0.5 G_{t+1} with r_t = t + 1, computed by hand
RETURNS_TERMINATED_AT_5 = [3.5625, 5.125, 6.25, 6.5, 5.0]  # rewards 1 2 3 4 5
RETURNS_TRUNCATED_AT_4 = [3.25, 4.5, 5.0, 4.0]  # rewards 1 2 3 4, no bootstrap at the time limit
RETURNS_BOOTSTRAPPED_AT_4 = [3.5, 5.0, 6.0, 6.0]  # rewards 1 2 3 4 + 0.5 V(s_4), with V(s_4) = 4


def test_returns_of_complete_episodes_match_hand_computed_values_across_batch_boundaries():
    # 2 envs x 3 steps per batch: every episode (5 and 4 steps) is cut by a batch boundary and carried over
    collector = episode_collector(frames_per_batch=6, episodes_per_batch=2, total_frames=60)
    seen = {5: 0, 4: 0}
    for episodes in collector:
        done = episodes.get(("next", "done")).flatten()
        assert done[-1]  # complete episodes only
        returns = returns_to_go(episodes, GAMMA).flatten().tolist()
        ends = (torch.nonzero(done).flatten() + 1).tolist()
        for start, stop in zip([0] + ends[:-1], ends):
            episode = episodes[start:stop]
            observations = episode.get("observation").flatten().tolist()
            assert observations == list(range(stop - start))  # the fragments were stitched in order
            length = stop - start
            expected = RETURNS_TERMINATED_AT_5 if length == 5 else RETURNS_TRUNCATED_AT_4
            assert returns[start:stop] == pytest.approx(expected)
            assert bool(episode.get(("next", "truncated"))[-1]) == (length == 4)
            seen[length] += 1
    collector.shutdown()
    assert seen[5] >= 3 and seen[4] >= 3


def test_a_learned_value_carries_truncated_returns_on_past_the_time_limit_and_never_past_a_termination():
    critic = ValueOperator(nn.Linear(1, 1), in_keys=["observation"])  # V(s) = s: the step count
    with torch.no_grad():
        critic.module.weight.fill_(1.0)
        critic.module.bias.zero_()
    collector = episode_collector(frames_per_batch=6, episodes_per_batch=2, total_frames=60)
    seen = {5: 0, 4: 0}
    for episodes in collector:
        values = truncation_values(critic, episodes)
        returns = returns_to_go(episodes, GAMMA, values).flatten().tolist()
        ends = (torch.nonzero(episodes.get(("next", "done")).flatten()).flatten() + 1).tolist()
        for start, stop in zip([0] + ends[:-1], ends):
            length = stop - start
            truncated = length == 4
            expected_values = [0.0, 0.0, 0.0, 4.0] if truncated else [0.0] * 5  # the terminal s_5 = 5 unread
            assert values[start:stop].flatten().tolist() == expected_values
            expected = RETURNS_BOOTSTRAPPED_AT_4 if truncated else RETURNS_TERMINATED_AT_5
            assert returns[start:stop] == pytest.approx(expected)
            seen[length] += 1
    collector.shutdown()
    assert seen[5] >= 3 and seen[4] >= 3
    no_time_limit = TensorDict(
        {"next": {"reward": torch.ones(2, 1), "terminated": torch.tensor([[False], [True]])}}, batch_size=[2]
    )
    assert truncation_values(critic, no_time_limit).abs().sum() == 0


@pytest.mark.parametrize("baseline", ["value", "running-mean"])
def test_vpg_bootstraps_time_limits_with_its_learned_value_only(baseline, output_dir, monkeypatch):
    calls = []

    def recording(episodes, gamma, truncation_values=None):
        calls.append((episodes.get(("next", "truncated")).clone(), truncation_values))
        return returns_to_go(episodes, gamma, truncation_values)

    monkeypatch.setattr(vpg, "returns_to_go", recording)
    vpg.main(tiny_vpg(output_dir, "Pendulum-v1", baseline, max_episode_steps=20))  # every episode truncated
    assert calls
    for truncated, values in calls:
        if baseline == "value":
            assert truncated.sum() >= 2 and ((values != 0) == truncated).all()
        else:
            assert values is None


def test_returns_to_go_rejects_unfinished_episodes():
    done = torch.tensor([[False], [True], [False]])
    episodes = TensorDict({"next": {"reward": torch.ones(3, 1), "done": done}}, batch_size=[3])
    with pytest.raises(ValueError, match="does not end an episode"):
        returns_to_go(episodes, 0.9)
    assert returns_to_go(episodes[:2], 0.5).flatten().tolist() == [1.5, 1.0]


def test_return_baseline_starts_at_zero_then_averages_then_tracks():
    baseline = ReturnBaseline(rate=0.5)
    observations = TensorDict({"observation": torch.zeros(4, 3)}, batch_size=[4])
    assert baseline(observations.clone())["state_value"].shape == (4, 1)
    assert baseline(observations.clone())["state_value"].abs().sum() == 0
    baseline.update(torch.tensor([[2.0], [4.0]]))  # first batch: its mean
    assert baseline.mean.item() == 3.0
    baseline.update(torch.tensor([[7.0]]))  # second: plain average of the two batch means (weight 1/2)
    assert baseline.mean.item() == 5.0
    baseline.update(torch.tensor([[9.0]]))  # third: rate 0.5 outweighs 1/3
    assert baseline.mean.item() == 7.0
    with pytest.raises(InputError, match="rate"):
        ReturnBaseline(rate=0.0)


def per_episode_gradients(loss_module, episodes, advantage):
    """One policy-gradient estimate sum_t grad log pi(a_t|s_t) A_t per episode, flattened."""
    episodes = episodes.set("advantage", advantage)
    actor_parameters = list(loss_module.actor_network.parameters())
    ends = (torch.nonzero(episodes.get(("next", "done")).flatten()).flatten() + 1).tolist()
    gradients = []
    for start, stop in zip([0] + ends[:-1], ends):
        loss = loss_module(episodes[start:stop])["loss_objective"] * (
            stop - start
        )  # the sum over the episode
        gradients.append(torch.cat([g.flatten() for g in torch.autograd.grad(loss, actor_parameters)]))
    return torch.stack(gradients)


def test_baselines_lower_the_variance_of_the_policy_gradient_on_a_fixed_batch():
    torch.manual_seed(0)
    env = make_env("CartPole-v1", 8, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    collector = Collector(
        env,
        actor,
        frames_per_batch=256,
        total_frames=-1,
        trajs_per_batch=64,
        traj_format="cat",
        track_traj_ids=True,
        auto_register_policy_transforms=False,
    )
    iterator = iter(collector)
    fit_batch, batch = next(iterator), next(iterator)
    collector.shutdown()
    # the baselines are fitted on one batch and used on another, as in the recipe (fitted before the update)
    fit_returns, returns = returns_to_go(fit_batch, 0.99), returns_to_go(batch, 0.99)
    running_mean = ReturnBaseline()
    running_mean.update(fit_returns)
    critic = make_critic(env.observation_spec["observation"])
    optimizer = torch.optim.Adam(critic.parameters(), lr=1e-2)
    for _ in range(300):
        optimizer.zero_grad()
        nn.functional.mse_loss(critic(fit_batch.clone())["state_value"], fit_returns).backward()
        optimizer.step()
    loss_module = A2CLoss(actor, critic, entropy_bonus=False, critic_coeff=None, functional=False)

    def variance(baseline):
        with torch.no_grad():
            values = baseline(batch.clone()).get("state_value")
        gradients = per_episode_gradients(loss_module, batch.clone(), returns - values)
        return gradients.var(dim=0).sum().item()

    without, with_mean, with_value = variance(ReturnBaseline()), variance(running_mean), variance(critic)
    # measured: 7.0e3 without a baseline, 3.5e3 with the mean return, 3.0e3 with the fitted critic
    assert with_mean < 0.6 * without
    assert with_value < 0.6 * without


def make_pendulum_specs():
    env = make_env("Pendulum-v1", 1)
    return env.observation_spec["observation"], env.action_spec


@pytest.mark.parametrize("shared", [False, True])
def test_a2c_gradients_reach_only_the_right_parameters(shared):
    observation_spec, action_spec = make_pendulum_specs()
    actor = make_actor(observation_spec, action_spec, hidden_sizes=(8, 8))
    critic = make_shared_critic(actor) if shared else make_critic(observation_spec, (8, 8))
    loss_module = A2CLoss(actor, critic, entropy_bonus=False, loss_critic_type="l2", functional=False)
    batch = TensorDict(
        {
            "observation": torch.randn(5, 3),
            "action": torch.rand(5, 1) * 2 - 1,
            "advantage": torch.randn(5, 1),
            "value_target": torch.randn(5, 1),
        },
        batch_size=[5],
    )
    loss = loss_module(batch)
    actor_parameters = set(actor.parameters())
    critic_only = [p for p in critic.parameters() if p not in actor_parameters]
    assert len(critic_only) == (2 if shared else 6)  # the value head (shared) or the whole critic MLP
    actor_gradients = torch.autograd.grad(
        loss["loss_objective"], list(actor_parameters) + critic_only, allow_unused=True
    )
    assert all(g is None or g.abs().sum() == 0 for g in actor_gradients[len(actor_parameters) :])
    critic_gradients = dict(
        zip(
            list(actor_parameters) + critic_only,
            torch.autograd.grad(loss["loss_critic"], list(actor_parameters) + critic_only, allow_unused=True),
        )
    )
    assert all(critic_gradients[p] is not None for p in critic_only)
    torso = [p for p in critic.parameters() if p in actor_parameters]
    if shared:  # the value loss shapes the actor's hidden layers, never its output layer or scale
        assert len(torso) == 4 and all(critic_gradients[p].abs().sum() > 0 for p in torso)
        others = actor_parameters - set(torso)
        assert all(critic_gradients[p] is None for p in others)
    else:
        assert not torso and all(critic_gradients[p] is None for p in actor_parameters)


def test_shared_critic_needs_a_hidden_layer():
    observation_spec, action_spec = make_pendulum_specs()
    with pytest.raises(InputError, match="at least one hidden layer"):
        make_shared_critic(make_actor(observation_spec, action_spec, hidden_sizes=()))


def test_a2c_n_step_targets_stop_at_termination_and_bootstrap_at_truncation_and_segment_end():
    # V(s) = 2 s, gamma 0.5, one env, 5 steps: an episode truncated after step 1 (bootstrap from V(3) = 6),
    # one terminated after step 3 (no bootstrap), one still running at the segment end (bootstrap from V(9))
    linear = nn.Linear(1, 1)
    with torch.no_grad():
        linear.weight.fill_(2.0)
        linear.bias.zero_()
    critic = ValueOperator(linear, in_keys=["observation"])

    def column(values, dtype=torch.float32):
        return torch.tensor(values, dtype=dtype).reshape(1, 5, 1)

    terminated = column([False, False, False, True, False], torch.bool)
    truncated = column([False, True, False, False, False], torch.bool)
    batch = TensorDict(
        {
            "observation": column([1.0, 2.0, 5.0, 6.0, 8.0]),
            "next": {
                "observation": column([2.0, 3.0, 6.0, 7.0, 9.0]),
                "reward": column([1.0, 1.0, 2.0, 4.0, 1.0]),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[1, 5],
    )
    a2c.make_advantage_module(critic, gamma=0.5, gae_lambda=None, device=torch.device("cpu"))(batch)
    # 1 + .5 (1 + .5 * 6) = 3 | 1 + .5 * 6 = 4 | 2 + .5 * 4 = 4 | 4 | 1 + .5 * 18 = 10
    expected_targets = torch.tensor([3.0, 4.0, 4.0, 4.0, 10.0])
    torch.testing.assert_close(batch["value_target"].flatten(), expected_targets)
    torch.testing.assert_close(
        batch["advantage"].flatten(), expected_targets - torch.tensor([2.0, 4, 10, 12, 16])
    )
    # lambda = 1 is the same estimate; lambda = 0 is one-step TD
    for gae_lambda, expected in ((1.0, expected_targets), (0.0, torch.tensor([3.0, 4.0, 8.0, 4.0, 10.0]))):
        batch_copy = batch.exclude("advantage", "value_target", "state_value", ("next", "state_value"))
        a2c.make_advantage_module(critic, gamma=0.5, gae_lambda=gae_lambda, device=torch.device("cpu"))(
            batch_copy
        )
        torch.testing.assert_close(batch_copy["value_target"].flatten(), expected)


# ------------------------------------------------------------------------------------------------- smoke


def tiny_run(output_dir, env_id, video=False, **overrides):
    options = {
        "env_id": env_id,
        "num_envs": 2,
        "total_frames": 800,
        "eval_every": 400,
        "eval_episodes": 2,
        "output_dir": output_dir,
        "logger": "csv",
        "video": video,
        "progress": False,
    }
    return RunConfig(**{**options, **overrides})


def tiny_reinforce(output_dir, env_id="CartPole-v1", **overrides):
    return reinforce.ReinforceConfig(
        run=tiny_run(output_dir, env_id, **overrides),
        collector=reinforce.CollectorConfig(episodes_per_update=2, steps_per_env=16),
    )


def tiny_vpg(output_dir, env_id="CartPole-v1", baseline="value", **overrides):
    return vpg.VPGConfig(
        run=tiny_run(output_dir, env_id, **overrides),
        collector=vpg.CollectorConfig(episodes_per_update=2, steps_per_env=16),
        loss=vpg.LossConfig(baseline=baseline, entropy_coef=0.01),
    )


def tiny_a2c(output_dir, env_id="CartPole-v1", **overrides):
    return a2c.A2CConfig(
        run=tiny_run(output_dir, env_id, **overrides), collector=a2c.CollectorConfig(steps_per_env=5)
    )


def check_outputs(output_dir, summary, algorithm, env_id, video=False):
    assert summary["algorithm"] == algorithm and summary["env_id"] == env_id
    names = [
        "summary.json",
        "evaluations.csv",
        "learning_curve.png",
        "agent.ckpt",
        "best_agent.ckpt",
        "config.json",
    ]
    for name in names + (["video.mp4"] if video else []):
        assert (output_dir / name).stat().st_size > 0, name
    assert list((output_dir / "csv").rglob("loss_objective*")), "training losses logged"
    agent = Agent.load(output_dir)
    assert agent.algorithm == algorithm and agent.env_id == env_id
    assert agent.evaluate(episodes=2, seed=evaluation_seed(summary["seed"])).mean == pytest.approx(
        summary["eval_return_mean"], rel=1e-5
    )
    return agent


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_reinforce_smoke(env_id, output_dir):
    video = env_id == "CartPole-v1"
    summary = reinforce.main(tiny_reinforce(output_dir, env_id, video=video))
    check_outputs(output_dir, summary, "reinforce", env_id, video=video)
    assert 0 < summary["frames"] <= 800  # the steps of the complete episodes used


@pytest.mark.parametrize(
    "env_id, baseline", [("CartPole-v1", "value"), ("Pendulum-v1", "running-mean"), ("CartPole-v1", "none")]
)
def test_vpg_smoke(env_id, baseline, output_dir):
    summary = vpg.main(tiny_vpg(output_dir, env_id, baseline))
    check_outputs(output_dir, summary, "vpg", env_id)


def test_a2c_smoke_cartpole(output_dir):
    summary = a2c.main(tiny_a2c(output_dir, video=True))
    check_outputs(output_dir, summary, "a2c", "CartPole-v1", video=True)
    assert summary["frames"] == 800


def test_a2c_smoke_pendulum_with_every_option(output_dir):
    config = tiny_a2c(output_dir, "Pendulum-v1")
    config.network.shared_network, config.network.normalize_obs, config.network.ortho_init = True, True, True
    config.loss.gae_lambda, config.loss.entropy_coef, config.loss.reward_scale = 0.9, 0.01, 0.1
    config.optim.optimizer, config.optim.anneal_lr = "adam", True
    summary = a2c.main(config)
    agent = check_outputs(output_dir, summary, "a2c", "Pendulum-v1")
    assert agent.normalizer.count.item() == 800


@pytest.mark.parametrize("kind", ["discrete", "box", "gsde", "shared"])
def test_orthogonal_init_as_stable_baselines3(kind):
    env_id = "CartPole-v1" if kind in ("discrete", "shared") else "Pendulum-v1"
    env = make_env(env_id, num_envs=1)
    spec = env.observation_spec["observation"]
    if kind == "gsde":
        actor = make_gsde_actor(spec, env.action_spec, hidden_sizes=(32, 16))
    else:
        actor = make_actor(spec, env.action_spec, hidden_sizes=(32, 16), state_dependent_scale=kind == "box")
    critic = make_shared_critic(actor) if kind == "shared" else make_critic(spec, (32, 16))
    env.close()
    orthogonal_init(actor, critic)

    def singular_values(layer):
        return torch.linalg.svdvals(layer.weight.detach())

    for module, output_gain in ((actor, 0.01), (critic, 1.0)):
        *hidden, output = [layer for layer in module.modules() if isinstance(layer, nn.Linear)]
        assert torch.allclose(singular_values(output), torch.full_like(singular_values(output), output_gain))
        for layer in hidden:
            assert torch.allclose(singular_values(layer), torch.full_like(singular_values(layer), 2**0.5))
            assert not layer.bias.any()
        assert not output.bias.any()


def test_log_std_init_sets_the_first_scale_of_box_policies(output_dir):
    env = make_env("Pendulum-v1", num_envs=1)
    spec, action_spec = env.observation_spec["observation"], env.action_spec
    assert initial_scale_kwargs(0.0, action_spec, use_sde=False) == {}
    assert initial_scale_kwargs(-2.0, action_spec, use_sde=True) == {
        "sigma_init": pytest.approx(np.exp(-2.0))
    }
    actor = make_actor(spec, action_spec, **initial_scale_kwargs(-2.0, action_spec, use_sde=False))
    assert torch.allclose(actor(env.reset())["scale"], torch.full((1, 1), np.exp(-2.0)))
    env.close()
    with pytest.raises(InputError, match="--log-std-init sets the first scale of a Box action policy"):
        initial_scale_kwargs(-1.0, make_env("CartPole-v1", num_envs=1).action_spec, use_sde=False)
    config = tiny_a2c(output_dir, "Pendulum-v1")
    config.network.log_std_init = -1.0
    a2c.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")  # the trained scale, rebuilt from the saved options
    assert agent.policy_kwargs["log_std_init"] == -1.0


# ------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "recipe, make_config, group, option, value, message",
    [
        (reinforce, tiny_reinforce, "loss", "gamma", 1.5, "--gamma must be in (0, 1]"),
        (reinforce, tiny_reinforce, "optim", "lr", 0.0, "--lr must be in (0, inf)"),
        (reinforce, tiny_reinforce, "collector", "episodes_per_update", 0, "--episodes-per-update must be"),
        (vpg, tiny_vpg, "loss", "baseline_rate", 1.5, "--baseline-rate must be in (0, 1]"),
        (vpg, tiny_vpg, "optim", "critic_lr", -1.0, "--critic-lr must be in (0, inf)"),
        (vpg, tiny_vpg, "loss", "entropy_coef", -0.1, "--entropy-coef must be in [0, inf)"),
        (
            reinforce,
            tiny_reinforce,
            "loss",
            "entropy_coef",
            math.inf,
            "--entropy-coef must be in [0, inf), got inf",
        ),
        (a2c, tiny_a2c, "loss", "entropy_coef", math.inf, "--entropy-coef must be in [0, inf), got inf"),
        (a2c, tiny_a2c, "loss", "gae_lambda", 1.5, "--gae-lambda must be in [0, 1]"),
        (a2c, tiny_a2c, "optim", "max_grad_norm", 0.0, "--max-grad-norm must be > 0"),
        (a2c, tiny_a2c, "loss", "reward_scale", 0.0, "--reward-scale must be in (0, inf)"),
        (a2c, tiny_a2c, "collector", "steps_per_env", 0, "--steps-per-env must be a positive integer"),
    ],
)
def test_bad_hyperparameters_raise_input_errors(recipe, make_config, group, option, value, message, tmp_path):
    config = make_config(tmp_path / "run")
    setattr(getattr(config, group), option, value)
    with pytest.raises(InputError) as error:
        recipe.main(config)
    assert message in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()  # refused before any work


def test_a2c_shared_network_without_hidden_layers_is_refused(output_dir):
    config = tiny_a2c(output_dir)
    config.network.shared_network, config.network.hidden_sizes = True, ()
    with pytest.raises(InputError, match="at least one hidden layer"):
        a2c.main(config)


@pytest.mark.parametrize(
    "recipe, config_type, flags",
    [
        (
            reinforce,
            reinforce.ReinforceConfig,
            ["--episodes-per-update", "--normalize-returns", "--entropy-coef"],
        ),
        (vpg, vpg.VPGConfig, ["--baseline", "--baseline-rate", "--critic-lr", "--normalize-advantage"]),
        (
            a2c,
            a2c.A2CConfig,
            ["--gae-lambda", "--shared-network", "--optimizer", "--anneal-lr", "--reward-scale"],
        ),
    ],
)
def test_cli_documents_options_and_reports_bad_input_in_one_line(
    recipe, config_type, flags, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(sys, "argv", [recipe.__name__, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(recipe.main, config_type, recipe.__doc__)
    help_text = capsys.readouterr().out
    assert exit_info.value.code == 0
    for flag in flags + [
        "--env-id",
        "--total-frames",
        "--gamma",
        "--lr",
        "--hidden-sizes",
        "--normalize-obs",
    ]:
        assert flag in help_text, flag
    monkeypatch.setattr(sys, "argv", [recipe.__name__, "--output-dir", str(tmp_path), "--gamma", "0"])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(recipe.main, config_type, recipe.__doc__)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: --gamma must be in (0, 1], got 0.0."]


def test_recipe_runs_as_a_module():
    result = subprocess.run(
        [sys.executable, "-m", "recipes.vpg", "--baseline", "running-mean", "--baseline-rate", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == ["error: --baseline-rate must be in (0, 1], got 2.0."]


@pytest.mark.parametrize("make_config", [tiny_reinforce, tiny_vpg], ids=["reinforce", "vpg"])
def test_a_budget_that_ends_before_a_batch_of_whole_episodes_warns_that_the_agent_is_untrained(
    tmp_path, make_config
):
    config = make_config(
        tmp_path / "run", "Pendulum-v1", total_frames=150, num_envs=2
    )  # episodes of 200 steps
    with pytest.warns(
        UserWarning, match="ended without a gradient step: its --total-frames 150 ran out before"
    ):
        summary = (reinforce if make_config is tiny_reinforce else vpg).main(config)
    assert summary["frames"] == 0
