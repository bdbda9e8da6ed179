"""Gymnasium vector envs as batched TorchRL envs: one TensorDict per batched step.

TorchRL's ``GymWrapper`` refuses Gymnasium's default ``NEXT_STEP`` autoreset mode, breaks on Gymnasium's
numpy-vectorised envs (they have no ``autoreset_mode`` attribute) and costs a few milliseconds per batched
step. :class:`GymnasiumVectorEnv` drives a ``SAME_STEP`` vector env directly: the step that ends an episode
reports the true final observation under ``"next"`` and the reset observation at the root of the following
step, so termination and truncation stay separate and value estimators can bootstrap on truncation.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import signal
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import resource_tracker
from typing import Any, Literal, NamedTuple

import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode
from tensordict import TensorDictBase
from torchrl.envs import EnvBase

from envs.atari import check_atari_id, check_atari_kwargs, is_atari, make_atari_env, register_atari_envs
from envs.classic import torch_env_class
from envs.specs import (
    ACTION_MASK_KEY,
    EPISODE_LENGTH_KEY,
    EPISODE_RETURN_KEY,
    set_specs,
    space_to_spec,
    unchecked_tensordict,
)
from envs.wrappers import apply_wrappers, with_discrete_tuples, wrapper_error
from errors import InputError, is_whole_number

Vectorization = Literal["sync", "async"]
Backend = Literal["gymnasium", "torch"]


# Gymnasium's code and what it calls on a sub-env's results: its package, NumPy's, functools (singledispatch)
_GYMNASIUM_CODE = tuple(os.path.dirname(module.__file__) + os.sep for module in (gym, np)) + (
    functools.__file__,
)


def _raised_reading_a_result(error: BaseException) -> bool:
    """Whether ``error`` (a ``ValueError`` or ``TypeError``) came from Gymnasium reading what a sub-env's ``step``
    or ``reset`` returned (unpacking it in a wrapper, stacking it into the vector env's arrays), not from inside
    the sub-env: every frame below the call into the vector env is Gymnasium's (or NumPy's, which it calls)."""
    if not isinstance(error, (ValueError, TypeError, AttributeError)):
        return False
    frames, traceback = [], error.__traceback__
    while traceback is not None:
        frames.append(traceback.tb_frame.f_code.co_filename)
        traceback = traceback.tb_next
    inner = frames[1:]  # the first frame is the caller's, here
    return bool(inner) and all(name.startswith(_GYMNASIUM_CODE) for name in inner)


FLOAT32_MAX = float(np.finfo(np.float32).max)


def _nonfinite_rows(*arrays: np.ndarray) -> set[int]:
    rows: set[int] = set()
    for array in arrays:
        rows |= set(np.flatnonzero(~np.isfinite(array.reshape(len(array), -1)).all(axis=1)).tolist())
    return rows


def _start(space: gym.Space) -> int | np.ndarray | None:
    """The first value of a Discrete space, or of each component of a MultiDiscrete one; None where values start at
    0 (and for other spaces), so that stepping skips the shift."""
    if isinstance(space, gym.spaces.Discrete) and int(space.start) != 0:
        return int(space.start)
    if isinstance(space, gym.spaces.MultiDiscrete) and np.any(space.start != 0):
        return space.start
    return None


class StepArrays(NamedTuple):
    """One step of a Gymnasium vector env as NumPy arrays (:meth:`GymnasiumVectorEnv.step_arrays`)."""

    current: dict[str | None, np.ndarray]
    """The observations after any autoreset, per entry (key None for a space that is not a Dict)."""
    final: dict[str | None, np.ndarray]
    """The observations the step reached: a finished episode's final one where ``current`` holds its reset one."""
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    done: np.ndarray
    info: dict[str, Any]


class GymnasiumVectorEnv(EnvBase):
    """A Gymnasium vector env in ``SAME_STEP`` autoreset mode as a batched TorchRL env.

    Keys: ``"observation"``, ``"action"``, ``("next", "reward")``, ``("next", "terminated")``,
    ``("next", "truncated")``, ``("next", "done")``, plus the running ``"episode_return"`` and
    ``"episode_length"`` of each sub-env (at the end of an episode, ``("next", "episode_return")`` is the
    episode's return).

    :meth:`step_and_maybe_reset` (what collectors and ``rollout`` call) does the step and the reset of
    finished sub-envs in one pass, reusing the reset observation that Gymnasium already computed.

    Args:
        vector_env: a Gymnasium vector env with ``autoreset_mode`` ``SAME_STEP`` (see :func:`make_env`, which
            also converts the other modes).
        device: where the env's tensors live. Stepping happens in NumPy on the CPU.
        clip_actions: clip each action to the Box bounds on its way into the Gymnasium env, in NumPy, while the
            tensordict keeps the action it was given (the env side of an unsquashed Gaussian policy, see
            :func:`agents.gsde.clip_env_actions`). Needs a Box action space.

    Examples:
        >>> import gymnasium as gym
        >>> venv = gym.make_vec("CartPole-v1", 4, vectorization_mode="sync",
        ...                     vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
        >>> env = GymnasiumVectorEnv(venv)
        >>> env.rollout(3).batch_size
        torch.Size([4, 3])
    """

    def __init__(
        self, vector_env: gym.vector.VectorEnv, device: torch.device | str = "cpu", clip_actions: bool = False
    ):
        mode = getattr(vector_env, "autoreset_mode", vector_env.metadata.get("autoreset_mode"))
        if mode != AutoresetMode.SAME_STEP:
            raise InputError(
                f"GymnasiumVectorEnv needs autoreset_mode=SAME_STEP, got {mode}; build it with make_env."
            )
        num_envs = vector_env.num_envs
        super().__init__(device=device, batch_size=torch.Size([num_envs]))
        self.vector_env = vector_env
        self._name = vector_env.spec.id if vector_env.spec is not None else type(vector_env).__name__
        self.single_observation_space = vector_env.single_observation_space
        self.single_action_space = vector_env.single_action_space
        self._action_offset = _start(self.single_action_space)
        self._action_dtype = self.single_action_space.dtype
        self.clip_actions = clip_actions
        # each observation entry (one, None, for a space that is not a Dict): its NumPy dtype and start offset
        space = self.single_observation_space
        entries = space.spaces if isinstance(space, gym.spaces.Dict) else {None: space}
        self._observation_entries = {
            key: (torch.empty((), dtype=space_to_spec(entry, 1).dtype).numpy().dtype, _start(entry))
            for key, entry in entries.items()
        }
        self._on_cpu = self.device.type == "cpu"
        # an env that says which actions are allowed (Discrete actions; Gymnasium's info["action_mask"], found by
        # one reset here, or a Dict observation's "action_mask" entry of one value per action): the mask travels
        # as "action_mask" beside each observation
        discrete = isinstance(self.single_action_space, gym.spaces.Discrete)
        entry = entries.get(ACTION_MASK_KEY)
        self._mask_in_observation = (
            discrete and entry is not None and tuple(entry.shape) == (int(self.single_action_space.n),)
        )
        self.has_action_mask = discrete and (
            self._mask_in_observation or ACTION_MASK_KEY in self._reset_vector_env(None)[1]
        )
        set_specs(self, self.single_observation_space, self.single_action_space, self.has_action_mask)
        self._action_mask: torch.Tensor | None = None
        self._seed: int | None = None
        self._observation: torch.Tensor | None = None  # the current observation, after any autoreset
        self._episode_return = torch.zeros(num_envs, 1, device=self.device)
        self._episode_length = torch.zeros(num_envs, 1, dtype=torch.int64, device=self.device)

    @property
    def clip_actions(self) -> bool:
        """Whether actions are clipped to the Box bounds before they reach the Gymnasium env."""
        return self._clip_bounds is not None

    @clip_actions.setter
    def clip_actions(self, clip: bool) -> None:
        space = self.single_action_space
        if clip and not (isinstance(space, gym.spaces.Box) and np.issubdtype(space.dtype, np.floating)):
            raise InputError(f"Clipping actions needs a bounded Box action space, got {space}.")
        self._clip_bounds = (space.low, space.high) if clip else None

    def _set_seed(self, seed: int | None) -> None:
        self._seed = seed
        if seed is not None:
            self.vector_env.action_space.seed(seed)

    def _to_tensor(self, array: np.ndarray, dtype: np.dtype) -> torch.Tensor:
        """A tensor that owns its memory (vector envs built with ``copy=False`` reuse their arrays)."""
        tensor = torch.from_numpy(np.array(array, dtype=dtype, copy=True))
        return tensor if self._on_cpu else tensor.to(self.device, non_blocking=True)

    def _observation_arrays(self, observation: Any) -> dict[str | None, np.ndarray]:
        """Gymnasium observations as the spec's dtypes, Discrete ones shifted to start at 0: one array (key None),
        or one per entry of a Dict space."""
        arrays = {}
        for key, (dtype, offset) in self._observation_entries.items():
            array = np.asarray(observation if key is None else observation[key], dtype=dtype)
            arrays[key] = array if offset is None else array - offset
        return arrays

    def _observation_tensor(self, arrays: dict[str | None, np.ndarray]) -> torch.Tensor | TensorDictBase:
        tensors = {key: self._to_tensor(array, array.dtype) for key, array in arrays.items()}
        return (
            tensors[None] if None in tensors else unchecked_tensordict(tensors, self.batch_size, self.device)
        )

    def _mask_array(self, info: dict[str, Any], observations: dict[str | None, np.ndarray]) -> np.ndarray:
        """The allowed actions of each sub-env as booleans, from ``info`` or the observations' ``"action_mask"``
        entry; a sub-env that gave no mask, or allowed nothing (a terminal state), allows every action."""
        if self._mask_in_observation:
            info = {ACTION_MASK_KEY: observations[ACTION_MASK_KEY]}
        size = (self.batch_size[0], int(self.single_action_space.n))
        # a copy: the env's info and observation arrays stay as the env gave them
        mask = np.array(info.get("action_mask", np.ones(size)), dtype=bool).reshape(size)
        given = np.asarray(info.get("_action_mask", np.ones(size[0])), dtype=bool)
        mask[~given | ~mask.any(axis=1)] = True
        return mask

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        reset_mask = None if tensordict is None else tensordict.get("_reset", None)
        if reset_mask is None or self._observation is None:
            observation, info = self._reset_vector_env(self._seed)
            self._seed = None  # seed once; later resets continue the seeded generators
            arrays = self._observation_arrays(observation)
            self._check_finite(list(arrays.values()), "an observation at reset")
            self._observation = self._observation_tensor(arrays)
            if self.has_action_mask:
                self._action_mask = self._to_tensor(self._mask_array(info, arrays), np.bool_)
            self._episode_return = torch.zeros_like(self._episode_return)
            self._episode_length = torch.zeros_like(self._episode_length)
        else:
            # SAME_STEP: finished sub-envs were already reset by Gymnasium in the last step.
            reset_mask = reset_mask.reshape(self.batch_size + (1,))
            self._episode_return = self._episode_return.masked_fill(reset_mask, 0.0)
            self._episode_length = self._episode_length.masked_fill(reset_mask, 0)
        return self._root()

    def _reset_vector_env(self, seed: int | None) -> tuple[Any, dict[str, Any]]:
        """``vector_env.reset(seed=seed)``, with a wrapper's failure or a result Gymnasium cannot read (the old
        API's lone observation, one of another shape) as :class:`InputError` naming it."""
        try:
            return self.vector_env.reset(seed=seed)
        except Exception as error:
            if (translated := self._vector_env_error(error, "reset")) is None:
                raise  # the env's own error, with its own traceback
            raise translated from error

    def _vector_env_error(self, error: Exception, method: str) -> InputError | None:
        """What to raise for ``error`` from the vector env's ``method`` (``"step"`` or ``"reset"``): a wrapper's
        failure, or a result Gymnasium cannot read, as :class:`InputError`; None for the env's own error."""
        if (from_wrapper := wrapper_error(error, self._name, method)) is not None:
            return from_wrapper
        return self._unreadable(method, error) if _raised_reading_a_result(error) else None

    def _unreadable(self, method: str, error: BaseException) -> InputError:
        """The error for a sub-env's ``method`` (``"step"`` or ``"reset"``) that returned what cannot be stored."""
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        returns = (
            "(observation, reward, terminated, truncated, info) with a plain number as the reward and booleans as "
            "terminated and truncated (not arrays such as np.array([1.0])), and"
            if method == "step"
            else "(observation, info), with"
        )
        return InputError(
            f"{self._name}'s {method} returned something Gymnasium's vector env cannot store ({reason}): {method} "
            f"must return {returns} an observation of the observation space's shape."
        )

    def _root(self) -> TensorDictBase:
        not_done = torch.zeros(self.batch_size + (1,), dtype=torch.bool, device=self.device)
        root = {
            "observation": self._observation,
            EPISODE_RETURN_KEY: self._episode_return,
            EPISODE_LENGTH_KEY: self._episode_length,
            "done": not_done,
            "terminated": not_done.clone(),
            "truncated": not_done.clone(),
        }
        if self.has_action_mask:
            root[ACTION_MASK_KEY] = self._action_mask
        return unchecked_tensordict(root, self.batch_size, self.device)

    def step_arrays(self, action: torch.Tensor) -> StepArrays:
        """Step every sub-env with ``action`` and return what they gave as NumPy arrays, leaving the env's own
        state (its current observation, the episodes' returns and lengths) to the caller.

        Raises:
            InputError: the env returned NaN or Inf in an observation or reward.
        """
        action = action.detach().cpu().numpy()
        if self._clip_bounds is not None:
            action = np.clip(action, *self._clip_bounds)  # a copy: the tensordict keeps the policy's action
        if self._action_offset is not None:
            action = action + self._action_offset
        try:
            observation, reward, terminated, truncated, info = self.vector_env.step(
                action.astype(self._action_dtype)
            )
        except Exception as error:
            if (translated := self._vector_env_error(error, "step")) is None:
                raise  # the env's own error, with its own traceback
            raise translated from error
        done = np.logical_or(terminated, truncated)
        current = self._observation_arrays(observation)
        final = current
        if done.any():
            finished = np.flatnonzero(info["_final_obs"])
            try:
                last = (
                    self._observation_arrays(  # the finished episodes' final observations, stacked per entry
                        {
                            key: np.stack([entries[key] for entries in info["final_obs"][finished]])
                            for key in current
                        }
                        if None not in current
                        else np.stack(info["final_obs"][finished])
                    )
                )
                final = {key: array.copy() for key, array in current.items()}
                for key, array in final.items():
                    array[finished] = last[key]
            except ValueError as error:  # a final observation of another shape (the next one was a reset's)
                raise self._unreadable("step", error) from error
        arrays = [*current.values(), reward, *(final.values() if final is not current else ())]
        self._check_finite(arrays, "an observation or reward")
        beyond = np.flatnonzero(np.abs(np.asarray(reward, np.float64)) > FLOAT32_MAX)
        if beyond.size:  # rewards are kept as float32, where these would be Inf
            raise InputError(
                f"{self._name} returned a reward beyond float32's range (|reward| > {FLOAT32_MAX:.2e}; sub-envs "
                f"{beyond.tolist()}); scale the env's rewards. Checkpoints written so far are kept."
            )
        return StepArrays(current, final, reward, terminated, truncated, done, info)

    def _check_finite(self, arrays: list[np.ndarray], returned: str) -> None:
        """Raise :class:`InputError` naming the sub-envs where a float array of ``arrays`` holds NaN or Inf
        (before any of it reaches the policy)."""
        if not all(np.isfinite(array).all() for array in arrays if array.dtype.kind in "fc"):  # floats only
            raise InputError(
                f"{self._name} returned NaN or Inf in {returned} (sub-envs {sorted(_nonfinite_rows(*arrays))}); "
                "check the env and its wrappers. Checkpoints written so far are kept."
            )

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        current, final, reward, terminated, truncated, done, info = self.step_arrays(tensordict.get("action"))
        self._observation = self._observation_tensor(current)
        reward = self._to_tensor(reward[:, None], np.float32)
        self._episode_return = self._episode_return + reward
        self._episode_length = self._episode_length + 1
        flags = self._to_tensor(np.stack([done, terminated, truncated], axis=1)[..., None], np.bool_)
        next_step = {
            "observation": self._observation_tensor(final),
            "reward": reward,
            "done": flags[:, 0],
            "terminated": flags[:, 1],
            "truncated": flags[:, 2],
            EPISODE_RETURN_KEY: self._episode_return,
            EPISODE_LENGTH_KEY: self._episode_length,
        }
        if (
            self.has_action_mask
        ):  # the next state's mask: a finished episode's final one, the reset one carried on
            mask = self._mask_array(info, current)
            final_mask = mask
            if done.any() and self._mask_in_observation:
                final_mask = self._mask_array(info, final)
            elif done.any() and "final_info" in info:
                final_mask = mask.copy()
                finished = np.flatnonzero(info["_final_info"])
                final_mask[finished] = self._mask_array(info["final_info"], final)[finished]
            self._action_mask = self._to_tensor(mask, np.bool_)
            next_step[ACTION_MASK_KEY] = self._to_tensor(final_mask, np.bool_)
        return unchecked_tensordict(next_step, self.batch_size, self.device)

    def _step_and_maybe_reset(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
        """Step, then reset finished sub-envs from the observations Gymnasium already reset (no extra call)."""
        next_td = self._step(tensordict)
        tensordict.set("next", next_td)
        done = next_td.get("done")
        self._episode_return = self._episode_return.masked_fill(done, 0.0)
        self._episode_length = self._episode_length.masked_fill(done, 0)
        return tensordict, self._root()

    def close(self, *, raise_if_closed: bool = True) -> None:
        self.vector_env.close()
        super().close(raise_if_closed=raise_if_closed)


def env_spec(env_id: str, import_module: bool = True) -> gym.envs.registration.EnvSpec:
    """Gymnasium's spec of ``env_id``, importing the module of a ``"module:EnvId"`` id first (the form
    ``gymnasium.make`` takes for an env registered by the user's own module); ``ALE/...`` ids are registered first,
    which needs ``ale-py``.

    Args:
        env_id: a registered id, or ``"module:EnvId"``.
        import_module: import the module a ``"module:EnvId"`` id names. Pass False for an id read from a file
            (a checkpoint): then the module must already be imported, since loading a file never runs code.

    Raises:
        InputError: the module name is malformed, cannot be (or, without ``import_module``, is not) imported, the
            id is not registered, or it is one of ALE's older ids (:func:`envs.atari.check_atari_id`).
    """
    if not isinstance(env_id, str):
        raise InputError(f"An env id is a string such as 'CartPole-v1', got {env_id!r}.")
    if is_atari(env_id):
        register_atari_envs()
    module, separator, name = env_id.rpartition(":")
    if separator:
        if not module or not all(part.isidentifier() for part in module.split(".")):
            raise InputError(
                f"Env id {env_id!r} names the module {module!r}, which is not an importable module name (a dotted "
                "name such as my_package.my_envs)."
            )
        if not import_module and module not in sys.modules:
            raise InputError(
                f"Env id {env_id!r} names the module {module!r}, which is not imported; a checkpoint never makes "
                f"this toolkit import code. Import {module} yourself first, or name the env explicitly (for "
                f"recipes.evaluate: --env-id {env_id})."
            )
        try:
            importlib.import_module(module)
        except (ImportError, ValueError, TypeError) as error:
            raise InputError(
                f"Env id {env_id!r} names the module {module!r}, which cannot be imported ({error}); put it on "
                "PYTHONPATH (or install it) so that importing it registers the env."
            ) from None
    # PongNoFrameskip-v4 and the like exist once ale_py is imported, but without the toolkit's preprocessing
    check_atari_id(name if separator else env_id)
    try:
        return gym.spec(name if separator else env_id)
    except gym.error.Error as error:
        raise InputError(
            f"Unknown Gymnasium env id {env_id!r} ({error}). Use a registered id such as 'CartPole-v1', or "
            "'my_module:MyEnv-v0' for an env that my_module registers; gymnasium.pprint_registry() lists them all."
        ) from None


def check_env_id(env_id: str) -> None:
    """Raise :class:`InputError` unless ``env_id`` is registered with Gymnasium (see :func:`env_spec`)."""
    env_spec(env_id)


def _constructor_parameters(creator: Any) -> tuple[dict[str, inspect.Parameter], bool]:
    """The keyword parameters ``creator`` takes, following a class's ``**kwargs`` up its bases' ``__init__`` (as
    MuJoCo's envs pass theirs to ``MujocoEnv``), and whether any name goes (a ``**kwargs`` no base closes)."""
    classes = creator.__mro__ if isinstance(creator, type) else (creator,)
    parameters: dict[str, inspect.Parameter] = {}
    for owner in classes:
        function = owner.__init__ if isinstance(owner, type) else owner
        if isinstance(owner, type) and "__init__" not in vars(owner):
            continue
        if owner is object:
            return parameters, True  # an __init__ handing **kwargs to object: not read here
        own = inspect.signature(function).parameters
        for name, parameter in own.items():
            if parameter.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY):
                parameters.setdefault(name, parameter)
        if not any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in own.values()):
            return parameters, False
    return parameters, True


# keyword arguments gymnasium.make takes itself, before the env's constructor
MAKE_KWARGS = {"max_episode_steps", "disable_env_checker", "autoreset", "apply_api_compatibility"}


def check_env_kwargs(env_id: str, kwargs: dict[str, Any], option: str = "--env-kwargs") -> None:
    """Raise :class:`InputError` for a keyword argument that ``env_id``'s constructor does not take, or for text
    given where the constructor's default is a flag or a number (``continuous=ture`` would be truthy text).

    A class's ``**kwargs`` are followed to its bases' ``__init__`` (MuJoCo's envs pass theirs to ``MujocoEnv``);
    where no base closes them, any name goes. A constructor whose signature cannot be read is not checked. Atari ids
    refuse the arguments the toolkit sets itself (:func:`envs.atari.check_atari_kwargs`), ``render_mode`` included.
    ``gymnasium.make``'s own arguments are checked whatever the env: ``max_episode_steps`` a whole number of at
    least 1 (Gymnasium would read -1 as no time limit), the others true, false or None (Gymnasium's
    default)."""
    for key in MAKE_KWARGS & kwargs.keys():
        value = kwargs[key]
        if key == "max_episode_steps":
            if not is_whole_number(value) or value < 1:
                raise InputError(
                    f"{option} max_episode_steps={value!r}: a time limit is a whole number of steps, at least 1."
                )
        elif value is not None and not isinstance(value, bool):
            raise InputError(f"{option} {key}={value!r}: gymnasium.make's {key} is true, false or null.")
    entry_point = env_spec(env_id).entry_point
    if is_atari(env_id):
        check_atari_kwargs(kwargs, option)
    try:
        creator = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
        parameters, open_ended = _constructor_parameters(creator)
    except (ValueError, TypeError, ImportError, AttributeError):
        return
    for key, value in kwargs.items():
        parameter = parameters.get(key)
        if parameter is None:
            if open_ended or key in MAKE_KWARGS:
                continue
            names = ", ".join(name for name in parameters if name not in ("self", "args", "kwargs")) or "none"
            raise InputError(
                f"{option} {key}={value!r}: {env_id} takes no argument {key!r}; it takes: {names}."
            )
        default = parameter.default
        if isinstance(default, bool) and not isinstance(value, bool):
            raise InputError(
                f"{option} {key}={value!r}: {env_id}'s {key} is true or false (default {default})."
            )
        if (
            isinstance(default, (int, float))
            and not isinstance(default, bool)
            and not isinstance(value, (int, float))
        ):
            raise InputError(f"{option} {key}={value!r}: {env_id}'s {key} is a number (default {default}).")


def registration(env_id: str) -> dict[str, Any]:
    """How ``env_id`` is registered with Gymnasium, as JSON-compatible data: its entry point, keyword arguments and
    time limit (what builds the env: a resumed run checks it is unchanged)."""
    spec = env_spec(env_id)
    return json.loads(
        json.dumps(
            {
                "entry_point": _stable_name(spec.entry_point),
                "kwargs": spec.kwargs,
                "max_episode_steps": spec.max_episode_steps,
            },
            default=_stable_name,
        )
    )


def _stable_name(value: Any) -> Any:
    """A name for a registration value that is the same in every process: strings as they are, classes and
    functions as ``module:qualname`` (an entry-point string's form), other objects by their type (their repr may
    hold a memory address)."""
    if isinstance(value, str):
        return value
    if callable(value) and hasattr(value, "__qualname__"):
        return f"{getattr(value, '__module__', '?')}:{value.__qualname__}"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def _to_same_step(vector_env: gym.vector.VectorEnv) -> gym.vector.VectorEnv:
    """Return a vector env equivalent to ``vector_env`` whose autoreset mode is ``SAME_STEP``."""
    mode = getattr(vector_env, "autoreset_mode", vector_env.metadata.get("autoreset_mode"))
    if mode == AutoresetMode.SAME_STEP:
        return vector_env
    if isinstance(vector_env, gym.vector.SyncVectorEnv) and mode == AutoresetMode.NEXT_STEP:
        # Sub-envs are plain Gymnasium envs: re-host them in a SAME_STEP vector env.
        return gym.vector.SyncVectorEnv(
            [lambda env=env: env for env in vector_env.envs], autoreset_mode=AutoresetMode.SAME_STEP
        )
    spec = vector_env.spec
    wrapped = isinstance(vector_env, gym.vector.VectorWrapper) or (
        spec is not None and spec.kwargs.get("wrappers")
    )
    if wrapped and mode == AutoresetMode.NEXT_STEP:
        raise InputError(
            f"{type(vector_env).__name__} steps in NEXT_STEP autoreset mode, which TorchRL transitions cannot take, "
            "and rebuilding it in SAME_STEP mode would drop its wrappers: build it with vector_kwargs="
            "{'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}, or pass the env id with wrappers= "
            "(--env-wrappers)."
        )
    if spec is not None and mode == AutoresetMode.NEXT_STEP:
        # NEXT_STEP hands out the reset observation one step late, in a step that ignores the action: it
        # cannot be turned into a TorchRL transition. Rebuild the same env per sub-env instead.
        warnings.warn(
            f"{type(vector_env).__name__} only supports NEXT_STEP autoreset; rebuilding {spec.id!r} as a "
            "SyncVectorEnv in SAME_STEP mode with the same kwargs.",
            stacklevel=3,
        )
        env_kwargs = {
            key: value
            for key, value in spec.kwargs.items()
            if key not in ("num_envs", "vectorization_mode", "vector_kwargs", "wrappers")
        }
        rebuilt = gym.make_vec(
            spec.id,
            num_envs=vector_env.num_envs,
            vectorization_mode="sync",
            vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
            **env_kwargs,
        )
        vector_env.close()
        return rebuilt
    raise InputError(
        f"{type(vector_env).__name__} with autoreset_mode={mode} cannot be converted to SAME_STEP. Build it with "
        "vector_kwargs={'autoreset_mode': gymnasium.vector.AutoresetMode.SAME_STEP}, or pass the env id."
    )


def make_env(
    env: str | gym.Env | gym.vector.VectorEnv,
    num_envs: int = 1,
    device: torch.device | str = "cpu",
    seed: int | None = None,
    vectorization: Vectorization = "sync",
    env_kwargs: dict[str, Any] | None = None,
    backend: Backend = "gymnasium",
    dtype: torch.dtype = torch.float32,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
) -> EnvBase:
    """Build a batched TorchRL env from a Gymnasium id, env or vector env.

    With ``backend="torch"`` the env is one of the torch-native classic-control envs (:mod:`envs.classic`):
    the whole batch steps as tensor operations on ``device``, with no Gymnasium or NumPy in the loop.

    An Atari id (``"ALE/Pong-v5"``) gives sub-envs from :func:`envs.atari.make_atari_env` with ``training=True``:
    ``uint8`` observations of 4 stacked 84x84 frames, a lost life ending the episode and rewards clipped to their
    sign, so ``"episode_return"`` is a clipped per-life return.

    Args:
        env: a registered Gymnasium id (``"CartPole-v1"``), a Gymnasium env (then ``num_envs`` must be 1) or a
            Gymnasium vector env of any autoreset mode.
        num_envs: number of sub-envs stepped together (ignored for a vector env, which has its own).
        device: device of the returned tensors.
        seed: seeds sub-env ``i`` with ``seed + i`` at the first reset, and the action space.
        vectorization: ``"sync"`` steps sub-envs one after another in this process (best on few cores);
            ``"async"`` steps each in its own process.
        env_kwargs: keyword arguments for ``gymnasium.make`` (the torch backend takes ``max_episode_steps``;
            Atari ids pass them to :func:`envs.atari.make_atari_env`).
        backend: ``"gymnasium"`` (any env) or ``"torch"`` (CartPole-v1, Pendulum-v1, MountainCar-v0,
            MountainCarContinuous-v0, Acrobot-v1).
        dtype: state dtype of the torch backend (``torch.float64`` reproduces Gymnasium's arithmetic).
        wrappers: functions wrapping each Gymnasium sub-env, innermost first (:func:`envs.wrappers.wrapper_functions`;
            not for a vector env or the torch backend).

    Returns:
        A :class:`GymnasiumVectorEnv`, or a :class:`envs.classic.ClassicControlEnv` for the torch backend,
        with batch size ``[num_envs]``.

    Raises:
        InputError: unknown id, ``num_envs`` or ``seed`` not a whole number (or below 1 and 0), a device that is
            malformed or absent here, ``env_kwargs`` the env's constructor does not take, an unsupported space,
            autoreset mode or backend.

    Examples:
        >>> env = make_env("CartPole-v1", num_envs=8, seed=0)
        >>> env.reset()["observation"].shape
        torch.Size([8, 4])
    """
    device = check_device(str(device))
    if seed is not None:
        if not is_whole_number(seed) or seed < 0:
            raise InputError(f"seed must be a whole number of at least 0, or None; got {seed!r:.60}.")
        seed = int(seed)  # NumPy's integers too, as the recipes take them
    if not is_whole_number(num_envs):
        raise InputError(f"num_envs must be a whole number of at least 1, got {num_envs!r:.60}.")
    num_envs = int(num_envs)
    if env_kwargs is not None and not isinstance(env_kwargs, dict):
        raise InputError(
            f"env_kwargs takes a dict of the env constructor's keyword arguments, got {env_kwargs!r:.60}."
        )
    if isinstance(env, str) and env_kwargs and backend == "gymnasium":
        check_env_id(env)
        check_env_kwargs(env, env_kwargs, "env_kwargs")
        if "max_episode_steps" in env_kwargs:  # Gymnasium's TimeLimit takes Python's int alone
            env_kwargs = {**env_kwargs, "max_episode_steps": int(env_kwargs["max_episode_steps"])}
    if wrappers and (backend == "torch" or isinstance(env, gym.vector.VectorEnv)):
        raise InputError(
            "Wrappers wrap Gymnasium sub-envs: pass an env id or env with the gymnasium backend."
        )
    if backend == "torch":
        return _make_torch_env(env, num_envs, device, seed, env_kwargs, dtype)
    wrappers = (*wrappers, with_discrete_tuples)  # outermost: Tuple-of-Discrete observations as MultiDiscrete
    if backend != "gymnasium":
        raise InputError(f"backend must be 'gymnasium' or 'torch', got {backend!r}.")
    if isinstance(env, gym.vector.VectorEnv):
        vector_env = _to_same_step(env)
    else:
        if num_envs < 1:
            raise InputError(f"num_envs must be at least 1, got {num_envs}.")
        if vectorization not in ("sync", "async"):
            raise InputError(f"vectorization must be 'sync' or 'async', got {vectorization!r}.")
        if isinstance(env, gym.Env):
            if num_envs != 1:
                raise InputError(
                    "A Gymnasium env object cannot be copied into several sub-envs: pass its id, or num_envs=1."
                )
            wrapped = apply_wrappers(env, wrappers)
            vector_env = gym.vector.SyncVectorEnv([lambda: wrapped], autoreset_mode=AutoresetMode.SAME_STEP)
        elif isinstance(env, str) and is_atari(env):
            check_env_id(env)
            vector_class = gym.vector.SyncVectorEnv if vectorization == "sync" else gym.vector.AsyncVectorEnv
            make_sub_env = functools.partial(
                _wrapped_atari_env, env, tuple(wrappers), training=True, **(env_kwargs or {})
            )
            with sigint_ignored_by_children():
                vector_env = vector_class([make_sub_env] * num_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        elif isinstance(env, str):
            check_env_id(env)
            with sigint_ignored_by_children():
                vector_env = gym.make_vec(
                    env,
                    num_envs=num_envs,
                    vectorization_mode=vectorization,
                    vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
                    wrappers=list(wrappers),
                    **(env_kwargs or {}),
                )
        else:
            raise InputError(f"make_env takes a Gymnasium id, env or vector env, got {type(env).__name__}.")
    torchrl_env = GymnasiumVectorEnv(vector_env, device=device)
    if seed is not None:
        torchrl_env.set_seed(seed)
    return torchrl_env


@contextlib.contextmanager
def sigint_ignored_by_children() -> Iterator[None]:
    """Block SIGINT in this thread while processes are started inside: they inherit the blocked signal (through
    fork and exec alike) and never see it, so Ctrl-C in a terminal (sent to the whole process group) reaches only
    the training loop, which finishes its batch, saves and closes them itself. This process keeps its handler: a
    Ctrl-C meanwhile goes to another of its threads or waits until the block ends, never lost (ignoring SIGINT here
    instead would drop one pressed while the processes start, and the run would go on). SIGTERM keeps its
    default."""
    # multiprocessing's resource tracker unblocks SIGINT in the thread that starts it: start it first
    resource_tracker.ensure_running()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _wrapped_atari_env(env_id: str, wrappers: tuple, **options: Any) -> gym.Env:
    return apply_wrappers(make_atari_env(env_id, **options), wrappers)


def _make_torch_env(env, num_envs, device, seed, env_kwargs, dtype) -> EnvBase:
    if not isinstance(env, str):
        raise InputError(
            "The torch backend builds envs from an id such as 'CartPole-v1', not from an env object."
        )
    env_class = torch_env_class(env)
    options = dict(env_kwargs or {})
    max_episode_steps = options.pop("max_episode_steps", None)
    if options:
        raise InputError(
            f"The torch backend takes only max_episode_steps in env_kwargs, got {sorted(options)}."
        )
    return env_class(num_envs, device=device, dtype=dtype, seed=seed, max_episode_steps=max_episode_steps)


def check_device(name: str) -> torch.device:
    """Return ``torch.device(name)``, or raise :class:`InputError` if it is malformed or absent here."""
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise InputError(f"Device {name!r} is not a torch device (try 'cpu' or 'cuda').") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"Device {name!r} was asked for but no CUDA device is available; use 'cpu'.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(
                f"Device {name!r} does not exist: this machine has {torch.cuda.device_count()} GPU(s)."
            )
    elif device.type == "cpu" and device.index is not None:  # torch's "cpu:0" is "cpu" with another name
        raise InputError(f"Device {name!r}: the CPU takes no index here; use 'cpu'.")
    elif device.type in ("mps", "xpu"):
        backend = (
            getattr(torch.backends, device.type, None)
            if device.type == "mps"
            else getattr(torch, "xpu", None)
        )
        if backend is None or not backend.is_available():
            raise InputError(
                f"Device {name!r} was asked for but this torch build or machine has none; use 'cpu'."
            )
    elif device.type != "cpu":
        raise InputError(f"Device {name!r} is not supported; use 'cpu' or 'cuda'.")
    return device
