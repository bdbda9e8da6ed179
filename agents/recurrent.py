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

import math
import weakref

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
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


class RecurrentTrunk(TensorDictModuleBase):
    """The observation encoder and the recurrent layer of a recurrent actor, shared with its critic.

    Reads ``"observation"``, the layer's state keys and ``"is_init"``; writes ``"features"``, ``"memory"`` and the
    next state. A policy-gradient loss calls the actor and then the critic on the same minibatch: with gradients
    enabled, the second call gets the first call's outputs (the same autograd graph) instead of running the
    encoder and the recurrent layer again, so they run once per minibatch, forward and backward, as one network
    would. Outputs are reused only for the very same input tensors, unchanged since (their version counters), with
    the same parameters, unchanged since (an optimizer step bumps their version), in the same recurrent mode; a
    backward pass through them drops them.

    Args:
        encoder: the observation encoder (from :func:`agents.networks.observation_encoder`).
        layer: the recurrent layer (from :func:`make_recurrent_layer`).
    """

    def __init__(self, encoder: nn.Module, layer: LSTMModule | GRUModule):
        super().__init__()
        self.encoder = TensorDictModule(encoder, in_keys=["observation"], out_keys=[FEATURES_KEY])
        self.layer = layer
        self.in_keys = ["observation", *layer.in_keys[1:]]
        self.out_keys = [FEATURES_KEY, *layer.out_keys]
        self._memo: tuple[tuple, dict] | None = None  # (key, outputs) of the last call with gradients

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        key = self._memo_key(tensordict) if torch.is_grad_enabled() else None
        if key is not None and self._memo is not None and _same_key(self._memo[0], key):
            outputs = self._memo[1]
        else:  # on a shallow copy: the layer writes reshaped copies of its inputs back, the caller's stay as given
            inputs = tensordict.select(*self.in_keys, strict=False)
            self.layer(self.encoder(inputs))
            outputs = {name: inputs.get(name) for name in self.out_keys}
        for name, value in outputs.items():
            tensordict.set(name, value)
        if key is not None and (self._memo is None or self._memo[1] is not outputs):
            self._memo = (key, outputs)
            memory = outputs[MEMORY_KEY]
            if memory.requires_grad:  # once gradients flow back through them, the graph is spent
                owner = weakref.ref(self)
                memory.register_hook(lambda grad: _forget(owner))
        return tensordict

    def _memo_key(self, tensordict: TensorDictBase) -> tuple:
        # by storage, not tensor object: the layer writes its inputs back as reshaped views of the same memory
        # (the memo holds the tensors, so that memory cannot be reused by another tensor meanwhile)
        inputs = tuple(
            (tensor, (tensor.data_ptr(), tensor.shape, tensor.stride(), tensor.dtype, tensor._version))
            for name in self.in_keys
            for tensor in _leaves(tensordict.get(name, None))
        )
        parameters = tuple((parameter, parameter._version) for parameter in self.parameters())
        return inputs, parameters, bool(self.layer.recurrent_mode)

    def __getstate__(self) -> dict:  # copies and pickles never carry outputs (nor their graph)
        return {**self.__dict__, "_memo": None}


def _leaves(value) -> list[torch.Tensor]:
    if value is None:
        return []
    if isinstance(value, TensorDictBase):
        return list(value.values(True, True))
    return [value]


def _same_key(old: tuple, new: tuple) -> bool:
    """Whether two :meth:`RecurrentTrunk._memo_key` keys name the same input memory at the same versions, the
    same parameters (by identity) at the same versions, and the same recurrent mode."""
    (old_inputs, old_parameters, old_mode), (new_inputs, new_parameters, new_mode) = old, new
    return (
        old_mode == new_mode
        and len(old_inputs) == len(new_inputs)
        and len(old_parameters) == len(new_parameters)
        and all(
            old_view == new_view for (_, old_view), (_, new_view) in zip(old_inputs, new_inputs, strict=True)
        )
        and all(
            a is b and version_a == version_b
            for (a, version_a), (b, version_b) in zip(old_parameters, new_parameters, strict=True)
        )
    )


def _forget(owner: weakref.ref) -> None:
    trunk = owner()
    if trunk is not None:
        trunk._memo = None


def recurrent_trunk(actor: nn.Module) -> RecurrentTrunk:
    """The :class:`RecurrentTrunk` of a recurrent actor from :func:`agents.make_actor`."""
    body = actor.module[0]
    trunk = body.module[0] if isinstance(body, TensorDictSequential) else None
    if not isinstance(trunk, RecurrentTrunk):
        raise TypeError("recurrent_trunk: the actor is not a recurrent actor from make_actor.")
    return trunk


def sequences(batch: TensorDictBase, length: int) -> TensorDictBase:
    """A collector's ``[envs, steps]`` batch as ``[envs * steps / length, length]`` slices of consecutive steps of
    one env (each starts from its stored state), for minibatches that keep the recurrence."""
    if batch.ndim != 2 or batch.shape[1] % length:
        raise InputError(
            f"Recurrent minibatches cut each env's {batch.shape[-1]} steps into sequences of {length}: "
            "--steps-per-env must be a multiple of --sequence-length."
        )
    return batch.reshape(batch.shape[0] * (batch.shape[1] // length), length)


def sequence_length(steps_per_env: int, minibatch_size: int, given: int | None) -> int:
    """The steps of one env in a recurrent minibatch's sequence: ``given`` (``--sequence-length``), by default the
    longest length that both ``steps_per_env`` and ``minibatch_size`` are multiples of (all of an env's steps
    wherever the minibatch holds whole batches of them)."""
    return given or math.gcd(steps_per_env, minibatch_size)


def check_sequence_options(steps_per_env: int, sequence_length: int, minibatch_size: int) -> None:
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


__all__ = [
    "FEATURES_KEY",
    "IS_INIT_KEY",
    "MEMORY_KEY",
    "RECURRENT_KINDS",
    "STATE_KEYS",
    "RecurrentTrunk",
    "check_recurrent_options",
    "check_sequence_options",
    "initial_state",
    "is_recurrent",
    "make_recurrent_env",
    "make_recurrent_layer",
    "recurrent_kwargs",
    "recurrent_layers",
    "recurrent_trunk",
    "sequence_length",
    "sequences",
    "state_shapes",
]
