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
