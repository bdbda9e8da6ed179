"""Partially observed classic control, for policies with memory: ``rlkit/CartPoleNoVelocity-v1`` is CartPole-v1
that shows only the cart's position and the pole's angle (its two velocities hidden), so a policy must infer them
from the observations it has seen. Same dynamics, rewards, time limit (500) and reward threshold (475)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

from envs.deepsea import NAMESPACE

POSITIONS = (0, 2)  # CartPole's observation: cart position, cart velocity, pole angle, pole angular velocity


class PositionsOnly(gym.ObservationWrapper):
    """Keep the entries ``indices`` of a Box observation (by default CartPole's positions, dropping velocities).

    Examples:
        >>> env = PositionsOnly(gym.make("CartPole-v1"))
        >>> env.observation_space.shape
        (2,)
    """

    def __init__(self, env: gym.Env, indices: tuple[int, ...] = POSITIONS):
        super().__init__(env)
        self.indices = list(indices)
        space = env.observation_space
        self.observation_space = gym.spaces.Box(
            space.low[self.indices], space.high[self.indices], dtype=space.dtype
        )

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return observation[self.indices]


def make_cartpole_no_velocity(**kwargs) -> gym.Env:
    return PositionsOnly(gym.make("CartPole-v1", **kwargs).unwrapped)


def register_partial_envs() -> None:
    """Register ``rlkit/CartPoleNoVelocity-v1`` (idempotent)."""
    env_id = f"{NAMESPACE}/CartPoleNoVelocity-v1"
    if env_id not in gym.registry:
        gym.register(
            id=env_id, entry_point=make_cartpole_no_velocity, max_episode_steps=500, reward_threshold=475.0
        )


register_partial_envs()
