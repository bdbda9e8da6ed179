"""Gymnasium wrappers named on the command line (``--env-wrappers``), :class:`MaxTotalReward`, and
:class:`DiscreteTuple`, which every env the toolkit makes gets when it has Tuple-of-Discrete observations.

A wrapper is named by its import path, with its keyword arguments as a JSON object after ``=``::

    gymnasium.wrappers.TimeAwareObservation
    gymnasium.wrappers.ClipReward={"min_reward": -1, "max_reward": 1}

Importing a module runs its code, so a path read from a file (a checkpoint, a resumed run) is imported only when it
is trusted: a class of Gymnasium (``gymnasium.*``) or of this toolkit's env layer (``envs.*``), or one the user
allows by name (``Agent.load(path, allow_wrappers=[...])``, ``--allow-wrappers``). The wrapper itself must be a
``gymnasium.Wrapper`` subclass; anything else is refused before it is called. Gymnasium's wrappers that write files
where their arguments say (``RecordVideo``, :data:`WRITING_WRAPPERS`) need allowing by name too when a file names
them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np

from errors import InputError, loads_finite

TRUSTED_PACKAGES = ("gymnasium", "envs")  # importing these runs no code a file could bring
_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
MAX_WRAPPERS = 32  # a checkpoint naming more is forged
MAX_TOTAL_REWARD = "envs.wrappers.MaxTotalReward"  # --max-total-reward's wrapper
# trusted wrappers that write files wherever their arguments say: named in a file, they too need allowing by name
WRITING_WRAPPERS = (gym.wrappers.RecordVideo,)


class MaxTotalReward(gym.Wrapper):
    """End an episode (as a truncation: value estimators still bootstrap) once its return reaches
    ``max_total_reward`` (rlib's ``max_total_reward``).

    Examples:
        >>> env = MaxTotalReward(gym.make("CartPole-v1"), 100)   # episodes of at most 100 reward
    """

    def __init__(self, env: gym.Env, max_total_reward: float):
        super().__init__(env)
        self.max_total_reward = float(max_total_reward)
        self._total = 0.0
        self._steps = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        self._total, self._steps = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self._total += float(reward)
        self._steps += 1
        reached = self._total >= self.max_total_reward
        if reached and self._steps == 1 and not (terminated or truncated):
            # one text for every env and episode: Python's warnings show it once per process
            warnings.warn(
                f"--max-total-reward {self.max_total_reward:g} ended an episode at its first step (the first "
                "reward already reached it), as it ends every episode whose first reward is at or above it (a "
                "threshold at or below 0 with negative rewards); set it above the returns you mean to cap.",
                stacklevel=2,
            )
        return observation, reward, terminated, truncated or reached, info


class DiscreteTuple(gym.ObservationWrapper):
    """A ``Tuple`` of ``Discrete`` observations (Blackjack-v1's ``(player sum, dealer card, usable ace)``) as the
    ``MultiDiscrete`` space of the same values, one integer array per observation, which every recipe reads.

    Examples:
        >>> env = DiscreteTuple(gym.make("Blackjack-v1"))
        >>> env.observation_space
        MultiDiscrete([32 11  2])
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        if not is_discrete_tuple(env.observation_space):
            raise InputError(
                f"DiscreteTuple wraps Tuple observations of Discrete spaces, got {env.observation_space}."
            )
        parts = env.observation_space.spaces
        self.observation_space = gym.spaces.MultiDiscrete(
            [int(part.n) for part in parts], dtype=np.int64, start=[int(part.start) for part in parts]
        )

    def observation(self, observation: Any) -> np.ndarray:
        return np.asarray(observation, dtype=np.int64)


def is_discrete_tuple(space: gym.Space) -> bool:
    """Whether ``space`` is a non-empty ``Tuple`` of ``Discrete`` spaces."""
    return (
        isinstance(space, gym.spaces.Tuple)
        and len(space.spaces) > 0
        and all(type(part) is gym.spaces.Discrete for part in space.spaces)
    )


def with_discrete_tuples(env: gym.Env) -> gym.Env:
    """``env`` wrapped by :class:`DiscreteTuple` when its observations are a ``Tuple`` of ``Discrete`` spaces; else
    ``env`` itself (the outermost wrapper of every env the toolkit makes)."""
    return DiscreteTuple(env) if is_discrete_tuple(env.observation_space) else env


def parse_env_wrappers(items: Iterable[str]) -> list[dict[str, Any]]:
    """``["gymnasium.wrappers.ClipReward={\"max_reward\": 1}"]`` -> ``[{"path": "gymnasium.wrappers.ClipReward",
    "kwargs": {"max_reward": 1}}]``.

    Raises:
        InputError: a path that is not a dotted import path, keyword arguments that are not a JSON object, or a
            number in them that is not finite.
    """
    specs = []
    for item in items:
        path, separator, text = str(item).partition("=")
        kwargs: Any = {}
        if separator:
            try:
                kwargs = loads_finite(text, f"--env-wrappers {path.strip()}")
            except InputError:
                raise
            except ValueError:
                kwargs = None
        if not isinstance(kwargs, dict):
            raise InputError(
                f"--env-wrappers takes IMPORT.PATH or IMPORT.PATH={{JSON object of keyword arguments}}, such as "
                f'gymnasium.wrappers.ClipReward={{"max_reward": 1}}; got {item!r}.'
            )
        specs.append(check_wrapper_spec({"path": path.strip(), "kwargs": kwargs}))
    return specs


def check_wrapper_spec(spec: Any) -> dict[str, Any]:
    """``spec`` if it is ``{"path": dotted import path, "kwargs": {str: JSON value}}``, else :class:`InputError`."""
    if not isinstance(spec, dict) or set(spec) != {"path", "kwargs"}:
        raise InputError(f"A wrapper is described by its path and kwargs; got {spec!r}.")
    path, kwargs = spec["path"], spec["kwargs"]
    if not isinstance(path, str) or not _PATH.fullmatch(path):
        raise InputError(
            f"A wrapper is named by its import path, such as gymnasium.wrappers.TimeAwareObservation; got {path!r}."
        )
    if not isinstance(kwargs, dict) or not all(isinstance(key, str) and key.isidentifier() for key in kwargs):
        raise InputError(f"The keyword arguments of {path} must be a JSON object with identifier keys.")
    return {"path": path, "kwargs": kwargs}


def is_trusted(path: str) -> bool:
    """Whether importing ``path`` runs only Gymnasium's or this toolkit's code."""
    return path.split(".")[0] in TRUSTED_PACKAGES


def wrapper_functions(
    specs: Sequence[dict[str, Any]], allowed: Iterable[str] = ()
) -> list[Callable[[gym.Env], gym.Env]]:
    """One ``env -> wrapped env`` function per spec, in order, importing each wrapper's module.

    Args:
        specs: wrapper descriptions (:func:`parse_env_wrappers`).
        allowed: import paths that may be imported besides Gymnasium's and this toolkit's.

    Raises:
        InputError: a path neither trusted nor allowed, a module that cannot be imported, a name it lacks, or a
            name that is not a ``gymnasium.Wrapper`` subclass.
    """
    if len(specs) > MAX_WRAPPERS:
        raise InputError(f"At most {MAX_WRAPPERS} env wrappers are supported; got {len(specs)}.")
    allowed = set(allowed)
    functions = []
    for spec in specs:
        path, kwargs = check_wrapper_spec(spec)["path"], spec["kwargs"]
        if not is_trusted(path) and path not in allowed:
            raise InputError(
                f"The env is wrapped by {path}, named in the file being read; importing it would run that module's "
                f"code. If you trust it, allow it by name: Agent.load(..., allow_wrappers=[{path!r}]), or "
                f"--allow-wrappers {path} on the command line."
            )
        module_name, _, name = path.rpartition(".")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise InputError(f"Cannot import the wrapper {path}: {error}.") from None
        wrapper = getattr(module, name, None)
        if not (isinstance(wrapper, type) and issubclass(wrapper, gym.Wrapper)):
            raise InputError(
                f"{path} is not a gymnasium.Wrapper subclass; --env-wrappers takes wrapper classes."
            )
        if issubclass(wrapper, WRITING_WRAPPERS) and path not in allowed:
            raise InputError(
                f"The env is wrapped by {path}, named in the file being read, which writes files where its "
                f"arguments say ({kwargs!r:.120}). If you trust it, allow it by name: Agent.load(..., "
                f"allow_wrappers=[{path!r}]), or --allow-wrappers {path} on the command line."
            )
        functions.append(functools.partial(_wrap, wrapper, path, kwargs))
    return functions


def _wrap(wrapper: type[gym.Wrapper], path: str, kwargs: dict[str, Any], env: gym.Env) -> gym.Env:
    try:
        wrapped = wrapper(env, **_typed_arrays(wrapper, kwargs))
    except TypeError as error:
        raise InputError(f"{path}({', '.join(kwargs)}) failed: {error}.") from None
    _NAMED_WRAPPERS[wrapped] = f"{path}={json.dumps(kwargs)}" if kwargs else path
    return wrapped


# the wrappers made from --env-wrappers, as the option named them: an error raised in their own code is theirs
_NAMED_WRAPPERS: weakref.WeakKeyDictionary[gym.Env, str] = weakref.WeakKeyDictionary()


def failing_wrapper(error: BaseException) -> str | None:
    """The ``--env-wrappers`` item whose own code raised ``error`` (the innermost env or wrapper method on its
    traceback is one of that wrapper's), or None: the env's own error, or one raised outside any env."""
    culprit = None
    traceback = error.__traceback__
    while traceback is not None:
        owner = traceback.tb_frame.f_locals.get("self")
        if isinstance(owner, gym.Env):
            culprit = owner
        traceback = traceback.tb_next
    return None if culprit is None else _NAMED_WRAPPERS.get(culprit)


def wrapper_error(error: BaseException, name: str, call: str) -> InputError | None:
    """An :class:`InputError` naming the wrapper whose code raised ``error`` in ``call`` of env ``name``, or None
    when no wrapper of ``--env-wrappers`` did."""
    culprit = failing_wrapper(error)
    if culprit is None:
        return None
    reason = str(error).splitlines()[0] if str(error) else ""
    return InputError(
        f"The env wrapper {culprit} failed in {name}'s {call}: {type(error).__name__}: {reason:.300} (check its "
        "keyword arguments and their types in --env-wrappers). Checkpoints written so far are kept."
    )


def _typed_arrays(wrapper: type[gym.Wrapper], kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with each JSON array given as the container the wrapper's annotation names for it: a tuple for
    a ``tuple[...]`` parameter (``ResizeObservation(shape=...)``), a NumPy array for an ``np.ndarray`` one
    (``RescaleAction(min_action=...)``; float32 for floats), which JSON cannot spell and Gymnasium's wrappers
    check for; other values and parameters as they are."""
    try:
        parameters = inspect.signature(wrapper.__init__).parameters
    except (TypeError, ValueError):
        return kwargs
    typed = dict(kwargs)
    for name, value in kwargs.items():
        parameter = parameters.get(name)
        if not isinstance(value, list) or parameter is None:
            continue
        annotation = str(parameter.annotation)
        if re.search(r"\b(tuple|Tuple)\b", annotation):
            typed[name] = tuple(value)
        elif "ndarray" in annotation:
            try:
                array = np.asarray(value)
            except ValueError:  # ragged: the wrapper says what it expected
                continue
            # Gymnasium's Boxes are float32: a float64 bound would be cast down with a warning
            typed[name] = array.astype(np.float32) if array.dtype == np.float64 else array
    return typed


def apply_wrappers(env: gym.Env, functions: Sequence[Callable[[gym.Env], gym.Env]]) -> gym.Env:
    """``env`` wrapped by each function in turn (the first is innermost)."""
    for function in functions:
        env = function(env)
    return env
