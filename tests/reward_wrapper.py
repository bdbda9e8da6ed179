"""A wrapper that lives outside Gymnasium and the toolkit (tests of --env-wrappers and allow_wrappers)."""

import gymnasium as gym


class ScaleReward(gym.RewardWrapper):
    """Multiply every reward by ``scale``."""

    def __init__(self, env: gym.Env, scale: float = 1.0):
        super().__init__(env)
        self.scale = scale

    def reward(self, reward):
        return self.scale * reward


NOT_A_WRAPPER = 3
