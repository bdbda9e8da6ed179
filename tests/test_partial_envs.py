"""Partially observed CartPole (``rlkit/CartPoleNoVelocity-v1``): CartPole-v1's positions only."""

import gymnasium as gym
import numpy as np

import envs  # noqa: F401 - registers the rlkit/ ids
from envs import make_env


def test_cartpole_without_velocities_shows_the_positions_of_cartpole():
    partial, full = gym.make("rlkit/CartPoleNoVelocity-v1"), gym.make("CartPole-v1")
    assert partial.observation_space.shape == (2,) and partial.spec.max_episode_steps == 500
    assert partial.spec.reward_threshold == 475.0
    observation, _ = partial.reset(seed=3)
    state, _ = full.reset(seed=3)
    for _ in range(20):
        np.testing.assert_array_equal(observation, state[[0, 2]])  # cart position and pole angle
        observation, reward, terminated, _, _ = partial.step(1)
        state, full_reward, full_terminated, _, _ = full.step(1)
        assert (reward, terminated) == (full_reward, full_terminated)
        if terminated:
            break


def test_it_trains_like_any_registered_env():
    env = make_env("rlkit/CartPoleNoVelocity-v1", 2, seed=0)
    assert env.observation_spec["observation"].shape == (2, 2)
    assert env.rollout(5)["observation"].shape == (2, 5, 2)
    env.close()
