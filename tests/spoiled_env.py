"""An env that goes wrong on request, registered on import (``spoiled_env:Spoiled-v0``): its observations turn NaN
from step ``nan_at`` on (0: already at reset), or with ``nan_reward`` its rewards do; ``box`` gives it Box actions;
``frame`` is the shape of the frames it renders (odd sizes, grayscale). Otherwise action 0 earns 1 a step, for 20
steps an episode."""

import gymnasium as gym
import numpy as np


class Spoiled(gym.Env):
    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}  # noqa: RUF012 - Gymnasium's convention
    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)

    def __init__(self, nan_at=None, nan_reward=False, box=False, frame=(32, 32, 3), render_mode=None):
        self.nan_at, self.nan_reward, self.frame, self.render_mode = (
            nan_at,
            nan_reward,
            tuple(frame),
            render_mode,
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32) if box else gym.spaces.Discrete(2)

    def _spoiled(self) -> bool:
        return self.nan_at is not None and self.steps >= self.nan_at

    def _observation(self) -> np.ndarray:
        observation = self.np_random.uniform(-1, 1, 3).astype(np.float32)
        return observation * np.nan if self._spoiled() and not self.nan_reward else observation

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._observation(), {}

    def step(self, action):
        if not self.action_space.contains(np.asarray(action, self.action_space.dtype)):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        self.steps += 1
        reward = float(np.all(np.asarray(action) <= 0))
        reward = float("nan") if self._spoiled() and self.nan_reward else reward
        return self._observation(), reward, False, self.steps >= 20, {}

    def render(self):
        return np.full(self.frame, 128, np.uint8)


gym.register("Spoiled-v0", entry_point=Spoiled, max_episode_steps=20)
