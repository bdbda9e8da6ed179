"""Unsquashed Box policies (``--no-squash``): a plain Gaussian whose actions the env clips to the Box."""

import os
from pathlib import Path

import echo_env  # noqa: F401 - registers EchoAction-v0, MixedBoundsEcho-v0 and Reach-v0
import numpy as np
import pytest
import torch
from run_helpers import tiny_a2c, tiny_ppo
from tensordict import TensorDict
from torchrl.data import Unbounded
from torchrl.envs import TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import IndependentNormal, TanhNormal

from agents import Agent, make_actor
from agents.gsde import clip_env_actions, clips_actions
from agents.networks import box_policy_kwargs, fixed_action_dims
from envs import make_env
from errors import InputError
from recipes import a2c, ppo, rnd_ppo, sac, td3
from training import RunConfig, make_collector, make_training_env, quiet


def pendulum_actor(squash):
    env = make_env("Pendulum-v1", num_envs=1)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, squash=squash)
    return env, actor


def test_an_unsquashed_actor_samples_an_unbounded_gaussian_and_acts_with_its_mean():
    torch.manual_seed(0)
    env, actor = pendulum_actor(squash=False)
    observation = env.reset()
    assert isinstance(actor.get_dist(observation.clone()), IndependentNormal)
    assert isinstance(pendulum_actor(squash=True)[1].get_dist(observation.clone()), TanhNormal)
    with torch.no_grad():
        last = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)][-1]
        last.bias.fill_(5.0)  # a mean far outside Pendulum's [-2, 2]
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            output = actor(observation.clone())
        assert torch.allclose(output["action"], output["loc"])
        assert (output["action"] > 2.0).all()  # not squashed: the env clips, the data keeps the mean
        with set_exploration_type(ExplorationType.RANDOM):
            sampled = actor(observation.expand(4096).clone())
    distribution = IndependentNormal(sampled["loc"], sampled["scale"])
    assert torch.allclose(sampled["action_log_prob"], distribution.log_prob(sampled["action"]))
    noise = sampled["action"] - sampled["loc"]  # Gaussian noise of the learned scale around the mean
    assert noise.mean().item() == pytest.approx(0.0, abs=0.1)
    assert (noise / sampled["scale"]).std().item() == pytest.approx(1.0, abs=0.1)
    env.close()


def test_the_clipping_env_steps_with_clipped_actions_and_keeps_the_policys_action():
    clipped = clip_env_actions(make_env("Pendulum-v1", num_envs=1, seed=3))
    bounded = make_env("Pendulum-v1", num_envs=1, seed=3)
    out_of_bounds = clipped.reset().set("action", torch.tensor([[7.5]]))
    at_bound = bounded.reset().set("action", torch.tensor([[2.0]]))
    step, reference = clipped.step(out_of_bounds), bounded.step(at_bound)
    assert step["action"].item() == 7.5  # what the policy sampled, whose log-probability was recorded
    assert torch.equal(step["next", "observation"], reference["next", "observation"])
    assert torch.equal(step["next", "reward"], reference["next", "reward"])
    clipped.close()
    bounded.close()
    with pytest.raises(InputError, match="bounded Box action space"):
        clip_env_actions(make_env("CartPole-v1", num_envs=1))


@pytest.mark.parametrize("backend", ["gymnasium", "torch"])
def test_both_env_backends_clip_in_place_or_through_a_transform(backend):
    """A Gymnasium env clips in NumPy inside its step (no TransformedEnv layer); a torch env gets the transform."""
    plain = make_env("MountainCarContinuous-v0", num_envs=2, seed=3, backend=backend)
    assert not clips_actions(plain)
    clipped = clip_env_actions(plain)
    assert clips_actions(clipped)
    assert isinstance(clipped, TransformedEnv) == (backend == "torch")
    reference = make_env("MountainCarContinuous-v0", num_envs=2, seed=3, backend=backend)
    step = clipped.step(clipped.reset().set("action", torch.tensor([[7.5], [-3.0]])))
    expected = reference.step(reference.reset().set("action", torch.tensor([[1.0], [-1.0]])))
    assert step["action"].flatten().tolist() == [7.5, -3.0]
    assert torch.equal(step["next", "reward"], expected["next", "reward"])  # the env's penalty on |action|
    assert torch.equal(step["next", "observation"], expected["next", "observation"])
    clipped.close()
    reference.close()


def test_a_discrete_gymnasium_env_refuses_to_clip_in_one_line():
    env = make_env("CartPole-v1", num_envs=1)
    with pytest.raises(InputError, match="bounded Box action space") as error:
        env.clip_actions = True
    assert "\n" not in str(error.value) and not env.clip_actions
    env.close()


def test_box_policy_kwargs_refuse_no_squash_for_discrete_actions_and_ignore_it_for_gsde():
    box = make_env("Pendulum-v1", num_envs=1).action_spec
    assert box_policy_kwargs(box) == {}
    assert box_policy_kwargs(box, -2.0, squash=False) == {"log_std_init": -2.0, "squash": False}
    assert box_policy_kwargs(box, squash=False, use_sde=True) == {}  # gSDE's policy is unsquashed already
    with pytest.raises(InputError, match="--no-squash makes a Box action policy unbounded"):
        box_policy_kwargs(make_env("CartPole-v1", num_envs=1).action_spec, squash=False)


@pytest.mark.parametrize(
    "recipe, config_class", [(ppo, ppo.PPOConfig), (a2c, a2c.A2CConfig), (rnd_ppo, rnd_ppo.RNDPPOConfig)]
)
def test_recipes_train_save_and_reload_unsquashed_policies(recipe, config_class, tmp_path):
    config = quiet(
        config_class(), tmp_path / "run", env_id="Pendulum-v1", num_envs=2, total_frames=256, eval_every=256,
        eval_episodes=1,
    )  # fmt: skip
    config.network.squash = False
    config.network.log_std_init = 1.0  # wide samples: many fall outside the Box and reach the env clipped
    if recipe is not a2c:
        config.collector.steps_per_env = 64
        config.optim.minibatch_size = 64
    recipe.main(config)
    agent = Agent.load(tmp_path / "run" / "agent.ckpt")
    assert agent.policy_kwargs["squash"] is False
    actions = agent.predict(np.zeros((256, 3), dtype=np.float32), deterministic=False)
    assert np.abs(actions).max() <= 2.0 and (np.abs(actions) == 2.0).any()  # clipped into Pendulum's Box
    distribution = agent.policy.get_dist(TensorDict({"observation": torch.zeros(1, 3)}, [1]))
    assert isinstance(distribution, IndependentNormal)


def test_no_squash_on_a_discrete_env_is_one_line(tmp_path):
    config = quiet(ppo.PPOConfig(), tmp_path / "run", env_id="CartPole-v1", total_frames=64)
    config.network.squash = False
    with pytest.raises(InputError) as error:
        ppo.main(config)
    assert "--no-squash" in str(error.value) and "\n" not in str(error.value)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend", ["single", "multiprocess"])
def test_every_collector_backend_steps_its_envs_with_clipped_actions(backend, monkeypatch):
    """Worker processes build their own envs: they must clip as the recipe's env does."""
    tests_folder = str(Path(__file__).parent)
    monkeypatch.syspath_prepend(tests_folder)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests_folder, os.environ.get("PYTHONPATH", "")]))
    run = RunConfig(env_id="echo_env:EchoAction-v0", num_envs=4, collector_backend=backend, num_workers=2)
    env = clip_env_actions(make_training_env(run, torch.device("cpu")))
    actor = make_actor(env.observation_spec["observation"], env.action_spec, log_std_init=2.0, squash=False)
    collector = make_collector(run, env, actor, torch.device("cpu"), 32, 320)
    batch = next(iter(collector))
    collector.shutdown()
    env.close()
    assert batch["action"].abs().max() > 1.0  # the policy's samples, kept unclipped for their log-probability
    assert torch.equal(batch["next", "observation"], batch["action"].clamp(-1.0, 1.0))  # what the envs got


def test_a_box_with_an_infinite_bound_gets_an_unsquashed_gaussian_and_the_squashing_recipes_refuse_it(
    tmp_path,
):
    env = make_env("echo_env:MixedBoundsEcho-v0", num_envs=2)
    spec = env.action_spec
    assert isinstance(spec, Unbounded)
    assert box_policy_kwargs(spec) == {"squash": False}
    assert box_policy_kwargs(spec, use_sde=True) == {}
    with pytest.raises(
        InputError, match="infinite bound has no range to squash the policy into: build it with squash=False"
    ):
        make_actor(env.observation_spec["observation"], spec)
    actor = make_actor(env.observation_spec["observation"], spec, **box_policy_kwargs(spec))
    assert isinstance(actor.get_dist(env.reset()), IndependentNormal)
    env.close()
    for recipe in (sac, td3):
        config = quiet(
            recipe.SACConfig() if recipe is sac else recipe.TD3Config(),
            tmp_path / "run",
            env_id="echo_env:MixedBoundsEcho-v0",
            total_frames=64,
        )
        with pytest.raises(InputError) as error:
            recipe.main(config)
        assert "has an infinite bound" in str(error.value) and "\n" not in str(error.value)


def test_a_box_with_a_fixed_dim_gets_an_unsquashed_gaussian_that_acts_at_its_value_and_sac_refuses_it(
    tmp_path,
):
    env = make_env("echo_env:FixedDimEcho-v0", num_envs=2)
    spec = env.action_spec
    assert fixed_action_dims(spec) == [1]
    assert box_policy_kwargs(spec) == {"squash": False}
    with pytest.raises(InputError, match=r"Box action dims \[1\] have low equal to high"):
        make_actor(env.observation_spec["observation"], spec)
    env.close()
    config = quiet(ppo.PPOConfig(), tmp_path / "ppo", env_id="echo_env:FixedDimEcho-v0", total_frames=64)
    config.collector.steps_per_env, config.optim.minibatch_size, config.run.eval_episodes = 32, 32, 1
    ppo.main(config)
    agent = Agent.load(tmp_path / "ppo")
    assert agent.policy_kwargs["squash"] is False
    actions = agent.predict(np.random.default_rng(0).uniform(-1, 1, (16, 2)).astype(np.float32))
    assert (actions[:, 1] == 0.5).all() and (np.abs(actions[:, 0]) <= 1.0).all()
    config = quiet(sac.SACConfig(), tmp_path / "sac", env_id="echo_env:FixedDimEcho-v0", total_frames=64)
    with pytest.raises(InputError, match="low equal to high") as error:
        sac.main(config)
    assert "\n" not in str(error.value)


def test_the_training_env_clips_only_the_finite_bounds_of_a_box_with_an_infinite_one():
    run = RunConfig(env_id="echo_env:MixedBoundsEcho-v0", num_envs=4)
    env = clip_env_actions(make_training_env(run, torch.device("cpu")))
    assert clips_actions(env)
    actor = make_actor(env.observation_spec["observation"], env.action_spec, log_std_init=2.0, squash=False)
    collector = make_collector(run, env, actor, torch.device("cpu"), 32, 320)
    batch = next(iter(collector))
    collector.shutdown()
    env.close()
    action = batch["action"]
    assert action[..., 0].abs().max() > 1.0 and action[..., 1].abs().max() > 1.0
    assert torch.equal(batch["next", "observation"][..., 0], action[..., 0].clamp(-1.0, 1.0))
    assert torch.equal(batch["next", "observation"][..., 1], action[..., 1])


@pytest.mark.parametrize("recipe", ["ppo", "a2c"])
def test_policy_gradient_recipes_learn_a_box_unbounded_both_ways(tmp_path, recipe):
    # the untrained policy's mean action is about 0: -20 a ten-step episode on targets uniform in [-4, 4]
    make_config, main = (tiny_ppo, ppo.main) if recipe == "ppo" else (tiny_a2c, a2c.main)
    config = make_config(tmp_path / "run", env_id="echo_env:Reach-v0", total_frames=8_192, seed=0)
    config.run.eval_every = config.run.total_frames
    quiet(config, tmp_path / "run")
    assert main(config)["eval_return_mean"] >= -8.0
    agent = Agent.load(tmp_path / "run" / "agent.ckpt")
    action = agent.predict(np.array([3.0], np.float32))
    assert action.shape == (1,) and abs(float(action[0]) - 3.0) < 1.5
