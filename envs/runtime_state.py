"""The mid-episode state of a training env, as plain data (tensors, arrays, numbers, strings), for exact resume.

A torch-backend env's state is its tensors and its generator. A Gymnasium env's state is read from the
attributes of every layer of every sub-env (the wrappers and the env itself) and of the vector env: numbers,
strings, numeric arrays and tuples or lists of them are copied, NumPy generators are saved as their bit
generator's state, spaces' generators likewise. Dicts (configuration such as ``metadata`` or Taxi's transition
table), arrays of bytes or strings (maps), the env spec, callables and the wrapped env are skipped. Any other attribute (a physics engine handle such as
a Box2D world, a MuJoCo ``MjData``, the ALE emulator) makes the env's state uncapturable: then
:func:`env_runtime_state` returns None and a resumed run starts new episodes instead.

Restoring sets those attributes on a freshly built env of the same id, each only to a value of the kind the fresh
env holds there (numbers for numbers, an array of the same shape, text for text), the vector env's configuration
(its numbers and text, such as ``num_envs``) only to the value it already has, and never an attribute its class
defines (a method); nothing is unpickled or imported.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.envs import EnvBase, TransformedEnv

from envs.classic import ClassicControlEnv
from envs.vector import GymnasiumVectorEnv
from errors import InputError

# attributes that describe the env rather than its state, or that hold the layers below
_SKIPPED = {"env", "envs", "env_fns", "spec", "_cached_spec", "unwrapped", "closed"}
_BIT_GENERATORS = {
    name: getattr(np.random, name) for name in ("PCG64", "PCG64DXSM", "MT19937", "Philox", "SFC64")
}


class _Uncapturable(Exception):
    """An attribute whose value is not plain data."""


def _is_plain(value: Any) -> bool:
    if isinstance(value, (np.ndarray, np.generic)):
        return value.dtype.kind in "biufc"  # numbers; arrays of bytes or strings are maps and layouts
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (tuple, list)):
        return all(_is_plain(item) for item in value)
    return False


def _is_layout(value: Any) -> bool:
    """Arrays of bytes or strings (FrozenLake's map, Taxi's): configuration, not state."""
    return isinstance(value, np.ndarray) and value.dtype.kind in "SU"


def _generator_state(generator: np.random.Generator) -> dict[str, Any]:
    return generator.bit_generator.state


def _restore_generator(current: Any, state: dict[str, Any]) -> np.random.Generator:
    bit_generator = _BIT_GENERATORS.get(state.get("bit_generator"))
    if bit_generator is None:
        raise InputError(f"Unknown NumPy bit generator {state.get('bit_generator')!r} in the checkpoint.")
    generator = current if isinstance(current, np.random.Generator) else np.random.Generator(bit_generator())
    if type(generator.bit_generator).__name__ != state["bit_generator"]:
        generator = np.random.Generator(bit_generator())
    generator.bit_generator.state = state
    return generator


def _object_state(obj: Any) -> dict[str, Any]:
    """The plain-data attributes of one env layer; raises :class:`_Uncapturable` naming the first other one."""
    values, generators, spaces = {}, {}, {}
    for name, value in vars(obj).items():
        if (
            name in _SKIPPED
            or _is_layout(value)
            or isinstance(value, (dict, gym.Env, gym.vector.VectorEnv, enum.Enum, Callable))
        ):
            continue
        if isinstance(value, np.random.Generator):
            generators[name] = _generator_state(value)
        elif isinstance(value, gym.Space):
            rng = getattr(value, "_np_random", None)
            if rng is not None:
                spaces[name] = _generator_state(rng)
        elif _is_plain(value):
            values[name] = value
        else:
            raise _Uncapturable(f"{type(obj).__name__}.{name} ({type(value).__name__})")
    return {"class": type(obj).__name__, "values": values, "generators": generators, "spaces": spaces}


def _is_numeric(value: Any) -> bool:
    """Numbers, numeric arrays and tuples or lists of them (no text)."""
    if isinstance(value, str):
        return False
    if isinstance(value, (tuple, list)):
        return all(_is_numeric(item) for item in value)
    return _is_plain(value)


def _same_form(current: Any, saved: Any) -> bool:
    """Whether ``saved`` may replace the attribute value ``current`` of a freshly built env: the same kind of
    value (numbers for numbers, numbers of the same shape for an array, tuples and lists of the same length whose
    items fit, text for text); where the fresh env holds None (state set at the first reset), None or numbers."""
    if current is None or saved is None:
        return saved is None or _is_numeric(saved)
    arrays = isinstance(current, np.ndarray) or isinstance(saved, np.ndarray)
    if arrays:  # one side may be a tuple of numbers: MountainCar's state is either
        try:
            array = np.asarray(saved)
        except ValueError:  # ragged
            return False
        return array.shape == np.shape(current) and array.dtype.kind in "biuf"
    numbers = (int, float, np.number)
    if isinstance(current, numbers) and not isinstance(current, bool):
        return isinstance(saved, numbers) and not isinstance(saved, bool)
    if isinstance(current, (tuple, list)):
        return (
            isinstance(saved, type(current))
            and len(saved) == len(current)
            and all(_same_form(now, then) for now, then in zip(current, saved, strict=True))
        )
    return type(saved) is type(current)


def _load_object_state(obj: Any, state: dict[str, Any], configured: bool = False) -> None:
    """Set ``obj``'s attributes to the saved values that fit them (see :func:`_same_form`); with ``configured``
    (the vector env, whose numbers and text are its configuration: ``num_envs`` sizes every step's arrays) those
    must equal the fresh env's own, and only its arrays, lists and generators take the saved values."""
    if type(obj).__name__ != state["class"]:
        raise InputError(
            f"The checkpoint's env layer {state['class']} does not match this env's {type(obj).__name__}."
        )
    current = vars(obj)
    for name, value in state["values"].items():
        fits = (
            _same_form(current[name], value)
            if name in current
            else name.isidentifier() and not hasattr(type(obj), name) and _is_plain(value)
        )
        if configured and not isinstance(current.get(name), (np.ndarray, list)):
            fits = fits and name in current and type(value) is type(current[name]) and value == current[name]
        if name in _SKIPPED or not fits:
            raise InputError(
                f"The checkpoint sets {type(obj).__name__}.{name} to {value!r:.60}, which does not fit this env's "
                f"{current.get(name, 'attribute')!r:.60}; the file is damaged or forged."
            )
    for name in state["generators"]:  # a generator replaces a generator (or the None of an unseeded env) only
        held = current.get(name)
        fits = (
            held is None or isinstance(held, np.random.Generator)
            if name in current
            else isinstance(name, str) and name.isidentifier() and not hasattr(type(obj), name)
        )
        if name in _SKIPPED or not fits:
            raise InputError(
                f"The checkpoint puts a random generator in {type(obj).__name__}.{name!s:.60}, which is "
                f"{f'a {type(held).__name__}' if name in current else 'part of its class'} in this env; the file "
                "is damaged or forged."
            )
    for name in state["spaces"]:
        if name in _SKIPPED or not isinstance(current.get(name), gym.Space):
            raise InputError(
                f"The checkpoint sets the random generator of a space {type(obj).__name__}.{name!s:.60}, which "
                "is not a space in this env; the file is damaged or forged."
            )
    for name, value in state["values"].items():
        setattr(obj, name, value)
    for name, generator_state in state["generators"].items():
        setattr(obj, name, _restore_generator(getattr(obj, name, None), generator_state))
    for name, generator_state in state["spaces"].items():
        space = getattr(obj, name)
        space._np_random = _restore_generator(getattr(space, "_np_random", None), generator_state)


def _layers(env: gym.Env) -> list[Any]:
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _vector_env_state(vector_env: gym.vector.VectorEnv) -> dict[str, Any]:
    if not isinstance(vector_env, gym.vector.SyncVectorEnv):
        raise _Uncapturable(f"{type(vector_env).__name__} (sub-envs live in other processes)")
    return {
        "vector": _object_state(vector_env),
        "sub_envs": [[_object_state(layer) for layer in _layers(env)] for env in vector_env.envs],
    }


def env_runtime_state(env: EnvBase) -> tuple[dict[str, Any] | None, str | None]:
    """The training env's state as plain data and None, or None and the reason it cannot be captured."""
    if isinstance(env, TransformedEnv):  # e.g. an InitTracker for Ornstein-Uhlenbeck noise, a gSDE transform
        base, reason = env_runtime_state(env.base_env)
        if base is None:
            return None, reason
        return {"kind": "transformed", "base": base, "transform": env.transform.state_dict()}, None
    if isinstance(env, ClassicControlEnv):
        batch = env.batch
        return {
            "kind": "torch",
            "state": batch.state,
            "episode_return": batch.episode_return,
            "episode_length": batch.episode_length,
            "generator": env.generator.get_state(),
        }, None
    if isinstance(env, GymnasiumVectorEnv):
        try:
            vector = _vector_env_state(env.vector_env)
        except _Uncapturable as reason:
            return None, str(reason)
        return {
            "kind": "gymnasium",
            # a Dict space's observations as a dict of tensors
            "observation": env._observation
            if isinstance(env._observation, torch.Tensor)
            else env._observation.to_dict(),
            "episode_return": env._episode_return,
            "episode_length": env._episode_length,
            "action_mask": env._action_mask,
            "seed": env._seed,
            **vector,
        }, None
    return None, f"{type(env).__name__} (an env of unknown type)"


def _fitting(saved: Any, current: torch.Tensor, name: str) -> torch.Tensor:
    """``saved`` on ``current``'s device and in its dtype, if it is a tensor of ``current``'s shape."""
    if not isinstance(saved, torch.Tensor) or saved.shape != current.shape or saved.is_complex():
        raise InputError(
            f"The checkpoint's env {name} is {type(saved).__name__} {tuple(getattr(saved, 'shape', ()))}, not a "
            f"tensor of this env's shape {tuple(current.shape)}; the file is damaged or forged."
        )
    return saved.to(current.device, current.dtype)


def load_env_runtime_state(env: EnvBase, state: dict[str, Any]) -> None:
    """Put ``env`` (freshly built from the same id and number of sub-envs) in the captured ``state``."""
    if state["kind"] == "transformed" and isinstance(env, TransformedEnv):
        load_env_runtime_state(env.base_env, state["base"])
        env.transform.load_state_dict(state["transform"])
        return
    if state["kind"] == "torch" and isinstance(env, ClassicControlEnv):
        batch = env.batch
        batch.state = _fitting(state["state"], batch.state, "state")
        batch.episode_return = _fitting(state["episode_return"], batch.episode_return, "episode_return")
        batch.episode_length = _fitting(state["episode_length"], batch.episode_length, "episode_length")
        env.generator.set_state(state["generator"].cpu())
        return
    if state["kind"] == "gymnasium" and isinstance(env, GymnasiumVectorEnv):
        vector_env = env.vector_env
        if not isinstance(vector_env, gym.vector.SyncVectorEnv) or len(vector_env.envs) != len(
            state["sub_envs"]
        ):
            raise InputError("The checkpoint's training envs do not match this run's (number of sub-envs).")
        _load_object_state(vector_env, state["vector"], configured=True)
        for sub_env, layer_states in zip(vector_env.envs, state["sub_envs"], strict=True):
            layers = _layers(sub_env)
            if len(layers) != len(layer_states):
                raise InputError("The checkpoint's env wrappers do not match this run's.")
            for layer, layer_state in zip(layers, layer_states, strict=True):
                _load_object_state(layer, layer_state)
        observation, current = state["observation"], env._observation
        env._observation = (
            _fitting(observation, current, "observation")
            if isinstance(current, torch.Tensor)
            else TensorDict(observation, batch_size=env.batch_size).to(env.device)
        )
        env._episode_return = _fitting(state["episode_return"], env._episode_return, "episode_return")
        env._episode_length = _fitting(state["episode_length"], env._episode_length, "episode_length")
        mask = state.get("action_mask")  # absent from checkpoints of before masks
        env._action_mask = None if mask is None else mask.to(env.device)
        seed = state["seed"]  # the seed of the next full reset: None once the envs were seeded
        if seed is not None and (type(seed) is not int or seed < 0):
            raise InputError(
                f"The checkpoint's env seed {seed!r:.40} is not a seed; the file is damaged or forged."
            )
        env._seed = seed
        return
    raise InputError(
        f"The checkpoint holds a {state['kind']} env's state; this run's env is {type(env).__name__}."
    )


__all__ = ["env_runtime_state", "load_env_runtime_state"]
