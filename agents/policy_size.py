"""Checking an agent description against the tensors its checkpoint holds, before the policy is built.

An agent checkpoint describes its policy (a builder, its keyword arguments, the spaces) and holds its tensors. A
forged description (``hidden_sizes: [1000000, 1000000]``, a grid of 10**12 cells) would make building the policy
allocate gigabytes although the file holds kilobytes. So the policy is first built on PyTorch's ``meta`` device,
which records shapes and allocates nothing, and its tensors must be exactly those the archive holds: then building
it for real allocates what the file holds. A few builders cannot be built on ``meta`` (TorchRL's gSDE and
Ornstein-Uhlenbeck modules, the observation grid, read values while they are built); for those the size of their
network is estimated from the description and must not exceed twice what the file holds.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import torch
from torch import nn

from agents.archive import TensorShapes, nbytes
from agents.networks import make_actor
from envs.specs import space_to_spec
from errors import InputError

SLACK_BYTES = 2**20  # what an estimate may exceed the file's tensors by (small buffers, rounding)


def check_description_fits(
    builder: str,
    make_policy: Callable[..., nn.Module],
    observation_space: gym.Space,
    action_space: gym.Space,
    policy_kwargs: dict[str, Any],
    saved: TensorShapes,
) -> None:
    """Raise :class:`InputError` unless the policy that ``make_policy`` (registered as ``builder``) would build holds
    the tensors ``saved``; the caller names the file."""
    observation_spec, action_spec = space_to_spec(observation_space, 1), space_to_spec(action_space, 1)
    try:
        with torch.device("meta"):
            policy = make_policy(observation_spec, action_spec, **policy_kwargs)
    except (RuntimeError, NotImplementedError):  # reads a value while it is built: estimate instead
        _check_estimate(builder, make_policy, observation_space, action_space, policy_kwargs, nbytes(saved))
        return
    implied = {name: (tuple(tensor.shape), tensor.dtype) for name, tensor in policy.state_dict().items()}
    if implied != saved:
        differences = sorted(set(implied.items()) ^ set(saved.items()), key=str)
        raise InputError(
            f"it describes a policy ({builder}) whose tensors differ from those the file holds (first: "
            f"{differences[0][0]}: described {implied.get(differences[0][0])}, held {saved.get(differences[0][0])}); "
            "the file is damaged or forged."
        )


def _check_estimate(
    builder: str,
    make_policy: Callable[..., nn.Module],
    observation_space: gym.Space,
    action_space: gym.Space,
    policy_kwargs: dict[str, Any],
    held: int,
) -> None:
    if builder == "q_table" and isinstance(observation_space, gym.spaces.Box):
        grid_size, dims = int(policy_kwargs.get("grid_size") or 1), math.prod(observation_space.shape)
        # in log space first: a forged grid_size ** dims could take minutes to compute, let alone allocate
        if grid_size > 1 and dims * math.log2(grid_size) > math.log2(2 * held + SLACK_BYTES + 1):
            estimate = 2 * held + SLACK_BYTES + 1
        else:
            estimate = grid_size**dims * int(getattr(action_space, "n", 1)) * 4
    else:  # an MLP actor with extra exploration modules: about the size of a plain MLP actor
        defaults = inspect.signature(make_policy).parameters
        network = {
            name: policy_kwargs.get(name, defaults[name].default)
            for name in ("hidden_sizes", "activation")
            if name in defaults
        }
        specs = space_to_spec(observation_space, 1), space_to_spec(action_space, 1)  # built outside: values
        with torch.device("meta"):
            mlp = make_actor(*specs, **network)
        estimate = sum(tensor.numel() * tensor.element_size() for tensor in mlp.state_dict().values())
    if estimate > 2 * held + SLACK_BYTES:
        raise InputError(
            f"it describes a policy ({builder}) of about {estimate} bytes but holds {held} bytes of tensors; "
            "the file is damaged or forged. Refusing to build it."
        )
