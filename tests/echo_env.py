"""An env that shows what reached it: its observation is the action it was last stepped with. Importing this module
registers ``EchoAction-v0`` (``--env-id echo_env:EchoAction-v0`` with the tests folder on ``PYTHONPATH``)."""

import gymnasium as gym
import numpy as np


class EchoAction(gym.Env):
    """Box(-1, 1) actions, taken as they come (no clipping, as MuJoCo's envs); the observation repeats the last one."""

    observation_space = gym.spaces.Box(-100.0, 100.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        return np.asarray(action, np.float32).copy(), 0.0, False, False, {}


gym.register("EchoAction-v0", entry_point=EchoAction, max_episode_steps=20)


class MixedBoundsEcho(EchoAction):
    """EchoAction with a Box bounded in its first dim only, ``[-1, 1] x (-inf, inf)``: a Gymnasium Box with an
    infinite bound."""

    action_space = gym.spaces.Box(np.array([-1.0, -np.inf], np.float32), np.array([1.0, np.inf], np.float32))


class FixedDimEcho(EchoAction):
    """EchoAction whose second action dim is fixed, ``[-1, 1] x [0.5, 0.5]`` (low equal to high)."""

    action_space = gym.spaces.Box(np.array([-1.0, 0.5], np.float32), np.array([1.0, 0.5], np.float32))


class UnevenEcho(EchoAction):
    """EchoAction with action dims of different widths and off-centre, ``[0, 4] x [-50, -10]`` (half-widths 2 and
    20)."""

    action_space = gym.spaces.Box(np.array([0.0, -50.0], np.float32), np.array([4.0, -10.0], np.float32))


class Reach(gym.Env):
    """Say a number: the observation is a target in [-4, 4], the reward minus the action's distance to it, with an
    action space unbounded both ways (``Box(-inf, inf, (1,))``); ten steps an episode, a new target each step."""

    observation_space = gym.spaces.Box(-4.0, 4.0, (1,), np.float32)
    action_space = gym.spaces.Box(-np.inf, np.inf, (1,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = self.np_random.uniform(-4.0, 4.0, (1,)).astype(np.float32)
        return self.target.copy(), {}

    def step(self, action):
        reward = -float(np.abs(np.asarray(action) - self.target).sum())
        self.target = self.np_random.uniform(-4.0, 4.0, (1,)).astype(np.float32)
        return self.target.copy(), reward, False, False, {}


gym.register("MixedBoundsEcho-v0", entry_point=MixedBoundsEcho, max_episode_steps=20)
gym.register("FixedDimEcho-v0", entry_point=FixedDimEcho, max_episode_steps=20)
gym.register("UnevenEcho-v0", entry_point=UnevenEcho, max_episode_steps=20)
gym.register("Reach-v0", entry_point=Reach, max_episode_steps=10)
