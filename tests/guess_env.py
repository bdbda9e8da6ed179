"""A user's own env, as README shows it: importing this module registers ``Guess-v0``, so every recipe trains on it
with ``--env-id guess_env:Guess-v0`` (Gymnasium's ``module:EnvId`` form) when the module is on ``PYTHONPATH``."""

import gymnasium as gym
import numpy as np


class Guess(gym.Env):
    """Say which side the marker is on: reward 1 per step for the right side, ten steps an episode."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 4}  # noqa: RUF012 - Gymnasium's convention
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, render_mode=None):
        self.render_mode = render_mode

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.side, self.steps = int(self.np_random.integers(2)), 0
        return np.array([2 * self.side - 1, 0], np.float32), {}

    def step(self, action):
        self.steps += 1
        observation = np.array([2 * self.side - 1, self.steps / 10], np.float32)
        return observation, float(action == self.side), False, self.steps >= 10, {}

    def render(self):
        return np.full((64, 64, 3), 255 * self.side, np.uint8)


gym.register("Guess-v0", entry_point=Guess, max_episode_steps=10, reward_threshold=9.5)
