"""Envs whose observations take the less common Box forms: images channels last ``(H, W, 3)``, grayscale ``(H,
W)`` or two stacked RGB frames ``(2, H, W, 3)`` (``Look-v0``), a scalar Box ``()`` and an integer Box
(``Sign-v0``), a scalar Box action (``Nudge-v0``; ``FlatNudge-v0`` wraps it into a vector), and a bandit that
observes nothing, a Box of shape ``(0,)`` (``Bandit-v0``). Importing this module registers them; in the first two
the reward is 1 for the action that names the side the observation shows, ten steps an episode."""

import gymnasium as gym
import numpy as np

IMAGE_SHAPES = {"hwc": (36, 40, 3), "hw": (36, 40), "shwc": (2, 36, 40, 3)}  # shwc: two stacked RGB frames
WIDTH_AXES = {"hwc": 1, "hw": 1, "shwc": 2}


class Sides(gym.Env):
    """Name the side the observation shows (``_observation``): reward 1 for the right action, a new side each step."""

    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.side, self.steps = int(self.np_random.integers(2)), 0
        return self._observation(), {}

    def step(self, action):
        self.steps += 1
        reward = float(action == self.side)
        self.side = int(self.np_random.integers(2))
        return self._observation(), reward, False, self.steps >= 10, {}


class Look(Sides):
    """An image whose left or right half is lit: action 0 for left, 1 for right."""

    def __init__(self, layout: str = "hwc"):
        self.observation_space = gym.spaces.Box(0, 255, IMAGE_SHAPES[layout], np.uint8)
        self.width_axis = WIDTH_AXES[layout]

    def _observation(self) -> np.ndarray:
        image = np.zeros(self.observation_space.shape, np.uint8)
        columns = np.moveaxis(
            image, self.width_axis, 0
        )  # a view: lighting its rows lights the image's columns
        half = len(columns) // 2
        columns[half * self.side : half * (self.side + 1)] = 200
        return image


class Sign(Sides):
    """A scalar Box (``()``, float32), an integer Box (``(2,)``, int64) or a Discrete(2) holding the side:
    action 0 for -1 (Discrete: 0), 1 for +1 (Discrete: 1)."""

    def __init__(self, kind: str = "scalar"):
        self.kind = kind
        if kind == "scalar":
            self.observation_space = gym.spaces.Box(-1.0, 1.0, (), np.float32)
        elif kind == "discrete":
            self.observation_space = gym.spaces.Discrete(2)
        else:
            self.observation_space = gym.spaces.Box(-5, 5, (2,), np.int64)

    def _observation(self) -> np.ndarray:
        sign = 2 * self.side - 1
        if self.kind == "scalar":
            return np.array(sign, np.float32)
        if self.kind == "discrete":
            return self.side
        return np.array([sign * 3, self.steps % 5], np.int64)


class Bandit(gym.Env):
    """Three arms and nothing to observe (an empty Box): arm ``a`` pays ``a / 2``, one pull an episode."""

    observation_space = gym.spaces.Box(0.0, 1.0, (0,), np.float32)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(0, np.float32), {}

    def step(self, action):
        return np.zeros(0, np.float32), int(action) / 2, True, False, {}


class Nudge(gym.Env):
    """A scalar Box action (shape ``()``): say the observed number in [-1, 1], reward minus the distance to it."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-1, 1, (1,)).astype(np.float32)
        return self.target, {}

    def step(self, action):
        reward = -abs(float(action) - float(self.target[0]))
        self.target = self.np_random.uniform(-1, 1, (1,)).astype(np.float32)
        return self.target, reward, False, False, {}


def flat_nudge() -> gym.Env:
    """Nudge with the vector action the recipes need, through the wrapper their error message names."""
    env = Nudge()
    return gym.wrappers.TransformAction(
        env,
        lambda a: a.reshape(env.action_space.shape),
        gym.spaces.Box(env.action_space.low.reshape(-1), env.action_space.high.reshape(-1)),
    )


gym.register("Look-v0", entry_point=Look, max_episode_steps=10)
gym.register("Nudge-v0", entry_point=Nudge, max_episode_steps=10)
gym.register("FlatNudge-v0", entry_point=flat_nudge, max_episode_steps=10)
gym.register("Bandit-v0", entry_point=Bandit)
gym.register("Sign-v0", entry_point=Sign, max_episode_steps=10)
