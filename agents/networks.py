"""Actor and critic builders that read the env's specs."""

from __future__ import annotations

import itertools
import math
import os
import weakref
from collections.abc import Sequence
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import (
    AddStateIndependentNormalScale,
    NormalParamExtractor,
    TensorDictModule,
    TensorDictModuleBase,
    TensorDictSequential,
)
from torch import nn
from torchrl.data import Binary, Bounded, Categorical, Composite, MultiCategorical, TensorSpec, Unbounded
from torchrl.envs import EnvBase
from torchrl.modules import (
    MLP,
    IndependentNormal,
    MaskedCategorical,
    ProbabilisticActor,
    TanhNormal,
    ValueOperator,
)

from agents.distributions import FactorisedBernoulli, FactorisedCategorical
from agents.fast_paths import unrolled
from agents.normalization import ObservationNormalizer
from agents.recurrent import (
    MEMORY_KEY,
    RecurrentTrunk,
    check_recurrent_options,
    make_recurrent_layer,
    recurrent_trunk,
    state_shapes,
)
from envs.specs import ACTION_MASK_KEY
from errors import InputError, is_whole_number

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}
MAX_WIDTH = (
    2**20
)  # units in one hidden layer: a square layer this wide already holds 4 TiB of float32 weights


class OneHot(nn.Module):
    """Encodes integer observations of a ``Discrete(n)`` space as one-hot float vectors."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(observation.long(), self.n).float()


class MultiOneHot(nn.Module):
    """Encodes observations of a ``MultiDiscrete(nvec)`` space as the one-hot vectors of their components, one
    after the other (``MultiBinary`` observations, ``nvec`` all 2, are read as their 0/1 values instead)."""

    def __init__(self, nvec: Sequence[int]):
        super().__init__()
        self.nvec = [int(n) for n in nvec]

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        parts = observation.long().unbind(-1)
        return torch.cat(
            [nn.functional.one_hot(part, n) for part, n in zip(parts, self.nvec, strict=True)], -1
        ).float()


class ToFloat(nn.Module):
    """Integer observations (``MultiBinary``'s 0/1, an integer Box) as floats."""

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return observation.float()


class NatureCNN(nn.Module):
    """The convolutional torso of DQN (Mnih et al. 2015, "Human-level control through deep reinforcement learning").

    ``uint8`` images are scaled to ``[0, 1]`` and pass through three convolutions (32 8x8 filters with stride 4, 64
    4x4 with stride 2, 64 3x3 with stride 1) and a 512-unit linear layer, each followed by a ReLU. The images come
    in the env's layout (``layout``): channels first ``(C, H, W)`` as stacked Atari frames, channels last ``(H, W,
    C)`` as most rendered frames (CarRacing's ``(96, 96, 3)``), one grayscale channel ``(H, W)``, or a stack of
    frames of either kind (``(S, H, W, C)``, ``(S, C, H, W)``: Gymnasium's ``FrameStackObservation`` of RGB
    frames), whose frames' channels the network reads as ``S * C`` channels; the network moves the channels first
    itself, so observations go in as the env returns them. Any number of leading batch dims is accepted.

    A trunk shared by an actor and a critic (:func:`make_critic` with ``encoder=``) sets :attr:`reuse_features`:
    a policy-gradient loss calls the actor and then the critic on the same minibatch, and the second call gets the
    first call's features (the same autograd graph) instead of running the convolutions again, so the trunk runs
    once per minibatch, forward and backward, as Stable-Baselines3's shared features extractor does. The features
    are reused only for the very same observation tensor, unchanged since (its version counter), with the same
    parameter tensors, unchanged since (an optimizer step bumps their version), and the same grad mode; a backward
    pass through them drops them.

    Args:
        image_shape: the shape of one observation in ``layout``, e.g. ``(4, 84, 84)`` for stacked Atari frames.
        layout: ``"chw"``, ``"hwc"``, ``"hw"``, ``"shwc"`` or ``"schw"`` (see :func:`image_layout`).
        divisor: what the inputs are divided by first: 255 for ``uint8`` pixels, 1 for images already
            normalised to floats (RND's, :mod:`agents.rnd`).

    Raises:
        InputError: the image is smaller than the 36x36 the convolutions need.

    Examples:
        >>> cnn = NatureCNN((4, 84, 84))
        >>> cnn(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape
        torch.Size([2, 512])
    """

    CONVOLUTIONS = ((32, 8, 4), (64, 4, 2), (64, 3, 1))  # (filters, kernel size, stride)
    out_features = 512

    def __init__(self, image_shape: Sequence[int], layout: str = "chw", divisor: float = 255.0):
        super().__init__()
        self.divisor = float(divisor)
        self.reuse_features = False
        self._memo: tuple | None = None  # (key, features) of the last call, with reuse_features
        self.image_shape = tuple(int(size) for size in image_shape)
        if layout not in IMAGE_LAYOUTS or len(self.image_shape) != len(layout):
            raise InputError(
                f"An image of shape {self.image_shape} cannot have the layout {layout!r}: the layouts are "
                f"{', '.join(IMAGE_LAYOUTS)} (channels first, channels last, grayscale, stacks of either)."
            )
        self.layout = layout
        sizes = dict(zip(layout, self.image_shape, strict=True))
        channels, height, width = sizes.get("s", 1) * sizes.get("c", 1), sizes["h"], sizes["w"]
        self._channels_first_shape = (channels, sizes["h"], sizes["w"])
        for _, kernel, stride in self.CONVOLUTIONS:
            height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
        if height < 1 or width < 1:
            raise InputError(
                f"Image observations of shape {self.image_shape} (read as {layout.upper()}) are too small for "
                "the Nature CNN, which needs at least 36x36 pixels; scale them up with "
                "gymnasium.wrappers.ResizeObservation, or give the env a float32 Box to train an MLP on them."
            )
        layers: list[nn.Module] = []
        in_channels = channels
        for filters, kernel, stride in self.CONVOLUTIONS:
            layers += [nn.Conv2d(in_channels, filters, kernel, stride), nn.ReLU()]
            in_channels = filters
        self.convolutions = nn.Sequential(*layers, ChannelsLastFlatten())
        self.linear = nn.Sequential(nn.Linear(in_channels * height * width, self.out_features), nn.ReLU())
        self._linear = unrolled(self.linear)  # its product through oneDNN where agents.linear takes it

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        key = self._memo_key(observation) if self.reuse_features else None
        if key is not None and self._memo is not None and _same_key(self._memo[0], key):
            return self._memo[1]
        batch_shape = observation.shape[: observation.dim() - len(self.image_shape)]
        pixels = observation.reshape(-1, *self.image_shape)
        if self.layout == "hwc":  # a view: the copy below moves the bytes
            pixels = pixels.permute(0, 3, 1, 2)
        elif self.layout == "shwc":  # each frame's channels first, the frames' channels one after the other
            pixels = pixels.permute(0, 1, 4, 2, 3).reshape(-1, *self._channels_first_shape)
        elif self.layout in ("hw", "schw"):
            pixels = pixels.reshape(-1, *self._channels_first_shape)
        # torch.vmap has no memory formats, and ONNX export (tracing) has no in-place copy across dtypes
        if torch._C._functorch.is_batchedtensor(pixels) or torch.jit.is_tracing():
            images = pixels.to(torch.float32, copy=True)  # a copy even of float input: divided in place below
        else:  # channels last: oneDNN's convolutions run about a fifth faster on CPU with pixels laid out (H, W, C)
            images = torch.empty(pixels.shape, device=pixels.device, memory_format=torch.channels_last)
            images.copy_(pixels)  # bytes to floats and into that layout in one pass
        if self.divisor != 1.0:
            images = images.div_(self.divisor)
        features = self._linear(self.convolutions(images)).reshape(*batch_shape, self.out_features)
        if key is not None:
            self._memo = (key, features)
            if features.requires_grad:  # once gradients flow back through them, the graph is spent
                owner = weakref.ref(self)
                features.register_hook(lambda grad: _drop_memo(owner, key))
        return features

    def _memo_key(self, observation: torch.Tensor) -> tuple:
        parameters = tuple((parameter, parameter._version) for parameter in self.parameters())
        return observation, observation._version, torch.is_grad_enabled(), parameters

    def __getstate__(self) -> dict:  # copies and pickles never carry features (nor their graph)
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        return {**state, "_memo": None}


class ChannelsLastFlatten(nn.Module):
    """``nn.Flatten()`` of ``[N, C, H, W]`` feature maps (the features in C, H, W order, as ``nn.Flatten``'s),
    whose gradient goes back laid out as the maps were: channels last for channels-last maps.

    ``nn.Flatten`` hands back a contiguous (channels-first) gradient whatever the maps' layout, and the ReLU
    after the last convolution then computes its backward across two layouts: on this 2-core CPU about ten times
    as long as in one layout (on a 256x32x20x20 map: 9.7 against 0.9 ms on two threads); the Nature CNN's
    forward and backward pass at batch 256 took 69 against 75 ms (58.6 with oneDNN's linear layer as well). The
    gradient's values are the same. Under tracing (ONNX export), ``torch.vmap``, ``torch.compile``, without
    gradients and for channels-first maps it is ``nn.Flatten``.
    """

    def forward(self, maps: torch.Tensor) -> torch.Tensor:
        if (
            maps.dim() == 4
            and maps.requires_grad
            and torch.is_grad_enabled()
            and maps.is_contiguous(memory_format=torch.channels_last)
            and not maps.is_contiguous()
            and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()
            and not torch._C._functorch.is_functorch_wrapped_tensor(maps)
        ):
            return _ChannelsLastGradient.apply(maps)
        return maps.flatten(1)


class _ChannelsLastGradient(torch.autograd.Function):
    """``maps.flatten(1)`` whose backward returns the gradient channels last."""

    @staticmethod
    def forward(maps: torch.Tensor) -> torch.Tensor:
        return maps.flatten(1)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.shape = inputs[0].shape

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.reshape(ctx.shape).contiguous(memory_format=torch.channels_last)


def _same_key(old: tuple, new: tuple) -> bool:
    """Whether two :meth:`NatureCNN._memo_key` keys name the same input, parameters and grad mode (tensors by
    identity, versions by value)."""
    (observation, version, grad, parameters), (observation_new, version_new, grad_new, parameters_new) = (
        old,
        new,
    )
    return (
        observation is observation_new
        and version == version_new
        and grad == grad_new
        and len(parameters) == len(parameters_new)
        and all(p is q and v == w for (p, v), (q, w) in zip(parameters, parameters_new, strict=True))
    )


def _drop_memo(owner: weakref.ref, key: tuple) -> None:
    """Forget the features a :class:`NatureCNN` keeps under ``key`` (a gradient hook: gradients pass unchanged)."""
    module = owner()
    if module is not None and module._memo is not None and module._memo[0] is key:
        module._memo = None


IMAGE_LAYOUTS = ("chw", "hwc", "hw", "shwc", "schw")


def image_layout(observation_spec: TensorSpec) -> str | None:
    """The layout of the ``uint8`` images of ``observation_spec`` (batched: ``[N, ...]``), None for observations
    that are not images.

    Three dims are an image: ``"chw"`` when the first is no larger than the last (stacked Atari frames ``(4, 84,
    84)``), ``"hwc"`` otherwise (``(96, 96, 3)``), the rule Stable-Baselines3 applies. Four dims are a stack of
    such images: ``"schw"`` when the second is no larger than the last, ``"shwc"`` otherwise (four RGB frames
    ``(4, 96, 96, 3)``). Two dims are a grayscale image ``"hw"`` when the Box spans the whole byte, 0 to 255, as
    Stable-Baselines3 requires of every image; other ``uint8`` arrays are read as numbers
    (:func:`observation_encoder`).
    """
    if isinstance(observation_spec, Composite | Categorical) or observation_spec.dtype != torch.uint8:
        return None  # a Dict observation's image entries are encoded one by one
    shape = observation_spec.shape[1:]
    if len(shape) == 3:
        return "chw" if shape[0] <= shape[-1] else "hwc"
    if len(shape) == 4:
        return "schw" if shape[1] <= shape[-1] else "shwc"
    whole_byte = isinstance(observation_spec, Bounded) and bool(
        (observation_spec.space.low == 0).all() and (observation_spec.space.high == 255).all()
    )
    return "hw" if len(shape) == 2 and whole_byte else None


def is_image_spec(observation_spec: TensorSpec) -> bool:
    """Whether observations of ``observation_spec`` (batched: ``[N, ...]``) are ``uint8`` images
    (:func:`image_layout`)."""
    return image_layout(observation_spec) is not None


class DictEncoder(nn.Module):
    """The encoder of a Dict observation: :func:`observation_encoder`'s encoder for each entry (vectors flattened
    and, with ``normalize``, normalised each with statistics of its own; Discrete entries one-hot; ``uint8`` images
    through a :class:`NatureCNN` each), their features concatenated in the spec's order.

    Args:
        observation_spec: the ``Composite`` spec of ``"observation"`` (batched).
        normalize: normalise the float vector entries.

    Raises:
        InputError: ``normalize`` without a float vector entry to normalise.
    """

    def __init__(self, observation_spec: Composite, normalize: bool):
        super().__init__()
        self.encoders = nn.ModuleDict()
        self.out_features = 0
        normalized = []
        for key, entry in observation_spec.items():
            # integer vectors (counters, a time step) are passed through as they are, as a whole integer Box is
            normalized_entry = (
                normalize
                and not isinstance(entry, Categorical)
                and not is_image_spec(entry)
                and entry.dtype.is_floating_point
            )
            encoder, width = observation_encoder(entry, normalized_entry)
            self.encoders[key] = encoder
            self.out_features += width
            normalized += [key] if normalized_entry else []
        if normalize and not normalized:
            raise InputError(
                "Observation normalisation needs a float vector entry in the Dict; drop --normalize-obs."
            )
        self.normalized_keys = normalized

    def forward(self, observation: TensorDictBase) -> torch.Tensor:
        return torch.cat([encoder(observation.get(key)) for key, encoder in self.encoders.items()], dim=-1)

    @torch.no_grad()
    def update(self, observations: TensorDictBase) -> None:
        """Fold a batch of observations into each normalised entry's statistics."""
        for key in self.normalized_keys:
            find_normalizer(self.encoders[key]).update(observations.get(key))


def require_observation_values(observation_spec: TensorSpec, algorithm: str) -> None:
    """Raise :class:`InputError` if the observations hold no value at all (a Box of shape ``(0,)``: a bandit),
    which ``algorithm`` cannot train on (TorchRL's SACLoss, RND's novelty); the other recipes can (a bias is a
    policy)."""
    if observation_spec.shape[1:].numel() == 0:
        raise InputError(
            f"{algorithm} needs at least one observation value; this env's observations are empty (shape "
            f"{tuple(observation_spec.shape[1:])}). Observe a constant (a Box of shape (1,) that is always 0), or "
            "use recipes.ppo, a2c, dqn, td3, ddpg, reinforce, vpg or es, which train on empty observations (a bandit)."
        )


def observation_encoder(observation_spec: TensorSpec, normalize: bool) -> tuple[nn.Module, int]:
    """Return the input layer for observations of ``observation_spec`` and the width it outputs.

    Box observations are flattened (and normalised by an :class:`ObservationNormalizer` when ``normalize``),
    integer ones read as floats and a scalar Box as a vector of one; Discrete observations are one-hot encoded;
    ``uint8`` image observations (:func:`image_layout`: stacked Atari frames ``(4, 84, 84)``, RGB frames ``(H, W,
    3)``, grayscale ``(H, W)``) go through the :class:`NatureCNN`.

    Args:
        observation_spec: the spec of ``"observation"``, batched (the leading dim is the number of envs).
        normalize: put an :class:`ObservationNormalizer` in front (Box observations of floats only).

    Returns:
        The encoder module and the number of features it outputs per observation.

    Raises:
        InputError: normalisation asked for Discrete or image observations, or Box observations of a dtype
            that is not a number.
    """
    if isinstance(observation_spec, Composite):
        encoder = DictEncoder(observation_spec, normalize)
        return encoder, encoder.out_features
    if isinstance(
        observation_spec, Categorical
    ):  # Discrete, MultiDiscrete (its subclass) or MultiBinary (too)
        if normalize:
            raise InputError("Observation normalisation needs Box observations; drop --normalize-obs.")
        shape = observation_spec.shape[1:]  # MultiBinary and MultiDiscrete of several dims are flattened
        flatten = [as_vector(shape)] if len(shape) > 1 else []
        if isinstance(observation_spec, Binary):
            return nn.Sequential(*flatten, ToFloat()), int(torch.Size(shape).numel())
        if isinstance(observation_spec, MultiCategorical):
            nvec = multi_discrete_sizes(observation_spec)
            return nn.Sequential(*flatten, MultiOneHot(nvec)), sum(nvec)
        n = observation_spec.space.n
        return OneHot(n), n
    layout = image_layout(observation_spec)
    if layout is not None:
        if normalize:
            raise InputError(
                "Observation normalisation is for vector observations: image observations are scaled to [0, 1] "
                "by the CNN; drop --normalize-obs."
            )
        encoder = NatureCNN(observation_spec.shape[1:], layout)
        return encoder, encoder.out_features
    dtype = observation_spec.dtype
    if dtype.is_complex:
        raise InputError(
            f"Observations of dtype {dtype} are not supported by the network builders (they take Box "
            "observations of real numbers, Discrete observations, and uint8 images)."
        )
    shape = observation_spec.shape[1:]
    # an integer Box (counts, grid coordinates, Atari RAM) is read as floats
    layers: list[nn.Module] = [] if dtype.is_floating_point else [ToFloat()]
    layers += [ObservationNormalizer(shape)] if normalize else []
    layers += [] if len(shape) == 1 else [as_vector(shape)]
    return nn.Sequential(*layers or [nn.Identity()]), int(torch.Size(shape).numel())


def multi_discrete_sizes(observation_spec: MultiCategorical) -> list[int]:
    """The number of values of each component of one observation of a batched ``MultiDiscrete`` spec, its dims
    flattened in order."""
    shape = observation_spec.shape[1:]
    nvec = observation_spec.nvec.expand(observation_spec.shape).reshape(-1, torch.Size(shape).numel())[0]
    return [int(n) for n in nvec]


def as_vector(shape: Sequence[int]) -> nn.Module:
    """The layer that makes observations of ``shape`` (after any batch dims) vectors: flattened, a scalar as a
    vector of one."""
    if len(shape) == 0:
        return nn.Unflatten(-1, (-1, 1))
    return nn.Flatten(-len(shape)) if len(shape) > 1 else nn.Identity()


def encoder_width(observation_spec: TensorSpec) -> int:
    """The number of features :func:`observation_encoder` outputs for ``observation_spec``, without building it
    (for heads put on an encoder shared with another network)."""
    if isinstance(observation_spec, Composite):
        return sum(encoder_width(entry) for entry in observation_spec.values())
    if isinstance(observation_spec, Binary):
        return int(torch.Size(observation_spec.shape[1:]).numel())
    if isinstance(observation_spec, MultiCategorical):
        return sum(multi_discrete_sizes(observation_spec))
    if isinstance(observation_spec, Categorical):
        return observation_spec.space.n
    if is_image_spec(observation_spec):
        return NatureCNN.out_features
    return int(torch.Size(observation_spec.shape[1:]).numel())


def input_encoder(actor: ProbabilisticActor) -> nn.Module:
    """Return the observation encoder of an actor from :func:`make_actor`, to share it with a critic."""
    body = actor.module[0]
    if isinstance(
        body, TensorDictSequential
    ):  # a recurrent actor: its trunk (encoder, recurrent layer), heads
        return recurrent_trunk(actor).encoder.module
    return body.module[0]


class ClampedLogStd(nn.Module):
    """Split a network's output into a Gaussian's ``(loc, scale)`` with ``scale = exp(clamp(log_std, low, high))``:
    Stable-Baselines3's and Spinning Up's SAC head (bounds (-20, 2)), where TorchRL's ``NormalParamExtractor``
    maps the scale through a biased softplus with a floor of 1e-4."""

    def __init__(self, low: float, high: float):
        super().__init__()
        self.low, self.high = float(low), float(high)

    def forward(self, output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc, log_std = output.chunk(2, -1)
        return loc, log_std.clamp(self.low, self.high).exp()

    def extra_repr(self) -> str:
        return f"low={self.low}, high={self.high}"


def check_log_std_bounds(bounds: Any) -> tuple[float, float] | None:
    """``bounds`` as ``(low, high)`` finite floats with low < high, or None; :class:`InputError` otherwise."""
    if bounds is None:
        return None
    try:
        low, high = (float(bound) for bound in bounds)
    except (TypeError, ValueError):
        low = high = math.nan
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise InputError(
            f"log_std_bounds takes two finite numbers LOW HIGH with LOW < HIGH (Stable-Baselines3's: -20 2), "
            f"got {bounds!r:.60}."
        )
    return low, high


class SharedNormalizer(nn.Module):
    """Applies an :class:`ObservationNormalizer` that another module owns, without holding its statistics.

    The off-policy critics normalise their inputs with the actor's statistics. TorchRL's losses copy each Q
    network's parameters and buffers into their own (stacked, target) tensors, so a normaliser registered in the
    critic would freeze there; this one is kept outside the module tree and is read at every call, so every copy
    of the critic sees the statistics the actor is updated with. ``state_dict`` and ``parameters`` hold nothing
    of it: the statistics are saved with the actor.
    """

    def __init__(self, normalizer: ObservationNormalizer):
        super().__init__()
        if not isinstance(normalizer, ObservationNormalizer):
            raise InputError(
                "--normalize-obs with Dict observations is for PPO, A2C, RND-PPO, REINFORCE, VPG and DQN; SAC, TD3 "
                "and DDPG take Dict observations without it."
            )
        self.__dict__["normalizer"] = normalizer  # not a submodule: no state of its own

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.normalizer(observation)


GSDE_SCALE_RANGE = (0.01, 10.0)  # TorchRL's gSDEModule clamps each noise scale sigma_ij to this range


def initial_scale_kwargs(log_std_init: float, action_spec: TensorSpec, use_sde: bool) -> dict[str, float]:
    """The policy builder's keyword for a first standard deviation of ``exp(log_std_init)`` (Stable-Baselines3's
    ``log_std_init``): :func:`make_actor`'s ``log_std_init``, or the gSDE actor's ``sigma_init``. 0 (the
    builders' own start, a scale of 1) needs none.

    Raises:
        InputError: another value for actions that have no scale (Discrete).
    """
    if log_std_init == 0.0:
        return {}
    if not is_float_box(action_spec):
        raise InputError(
            "--log-std-init sets the first scale of a Box action policy; drop it for these actions."
        )
    if use_sde and not GSDE_SCALE_RANGE[0] <= math.exp(log_std_init) <= GSDE_SCALE_RANGE[1]:
        low, high = (math.log(bound) for bound in GSDE_SCALE_RANGE)
        raise InputError(
            f"--log-std-init {log_std_init} with --use-sde is outside [{low:.2f}, {high:.2f}]: TorchRL's gSDE "
            f"clamps each noise scale to [{GSDE_SCALE_RANGE[0]}, {GSDE_SCALE_RANGE[1]}], where the clamp would hold "
            "it with no gradient to move it; give a value inside."
        )
    return {"sigma_init": math.exp(log_std_init)} if use_sde else {"log_std_init": log_std_init}


def is_float_box(action_spec: TensorSpec) -> bool:
    """Whether ``action_spec`` is a Gymnasium ``Box`` of floats: ``Bounded``, or ``Unbounded`` where the Box has an
    infinite bound (:func:`envs.specs.space_to_spec`)."""
    return isinstance(action_spec, Bounded | Unbounded) and action_spec.dtype.is_floating_point


def fixed_action_dims(action_spec: TensorSpec) -> list[int]:
    """The dims of a Box action spec whose low equals high (a fixed value: no range to squash a policy into)."""
    if not isinstance(action_spec, Bounded) or not action_spec.dtype.is_floating_point:
        return []
    low, high = action_spec.space.low, action_spec.space.high
    flat = (low >= high).reshape(-1, *action_spec.shape[-1:]).any(0)
    return flat.nonzero().flatten().tolist()


def box_policy_kwargs(
    action_spec: TensorSpec, log_std_init: float = 0.0, squash: bool = True, use_sde: bool = False
) -> dict[str, float | bool]:
    """The policy builder's keywords for a PPO/A2C/REINFORCE/VPG policy's Box options: the first scale
    (:func:`initial_scale_kwargs`) and, for :func:`make_actor`, ``squash=False`` (an unbounded Gaussian that the
    env clips) when asked, and always for a Box with an infinite bound or a fixed dim (low equal to high), which
    have no range to squash into. A gSDE policy is unsquashed already, so ``squash`` adds nothing to it.

    Raises:
        InputError: ``log_std_init`` other than 0, or ``squash=False``, for actions that are not a Box.
    """
    kwargs: dict[str, float | bool] = dict(initial_scale_kwargs(log_std_init, action_spec, use_sde))
    if not squash and not is_float_box(action_spec):
        raise InputError("--no-squash makes a Box action policy unbounded; drop it for these actions.")
    no_range = isinstance(action_spec, Unbounded) or bool(fixed_action_dims(action_spec))
    if (not squash or no_range) and is_float_box(action_spec) and not use_sde:
        kwargs["squash"] = False
    return kwargs


def orthogonal_init(actor: nn.Module, *critics: nn.Module) -> None:
    """Initialise an actor-critic pair as Stable-Baselines3's ``ortho_init`` does for PPO and A2C: every linear
    and convolutional layer orthogonal with gain ``sqrt(2)`` and zero bias, then the policy's output layer with
    gain 0.01 (a near-uniform first policy) and each value output with gain 1. The output layer of each is its
    last linear layer (:func:`make_actor`, :func:`agents.make_gsde_actor`, :func:`make_critic` and
    :func:`agents.make_shared_critic` all end in one). Learned scales (tanh-normal, gSDE) are left as built."""
    for module in (actor, *critics):
        for layer in module.modules():
            if isinstance(layer, (nn.Linear, nn.Conv2d)):
                nn.init.orthogonal_(layer.weight, gain=math.sqrt(2))
                if layer.bias is not None:
                    nn.init.zeros_(layer.bias)
    for module, gain in ((actor, 0.01), *((critic, 1.0) for critic in critics)):
        output = [layer for layer in module.modules() if isinstance(layer, nn.Linear)][-1]
        nn.init.orthogonal_(output.weight, gain=gain)


def find_normalizer(module: nn.Module) -> ObservationNormalizer | DictEncoder | None:
    """Return the first :class:`ObservationNormalizer` inside ``module``, if any; for a Dict observation the
    :class:`DictEncoder` that normalises some of its entries (its ``update`` takes the whole observation)."""
    for candidate in module.modules():
        if isinstance(candidate, DictEncoder) and candidate.normalized_keys:
            return candidate
        if isinstance(candidate, ObservationNormalizer):
            return candidate
    return None


def action_mask_kwargs(env: EnvBase) -> dict[str, bool]:
    """``{"action_mask": True}`` for an env that gives the allowed actions (``"action_mask"``), else ``{}``: what
    a recipe adds to its policy's keyword arguments (and the agent saves)."""
    return {"action_mask": True} if ACTION_MASK_KEY in env.observation_spec.keys() else {}  # noqa: SIM118 - a Composite spec


MASKED_RECIPES = "PPO, A2C, RND-PPO, REINFORCE, VPG or DQN"  # the recipes whose policies take action masks


def refuse_action_masks(env: EnvBase, recipe: str) -> None:
    """Raise :class:`InputError` for an env that gives the allowed actions (``"action_mask"``) to a recipe whose
    policy cannot take them (it would pick disallowed actions, in training and in evaluation)."""
    if action_mask_kwargs(env):
        raise InputError(
            f"This env gives the allowed actions (info['action_mask']), which {recipe} cannot take: its policy "
            f"would pick disallowed actions. Train with {MASKED_RECIPES}, or remove the mask from the env."
        )


def physical_memory() -> int:
    """Bytes of this machine's physical memory (0 where the system does not say: the memory checks then pass)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 0


def check_mlp_options(hidden_sizes: Sequence[int], activation: str, option: str = "--hidden-sizes") -> None:
    """Raise :class:`InputError` for an unknown activation or a hidden width that is not a positive integer (the
    widths given as ``option``)."""
    if activation not in ACTIVATIONS:
        raise InputError(f"Unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}.")
    if any(not is_whole_number(size) or not 1 <= size <= MAX_WIDTH for size in hidden_sizes):
        raise InputError(
            f"{option} must be positive integers up to {MAX_WIDTH:,} (units per hidden layer), got "
            f"{list(hidden_sizes)}."
        )


def check_mlp_memory(in_features: int, out_features: int, hidden_sizes: Sequence[int]) -> None:
    """Raise :class:`InputError` when an MLP of these widths would hold float32 weights taking more than a quarter
    of this machine's physical memory (training keeps three more copies of them, gradients and Adam's two moments,
    besides target networks), before anything is allocated."""
    widths = [in_features, *hidden_sizes, out_features]
    weights = sum((inputs + 1) * outputs for inputs, outputs in itertools.pairwise(widths))
    memory = physical_memory()
    if memory and 4 * weights > memory // 4:
        raise InputError(
            f"--hidden-sizes {' '.join(map(str, hidden_sizes))} on {in_features:,} input features gives a network "
            f"of {weights:,} weights ({4 * weights / 2**30:,.1f} GiB in float32, four times that to train), more "
            f"than this machine's {memory / 2**30:,.1f} GiB of memory allows: use narrower layers."
        )


def make_mlp(in_features: int, out_features: int, hidden_sizes: Sequence[int], activation: str) -> MLP:
    """A TorchRL ``MLP`` with the named activation between layers and none on the output (options checked by
    :func:`check_mlp_options` and :func:`check_mlp_memory`)."""
    check_mlp_options(hidden_sizes, activation)
    check_mlp_memory(in_features, out_features, hidden_sizes)
    return MLP(
        in_features=in_features,
        out_features=out_features,
        num_cells=list(hidden_sizes),
        activation_class=ACTIVATIONS[activation],
    )


def make_actor(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    normalize_obs: bool = False,
    state_dependent_scale: bool = False,
    encoder: nn.Module | None = None,
    log_std_init: float = 0.0,
    squash: bool = True,
    action_mask: bool = False,
    recurrent: str | None = None,
    recurrent_size: int = 64,
    log_std_bounds: Sequence[float] | None = None,
) -> ProbabilisticActor:
    """Build a stochastic MLP policy for the env's action spec.

    A ``Categorical`` action spec (Gymnasium ``Discrete``) gets a categorical distribution over logits,
    ``MultiDiscrete`` one categorical per component and ``MultiBinary`` one Bernoulli per component
    (:mod:`agents.distributions`, from one vector of logits); a
    ``Bounded`` spec (Gymnasium ``Box``) gets a tanh-normal distribution scaled to the action bounds, with a
    learned state-independent scale (PPO's usual choice) or a state-dependent one. With ``squash=False`` (which a
    Box with an infinite bound, an ``Unbounded`` spec, needs) a Box policy is a plain diagonal Gaussian instead
    (Stable-Baselines3's PPO and A2C): its samples are unbounded,
    and the env clips them to the Box on their way in (:func:`agents.gsde.clip_env_actions` for a training env;
    :meth:`agents.Agent.predict` and ``evaluate`` clip likewise), so the collected action is the one whose
    log-probability was recorded. The network reads observations
    through :func:`observation_encoder`: ``uint8`` images (stacked Atari frames) get the :class:`NatureCNN` and
    ``hidden_sizes`` then sizes the MLP on top of its 512 features (``()``: linear heads, as in Mnih et al. 2015).

    Args:
        observation_spec: the spec of ``"observation"`` (batched: the leading dim is the number of envs).
        action_spec: the env's action spec (batched likewise).
        hidden_sizes: widths of the hidden layers.
        activation: ``"tanh"``, ``"relu"``, ``"elu"`` or ``"silu"``.
        normalize_obs: put an :class:`ObservationNormalizer` in front of the network.
        state_dependent_scale: let the network output the tanh-normal scale.
        encoder: an input module to share with a critic (from :func:`observation_encoder`); built when None.
        log_std_init: the logarithm of the first state-independent scale (Box actions; Stable-Baselines3's
            ``log_std_init``).
        squash: Box actions: squash the Gaussian by ``tanh`` into the bounds (True), or leave it unbounded for
            the env to clip (False). Its deterministic action is then the Gaussian's mean.
        action_mask: Discrete actions: the env gives the allowed actions (``"action_mask"``, see
            :func:`envs.make_env`): a ``MaskedCategorical`` samples, scores and takes the mode among those.
        recurrent: ``"lstm"`` or ``"gru"``: a recurrent layer of ``recurrent_size`` units between the encoder
            and the MLP (:mod:`agents.recurrent`); its state is carried by the env
            (:func:`agents.recurrent.make_recurrent_env`). None: no memory.
        recurrent_size: units of the recurrent layer.
        log_std_bounds: with ``state_dependent_scale``, ``(low, high)``: the scale is the exponential of the
            network's log std clamped to them (:class:`ClampedLogStd`); None: TorchRL's ``NormalParamExtractor``.

    Returns:
        A ``ProbabilisticActor`` reading ``"observation"`` and writing ``"action"`` and its log-probability.
        Under ``ExplorationType.DETERMINISTIC`` it returns the distribution's mode.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("CartPole-v1", num_envs=2)
        >>> actor = make_actor(env.observation_spec["observation"], env.action_spec)
        >>> actor(env.reset())["action"].shape
        torch.Size([2])
    """
    if encoder is None:
        encoder, in_features = observation_encoder(observation_spec, normalize_obs)
    else:
        in_features = encoder_width(observation_spec)
    if recurrent is not None:
        check_recurrent_options(recurrent, recurrent_size)
        trunk = RecurrentTrunk(encoder, make_recurrent_layer(recurrent, in_features, recurrent_size))
        in_features = recurrent_size  # the MLP reads the recurrent layer's output

    def body(head: list[nn.Module], out_keys: list[str]) -> TensorDictModuleBase:
        """The network from observations to the distribution's parameters, through the recurrent layer if any."""
        if recurrent is None:
            return TensorDictModule(nn.Sequential(encoder, *head), in_keys=["observation"], out_keys=out_keys)
        return TensorDictSequential(
            trunk, TensorDictModule(nn.Sequential(*head), in_keys=[MEMORY_KEY], out_keys=out_keys)
        )

    if isinstance(
        action_spec, MultiCategorical | Binary
    ):  # before Categorical: both are Categorical subclasses
        if action_spec.ndim != 2:
            raise InputError(
                f"{'MultiDiscrete' if isinstance(action_spec, MultiCategorical) else 'MultiBinary'} actions must be "
                f"one-dimensional per env, got shape {tuple(action_spec.shape[1:])}: flatten the action space."
            )
        if isinstance(action_spec, MultiCategorical):
            nvec = [int(n) for n in action_spec.nvec.reshape(-1, action_spec.shape[-1])[0]]
            width, distribution_class, distribution_kwargs = sum(nvec), FactorisedCategorical, {"nvec": nvec}
        else:
            width, distribution_class, distribution_kwargs = action_spec.shape[-1], FactorisedBernoulli, {}
        return ProbabilisticActor(
            body([make_mlp(in_features, width, hidden_sizes, activation)], ["logits"]),
            in_keys=["logits"],
            spec=action_spec,
            distribution_class=distribution_class,
            distribution_kwargs=distribution_kwargs,
            return_log_prob=True,
        )
    if isinstance(action_spec, Categorical):
        module = body([make_mlp(in_features, action_spec.space.n, hidden_sizes, activation)], ["logits"])
        masked = {
            "in_keys": {"logits": "logits", "mask": ACTION_MASK_KEY},
            "distribution_class": MaskedCategorical,
        }
        return ProbabilisticActor(
            module,
            **(
                masked
                if action_mask
                else {"in_keys": ["logits"], "distribution_class": torch.distributions.Categorical}
            ),
            spec=action_spec,
            return_log_prob=True,
        )
    if action_mask:
        raise InputError("Action masks are for Discrete actions; this env's are not Discrete.")
    if is_float_box(action_spec):
        if action_spec.ndim != 2:
            raise InputError(
                f"Box actions must be one-dimensional per env, got shape {tuple(action_spec.shape[1:])}."
            )
        if isinstance(action_spec, Unbounded) and squash:
            raise InputError(
                "A Box action space with an infinite bound has no range to squash the policy into: build it "
                "with squash=False (a Gaussian whose actions the env clips to the finite bounds)."
            )
        if squash and (fixed := fixed_action_dims(action_spec)):
            raise InputError(
                f"Box action dims {fixed} have low equal to high (a fixed value), and a tanh-normal policy needs "
                "high > low in every dim: drop those dims from the env's action space (a gymnasium.ActionWrapper), "
                "build the policy with squash=False (recipes.ppo, a2c, reinforce, vpg and rnd_ppo do so by "
                "themselves), or use recipes.td3 or recipes.ddpg, whose deterministic policy keeps them at their value."
            )
        action_dim = action_spec.shape[-1]
        if state_dependent_scale:
            bounds = check_log_std_bounds(log_std_bounds)
            extractor = NormalParamExtractor() if bounds is None else ClampedLogStd(*bounds)
            head = [make_mlp(in_features, 2 * action_dim, hidden_sizes, activation), extractor]
        else:
            if log_std_bounds is not None:
                raise InputError(
                    "log_std_bounds bound a state-dependent scale: add state_dependent_scale=True."
                )
            head = [
                make_mlp(in_features, action_dim, hidden_sizes, activation),
                AddStateIndependentNormalScale(action_dim, init_value=log_std_init),
            ]
        module = body(head, ["loc", "scale"])
        if not squash:
            return ProbabilisticActor(
                module,
                in_keys=["loc", "scale"],
                spec=action_spec,
                distribution_class=IndependentNormal,
                return_log_prob=True,
            )
        return ProbabilisticActor(
            module,
            in_keys=["loc", "scale"],
            spec=action_spec,
            distribution_class=TanhNormal,
            distribution_kwargs={"low": action_spec.space.low[0], "high": action_spec.space.high[0]},
            return_log_prob=True,
        )
    raise InputError(
        f"Action spec {type(action_spec).__name__} is not supported by make_actor: "
        "it builds policies for Discrete, MultiDiscrete, MultiBinary and Box action spaces of floats."
    )


def without_log_prob(actor: nn.Module) -> nn.Module:
    """``actor`` for a collector whose batches nobody reads the log-probability of (SAC's: its loss draws its own
    actions): a ``ProbabilisticActor`` of the same network (the same parameters, so it trains with ``actor``) and
    the same distribution, drawing the same actions, without ``return_log_prob``. At batch 1 the log-probability
    costs more than the draw. Any policy other than a two-module ``ProbabilisticActor`` of
    :func:`make_actor`'s kind, or one already without the log-probability, is returned as it is."""
    if type(actor) is not ProbabilisticActor or len(actor.module) != 2:
        return actor
    network, distribution = actor.module
    if not (
        distribution.return_log_prob
        and not distribution.safe
        and distribution.num_samples is None
        and distribution._generator is None
        and distribution._generator_key is None
        and len(distribution.dist_sample_keys) == 1
    ):
        return actor
    return ProbabilisticActor(
        network,
        in_keys=dict(zip(distribution.dist_keys, distribution.in_keys, strict=True)),
        out_keys=list(distribution.dist_sample_keys),
        spec=distribution.spec,
        default_interaction_type=distribution.default_interaction_type,
        distribution_class=distribution.distribution_class,
        distribution_kwargs=dict(distribution.distribution_kwargs),
        cache_dist=distribution.cache_dist,
        n_empirical_estimate=distribution.n_empirical_estimate,
        return_log_prob=False,
    )


def make_critic(
    observation_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    encoder: nn.Module | None = None,
) -> ValueOperator:
    """Build a state-value MLP reading ``"observation"`` and writing ``"state_value"``.

    Args:
        observation_spec: the spec of ``"observation"``.
        hidden_sizes: widths of the hidden layers.
        activation: activation name, as for :func:`make_actor`.
        encoder: an input module shared with the actor (so both see the same normalised observations, or share
            one CNN trunk, whose :attr:`NatureCNN.reuse_features` this sets); built from the spec when None.
    """
    if encoder is None:
        encoder, in_features = observation_encoder(observation_spec, False)
    else:
        in_features = encoder_width(observation_spec)
        if isinstance(encoder, NatureCNN):  # one trunk, run once per minibatch for actor and critic
            encoder.reuse_features = True
    net = nn.Sequential(encoder, make_mlp(in_features, 1, hidden_sizes, activation))
    return ValueOperator(net, in_keys=["observation"])


def critic_on_cnn_trunk(actor: ProbabilisticActor, critic: nn.Module) -> bool:
    """Whether ``critic`` (from :func:`make_critic` with ``encoder=input_encoder(actor)``) runs on ``actor``'s Nature
    CNN, whose features it then gets from the actor's call on the same observation tensor: a collector can
    write the critic's values beside the policy's outputs for the price of the value head (see
    :class:`agents.fast_paths.LeanActor`)."""
    module = getattr(critic, "module", None)
    encoder = module[0] if isinstance(module, nn.Sequential) and len(module) else None
    return (
        isinstance(encoder, NatureCNN)
        and encoder.reuse_features
        and isinstance(actor, ProbabilisticActor)
        and input_encoder(actor) is encoder
    )


def make_recurrent_critic(
    actor: nn.Module, hidden_sizes: Sequence[int] = (64, 64), activation: str = "tanh"
) -> TensorDictSequential:
    """A state-value critic that shares the recurrent actor's encoder and recurrent layer, with an MLP of
    ``hidden_sizes`` from ``"memory"`` to the value on top."""
    trunk = recurrent_trunk(actor)
    width = next(iter(state_shapes(trunk).values()))[1]
    head = make_mlp(width, 1, hidden_sizes, activation)
    return TensorDictSequential(trunk, ValueOperator(head, in_keys=[MEMORY_KEY]))
