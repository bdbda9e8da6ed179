"""The keys and specs every batched env of this toolkit shares, whichever backend steps it (Gymnasium vector envs
in :mod:`envs.vector`, the torch-native classic-control envs in :mod:`envs.classic`)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, Unbounded
from torchrl.envs import EnvBase

from errors import InputError

EPISODE_RETURN_KEY = "episode_return"
EPISODE_LENGTH_KEY = "episode_length"
# the Gymnasium spaces whose elements are one array each: what observations (or a Dict of them) and actions may be
ARRAY_SPACES = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
ACTION_MASK_KEY = "action_mask"  # the allowed Discrete actions of the observation beside it (True: allowed)


def space_to_spec(space: gym.Space, batch_size: int, device: torch.device | str = "cpu"):
    """Return the TorchRL spec of ``batch_size`` stacked elements of a Gymnasium space.

    Args:
        space: a ``Box``, ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` space.
        batch_size: number of sub-envs stacked in front.
        device: device of the spec.

    Returns:
        A TorchRL ``TensorSpec``. ``Box`` spaces of any float dtype become float32 specs; ``Discrete``
        spaces become integer ``Categorical`` specs with values in ``[0, n)`` (a ``start`` offset is
        applied by :class:`GymnasiumVectorEnv`).

    A ``Dict`` space (observations only) becomes a ``Composite`` spec of its entries' specs, each a ``Box``,
    ``Discrete``, ``MultiDiscrete`` or ``MultiBinary`` space.

    Raises:
        InputError: for other spaces (``Tuple``, ``Text``, a ``Dict`` inside a ``Dict``, ...).
    """
    if isinstance(space, gym.spaces.Dict):
        entries = {}
        for key, entry in space.spaces.items():
            if isinstance(entry, gym.spaces.Dict) or not str(key).isidentifier():
                raise InputError(
                    f"Dict observations need entries named like Python identifiers, none of them a Dict: got {key!r}: "
                    f"{entry} (flatten the inner Dict with gymnasium.wrappers.FlattenObservation)."
                )
            entries[key] = space_to_spec(entry, batch_size, device)
        return Composite(entries, shape=(batch_size,), device=device)
    if not isinstance(space, ARRAY_SPACES):
        raise InputError(
            f"Gymnasium space {space} is not supported: use a Box, Discrete, MultiDiscrete or MultiBinary space, or a "
            "Dict of them for observations (a Tuple of Discrete spaces is read as MultiDiscrete; wrap other Tuple "
            "observations with gymnasium.wrappers.FlattenObservation; variable-size spaces such as Graph, Sequence "
            "and Text need a gymnasium.ObservationWrapper that encodes them in a Box of fixed shape)."
        )
    shape = (batch_size, *space.shape)
    if isinstance(space, gym.spaces.Box):
        dtype = (
            torch.float32 if np.issubdtype(space.dtype, np.floating) else torch.from_numpy(space.low).dtype
        )
        if np.all(np.isfinite(space.low)) and np.all(np.isfinite(space.high)):
            low = torch.as_tensor(np.broadcast_to(space.low, shape).copy(), dtype=dtype)
            high = torch.as_tensor(np.broadcast_to(space.high, shape).copy(), dtype=dtype)
            return Bounded(low, high, shape=shape, dtype=dtype, device=device)
        return Unbounded(shape=shape, dtype=dtype, device=device)
    if isinstance(space, gym.spaces.Discrete):
        return Categorical(int(space.n), shape=shape, dtype=torch.int64, device=device)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return MultiCategorical(
            torch.as_tensor(space.nvec).expand(shape), shape=shape, dtype=torch.int64, device=device
        )
    return Binary(n=shape[-1], shape=shape, dtype=torch.int8, device=device)


# the Gymnasium space each TorchRL spec of space_to_spec stands for, most derived first (Binary and MultiCategorical
# are Categorical's subclasses)
_SPACE_NAMES = (
    (MultiCategorical, "MultiDiscrete"),
    (Binary, "MultiBinary"),
    (Categorical, "Discrete"),
    (Bounded, "Box"),
    (Unbounded, "unbounded Box"),
)


def space_name(spec: object) -> str:
    """The Gymnasium space a TorchRL spec stands for, as messages to users name it (``Categorical``:
    ``"Discrete"``); the class name of anything else."""
    return next((name for kind, name in _SPACE_NAMES if isinstance(spec, kind)), type(spec).__name__)


def unchecked_tensordict(
    source: dict[str, torch.Tensor], batch_size: torch.Size, device: torch.device
) -> TensorDict:
    """A TensorDict of tensors known to have the right shapes and device, built without re-validating them
    (the envs' hot path: validation costs more than the physics of a small batch)."""
    return TensorDict._new_unsafe(source, batch_size=batch_size, device=device)


def set_specs(
    env: EnvBase, observation_space: gym.Space, action_space: gym.Space, action_mask: bool = False
) -> None:
    """Give a batched env the specs shared by every env of this toolkit.

    ``"observation"`` and ``"action"`` follow the single-env Gymnasium spaces; ``"episode_return"`` and
    ``"episode_length"`` track each sub-env's episode; ``"reward"`` is float32 and ``"done"``,
    ``"terminated"`` and ``"truncated"`` are separate flags, all with a trailing dim of 1. With ``action_mask``
    (a Discrete action space), ``"action_mask"`` holds the allowed actions of each observation as booleans.
    """
    num_envs, device = env.batch_size[0], env.device
    if not isinstance(action_space, ARRAY_SPACES):
        raise InputError(
            f"Action space {action_space} is not supported: the recipes act in a Box, Discrete, MultiDiscrete or "
            "MultiBinary space (several Discrete choices at once are a MultiDiscrete space; a gymnasium."
            "ActionWrapper can map one onto the env's own actions)."
        )
    if isinstance(action_space, gym.spaces.Box) and not np.issubdtype(action_space.dtype, np.floating):
        raise InputError(
            f"Box action spaces of {action_space.dtype} are not supported ({action_space}): the recipes' policies "
            "act in a Box with floats. For integer choices give the env a MultiDiscrete (or Discrete) action space "
            "through a gymnasium.ActionWrapper mapping it onto the env's actions, or a float32 Box that the env "
            "rounds."
        )
    if isinstance(action_space, gym.spaces.Box) and len(action_space.shape) != 1:
        raise InputError(
            f"Box action spaces must be one-dimensional (a policy outputs a vector), got shape {action_space.shape}: "
            "wrap the env in gymnasium.wrappers.TransformAction(env, lambda a: a.reshape(env.action_space.shape), "
            "Box(env.action_space.low.reshape(-1), env.action_space.high.reshape(-1)))."
        )
    entries = {
        EPISODE_RETURN_KEY: Unbounded(shape=(num_envs, 1), device=device),
        EPISODE_LENGTH_KEY: Unbounded(shape=(num_envs, 1), dtype=torch.int64, device=device),
    }
    if action_mask:
        entries[ACTION_MASK_KEY] = Binary(
            n=int(action_space.n), shape=(num_envs, int(action_space.n)), dtype=torch.bool, device=device
        )
    env.observation_spec = Composite(
        observation=space_to_spec(observation_space, num_envs, device),
        **entries,
        shape=(num_envs,),
        device=device,
    )
    env.action_spec = space_to_spec(action_space, num_envs, device)
    env.reward_spec = Unbounded(shape=(num_envs, 1), device=device)
    flag = Categorical(2, shape=(num_envs, 1), dtype=torch.bool, device=device)
    env.done_spec = Composite(
        done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(num_envs,), device=device
    )
