"""Envs with factorised discrete actions, registered on import (``copy_env:CopyDigits-v0``,
``copy_env:CopyBits-v0``): copy the digits or bits shown, one reward per component copied right, ten steps an
episode. A random policy scores 10/3 (digits) and 5 (bits) an episode; a perfect one 10."""

import gymnasium as gym
import numpy as np

COMPONENTS = 3


class Copy(gym.Env):
    """Observation: ``COMPONENTS`` values in [0, levels) scaled to [0, 1]; action: the values themselves. The reward
    of a step is the fraction of components copied right."""

    def __init__(self, levels: int, start: int = 0):
        self.levels, self.start = levels, start
        self.observation_space = gym.spaces.Box(0.0, 1.0, (COMPONENTS,), np.float32)
        if levels == 2 and start == 0:
            self.action_space = gym.spaces.MultiBinary(COMPONENTS)
        else:
            self.action_space = gym.spaces.MultiDiscrete([levels] * COMPONENTS, start=[start] * COMPONENTS)

    def _observe(self) -> np.ndarray:
        self.target = self.np_random.integers(self.levels, size=COMPONENTS)
        return (self.target / (self.levels - 1)).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._observe(), {}

    def step(self, action):
        action = np.asarray(action)
        if not self.action_space.contains(action.astype(self.action_space.dtype)):
            raise ValueError(f"{action} is not in {self.action_space}")
        reward = float(np.mean(action - self.start == self.target))
        self.steps += 1
        return self._observe(), reward, False, self.steps >= 10, {}


gym.register("CopyDigits-v0", entry_point=Copy, kwargs={"levels": 3, "start": -1}, max_episode_steps=10)
gym.register("CopyBits-v0", entry_point=Copy, kwargs={"levels": 2}, max_episode_steps=10)
