"""Export an agent's deterministic policy to ONNX: a file that runs without this toolkit (``onnxruntime``).

The exported graph takes what a Gymnasium env gives and returns what it takes, batched: observations as the env
returns them (``float32`` for Box spaces of any dtype but ``uint8``, ``uint8`` ones as they are, ``int64`` for
Discrete and MultiDiscrete, ``float32`` for MultiBinary, one input per entry of a Dict space) and the env's actions (``int64`` for Discrete and MultiDiscrete, with their ``start`` offsets;
clipped to the Box for Box actions, in the Box's dtype; ``int8`` for MultiBinary). The observation normaliser, the
network and the action scaling are inside; exploration noise is not (``Agent.predict(obs, deterministic=True)``).
Extra inputs and outputs where the agent needs them:

- ``action_mask`` (booleans, one row per observation) for an agent trained with action masks (a Dict
  observation's own ``"action_mask"`` entry is that input: the file takes it once, as entry and mask);
- a recurrent agent's state: inputs ``is_init`` (``[batch, 1]`` booleans, True at an episode's first step) and
  one ``[batch, layers, hidden]`` input per state tensor (``recurrent_state_h``, ``recurrent_state_c`` for an LSTM,
  ``recurrent_state`` for a GRU), and an output ``next_<name>`` per state tensor to feed back at the next step.

:func:`export_onnx` traces the policy with PyTorch's TorchScript-based ONNX exporter (``dynamo=False``): the
policies are TensorDict modules whose bookkeeping is Python, which tracing records as the tensor operations it
performs, while ``torch.export`` (the newer exporter) stops at some of their distributions.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules.tensordict_module import rnn as torchrl_rnn

from agents.agent import Agent
from agents.files import write_atomically
from agents.recurrent import IS_INIT_KEY, state_shapes
from envs.specs import ACTION_MASK_KEY
from errors import InputError, WriteError

OPSET = 17


class DeterministicPolicy(nn.Module):
    """An agent's deterministic policy as a plain tensor module: env observations in, env actions out (see the
    module docstring for the inputs and outputs). ``input_names`` and ``output_names`` name them in order."""

    def __init__(self, agent: Agent):
        super().__init__()
        self.policy = agent.policy
        self.observation_space, self.action_space = agent.observation_space, agent.action_space
        spaces = (
            self.observation_space.spaces if isinstance(self.observation_space, gym.spaces.Dict) else None
        )
        self.entries = list(spaces) if spaces is not None else None
        self.masked = bool(agent.policy_kwargs.get("action_mask"))
        self.state_keys = list(state_shapes(agent.policy))
        self.input_names = list(self.entries or ["observation"])
        # the mask: an input of its own, unless the Dict observation has an "action_mask" entry, which is the mask
        self.input_names += (
            [ACTION_MASK_KEY] if self.masked and ACTION_MASK_KEY not in self.input_names else []
        )
        self.input_names += [IS_INIT_KEY, *self.state_keys] if self.state_keys else []
        self.output_names = ["action", *(f"next_{key}" for key in self.state_keys)]
        action_space = self.action_space
        if isinstance(action_space, gym.spaces.Box):
            # the Box's own dtype: casting the action to it, then clipping, gives predict's values (float bounds
            # are exact in their dtype, rounding keeps order); an integer Box clips in float64 before it truncates
            self.action_dtype = torch.from_numpy(np.zeros(0, action_space.dtype)).dtype
            clip_dtype = self.action_dtype if self.action_dtype.is_floating_point else torch.float64
            self.register_buffer("low", torch.as_tensor(action_space.low, dtype=clip_dtype))
            self.register_buffer("high", torch.as_tensor(action_space.high, dtype=clip_dtype))
        if isinstance(action_space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            self.register_buffer(
                "action_start", torch.as_tensor(np.asarray(action_space.start), dtype=torch.int64)
            )

    def _observation(self, value: torch.Tensor, space: gym.Space) -> torch.Tensor:
        if isinstance(space, gym.spaces.Discrete):
            return value.to(torch.int64) - int(space.start)
        if isinstance(space, gym.spaces.MultiDiscrete):  # values from 0, as the network was trained on
            return value.to(torch.int64) - torch.as_tensor(np.asarray(space.start), dtype=torch.int64)
        return value if space.dtype == np.uint8 else value.to(torch.float32)

    def forward(self, *inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = dict(zip(self.input_names, inputs))
        if self.entries is not None:
            spaces = self.observation_space.spaces
            observation = TensorDict(
                {key: self._observation(values[key], spaces[key]) for key in self.entries},
                batch_size=inputs[0].shape[:1],
            )
        else:
            observation = self._observation(values["observation"], self.observation_space)
        tensordict = TensorDict({"observation": observation}, batch_size=inputs[0].shape[:1])
        if self.masked:  # a row that allows nothing allows everything, as in training and predict
            mask = values[ACTION_MASK_KEY].to(torch.bool)
            tensordict.set(ACTION_MASK_KEY, mask | ~mask.any(-1, keepdim=True))
        for key in self.state_keys:
            tensordict.set(key, values[key])
        if self.state_keys:
            tensordict.set(IS_INIT_KEY, values[IS_INIT_KEY].to(torch.bool))
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            outputs = self.policy(tensordict)
        action = outputs.get("action")
        space = self.action_space
        if isinstance(space, gym.spaces.Box):
            action = torch.maximum(torch.minimum(action.to(self.low.dtype), self.high), self.low)
            action = action.to(self.action_dtype)
        elif isinstance(space, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            action = action.to(torch.int64) + self.action_start
        else:  # MultiBinary
            action = action.to(torch.int8)
        return (action, *(outputs.get(("next", key)) for key in self.state_keys))


def example_inputs(agent: Agent, batch: int = 2) -> tuple[torch.Tensor, ...]:
    """Inputs of the exported graph for ``batch`` observations sampled from the agent's space (for tracing)."""
    space = agent.observation_space
    spaces = space.spaces.values() if isinstance(space, gym.spaces.Dict) else [space]
    inputs = []
    for (
        entry
    ) in spaces:  # int64 for Discrete and MultiDiscrete spaces, uint8 for uint8 Box ones, else float32
        tensor = torch.as_tensor(np.stack([entry.sample() for _ in range(batch)]))
        if isinstance(entry, gym.spaces.Discrete | gym.spaces.MultiDiscrete):
            inputs.append(tensor.to(torch.int64))
        else:
            inputs.append(tensor if tensor.dtype == torch.uint8 else tensor.to(torch.float32))
    own_mask = isinstance(space, gym.spaces.Dict) and ACTION_MASK_KEY in space.spaces
    if agent.policy_kwargs.get("action_mask") and not own_mask:
        inputs.append(torch.ones(batch, int(agent.action_space.n), dtype=torch.bool))
    shapes = state_shapes(agent.policy)
    if shapes:
        inputs.append(torch.ones(batch, 1, dtype=torch.bool))
        inputs += [torch.zeros(batch, *shape) for shape in shapes.values()]
    return tuple(inputs)


def export_onnx(agent: Agent, path: str | Path, opset: int = OPSET) -> Path:
    """Write ``agent``'s deterministic policy to ``path`` as an ONNX model (atomically), batch size dynamic.

    Raises:
        InputError: the ``onnx`` package is missing, or the exporter cannot trace the policy.
    """
    if importlib.util.find_spec("onnx") is None:
        raise InputError(
            "ONNX export needs the onnx package: pip install -e '.[export]' (onnx, and onnxruntime to run the file)."
        )
    on_cpu = agent if agent.device.type == "cpu" else copy.deepcopy(agent).cpu()  # the caller's agent stays
    module = DeterministicPolicy(on_cpu).eval()
    inputs = example_inputs(agent)
    dynamic_axes = {name: {0: "batch"} for name in module.input_names + module.output_names}

    def write(temporary: Path) -> None:
        with warnings.catch_warnings(), torch.no_grad(), _traceable_recurrent_layers():
            warnings.simplefilter("ignore")  # the tracer's notes on Python values it records as constants
            torch.onnx.export(
                module,
                inputs,
                str(temporary),
                input_names=module.input_names,
                output_names=module.output_names,
                dynamic_axes=dynamic_axes,
                opset_version=opset,
                dynamo=False,
            )

    try:
        return write_atomically(Path(path), write)
    except (InputError, WriteError):
        raise
    except Exception as error:  # noqa: BLE001 - tracing fails in many ways
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise InputError(
            f"The {agent.policy_builder} policy could not be exported to ONNX: {detail}"
        ) from None


@contextlib.contextmanager
def _traceable_recurrent_layers() -> Iterator[None]:
    """TorchRL's recurrent layers re-lay a state tensor whose strides are not row-major through an in-place copy
    (``_canonical_contiguous``, for its scan kernels), which ONNX cannot express; tensors have no strides in ONNX,
    so while exporting the state passes as it is."""
    original = getattr(torchrl_rnn, "_canonical_contiguous", None)
    if original is None:
        yield
        return
    torchrl_rnn._canonical_contiguous = lambda value: value
    try:
        yield
    finally:
        torchrl_rnn._canonical_contiguous = original


def onnx_actions(path: str | Path, *inputs: Any) -> list[np.ndarray]:
    """Run an exported model with ``onnxruntime`` on ``inputs`` (arrays in the order of its inputs)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [node.name for node in session.get_inputs()]
    return session.run(None, dict(zip(names, inputs)))
