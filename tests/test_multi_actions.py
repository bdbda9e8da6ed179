"""MultiDiscrete and MultiBinary actions: the factorised policies, the builders' choice by exact space type, PPO
and A2C learning to copy digits and bits (envs in ``tests/copy_env.py``), the agent's round trip, and the
recipes that refuse them."""

import copy_env  # noqa: F401 - registers CopyDigits-v0 and CopyBits-v0
import gymnasium as gym
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torch import distributions as D

from agents import Agent
from agents.distributions import FactorisedBernoulli, FactorisedCategorical
from agents.networks import make_actor
from agents.qvalue import make_q_actor
from envs import make_env
from envs.specs import space_to_spec
from errors import InputError
from recipes import a2c, dqn, es, ppo, qlearning, reinforce, sac
from training import quiet


def test_factorised_categorical_is_the_product_of_its_components():
    logits = torch.randn(4, 5)
    dist = FactorisedCategorical(logits, nvec=[2, 3])
    first, second = D.Categorical(logits=logits[:, :2]), D.Categorical(logits=logits[:, 2:])
    action = dist.sample()
    assert action.shape == (4, 2) and (action[:, 0] < 2).all() and (action[:, 1] < 3).all()
    torch.testing.assert_close(
        dist.log_prob(action), first.log_prob(action[:, 0]) + second.log_prob(action[:, 1])
    )
    torch.testing.assert_close(dist.entropy(), first.entropy() + second.entropy())
    assert torch.equal(
        dist.deterministic_sample, torch.stack([logits[:, :2].argmax(-1), logits[:, 2:].argmax(-1)], -1)
    )
    with pytest.raises(ValueError, match="5 logits for components of sizes"):
        FactorisedCategorical(logits, nvec=[2, 2])


def test_factorised_bernoulli_is_the_product_of_its_components():
    logits = torch.randn(4, 3)
    dist = FactorisedBernoulli(logits)
    action = dist.sample()
    assert action.shape == (4, 3) and set(action.unique().tolist()) <= {0.0, 1.0}
    reference = D.Bernoulli(logits=logits)
    torch.testing.assert_close(dist.log_prob(action.to(torch.int8)), reference.log_prob(action).sum(-1))
    torch.testing.assert_close(dist.entropy(), reference.entropy().sum(-1))
    assert torch.equal(dist.deterministic_sample, (logits > 0).float())


@pytest.mark.parametrize(
    ("space", "distribution"),
    [
        (gym.spaces.Discrete(4), D.Categorical),
        (gym.spaces.MultiDiscrete([2, 3, 4]), FactorisedCategorical),
        (gym.spaces.MultiBinary(3), FactorisedBernoulli),
    ],
    ids=["Discrete", "MultiDiscrete", "MultiBinary"],
)
def test_make_actor_picks_the_policy_by_the_exact_space_type(space, distribution):
    observation_spec = space_to_spec(gym.spaces.Box(-1, 1, (2,), np.float32), 5)
    actor = make_actor(observation_spec, space_to_spec(space, 5))
    output = actor(TensorDict(observation=observation_spec.rand(), batch_size=[5]))
    assert isinstance(actor.get_dist(output), distribution)
    assert all(space.contains(action.numpy().astype(space.dtype)) for action in output["action"])
    output["action_log_prob"].sum().backward()  # gradients reach the network
    assert all(parameter.grad is not None for parameter in actor.parameters())


def test_builders_for_discrete_actions_only_refuse_the_factorised_spaces():
    observation_spec = space_to_spec(gym.spaces.Box(-1, 1, (2,), np.float32), 1)
    for space in (gym.spaces.MultiDiscrete([2, 3]), gym.spaces.MultiBinary(3)):
        with pytest.raises(InputError, match="DQN needs a Discrete action space.*recipes.ppo or recipes.a2c"):
            make_q_actor(observation_spec, space_to_spec(space, 1))
    with pytest.raises(InputError, match="MultiDiscrete actions must be one-dimensional per env"):
        make_actor(observation_spec, space_to_spec(gym.spaces.MultiDiscrete([[2, 3], [2, 3]]), 1))


def copy_config(module, config_type, env_id, output_dir, **run):
    config = config_type()
    quiet(config, output_dir, env_id=env_id, num_envs=8, eval_every=5_000, eval_episodes=10, **run)
    return config


@pytest.mark.learning
def test_ppo_learns_to_copy_digits_with_a_multidiscrete_policy(output_dir):
    config = copy_config(ppo, ppo.PPOConfig, "copy_env:CopyDigits-v0", output_dir, total_frames=20_000)
    config.collector.steps_per_env, config.optim.minibatch_size, config.optim.num_epochs = 32, 64, 4
    config.optim.lr = 3e-3
    summary = ppo.main(config)
    assert summary["eval_return_mean"] >= 9.5  # random: 10/3


@pytest.mark.learning
def test_a2c_learns_to_copy_bits_with_a_multibinary_policy(output_dir):
    summary = a2c.main(
        copy_config(a2c, a2c.A2CConfig, "copy_env:CopyBits-v0", output_dir, total_frames=20_000)
    )
    assert summary["eval_return_mean"] >= 9.5  # random: 5


def test_a_multidiscrete_agent_acts_in_its_space_and_round_trips(output_dir):
    config = copy_config(
        reinforce, reinforce.ReinforceConfig, "copy_env:CopyDigits-v0", output_dir, total_frames=512
    )
    reinforce.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")
    space = agent.action_space
    assert (
        isinstance(space, gym.spaces.MultiDiscrete) and (space.start == -1).all()
    )  # the start offset is kept
    env = gym.make("copy_env:CopyDigits-v0")
    observation, _ = env.reset(seed=0)
    action = agent.predict(observation)
    assert action.shape == (3,) and space.contains(action)
    assert agent.predict(np.stack([observation, observation])).shape == (2, 3)
    result = agent.evaluate(episodes=2, seed=0)
    assert result.lengths.tolist() == [10, 10]


def test_training_env_steps_multidiscrete_actions_from_their_start():
    env = make_env("copy_env:CopyDigits-v0", 2, seed=0)
    rollout = env.rollout(
        3, auto_reset=True
    )  # random actions in [0, 3): the env sees them shifted to [-1, 2)
    assert rollout["action"].min() >= 0 and rollout["action"].max() <= 2
    env.close()


@pytest.mark.parametrize(
    ("main", "config_type", "message"),
    [
        (dqn.main, dqn.DQNConfig, "DQN needs a Discrete action space"),
        (sac.main, sac.SACConfig, "SAC needs a Box"),
        (qlearning.main, qlearning.QLearningConfig, "Tabular Q-learning needs a Discrete action space"),
        (
            es.main,
            es.ESConfig,  # the Gymnasium space's name, not TorchRL's spec's
            "Evolution Strategies handle Discrete and one-dimensional Box actions, got Multi(Discrete|Binary) actions",
        ),
    ],
    ids=["dqn", "sac", "qlearning", "es"],
)
def test_recipes_without_factorised_policies_say_which_do(main, config_type, message, output_dir):
    config = copy_config(None, config_type, "copy_env:CopyBits-v0", output_dir, total_frames=512)
    with pytest.raises(InputError, match=message + r".*recipes\.ppo"):
        main(config)
