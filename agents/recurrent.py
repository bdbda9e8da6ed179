"""Recurrent policies: an LSTM or a GRU between the observation encoder and the heads.

A recurrent actor from :func:`agents.make_actor` (``recurrent="lstm"`` or ``"gru"``) is three TensorDict modules:
the encoder (``"observation"`` -> ``"features"``), TorchRL's :class:`~torchrl.modules.LSTMModule` or
:class:`~torchrl.modules.GRUModule` (``"features"`` and the recurrent state -> ``"memory"`` and the next state)
and the heads (``"memory"`` -> the distribution's parameters). The critic of :func:`make_recurrent_critic` shares
the encoder and the recurrent layer (one state to carry, as CleanRL's recurrent PPO) and adds a value head.

The state travels as env state: :func:`make_recurrent_env` adds TorchRL's ``InitTracker`` (``"is_init"``, true at
each episode's first step) and a ``TensorDictPrimer`` per recurrent layer (its state, zeros after every reset), so
a collector stores with every step the state the policy acted from. Acting runs one step at a time (the layer's
sequential mode: ``is_init`` zeroes the state of a new episode). Learning runs TorchRL's recurrent mode on
sequences (:func:`sequences`: the batch cut into slices of whole env steps, each slice starting from its stored
state and restarting at every ``is_init`` inside it), so gradients flow back through time within a slice.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.envs import Compose, EnvBase, InitTracker, TransformedEnv
from torchrl.modules import GRUModule, LSTMModule

from errors import InputError

RECURRENT_KINDS = ("lstm", "gru")
FEATURES_KEY = "features"
MEMORY_KEY = "memory"
IS_INIT_KEY = "is_init"
STATE_KEYS = {"lstm": ["recurrent_state_h", "recurrent_state_c"], "gru": ["recurrent_state"]}


def check_recurrent_options(kind: str | None, size: int) -> None:
    """Raise :class:`InputError` for a recurrent kind or size a policy cannot be built with."""
    if kind is None:
        return
    if kind not in RECURRENT_KINDS:
        raise InputError(f"--recurrent must be one of {', '.join(RECURRENT_KINDS)}, got {kind!r}.")
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise InputError(f"--recurrent-size must be a positive integer, got {size!r}.")


def recurrent_kwargs(kind: str | None, size: int) -> dict[str, str | int]:
    """The keyword arguments of :func:`agents.make_actor` for a recurrent layer (none without one)."""
    return {} if kind is None else {"recurrent": kind, "recurrent_size": size}


def make_recurrent_layer(kind: str, input_size: int, hidden_size: int) -> LSTMModule | GRUModule:
    """TorchRL's LSTM or GRU module from ``"features"`` to ``"memory"``, its state under :data:`STATE_KEYS`."""
    check_recurrent_options(kind, hidden_size)
    keys = STATE_KEYS[kind]
    module_class = LSTMModule if kind == "lstm" else GRUModule
    return module_class(
        input_size=input_size,
        hidden_size=hidden_size,
        in_keys=[FEATURES_KEY, *keys, IS_INIT_KEY],
        out_keys=[MEMORY_KEY, *(("next", key) for key in keys)],
    )


def recurrent_layers(module: nn.Module) -> list[LSTMModule | GRUModule]:
    """The LSTM and GRU modules inside ``module``."""
    return [layer for layer in module.modules() if isinstance(layer, LSTMModule | GRUModule)]


def is_recurrent(module: nn.Module) -> bool:
    return bool(recurrent_layers(module))


def state_shapes(module: nn.Module) -> dict[str, tuple[int, int]]:
    """Per recurrent state key of ``module``, the shape of one env's state: ``(layers, hidden size)``."""
    shapes: dict[str, tuple[int, int]] = {}
    for layer in recurrent_layers(module):
        network = layer.lstm if isinstance(layer, LSTMModule) else layer.gru
        for key in layer.in_keys[1:]:
            if key != IS_INIT_KEY:
                shapes[key] = (network.num_layers, network.hidden_size)
    return shapes


def initial_state(module: nn.Module, batch_size: int, device: torch.device | str = "cpu") -> TensorDict:
    """Zero states of ``module``'s recurrent layers for ``batch_size`` envs, with ``"is_init"`` set."""
    state = {
        key: torch.zeros(batch_size, *shape, device=device) for key, shape in state_shapes(module).items()
    }
    state[IS_INIT_KEY] = torch.ones(batch_size, 1, dtype=torch.bool, device=device)
    return TensorDict(state, batch_size=[batch_size], device=device)


def make_recurrent_env(env: EnvBase, policy: nn.Module) -> TransformedEnv:
    """``env`` with ``"is_init"`` and the recurrent state of ``policy``'s layers as env state (see the module)."""
    primers = [layer.make_tensordict_primer() for layer in recurrent_layers(policy)]
    if not primers:
        raise ValueError("make_recurrent_env: the policy has no LSTM or GRU module.")
    return TransformedEnv(env, Compose(InitTracker(), *primers))


def recurrent_trunk(actor: nn.Module) -> TensorDictSequential:
    """The encoder and recurrent layer of a recurrent actor from :func:`agents.make_actor`."""
    body = actor.module[0]
    if not (isinstance(body, TensorDictSequential) and is_recurrent(body)):
        raise ValueError("recurrent_trunk: the actor is not a recurrent actor from make_actor.")
    return TensorDictSequential(body.module[0], body.module[1])


def sequences(batch: TensorDictBase, length: int) -> TensorDictBase:
    """A collector's ``[envs, steps]`` batch as ``[envs * steps / length, length]`` slices of consecutive steps of
    one env (each starts from its stored state), for minibatches that keep the recurrence."""
    if batch.ndim != 2 or batch.shape[1] % length:
        raise InputError(
            f"Recurrent minibatches cut each env's {batch.shape[-1]} steps into sequences of {length}: "
            "--steps-per-env must be a multiple of --sequence-length."
        )
    return batch.reshape(batch.shape[0] * (batch.shape[1] // length), length)


def check_sequence_options(
    steps_per_env: int, sequence_length: int, minibatch_size: int, num_envs: int
) -> None:
    """Raise :class:`InputError` unless recurrent minibatches of ``minibatch_size`` frames are whole sequences."""
    if steps_per_env % sequence_length:
        raise InputError(
            f"--steps-per-env {steps_per_env} must be a multiple of --sequence-length {sequence_length}: "
            "recurrent minibatches are whole sequences of one env's steps."
        )
    if minibatch_size % sequence_length:
        raise InputError(
            f"--minibatch-size {minibatch_size} must be a multiple of --sequence-length {sequence_length}: "
            "recurrent minibatches are whole sequences of one env's steps."
        )
    if minibatch_size > num_envs * steps_per_env:
        raise InputError(
            f"--minibatch-size {minibatch_size} exceeds the {num_envs * steps_per_env} frames per batch."
        )


__all__ = [
    "FEATURES_KEY",
    "IS_INIT_KEY",
    "MEMORY_KEY",
    "RECURRENT_KINDS",
    "STATE_KEYS",
    "check_recurrent_options",
    "check_sequence_options",
    "initial_state",
    "is_recurrent",
    "make_recurrent_env",
    "make_recurrent_layer",
    "recurrent_kwargs",
    "recurrent_layers",
    "recurrent_trunk",
    "sequences",
    "state_shapes",
]
