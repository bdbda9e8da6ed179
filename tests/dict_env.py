"""An env with Dict observations, registered on import as ``dict_env:GoalReach-v0``: a vector entry (the agent's
position and the goal's, on a line), a Discrete entry (the goal's side) and a small uint8 image; reach the goal.
Ten steps an episode, reward 1 per step at the goal: a perfect policy scores about 8, a random one about 2."""

import gymnasium as gym
import numpy as np


class GoalReach(gym.Env):
    observation_space = gym.spaces.Dict(
        {
            "position": gym.spaces.Box(-1.0, 1.0, (2,), np.float32),  # agent, goal
            "side": gym.spaces.Discrete(2),  # 1: the goal is to the right
            "view": gym.spaces.Box(0, 255, (1, 36, 36), np.uint8),
        }
    )
    action_space = gym.spaces.Discrete(3)  # left, stay, right

    def _observe(self):
        view = np.zeros((1, 36, 36), np.uint8)
        view[0, :, int((self.goal + 1) * 17.5)] = 255
        position = np.array([self.position, self.goal], np.float32)
        return {"position": position, "side": int(self.goal > self.position), "view": view}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position, self.goal, self.steps = 0.0, float(self.np_random.choice([-0.5, 0.5])), 0
        return self._observe(), {}

    def step(self, action):
        self.position = float(np.clip(self.position + 0.25 * (int(action) - 1), -1, 1))
        self.steps += 1
        return self._observe(), float(abs(self.position - self.goal) < 1e-6), False, self.steps >= 10, {}


gym.register("GoalReach-v0", entry_point=GoalReach, max_episode_steps=10)


class GoalReachContinuous(GoalReach):
    """The same with a Box action: the move, scaled to at most 0.25 a step; reward 1 per step within 0.1 of the goal."""

    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def step(self, action):
        self.position = float(np.clip(self.position + 0.25 * float(np.asarray(action).reshape(-1)[0]), -1, 1))
        self.steps += 1
        return self._observe(), float(abs(self.position - self.goal) < 0.1), False, self.steps >= 10, {}


gym.register("GoalReachContinuous-v0", entry_point=GoalReachContinuous, max_episode_steps=10)
