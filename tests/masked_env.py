"""An env with action masks (Gymnasium's ``info["action_mask"]``), registered on import as
``masked_env:PickAllowed-v0``: each step allows a random non-empty subset of four actions; an allowed action earns
1 if it is the highest allowed one, else 0; a forbidden one costs 10 and ends the episode. Ten steps an episode:
a perfect policy scores 10, a uniformly random one about -8."""

import gymnasium as gym
import numpy as np

ACTIONS = 4


class PickAllowed(gym.Env):
    observation_space = gym.spaces.Box(0.0, 1.0, (ACTIONS,), np.float32)  # the allowed actions, as 0/1
    action_space = gym.spaces.Discrete(ACTIONS)

    def _draw(self) -> tuple[np.ndarray, dict]:
        self.mask = self.np_random.integers(0, 2, ACTIONS).astype(np.int8)
        if not self.mask.any():
            self.mask[self.np_random.integers(ACTIONS)] = 1
        return self.mask.astype(np.float32), {"action_mask": self.mask.copy()}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return self._draw()

    def step(self, action):
        self.steps += 1
        if not self.mask[action]:
            observation, info = self._draw()
            return observation, -10.0, True, False, info
        reward = float(action == np.flatnonzero(self.mask).max())
        observation, info = self._draw()
        return observation, reward, False, self.steps >= 10, info


gym.register("PickAllowed-v0", entry_point=PickAllowed, max_episode_steps=10)


class PickAllowedDict(PickAllowed):
    """The same, with the mask given as the ``"action_mask"`` entry of a Dict observation (PettingZoo's
    convention) instead of in ``info``."""

    observation_space = gym.spaces.Dict(
        {
            "observation": gym.spaces.Box(0.0, 1.0, (ACTIONS,), np.float32),
            "action_mask": gym.spaces.MultiBinary(ACTIONS),
        }
    )

    def _draw(self) -> tuple[dict, dict]:
        observation, info = super()._draw()
        return {"observation": observation, "action_mask": info["action_mask"]}, {}


gym.register("PickAllowedDict-v0", entry_point=PickAllowedDict, max_episode_steps=10)
