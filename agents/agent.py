"""The Agent: a trained policy with its env's spaces, ready to predict, evaluate, save and load."""

from __future__ import annotations

import contextlib
import json
import math
import os
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.checkpoint import Checkpoint
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import OrnsteinUhlenbeckProcessModule

from agents.archive import check_archive, component_of, first_line, read_manifest_metadata, state_shapes
from agents.continuous import make_deterministic_actor
from agents.es import make_es_policy
from agents.files import (
    atomic_write,
    is_checkpoint_archive,
    probe_writable,
    require_replaceable,
    write_atomically,
    write_errors,
)
from agents.gsde import make_gsde_actor
from agents.networks import MASKED_RECIPES, find_normalizer, make_actor
from agents.normalization import invalid_statistics
from agents.policy_size import check_description_fits
from agents.qvalue import make_q_actor
from agents.recurrent import IS_INIT_KEY, initial_state, is_recurrent
from agents.recurrent import state_shapes as recurrent_state_shapes
from agents.tabular import make_q_table
from envs.atari import is_atari, make_atari_env
from envs.rendering import check_display, check_mujoco_camera, headless_rendering
from envs.specs import ACTION_MASK_KEY, space_to_spec
from envs.vector import check_device, check_env_kwargs, env_spec
from envs.wrappers import apply_wrappers, check_wrapper_spec, with_discrete_tuples, wrapper_functions
from errors import InputError, RenderError, WriteError, is_whole_number

FORMAT = "rlkit.agent"
RESUME_FORMAT = "rlkit.resume"  # training.resume's file: the whole training state
FORMAT_VERSION = 1
EVALUATION_STEP_LIMIT = 1_000  # episode cap in evaluate() for ids registered without a time limit
MAX_EVALUATION_EPISODES = 10**9  # evaluate() keeps a return and a length per episode
VIDEO_SUFFIXES = (".mp4", ".mkv", ".mov", ".avi")  # what FFmpeg writes H.264 into

# Policies an agent checkpoint can be rebuilt from, by name. Loading builds one of these from the saved
# keyword arguments and then reads tensors into it: nothing from the file is ever executed.
POLICY_BUILDERS: dict[str, Callable[..., nn.Module]] = {
    "mlp_actor": make_actor,
    "gsde_actor": make_gsde_actor,
    "deterministic_actor": make_deterministic_actor,
    "es_policy": make_es_policy,
    "q_actor": make_q_actor,
    "q_table": make_q_table,
}


def builder_name(builder: str | Callable[..., nn.Module]) -> str:
    """The :data:`POLICY_BUILDERS` name of ``builder`` (a builder function or its name)."""
    if callable(builder):
        names = [name for name, known in POLICY_BUILDERS.items() if known is builder]
        if not names:
            raise InputError(
                f"{getattr(builder, '__name__', builder)!r} is not a policy builder an agent can be loaded with; "
                f"use one of {sorted(POLICY_BUILDERS)} (agents.POLICY_BUILDERS)."
            )
        return names[0]
    if builder not in POLICY_BUILDERS:
        raise InputError(f"Unknown policy builder {builder!r}; known: {sorted(POLICY_BUILDERS)}.")
    return builder


def _stack(observations: list[Any]) -> Any:
    """A batch of Gymnasium observations: one array, or for Dict observations a dict of arrays."""
    if isinstance(observations[0], dict):
        return {key: np.stack([observation[key] for observation in observations]) for key in observations[0]}
    return np.stack(observations)


def space_to_json(space: gym.Space) -> dict[str, Any]:
    """Describe a Box, Discrete, MultiDiscrete or MultiBinary space, or a Dict of them, as JSON-compatible data."""
    if isinstance(space, gym.spaces.Dict):
        return {"type": "Dict", "spaces": {key: space_to_json(entry) for key, entry in space.spaces.items()}}
    if isinstance(space, gym.spaces.Box):
        uniform = np.unique(space.low).size == 1 and np.unique(space.high).size == 1
        return {
            "type": "Box",
            # bounds shared by every element (image pixels) are saved once, not once per pixel
            "low": space.low.flat[0].item() if uniform else space.low.tolist(),
            "high": space.high.flat[0].item() if uniform else space.high.tolist(),
            "shape": list(space.shape),
            "dtype": str(space.dtype),
        }
    if isinstance(space, gym.spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, gym.spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": space.nvec.tolist(), "start": space.start.tolist()}
    if isinstance(space, gym.spaces.MultiBinary):
        return {"type": "MultiBinary", "n": space.n}
    raise InputError(f"Space {space} cannot be saved: use Box, Discrete, MultiDiscrete or MultiBinary.")


def space_from_json(data: dict[str, Any], max_elements: int | None = None) -> gym.Space:
    """Inverse of :func:`space_to_json`; with ``max_elements``, :class:`InputError` for a space of more elements
    (a description that would allocate more than its file justifies)."""
    if not isinstance(data, dict):
        raise InputError(f"Unknown space description {data!r} in checkpoint.")
    kind = data.get("type")
    if kind == "Dict" and isinstance(data.get("spaces"), dict):
        entries = {}
        for key, entry in data["spaces"].items():
            if not isinstance(entry, dict) or entry.get("type") == "Dict":
                raise InputError(f"Unknown space description {entry!r} in checkpoint.")
            entries[key] = space_from_json(entry, max_elements)
        return gym.spaces.Dict(entries)
    if kind == "Box":
        dtype, shape = np.dtype(data["dtype"]), tuple(data["shape"])
        if dtype.shape != () or dtype.kind not in "biuf":
            raise InputError(f"Box dtype {data['dtype']!r} in checkpoint is not a plain number type.")
        if not all(isinstance(size, int) and size >= 0 for size in shape):
            raise InputError(f"Box shape {list(shape)} in checkpoint is not a list of sizes.")
        if max_elements is not None and math.prod(shape) > max_elements:
            raise InputError(
                f"The checkpoint describes a Box of shape {list(shape)} ({math.prod(shape)} elements), more than "
                "its file can hold the network for; refusing to build it."
            )
        low, high = (np.broadcast_to(np.array(data[key], dtype=dtype), shape) for key in ("low", "high"))
        return gym.spaces.Box(low, high, shape=shape, dtype=dtype)
    if kind == "Discrete":
        _check_choices(kind, data["n"], data["n"], max_elements)
        return gym.spaces.Discrete(data["n"], start=data["start"])
    if kind == "MultiDiscrete":
        nvec = np.asarray(data["nvec"])
        if nvec.dtype.kind not in "iu" or nvec.size == 0:
            raise InputError(f"MultiDiscrete nvec {data['nvec']!r:.80} in checkpoint is not a list of sizes.")
        _check_choices(
            kind, f"{nvec.size} sub-actions of {int(nvec.sum())} choices", int(nvec.sum()), max_elements
        )
        return gym.spaces.MultiDiscrete(
            nvec, start=data.get("start")
        )  # start saved since MultiDiscrete policies
    if kind == "MultiBinary":
        n = data["n"]
        shape = [n] if isinstance(n, int) else n
        if not (isinstance(shape, list) and all(isinstance(size, int) and size > 0 for size in shape)):
            raise InputError(f"MultiBinary n {n!r:.80} in checkpoint is not a size or a list of sizes.")
        _check_choices(kind, n, math.prod(shape), max_elements)
        return gym.spaces.MultiBinary(n)
    raise InputError(f"Unknown space description {data!r} in checkpoint.")


def _check_choices(kind: str, described: Any, outputs: int, max_elements: int | None) -> None:
    """:class:`InputError` for a discrete space of more choices (each one output of the policy at least) than
    ``max_elements``."""
    if max_elements is not None and outputs > max_elements:
        raise InputError(
            f"The checkpoint describes a {kind} space of {described!s:.80} ({outputs} policy outputs), more than "
            "its file can hold the network for; refusing to build it."
        )


@dataclass(frozen=True)
class EvaluationResult:
    """Per-episode returns and lengths of an evaluation, in episode order, and the video written, if any."""

    returns: np.ndarray
    lengths: np.ndarray
    video_path: Path | None = None

    @property
    def mean(self) -> float:
        return float(self.returns.mean())

    @property
    def std(self) -> float:
        return float(self.returns.std())


def _mask_rows(masks: np.ndarray, rows: int, single: bool) -> np.ndarray:
    """``predict``'s action masks as one row per observation: a single observation's mask may be one row."""
    if single and masks.ndim == 1:
        return masks.reshape(1, -1)
    if masks.ndim != 2 or masks.shape[0] != rows:
        raise InputError(
            f"action_mask of shape {masks.shape} for {'one observation' if single else f'{rows} observations'}: "
            "pass one row of allowed actions per observation, shape "
            f"({'number of actions' if single else f'{rows}, number of actions'})."
        )
    return masks


def _episode_starts(episode_start: Any, rows: int) -> np.ndarray:
    """``predict``'s ``episode_start`` as one bool per observation; :class:`InputError` for anything but bools (or
    numbers 0 and 1, as ``dones.astype(np.float32)``), one or one per observation."""
    if episode_start is None:
        return np.zeros(rows, dtype=bool)
    try:
        flags = np.asarray(episode_start)
    except ValueError:
        flags = np.asarray([], dtype=object)
    if not (flags.dtype.kind == "b" or (flags.dtype.kind in "iuf" and np.isin(flags, (0, 1)).all())):
        raise InputError(
            f"episode_start takes bools (True where an episode starts), got {episode_start!r:.60}."
        )
    if flags.size not in (1, rows):
        raise InputError(f"episode_start needs one flag per observation ({rows}), got {flags.size}.")
    return np.broadcast_to(flags.reshape(-1).astype(bool), (rows,)).copy()


def _whole(array: np.ndarray) -> bool:
    """Whether ``array`` holds whole numbers only (integers and booleans always do)."""
    return array.dtype.kind in "biu" or bool(np.isfinite(array).all() and (array == np.floor(array)).all())


class Agent(nn.Module):
    """A policy together with what it was trained for.

    Every recipe's checkpoint loads into an ``Agent``. The policy reads raw Gymnasium observations: any
    observation normaliser is part of the policy, so its statistics are saved, loaded and moved with it, and
    neither :meth:`predict` nor :meth:`evaluate` changes them.

    Args:
        policy: a TensorDict module reading ``"observation"`` and writing ``"action"``, built by
            ``policy_builder(observation_spec, action_spec, **policy_kwargs)``.
        env_id: the Gymnasium id the agent acts in.
        observation_space: the single-env observation space.
        action_space: the single-env action space.
        algorithm: name of the recipe that trained it.
        policy_builder: the builder of ``policy``, one of :data:`POLICY_BUILDERS` (the function or its name):
            its name is saved, and loading rebuilds the policy with it.
        policy_kwargs: JSON-compatible keyword arguments of that builder.
        config: the training configuration, kept for reference.
        env_kwargs: keyword arguments of the env's constructor (``gymnasium.make(env_id, **env_kwargs)``), used
            whenever the agent makes its own env (evaluation, videos).
        env_wrappers: the Gymnasium wrappers around each env it acts in, innermost first, as
            ``{"path": import path, "kwargs": {...}}`` (:mod:`envs.wrappers`); applied whenever it makes an env.

    Examples:
        >>> agent = Agent.load("runs/demo/agent.ckpt")
        >>> result = agent.evaluate(episodes=20, seed=0)
        >>> result.mean, result.lengths
    """

    def __init__(
        self,
        policy: nn.Module,
        env_id: str,
        observation_space: gym.Space,
        action_space: gym.Space,
        algorithm: str,
        policy_builder: str | Callable[..., nn.Module] = "mlp_actor",
        policy_kwargs: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        env_kwargs: dict[str, Any] | None = None,
        env_wrappers: list[dict[str, Any]] | None = None,
    ):
        super().__init__()
        policy_builder = builder_name(policy_builder)
        self.policy = policy
        self.env_id = env_id
        self.observation_space = observation_space
        self.action_space = action_space
        self.algorithm = algorithm
        self.policy_builder = policy_builder
        self.policy_kwargs = dict(policy_kwargs or {})
        self.config = dict(config or {})
        self.env_kwargs = dict(env_kwargs or {})
        self.env_wrappers = [check_wrapper_spec(spec) for spec in env_wrappers or ()]
        # wrapper paths outside Gymnasium and this toolkit that may be imported (Agent.load's allow_wrappers)
        self.allowed_wrappers: set[str] = {spec["path"] for spec in self.env_wrappers}
        self._state: TensorDict | None = None  # a recurrent policy's state after the last predict call

    @classmethod
    def build(
        cls,
        env_id: str,
        observation_space: gym.Space,
        action_space: gym.Space,
        algorithm: str,
        policy_builder: str | Callable[..., nn.Module] = "mlp_actor",
        policy_kwargs: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        device: torch.device | str = "cpu",
        env_kwargs: dict[str, Any] | None = None,
        env_wrappers: list[dict[str, Any]] | None = None,
    ) -> Agent:
        """Build an agent with a fresh policy from ``policy_builder`` (see :data:`POLICY_BUILDERS`)."""
        policy_builder = builder_name(policy_builder)
        policy = POLICY_BUILDERS[policy_builder](
            space_to_spec(observation_space, 1), space_to_spec(action_space, 1), **(policy_kwargs or {})
        )
        agent = cls(
            policy,
            env_id,
            observation_space,
            action_space,
            algorithm,
            policy_builder,
            policy_kwargs,
            config,
            env_kwargs,
            env_wrappers,
        )
        return agent.to(device)

    @property
    def device(self) -> torch.device:
        tensor = next(iter(self.policy.parameters()), None)
        return tensor.device if tensor is not None else torch.device("cpu")

    @property
    def normalizer(self):
        """The policy's observation normaliser, or None."""
        return find_normalizer(self.policy)

    # ------------------------------------------------------------------ acting
    def _observation_tensor(self, observation: Any) -> tuple[torch.Tensor | TensorDict, bool]:
        space = self.observation_space
        if isinstance(space, gym.spaces.Dict):  # one tensor per entry, each checked as its own space's
            if not isinstance(observation, Mapping) or set(observation) != set(space.spaces):
                raise InputError(
                    f"This agent takes Dict observations with the entries {sorted(space.spaces)}; got "
                    f"{sorted(observation) if isinstance(observation, Mapping) else type(observation).__name__}."
                )
            tensors, singles = {}, set()
            for key, entry in space.spaces.items():
                tensors[key], single = self._entry_tensor(observation[key], entry)
                singles.add(single)
            if len(singles) != 1:
                raise InputError("Dict observation entries must all be single observations or all batches.")
            single = singles.pop()
            rows = {key: tensor.shape[0] for key, tensor in tensors.items()}
            if not single and len(set(rows.values())) > 1:
                raise InputError(
                    f"Dict observation entries hold batches of different sizes ({rows}); each entry holds one row "
                    "per observation."
                )
            batch = next(iter(tensors.values())).shape[:1]
            return TensorDict(tensors, batch_size=batch, device=self.device), single
        return self._entry_tensor(observation, space)

    def _entry_tensor(self, observation: Any, space: gym.Space) -> tuple[torch.Tensor, bool]:
        if isinstance(observation, np.ma.MaskedArray):
            raise InputError(
                "Observation is a masked array: the policy would read its masked values as they are; fill them "
                "(numpy.ma.filled) or pass the plain array."
            )
        if isinstance(observation, torch.Tensor) and observation.is_meta:
            raise InputError(
                "Observation is a meta tensor, which holds no values; pass the observation itself."
            )
        try:
            if isinstance(observation, torch.Tensor):
                tensor = observation.detach().cpu()
                if tensor.is_floating_point() and tensor.dtype not in (
                    torch.float16,
                    torch.float32,
                    torch.float64,
                ):
                    tensor = tensor.float()  # bfloat16, float8: NumPy has no such dtype
                array = tensor.numpy()
            else:
                array = np.asarray(observation)
        except (ValueError, TypeError) as error:  # rows of different lengths, a dtype NumPy cannot take
            raise InputError(
                f"Observation {observation!r:.60} is not an array ({error}); the agent's observation space is {space}."
            ) from None
        if array.dtype.kind == "f" and array.dtype.itemsize > 8:  # long double: torch has no such dtype
            with np.errstate(over="ignore"):  # beyond float64: inf, refused below as any inf is
                array = array.astype(np.float64)
        if array.dtype.kind not in "biuf":
            raise InputError(
                f"Observation {observation!r:.60} is not numeric ({array.dtype}); the agent's observation space is "
                f"{space}."
            )
        shape = space.shape
        single = array.shape == shape
        if not single and (array.shape[1:] != shape or array.shape[0] == 0):
            raise InputError(
                f"Observation of shape {array.shape} does not match the agent's observation space {space} "
                f"(expected {shape} or a batch of one or more of them)."
            )
        integral = isinstance(
            space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
        ) or (np.dtype(space.dtype).kind in "biu")
        if integral and not _whole(array):
            raise InputError(
                f"Observation values outside the agent's observation space {space}: it holds whole numbers, got "
                f"{array.tolist() if array.size <= 16 else 'a batch with fractions'}"
                + (
                    " (an image scaled to floats? the agent takes the env's own uint8 pixels, 0-255)."
                    if space.dtype == np.uint8
                    else "."
                )
            )
        if isinstance(space, gym.spaces.MultiBinary) or (
            isinstance(space, gym.spaces.Box) and np.dtype(space.dtype).kind in "biu"
        ):
            low, high = (0, 1) if isinstance(space, gym.spaces.MultiBinary) else (space.low, space.high)
            if not ((array >= low).all() and (array <= high).all()):
                raise InputError(
                    f"Observation values outside the agent's observation space {space}: got "
                    f"{array.tolist() if array.size <= 16 else 'a batch with values out of bounds'}."
                )
        if isinstance(
            space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete)
        ):  # values from 0, as in training
            sizes = np.asarray(space.n if isinstance(space, gym.spaces.Discrete) else space.nvec)
            # compared as they are (a uint64 beyond int64 would wrap in the conversion), then converted
            if ((array < space.start) | (array >= space.start + sizes)).any():
                raise InputError(
                    f"Observation values outside the agent's observation space {space} (start {space.start}): "
                    f"got {array.tolist() if array.size <= 16 else 'a batch'}."
                )
            tensor = torch.as_tensor(array.astype(np.int64) - space.start, dtype=torch.int64)
        else:
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                raise InputError("Observation contains NaN or Inf; check the env or its wrappers.")
            # uint8 images stay uint8 (the CNN scales them); other Box observations become float32
            dtype = torch.uint8 if space.dtype == np.uint8 else torch.float32
            tensor = torch.as_tensor(array, dtype=dtype)
            if not torch.isfinite(tensor).all():
                raise InputError(
                    "Observation values beyond float32's range (about ±3.4e38), which the agent computes in; "
                    "check the env or its wrappers."
                )
        if single:
            tensor = tensor.unsqueeze(0)
        return tensor.to(self.device), single

    def _to_env_action(self, action: torch.Tensor) -> np.ndarray:
        array = action.detach().cpu().numpy()
        space = self.action_space
        if isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            return (array + space.start).astype(space.dtype)
        if isinstance(space, gym.spaces.Box):
            return np.clip(array, space.low, space.high).astype(space.dtype)
        return array.astype(space.dtype)

    @property
    def recurrent(self) -> bool:
        """Whether the policy has memory (an LSTM or GRU layer, ``--recurrent``)."""
        return is_recurrent(self.policy)

    @property
    def state(self) -> TensorDict | None:
        """A recurrent agent's state after its last :meth:`predict` call (one row per observation; the
        ``state`` argument of a later call takes it back), or None before the first call, after
        :meth:`reset_state` and for an agent without memory."""
        return self._state

    def reset_state(self) -> None:
        """Forget a recurrent agent's state: the next :meth:`predict` call starts new episodes."""
        self._state = None

    def predict(
        self,
        observation: Any,
        deterministic: bool = True,
        action_mask: Any = None,
        state: Any = None,
        episode_start: Any = None,
    ) -> np.ndarray | Any:
        """Return the action for one observation, or a batch of actions for a batch of observations.

        A recurrent agent (trained with ``--recurrent``) remembers: each call continues from the state the last
        call left (:attr:`state`), so call it once per env step, in order, and mark the first step of each new
        episode with ``episode_start`` (or call :meth:`reset_state` between episodes), as with
        Stable-Baselines3's ``predict(obs, state, episode_start)``::

            observation, _ = env.reset()
            agent.reset_state()
            while True:
                observation, reward, terminated, truncated, _ = env.step(agent.predict(observation))
                if terminated or truncated:
                    break

        Args:
            observation: a Gymnasium observation (NumPy array, torch tensor, list or int), or a batch of them
                stacked along a new first dimension.
            deterministic: take the policy's mode instead of sampling.
            action_mask: for an agent trained with action masks, the allowed actions (``info["action_mask"]``
                of the env, booleans or 0/1, one row per observation); None: a Dict observation's own
                ``"action_mask"`` entry if it has one, else every action.
            state: a recurrent agent's state to act from (an earlier :attr:`state`, or a mapping of its keys to
                arrays of one row per observation); None: the state the last call left, or a new episode's.
            episode_start: a recurrent agent: whether each observation is the first of an episode (a bool, or one
                per observation); their state starts afresh.

        Returns:
            An action valid in the Gymnasium env (an ``int``-like NumPy scalar for Discrete spaces), or a
            batch of them.
        """
        _require_flag("predict", deterministic)
        if not deterministic:
            self._refuse_ou_sampling("predict(obs, deterministic=False)", "deterministic=True")
        if action_mask is not None and not self.policy_kwargs.get("action_mask"):
            raise InputError(
                f"action_mask is for agents trained with action masks; this {self.algorithm} agent was trained "
                f"without them and cannot apply one: drop action_mask, or train on the masked env with {MASKED_RECIPES}."
            )
        tensor, single = self._observation_tensor(observation)
        masks = None if action_mask is None else _mask_rows(np.asarray(action_mask), tensor.shape[0], single)
        recurrent_state = self._recurrent_input(tensor.shape[0], state, episode_start)
        with torch.no_grad(), set_exploration_type(_exploration(deterministic)):
            actions, next_state = self._act(tensor, masks, recurrent_state)
        if next_state is not None:
            self._state = next_state
        return actions[0] if single else actions

    def _recurrent_input(self, rows: int, state: Any, episode_start: Any) -> TensorDict | None:
        """The recurrent state (with ``"is_init"``) for ``rows`` observations, or None without memory."""
        if not self.recurrent:
            if state is not None or episode_start is not None:
                raise InputError(
                    "state and episode_start are for recurrent agents (trained with --recurrent); this agent "
                    "has no memory."
                )
            return None
        starts = _episode_starts(episode_start, rows)
        fresh = initial_state(self.policy, rows, self.device)
        state = self._state if state is None else state
        if state is None:
            return fresh
        shapes = recurrent_state_shapes(self.policy)
        if not hasattr(state, "keys") or not set(shapes) <= set(state.keys()):
            raise InputError(
                f"A recurrent state is a mapping with the entries {sorted(shapes)}; got {state!r}."
            )
        restored = fresh.clone()
        for key, shape in shapes.items():
            value = torch.as_tensor(state[key])
            if tuple(value.shape) != (rows, *shape):
                raise InputError(
                    f"The recurrent state's {key!r} has shape {tuple(value.shape)}; {rows} observations need "
                    f"{(rows, *shape)} (after a batch of another size, call reset_state())."
                )
            restored.set(key, value.to(device=self.device, dtype=torch.float32))
        is_init = torch.as_tensor(starts, device=self.device)
        restored.set(IS_INIT_KEY, is_init.reshape(rows, 1))
        return restored

    def _act(
        self,
        observations: torch.Tensor,
        action_masks: np.ndarray | None = None,
        recurrent_state: TensorDict | None = None,
    ) -> tuple[np.ndarray, TensorDict | None]:
        """Env actions for a batch of observation tensors (call under no_grad and an exploration type), and a
        recurrent policy's next state (None without one); a masked policy gets ``action_masks`` (every action
        allowed where None)."""
        inputs = TensorDict({"observation": observations}, batch_size=observations.shape[:1])
        if recurrent_state is not None:
            inputs.update(recurrent_state)
        if self.policy_kwargs.get("action_mask"):
            own_mask = (
                observations.get(ACTION_MASK_KEY, None) if isinstance(observations, TensorDict) else None
            )
            if action_masks is None and own_mask is not None:  # a Dict observation's own "action_mask" entry
                action_masks = own_mask.cpu().numpy()
            size = (observations.shape[0], int(self.action_space.n))
            masks = np.ones(size, dtype=bool) if action_masks is None else np.array(action_masks, dtype=bool)
            if masks.shape != size:
                raise InputError(f"action_mask has shape {masks.shape}; this agent needs {size}.")
            # a row that allows nothing allows everything, as in training (in a copy: the caller's masks stay)
            masks[~masks.any(axis=1)] = True
            inputs.set(ACTION_MASK_KEY, torch.as_tensor(masks, device=observations.device))
        outputs = self.policy(inputs)
        next_state = None
        if recurrent_state is not None:  # what the layer left: the state of each row's next step
            next_state = TensorDict(
                {key: outputs.get(("next", key)) for key in recurrent_state_shapes(self.policy)},
                batch_size=outputs.batch_size,
            )
            next_state.set(IS_INIT_KEY, torch.zeros_like(recurrent_state.get(IS_INIT_KEY)))
        return self._to_env_action(outputs.get("action")), next_state

    # -------------------------------------------------------------- evaluating
    def check_spaces(self, env: gym.Env | gym.vector.VectorEnv) -> None:
        """Raise :class:`InputError` if ``env``'s spaces differ from the agent's."""
        observation_space = getattr(env, "single_observation_space", env.observation_space)
        action_space = getattr(env, "single_action_space", env.action_space)
        if observation_space != self.observation_space or action_space != self.action_space:
            raise InputError(
                f"This agent was trained on {self.env_id!r} with observations {self.observation_space} and actions "
                f"{self.action_space}; the env given has {observation_space} and {action_space}."
            )

    def evaluate(
        self,
        env: str | gym.Env | None = None,
        episodes: int = 10,
        deterministic: bool = True,
        seed: int | None = None,
        video_path: str | Path | None = None,
        max_parallel_envs: int = 32,
        env_kwargs: dict[str, Any] | None = None,
        render: bool = False,
    ) -> EvaluationResult:
        """Run whole episodes and return their returns and lengths.

        Episodes run in up to ``max_parallel_envs`` Gymnasium envs at once, with one batched policy call per
        step. Episode ``k`` is reset with ``seed + k`` (modulo 2**32), so the same seed gives the same episodes whatever the
        parallelism (continuous actions: up to the float32 rounding of a batched policy call, which can differ in
        the last digits from a call on fewer rows). Rewards are the env's own, without the recipes' reward
        normalisation: the agent's ``env_wrappers`` apply (a reward wrapper among them, such as ``ClipReward``,
        changes the returns); Atari ids run in
        :func:`envs.atari.make_atari_env` with ``training=False``, so the agent sees the observations it was
        trained on while episodes are whole games scored with the game's own rewards.
        Envs without a time limit (ids registered without one, such as CliffWalking-v1, and env instances without
        a ``TimeLimit`` wrapper), Atari games excepted, are capped at ``EVALUATION_STEP_LIMIT`` steps.

        Args:
            env: a Gymnasium id, or a Gymnasium env (then episodes run one after another in it); defaults to
                the agent's env id.
            episodes: number of episodes.
            deterministic: act with the policy's mode.
            seed: base seed of the episodes' resets; None for unseeded resets.
            video_path: if given, the first episode is rendered and written there as H.264 video (a file ending
                in .mp4, .mkv, .mov or .avi, or a folder: its video.mp4).
            max_parallel_envs: most envs created at once when ``env`` is an id.
            env_kwargs: keyword arguments of the env's constructor; default: the agent's own for its own env id,
                none for another id. The agent's ``max_episode_steps`` (``--max-episode-steps``) holds in every
                env it makes unless ``env_kwargs`` names its own, and its wrappers (``env_wrappers``) wrap them all.
            render: show the episodes in a window (``render_mode="human"``), one after another;
                :class:`InputError` where no display exists.

        Returns:
            An :class:`EvaluationResult` with ``episodes`` returns and lengths.

        Raises:
            InputError: ``episodes`` not a whole number in [1, 1e9], a ``seed`` not a whole number in Gymnasium's
                ``[0, 2**32)`` (episode seeds ``seed + k`` past its end wrap around to 0), ``max_parallel_envs``
                below 1, or a ``video_path`` of another kind of file.
        """
        _require_flag("evaluate", deterministic)
        if not deterministic:
            self._refuse_ou_sampling(
                "evaluate(deterministic=False) (--stochastic)", "deterministic evaluation"
            )
        if not is_whole_number(episodes) or not 1 <= episodes <= MAX_EVALUATION_EPISODES:
            raise InputError(f"episodes must be between 1 and {MAX_EVALUATION_EPISODES:,}, got {episodes!r}.")
        if seed is not None and (not is_whole_number(seed) or not 0 <= seed < 2**32):
            raise InputError(f"seed must be a whole number in [0, 2**32), got {seed!r}.")
        if not is_whole_number(max_parallel_envs) or max_parallel_envs < 1:
            raise InputError(
                f"max_parallel_envs must be a whole number of at least 1, got {max_parallel_envs!r}."
            )
        episodes, seed, max_parallel_envs = (
            int(episodes),
            seed if seed is None else int(seed),
            int(max_parallel_envs),
        )
        if env_kwargs is not None and not isinstance(env_kwargs, dict):
            raise InputError(
                f"env_kwargs takes a dict of the env constructor's keyword arguments, got {env_kwargs!r:.60}."
            )
        if video_path is not None:
            if not isinstance(video_path, (str, os.PathLike)) or not str(video_path):
                raise InputError(
                    f"video_path takes the path of a video file or folder, got {video_path!r:.60}."
                )
            video_path = Path(video_path)
            if video_path.is_dir():
                video_path = video_path / "video.mp4"
            if video_path.suffix.lower() not in VIDEO_SUFFIXES:
                raise InputError(
                    f"Cannot write a video to {video_path}: name a file ending in {', '.join(VIDEO_SUFFIXES)} "
                    "(H.264 video), or a folder for video.mp4."
                )
            try:  # before any episode runs: a video that cannot be written fails now, not after them
                video_path.parent.mkdir(parents=True, exist_ok=True)
                probe_writable(video_path.parent)
            except OSError as error:
                reason = "a file stands in its path" if isinstance(error, FileExistsError) else error.strerror
                raise WriteError(
                    error.errno,
                    f"Could not write {video_path} (its folder: {reason}); no {video_path.name} was written: "
                    "choose another video_path.",
                ) from None
        if render:
            check_display()
            video_path, max_parallel_envs = None, 1
        if video_path is None:
            return self._evaluate(
                env, episodes, deterministic, seed, None, max_parallel_envs, env_kwargs, render
            )
        with headless_rendering():
            return self._evaluate(
                env, episodes, deterministic, seed, video_path, max_parallel_envs, env_kwargs
            )

    def _refuse_ou_sampling(self, call: str, fix: str) -> None:
        """Raise :class:`InputError` for sampled actions of an agent exploring with Ornstein-Uhlenbeck noise: the
        noise is per-episode state of a training env, which neither ``predict`` nor ``evaluate`` has."""
        if any(isinstance(module, OrnsteinUhlenbeckProcessModule) for module in self.policy.modules()):
            raise InputError(
                "This agent explores with Ornstein-Uhlenbeck noise, which is per-episode state of a training env: "
                f"{call} cannot apply it. Use {fix}."
            )

    def _evaluate(
        self,
        env: str | gym.Env | None,
        episodes: int,
        deterministic: bool,
        seed: int | None,
        video_path: str | Path | None,
        max_parallel_envs: int,
        env_kwargs: dict[str, Any] | None,
        render: bool = False,
    ) -> EvaluationResult:
        if isinstance(env, str) or env is None:

            def render_mode(index: int) -> str | None:
                if render:
                    return "human"
                return "rgb_array" if video_path is not None and index == 0 else None

            count = min(episodes, max_parallel_envs)
            envs, owned = [self.make_env(env, env_kwargs, render_mode(index)) for index in range(count)], True
        elif isinstance(env, gym.Env):
            if env_kwargs is not None:
                raise InputError(
                    "env_kwargs are the keyword arguments of the envs evaluate makes from an id; the env instance "
                    "given is used as it is: make it with them, or pass its id."
                )
            _warn_missing_wrappers(env, self.env_wrappers)
            if video_path is not None and env.render_mode != "rgb_array":
                raise RenderError("Recording a video needs an env made with render_mode='rgb_array'.")
            if _unlimited(env):  # as ids registered without a limit: a policy that never ends cannot hang
                env = gym.wrappers.TimeLimit(env, EVALUATION_STEP_LIMIT)
            envs, owned = [with_discrete_tuples(env)], False  # Tuple-of-Discrete observations, as in training
        else:
            raise InputError(f"evaluate takes a Gymnasium id or env, got {type(env).__name__}.")
        try:
            self.check_spaces(envs[0])
            if video_path is not None or render:
                check_mujoco_camera(envs[0])
            return self._run_episodes(envs, episodes, deterministic, seed, video_path)
        finally:
            if owned:
                for sub_env in envs:
                    sub_env.close()

    def make_env(
        self,
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
        render_mode: str | None = None,
    ) -> gym.Env:
        """One Gymnasium env as the agent evaluates in: ``env_id`` (default its own) made with ``env_kwargs``
        (default: its own for its own id), wrapped by its ``env_wrappers``. Atari ids get the evaluation
        preprocessing (:func:`envs.atari.make_atari_env` with ``training=False``), Tuple-of-Discrete observations
        :class:`envs.wrappers.DiscreteTuple`, as in training; ids registered without a time
        limit get ``EVALUATION_STEP_LIMIT`` steps, so that a policy which never ends an episode cannot hang.

        Raises:
            InputError: an unknown id, a keyword argument its constructor does not take (or text for a flag or
                number, see :func:`envs.vector.check_env_kwargs`), or a wrapper that may not be imported (see
                :mod:`envs.wrappers`).
        """
        own_env = env_id is None  # the id read from the checkpoint: its module is never imported here
        env_id = self.env_id if own_env else env_id
        if env_kwargs is None:
            env_kwargs = self.env_kwargs if env_id == self.env_id else {}
        cap = self.env_kwargs.get("max_episode_steps")  # --max-episode-steps: in every env, unless set anew
        if cap is not None and "max_episode_steps" not in env_kwargs:
            env_kwargs = {**env_kwargs, "max_episode_steps": cap}
        env_spec(env_id, import_module=not own_env)
        check_env_kwargs(env_id, env_kwargs, "env_kwargs")
        wrappers = [*wrapper_functions(self.env_wrappers, self.allowed_wrappers), with_discrete_tuples]
        if is_atari(env_id):
            return apply_wrappers(
                make_atari_env(env_id, training=False, render_mode=render_mode, **env_kwargs), wrappers
            )
        options = dict(env_kwargs)
        max_steps = (
            options.pop("max_episode_steps", None)
            or env_spec(env_id).max_episode_steps
            or EVALUATION_STEP_LIMIT
        )
        if render_mode is not None:  # only when frames are wanted: a user's env need not take it otherwise
            options["render_mode"] = render_mode
        try:
            return apply_wrappers(gym.make(env_id, max_episode_steps=max_steps, **options), wrappers)
        except TypeError as error:
            if render_mode is None or "render_mode" not in str(error):
                raise
            raise RenderError(
                f"{env_id} cannot render frames: its constructor takes no render_mode ({first_line(error)}); "
                "evaluate without a video or window, or give the env a render_mode argument (Gymnasium's "
                "render API) that takes 'rgb_array' and 'human'."
            ) from None
        except MemoryError as error:  # sizes in the keyword arguments (which may come from the file)
            raise InputError(
                f"Building {env_id} with the keyword arguments {env_kwargs!r:.200} and the wrappers "
                f"{[spec['path'] for spec in self.env_wrappers]} ran out of memory ({first_line(error)}); "
                "the env description asks for more than this machine has: pass other env_kwargs."
            ) from None

    def _run_episodes(self, envs, episodes, deterministic, seed, video_path) -> EvaluationResult:
        if video_path is None:
            returns, lengths = self._play(envs, episodes, deterministic, seed, None)
        else:  # the first episode's frames are encoded as they are rendered
            with video_writer(video_path, fps=envs[0].metadata.get("render_fps", 30)) as record:
                returns, lengths = self._play(envs, episodes, deterministic, seed, record)
        return EvaluationResult(returns=returns, lengths=lengths, video_path=video_path)

    def _play(self, envs, episodes, deterministic, seed, record) -> tuple[np.ndarray, np.ndarray]:
        """Run ``episodes`` episodes over ``envs``; ``record`` (if any) takes each frame of the first."""
        returns = np.zeros(episodes)
        lengths = np.zeros(episodes, dtype=np.int64)
        episode_of: dict[int, int] = {}  # env index -> the episode it is running
        observations: dict[int, Any] = {}
        masks: dict[
            int, Any
        ] = {}  # env index -> the allowed actions its env gave (info["action_mask"]), if any
        states: dict[int, TensorDict] = {}  # env index -> a recurrent policy's state for its next step
        recurrent = self.recurrent
        next_episode = 0

        def start(index: int) -> None:
            nonlocal next_episode
            episode_seed = None if seed is None else (seed + next_episode) % 2**32
            observations[index], info = envs[index].reset(seed=episode_seed)
            masks[index] = info.get("action_mask")
            episode_of[index] = next_episode
            if recurrent:
                states[index] = initial_state(self.policy, 1, self.device)[0]
            if record is not None and next_episode == 0:
                record(envs[index].render())
            next_episode += 1

        for index in range(len(envs)):
            start(index)
        with torch.no_grad(), set_exploration_type(_exploration(deterministic)):
            while episode_of:
                active = list(episode_of)
                batch, _ = self._observation_tensor(_stack([observations[i] for i in active]))
                batch_masks = None
                if any(masks[i] is not None for i in active):
                    size = int(getattr(self.action_space, "n", 0))
                    batch_masks = np.stack([np.ones(size) if masks[i] is None else masks[i] for i in active])
                state = torch.stack([states[i] for i in active]) if recurrent else None
                actions, next_state = self._act(batch, batch_masks, state)
                for row, (index, action) in enumerate(zip(active, actions, strict=True)):
                    if recurrent:
                        states[index] = next_state[row]
                    observation, reward, terminated, truncated, info = envs[index].step(action)
                    masks[index] = info.get("action_mask")
                    episode = episode_of[index]
                    returns[episode] += float(reward)
                    lengths[episode] += 1
                    observations[index] = observation
                    if record is not None and episode == 0:
                        record(envs[index].render())
                    if terminated or truncated:
                        del episode_of[index]
                        if next_episode < episodes:
                            start(index)
        return returns, lengths

    # ------------------------------------------------------------ persistence
    def metadata(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "algorithm": self.algorithm,
            "env_id": self.env_id,
            "observation_space": space_to_json(self.observation_space),
            "action_space": space_to_json(self.action_space),
            "policy_builder": self.policy_builder,
            "policy_kwargs": self.policy_kwargs,
            "config": json.loads(json.dumps(self.config, default=str)),
            "env_kwargs": json.loads(json.dumps(self.env_kwargs, default=str)),
            "env_wrappers": self.env_wrappers,
        }

    def save(self, path: str | Path) -> Path:
        """Write the agent to one file, atomically (a crash mid-write leaves any previous file intact), and return
        its path: ``path``, or ``path / "agent.ckpt"`` when ``path`` is a folder (as :meth:`load` reads one).

        The file is a TorchRL checkpoint archive: a JSON manifest with the env id, spaces, policy builder and
        config, and the policy's tensors (normaliser statistics included) in TensorDict's format.
        """
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise InputError(f"Agent.save takes the path of a file or folder, got {path!r:.60}.")
        named_folder = str(path).endswith(("/", os.sep))
        path = Path(path)
        if (path.is_dir() and not path.is_symlink()) or (named_folder and not path.exists()):
            path = path / "agent.ckpt"
        require_replaceable(path, "agent checkpoint", is_checkpoint_archive)
        # written beside the target, then renamed over it in one step (os.replace): at every moment the path
        # holds either the previous complete file or the new one, and a link at the path is replaced, not followed
        checkpoint = Checkpoint(format="archive", policy=self.policy)
        return write_atomically(path, lambda temporary: checkpoint.save(temporary, metadata=self.metadata()))

    @classmethod
    def load(
        cls, path: str | Path, device: torch.device | str = "cpu", allow_wrappers: Iterable[str] = ()
    ) -> Agent:
        """Load an agent saved by :meth:`save` (or written by any recipe) onto ``device``.

        Loading reads JSON and tensors only; it never unpickles objects and imports nothing. The env wrappers a
        checkpoint names are imported when the agent makes an env (``evaluate``), and only Gymnasium's, this
        toolkit's and those named in ``allow_wrappers`` (import paths the caller trusts).

        Raises:
            InputError: the file is missing, is not an agent checkpoint, or is damaged.
        """
        if not isinstance(path, (str, os.PathLike)):
            raise InputError(
                f"Agent.load takes the path of an agent checkpoint or run folder, got {path!r:.60}."
            )
        path = Path(path)
        device = check_device(str(device))
        if isinstance(allow_wrappers, str):  # one import path, not its characters
            allow_wrappers = (allow_wrappers,)
        if path.is_dir():
            path = path / "agent.ckpt"
        if not path.exists():
            raise InputError(f"No agent checkpoint at {path}.")
        tensors = check_archive(path)
        metadata = read_manifest_metadata(path, "agent")
        if not isinstance(metadata, dict):
            raise InputError(f"{path} is a TorchRL checkpoint but not an agent saved by this toolkit.")
        if metadata.get("format") == RESUME_FORMAT:
            raise InputError(
                f"{path} is a resume checkpoint (the whole training state, for --resume); pass the agent.ckpt or "
                f"best_agent.ckpt beside it, or the run directory {path.parent}."
            )
        if metadata.get("format") != FORMAT:
            raise InputError(f"{path} is a TorchRL checkpoint but not an agent saved by this toolkit.")
        if metadata.get("format_version") != FORMAT_VERSION:
            raise InputError(
                f"{path} has agent format version {metadata.get('format_version')}, expected {FORMAT_VERSION}."
            )
        component = component_of(path, tensors, "policy")
        saved = state_shapes(path, component, tensors[component])
        try:
            observation_space = space_from_json(
                metadata["observation_space"], max_elements=max(2**20, path.stat().st_size)
            )
            # each action (each choice of a discrete one) has at least one weight of its own in the policy held
            held = sum(math.prod(shape) for shape, _ in saved.values())
            action_space = space_from_json(metadata["action_space"], max_elements=max(held, 1))
            builder, policy_kwargs = builder_name(metadata["policy_builder"]), metadata["policy_kwargs"]
            if not isinstance(policy_kwargs, dict):
                raise TypeError("policy_kwargs is not a mapping")
            check_description_fits(
                builder, POLICY_BUILDERS[builder], observation_space, action_space, policy_kwargs, saved
            )
            agent = cls.build(
                env_id=metadata["env_id"],
                observation_space=observation_space,
                action_space=action_space,
                algorithm=metadata["algorithm"],
                policy_builder=builder,
                policy_kwargs=policy_kwargs,
                config=metadata["config"],
                env_kwargs=metadata.get("env_kwargs") or {},
                env_wrappers=metadata.get("env_wrappers") or [],
            )
            agent.allowed_wrappers = set(allow_wrappers)
        except InputError as error:  # a builder's refusal of an option (--hidden-sizes ...) or of its size
            raise InputError(f"{path} has an invalid agent description: {error}") from None
        except Exception as error:  # noqa: BLE001 - a forged description fails the builders in many ways
            raise InputError(
                f"{path} has an incomplete or invalid agent description ({type(error).__name__}: "
                f"{first_line(error)})."
            ) from None
        try:
            Checkpoint(policy=agent.policy).load(path, map_location="cpu")
        except Exception as error:  # noqa: BLE001 - damaged archives fail TorchRL's reader in many ways
            raise InputError(
                f"Could not read the weights in {path}: {type(error).__name__}: {first_line(error)}"
            ) from None
        non_finite = [
            name
            for name, tensor in agent.policy.state_dict().items()
            if tensor.is_floating_point() and not torch.isfinite(tensor).all()
        ]
        if non_finite:
            raise InputError(
                f"{path} holds NaN or Inf in {', '.join(non_finite[:3])}{' ...' if len(non_finite) > 3 else ''}; "
                "a healthy run never saves such weights. Refusing to load it."
            )
        if (statistics := invalid_statistics(agent.policy)) is not None:
            raise InputError(
                f"{path} holds observation statistics no run could have gathered (a negative variance or count "
                f"in {statistics}); the file is damaged or forged. Refusing to load it."
            )
        return agent.to(device)


def _unlimited(env: gym.Env) -> bool:
    """Whether nothing says ``env``'s episodes end: no ``TimeLimit`` among its wrappers (``PendulumEnv()``, not
    ``gym.make``; ``gym.make("Pendulum-v1").unwrapped``; ``gym.make("CliffWalking-v1")``, registered without a
    limit), as :meth:`Agent.make_env` caps the ids it makes. Atari games are not: they end on their own, at the
    emulator's frame limit."""
    spec = getattr(env, "spec", None)
    if spec is not None and is_atari(spec.id):
        return False
    while isinstance(env, gym.Wrapper):
        if isinstance(env, gym.wrappers.TimeLimit):
            return False
        env = env.env
    return True


def _warn_missing_wrappers(env: gym.Env, specs: list[dict[str, Any]]) -> None:
    """Warn when the env instance ``env`` lacks a wrapper the agent was trained in (``specs``, by class name):
    :meth:`Agent.evaluate` uses an instance as it is, so its observations or rewards may not be the trained ones."""
    present, inner = set(), env
    while isinstance(inner, gym.Wrapper):
        present.add(type(inner).__name__)
        inner = inner.env
    missing = [spec["path"] for spec in specs if spec["path"].rsplit(".", 1)[-1] not in present]
    if missing:
        warnings.warn(
            f"This agent was trained in envs wrapped in {', '.join(missing)}, which the env given lacks; an env "
            "instance is used as it is (only envs evaluate makes from an id get the agent's wrappers): wrap it "
            "the same way, or pass its id.",
            stacklevel=4,
        )


def _require_flag(method: str, deterministic: Any) -> None:
    """Raise :class:`InputError` unless ``deterministic`` is a bool: ``"False"`` would act deterministically."""
    if not isinstance(deterministic, (bool, np.bool_)):
        raise InputError(
            f"{method}(deterministic=...) takes True or False, got {deterministic!r:.40} "
            f"({type(deterministic).__name__})."
        )


def _exploration(deterministic: bool) -> ExplorationType:
    return ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM


def write_video(frames: Iterable[np.ndarray], path: str | Path, fps: int = 30) -> Path:
    """Write RGB frames (``H x W x 3`` uint8 arrays, a list or any iterable of them) to an MP4 file, complete or
    not at all (see :func:`video_writer`)."""
    with video_writer(path, fps) as append:
        for frame in frames:
            append(frame)
    return Path(path)


def _encodable(frame: np.ndarray) -> np.ndarray:
    """``frame`` as H.264 takes it: RGB (a grayscale frame, ``H x W`` or ``H x W x 1``, in three equal channels)
    with an even height and width (an odd one gets its last row or column again: the encoder refuses odd sizes)."""
    frame = np.asarray(frame)
    if frame.ndim == 3 and frame.shape[2] == 1:
        frame = frame[..., 0]
    if frame.ndim == 2:
        frame = np.repeat(frame[..., None], 3, axis=2)
    if frame.ndim == 3 and (frame.shape[0] % 2 or frame.shape[1] % 2):
        frame = np.pad(frame, ((0, frame.shape[0] % 2), (0, frame.shape[1] % 2), (0, 0)), mode="edge")
    return frame


@contextlib.contextmanager
def video_writer(path: str | Path, fps: int = 30) -> Iterator[Callable[[np.ndarray], None]]:
    """An MP4 file written frame by frame: yields a function that encodes one RGB frame as it comes, so that no
    frame is kept in memory (a 1,000-step MuJoCo episode at 480x480 would hold 690 MB). The frames go to a hidden
    temporary file beside ``path``, renamed over it when the block ends without an exception; an exception (a
    renderer that fails mid-episode) leaves ``path`` as it was and propagates, a failed write as
    :class:`errors.WriteError`, frames the encoder turns into nothing as :class:`errors.RenderError`. Grayscale
    frames are encoded as RGB, odd heights and widths padded by one row or column (see :func:`_encodable`)."""
    import imageio.v2 as imageio

    written, shape = 0, None
    with atomic_write(path) as temporary:
        with write_errors(path):
            writer = imageio.get_writer(
                temporary, format="FFMPEG", fps=fps, codec="libx264", macro_block_size=1
            )

        def append(frame: np.ndarray) -> None:
            nonlocal written, shape
            shape = np.shape(frame)
            frame = _encodable(frame)
            with write_errors(path):
                writer.append_data(frame)
            written += 1

        try:
            yield append
        finally:
            with write_errors(path):
                writer.close()
        if not written:
            raise InputError(f"No frames to write to {path}: a video needs at least one.")
        if not os.path.getsize(temporary):  # ffmpeg may end without an error and without a frame
            raise RenderError(
                f"The video encoder wrote nothing to {path} from {written} frames of shape {shape}: frames it "
                "cannot encode; no video was written."
            )
