"""Gymnasium faces of the torch classic-control envs, registered as ``rlkit/<Gymnasium id>``.

``gymnasium.make("rlkit/CartPole-v1")`` gives :class:`TorchClassicEnv` (one env, NumPy in and out, rendering
through Gymnasium's own renderer) and ``gymnasium.make_vec("rlkit/CartPole-v1", num_envs=N)`` gives
:class:`TorchClassicVectorEnv` (N envs stepped as one batch, ``SAME_STEP`` autoreset). Importing ``envs``
registers them; ``gymnasium.make("envs:rlkit/CartPole-v1")`` imports it on the fly.
"""

from __future__ import annotations

from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from tensordict import TensorDict

from envs.classic import NAMESPACE, TORCH_ENVS, ClassicControlEnv, torch_env_class
from envs.rendering import use_headless_video_driver
from errors import InputError

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def _dtype(dtype: str | torch.dtype) -> torch.dtype:
    if dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise InputError(f"dtype must be one of {sorted(DTYPES)} (the physics' precision), got {dtype!r}.")
    return DTYPES[dtype]


def _refuse_invalid_action(task: str, action: Any) -> None:
    """Raise the error Gymnasium's own ``task`` env raises for ``action`` (outside the action space): its step is
    run on the action (a Discrete index out of range: CartPole's and MountainCar's AssertionError, Acrobot's
    IndexError), or Gymnasium's usual AssertionError if that env would take it."""
    reference = gym.make(task).unwrapped
    try:
        reference.reset(seed=0)
        reference.step(action)
    finally:
        reference.close()
    raise AssertionError(f"{action!r} ({type(action)}) invalid")


def _seed_from(seed: int | list[int | None] | None, num_envs: int) -> int | None:
    """One seed for the batch's single generator: ``seed`` itself, or one drawn from a list of per-env seeds (as
    Gymnasium's vector envs take them; the same list always gives the same batch)."""
    if seed is None or isinstance(seed, int):
        return seed
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(f"Expected {num_envs} seeds, one per sub-env, got {len(seeds)}.")
    if all(entry is None for entry in seeds):
        return None
    entropy = [0 if entry is None else int(entry) + 1 for entry in seeds]
    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint64)[0] >> np.uint64(1))


def _action_tensor(env: ClassicControlEnv, action: Any) -> torch.Tensor:
    spec = env.action_spec
    return torch.as_tensor(np.asarray(action), dtype=spec.dtype, device=env.device).reshape(spec.shape)


class TorchClassicEnv(gym.Env):
    """One torch classic-control env behind Gymnasium's ``Env`` API.

    Args:
        task: the Gymnasium id it reproduces, e.g. ``"CartPole-v1"``.
        render_mode: ``None`` or ``"rgb_array"``.
        max_episode_steps: time limit (the task's registered one by default).
        dtype: dtype of the internal state, ``"float32"`` or ``"float64"``.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(
        self,
        task: str,
        render_mode: str | None = None,
        max_episode_steps: int | None = None,
        dtype: str | torch.dtype = "float32",
    ):
        self.env = torch_env_class(task)(
            num_envs=1, dtype=_dtype(dtype), max_episode_steps=max_episode_steps, seed=0
        )
        self.observation_space = self.env.single_observation_space
        self.action_space = self.env.single_action_space
        # Gymnasium's continuous-action envs clip out-of-range actions (the torch ones do the same); its discrete
        # ones refuse an index outside the space
        self._discrete = isinstance(self.action_space, gym.spaces.Discrete)
        self.render_mode = render_mode
        self._renderer: gym.Env | None = None
        self._last_action: Any = None
        reference = gym.envs.registration.load_env_creator(gym.spec(task).entry_point)
        self.metadata = {**self.metadata, "render_fps": reference.metadata.get("render_fps", 30)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        # Gymnasium's seeding gives every env a NumPy generator; it seeds the torch one.
        self.env.generator.manual_seed(int(self.np_random.integers(2**62)))
        root = self.env.reset()
        self._last_action = None
        return root["observation"][0].cpu().numpy(), {}

    def step(self, action):
        if self._discrete and not self.action_space.contains(action):
            _refuse_invalid_action(self.env.gymnasium_id, action)
        self._last_action = action
        next_td, _ = self.env._advance(_action_tensor(self.env, action))
        return (
            next_td["observation"][0].cpu().numpy(),
            float(next_td["reward"][0, 0]),
            bool(next_td["terminated"][0, 0]),
            bool(next_td["truncated"][0, 0]),
            {},
        )

    def render(self):
        if self.render_mode != "rgb_array":
            gym.logger.warn("TorchClassicEnv renders only with render_mode='rgb_array'.")
            return None
        return self.draw(self.env.state[0].to(torch.float64).cpu().numpy(), self._last_action)

    def draw(self, state: np.ndarray, last_action: Any = None) -> np.ndarray:
        """An RGB frame of the task in ``state``, drawn by Gymnasium's own renderer."""
        if self._renderer is None:
            use_headless_video_driver()
            self._renderer = gym.make(self.env.gymnasium_id, render_mode="rgb_array").unwrapped
            self._renderer.reset(seed=0)  # sets what its renderer reads besides the state (Pendulum's last_u)
        self._renderer.state = state
        if hasattr(self._renderer, "last_u"):  # Pendulum draws the applied torque
            self._renderer.last_u = None if last_action is None else float(np.asarray(last_action).ravel()[0])
        return self._renderer.render()

    def close(self):
        if self._renderer is not None:
            self._renderer.close()
        self.env.close(raise_if_closed=False)


class TorchClassicVectorEnv(gym.vector.VectorEnv):
    """A batch of torch classic-control envs behind Gymnasium's ``VectorEnv`` API, in ``SAME_STEP`` mode:
    a finished sub-env returns its reset observation, its final one is in ``info["final_obs"]`` and
    ``info["final_info"]`` is a dict, as in Gymnasium's own vector envs in that mode.

    Args:
        task: the Gymnasium id it reproduces.
        num_envs: batch size.
        device: where the physics runs; observations come back as NumPy arrays.
        max_episode_steps: time limit (the task's registered one by default).
        dtype: dtype of the internal state.
        render_mode: ``None`` or ``"rgb_array"`` (``render()`` returns one frame per sub-env).
    """

    metadata: ClassVar[dict[str, Any]] = {
        "autoreset_mode": AutoresetMode.SAME_STEP,
        "render_modes": ["rgb_array"],
    }

    def __init__(
        self,
        task: str,
        num_envs: int = 1,
        device: str = "cpu",
        max_episode_steps: int | None = None,
        dtype: str | torch.dtype = "float32",
        render_mode: str | None = None,
    ):
        if render_mode not in (None, "rgb_array"):
            raise gym.error.Error(
                f"{NAMESPACE}/{task} renders only with render_mode='rgb_array', got {render_mode!r}."
            )
        self.env = torch_env_class(task)(
            num_envs=num_envs, device=device, dtype=_dtype(dtype), max_episode_steps=max_episode_steps, seed=0
        )
        self.num_envs = num_envs
        self.autoreset_mode = AutoresetMode.SAME_STEP
        self.render_mode = render_mode
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        self._discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        self._renderers: list[TorchClassicEnv] = []
        self._last_actions: np.ndarray | None = None

    def reset(self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=_seed_from(seed, self.num_envs))
        self.env.generator.manual_seed(int(self.np_random.integers(2**62)))
        self._last_actions = None
        return self.env.reset()["observation"].cpu().numpy(), {}

    def step(self, actions):
        if self._discrete:  # a NumPy check on the host: the physics on the device waits for nothing
            array = np.asarray(actions)
            if not self.action_space.contains(array):
                invalid = [
                    action for action in array.reshape(-1) if not self.single_action_space.contains(action)
                ]
                _refuse_invalid_action(self.env.gymnasium_id, invalid[0] if invalid else array)
        self._last_actions = actions
        data = TensorDict({"action": _action_tensor(self.env, actions)}, batch_size=self.env.batch_size)
        data, root = self.env._step_and_maybe_reset(data)
        next_td = data["next"]
        done = next_td["done"].squeeze(-1).cpu().numpy()
        info: dict[str, Any] = {}
        if done.any():
            final = next_td["observation"].cpu().numpy()
            final_obs = np.empty(self.num_envs, dtype=object)
            for index in np.flatnonzero(done):
                final_obs[index] = final[index]
            info = {"final_obs": final_obs, "_final_obs": done, "final_info": {}, "_final_info": done}
        return (
            root["observation"].cpu().numpy(),
            next_td["reward"].squeeze(-1).cpu().numpy().astype(np.float64),
            next_td["terminated"].squeeze(-1).cpu().numpy(),
            next_td["truncated"].squeeze(-1).cpu().numpy(),
            info,
        )

    def render(self) -> tuple[np.ndarray, ...] | None:
        """One RGB frame per sub-env (``render_mode="rgb_array"``), drawn by Gymnasium's own renderer."""
        if self.render_mode != "rgb_array":
            gym.logger.warn("TorchClassicVectorEnv renders only with render_mode='rgb_array'.")
            return None
        states = self.env.state.to(torch.float64).cpu().numpy()
        frames = []
        for index, state in enumerate(states):
            if index == len(self._renderers):
                self._renderers.append(TorchClassicEnv(self.env.gymnasium_id, render_mode="rgb_array"))
            renderer = self._renderers[index]
            action = None if self._last_actions is None else np.asarray(self._last_actions)[index]
            frames.append(renderer.draw(state, action))
        return tuple(frames)

    def close_extras(self, **kwargs):
        for renderer in self._renderers:
            renderer.close()
        self.env.close(raise_if_closed=False)


def register_envs() -> None:
    """Register ``rlkit/<id>`` for every torch classic-control env (idempotent)."""
    for gymnasium_id in TORCH_ENVS:
        env_id = f"{NAMESPACE}/{gymnasium_id}"
        if env_id in gym.registry:
            continue
        gym.register(
            id=env_id,
            entry_point=TorchClassicEnv,
            vector_entry_point=TorchClassicVectorEnv,
            reward_threshold=gym.spec(gymnasium_id).reward_threshold,
            max_episode_steps=gym.spec(gymnasium_id).max_episode_steps,
            kwargs={"task": gymnasium_id},
        )
