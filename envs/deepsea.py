"""DeepSea (Osband et al. 2019, "Behaviour Suite for Reinforcement Learning", arXiv:1908.03568): a sparse-reward
exploration task, registered with Gymnasium as ``rlkit/DeepSea-v0`` (size 10) and ``rlkit/DeepSea<N>-v0``.

The agent starts in the top-left cell of an ``N x N`` grid and descends one row per step, moving one column left
or right, so every episode lasts exactly ``N`` steps. Moving right costs ``0.01 / N``; moving right out of the
bottom-right cell pays 1. The only rewarding episode takes ``N`` right moves in a row (return ``0.99``); every
other episode returns at most 0, so a policy that is not driven to explore learns to stay left. Which of the two
actions means "right" is drawn per cell (fixed by ``mapping_seed``), so no single action repeated finds the
treasure: a uniformly random policy finds it once every ``2**N`` episodes.

    >>> import gymnasium as gym
    >>> env = gym.make("rlkit/DeepSea-v0")
    >>> observation, _ = env.reset(seed=0)
    >>> observation.shape  # one-hot position in the flattened 10 x 10 grid
    (100,)
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np

from envs.classic import NAMESPACE
from errors import InputError, is_whole_number

DEFAULT_SIZE = 10
# a one-hot observation of a million cells (4 MB) and its action map: far beyond bsuite's sizes (10 to 50), and a
# bound on what a size read from a file can make the env allocate
MAX_SIZE = 1_024
REGISTERED_SIZES = (5, 8, 10, 12, 14, 16, 20, 30)  # rlkit/DeepSea<N>-v0
UNSCALED_MOVE_COST = 0.01  # bsuite's deep_sea: each right move costs 0.01 / size
REWARD_THRESHOLD = 0.9  # only the episode that reaches the treasure scores above 0 (it scores 1 - 0.01)


class DeepSeaEnv(gym.Env):
    """The DeepSea exploration task of bsuite, with deterministic transitions, behind Gymnasium's ``Env`` API.

    The dynamics, rewards and action mapping follow bsuite's ``deep_sea.DeepSea(deterministic=True)``. The
    observation is the agent's cell as a one-hot vector of the flattened ``size x size`` grid; the observation
    that ends an episode (the agent has left the bottom row) is all zeros. Episodes end by termination after
    exactly ``size`` steps.

    Args:
        size: side of the grid, and the episode length (2 to :data:`MAX_SIZE`).
        randomize_actions: draw per cell which action moves right; when False, action 1 is always right.
        mapping_seed: seed of that draw. The mapping belongs to the task, not to the episode: every sub-env of a
            vector env and every evaluation episode shares it, whatever ``reset(seed=...)`` is given.
        move_cost: cost of the right moves of one episode taken together (each costs ``move_cost / size``).
        render_mode: ``None`` or ``"rgb_array"``.

    Examples:
        >>> env = DeepSeaEnv(size=3, randomize_actions=False)
        >>> _ = env.reset(seed=0)
        >>> [env.step(1)[1] for _ in range(3)]  # right, right, right: the treasure minus the move costs
        [-0.0033333333333333335, -0.0033333333333333335, 0.9966666666666667]
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 4}

    def __init__(
        self,
        size: int = DEFAULT_SIZE,
        randomize_actions: bool = True,
        mapping_seed: int = 0,
        move_cost: float = UNSCALED_MOVE_COST,
        render_mode: str | None = None,
    ):
        if not is_whole_number(size) or not 2 <= size <= MAX_SIZE:
            raise InputError(f"DeepSea size must be a whole number from 2 to {MAX_SIZE}, got {size!r:.40}.")
        if render_mode not in (None, "rgb_array"):
            raise InputError(f"DeepSea renders only with render_mode='rgb_array', got {render_mode!r}.")
        self.size = size
        self.move_cost = move_cost
        self.render_mode = render_mode
        if randomize_actions:
            # bsuite: mapping_rng.binomial(1, 0.5, [size, size]); "right" is the action equal to the cell's entry
            self.action_mapping = np.random.default_rng(mapping_seed).integers(0, 2, size=(size, size))
        else:
            self.action_mapping = np.ones((size, size), dtype=np.int64)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(size * size,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.row, self.column = 0, 0

    def _observation(self) -> np.ndarray:
        observation = np.zeros(self.size * self.size, dtype=np.float32)
        if self.row < self.size:
            observation[self.row * self.size + self.column] = 1.0
        return observation

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.row, self.column = 0, 0
        return self._observation(), {}

    def step(self, action):
        if self.row >= self.size:
            raise RuntimeError("DeepSea episode is over: call reset() before step().")
        if not self.action_space.contains(action):
            raise InputError(f"DeepSea actions are 0 or 1 (Discrete(2)), got {action!r}.")
        right = int(action) == self.action_mapping[self.row, self.column]
        reward = 0.0
        if right and self.column == self.size - 1:
            reward += 1.0
        if right:
            self.column = min(self.column + 1, self.size - 1)
            reward -= self.move_cost / self.size
        else:
            self.column = max(self.column - 1, 0)
        self.row += 1
        terminated = self.row == self.size
        return self._observation(), reward, terminated, False, {}

    def render(self) -> np.ndarray | None:
        """An RGB image of the grid: the agent in white, the treasure in gold, cells it cannot reach dark."""
        if self.render_mode != "rgb_array":
            gym.logger.warn("DeepSeaEnv renders only with render_mode='rgb_array'.")
            return None
        cell = max(4, 256 // self.size)
        rows, columns = np.indices((self.size, self.size))
        image = np.where((columns <= rows)[..., None], [[30, 60, 120]], [[10, 15, 30]]).astype(np.uint8)
        image[-1, -1] = (230, 180, 30)
        image[min(self.row, self.size - 1), self.column] = (255, 255, 255)
        return np.kron(image, np.ones((cell, cell, 1), dtype=np.uint8))


def register_deepsea_envs() -> None:
    """Register ``rlkit/DeepSea-v0`` (size 10) and ``rlkit/DeepSea<N>-v0`` for each size in
    ``REGISTERED_SIZES`` (idempotent). Other sizes: ``gymnasium.make("rlkit/DeepSea-v0", size=N)``."""
    ids = {f"{NAMESPACE}/DeepSea-v0": DEFAULT_SIZE}
    ids.update({f"{NAMESPACE}/DeepSea{size}-v0": size for size in REGISTERED_SIZES})
    for env_id, size in ids.items():
        if env_id not in gym.registry:
            gym.register(
                id=env_id, entry_point=DeepSeaEnv, reward_threshold=REWARD_THRESHOLD, kwargs={"size": size}
            )


register_deepsea_envs()
