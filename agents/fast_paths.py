"""Shortcuts around per-call costs in TensorDict that do not change what any call returns.

:class:`LeanActor`, :class:`LeanQPolicy` and :class:`LeanDeterministicPolicy` (through :func:`lean_policy`) run
the stochastic policies of :func:`agents.make_actor`, the epsilon-greedy Q policies of :func:`agents.make_q_actor`
and the Gaussian-noise policies of :func:`agents.make_deterministic_actor` (DDPG, TD3) in one call for collection:
about 0.1 ms of the 0.25 ms a MuJoCo policy step costs through ``ProbabilisticActor``.

``TensorDictModule`` passes every output tensor of its module through ``TensorDict.from_any``, which asks
``importlib.util.find_spec("pandas")`` (a search of ``sys.path`` on disk) before it gives a plain tensor back
unchanged. That lookup costs about 0.1 ms per output, several per policy call: a tenth of an off-policy recipe's
collection time on a MuJoCo task. :func:`install` makes ``from_any`` return tensors at once, the value it returns
for them anyway (a tensor is no dict, tuple, dataclass, array, DataFrame or HDF5 file); every other input takes
TensorDict's own path. Importing :mod:`agents` installs it.

:func:`unrolled` runs a network of the recipes' shape (``nn.Sequential`` or TorchRL ``MLP`` of ``nn.Linear``
layers and activations) as one flat list of tensor operations, without a module call per layer: about 0.02 ms
of a 0.05 ms Q-network call at batch 1 on a 2-core CPU. The lean policies, ``TensorDQNLoss`` and
``TensorClipPPOLoss`` call their networks through it.

:func:`flat_select` is ``select`` then ``reshape(-1)`` of a collected batch, built from the batch's own views:
what an off-policy recipe stores of each batch, about 0.07 ms a batch cheaper, which at one frame per batch (SAC,
TD3, DDPG at their usual settings) is paid once per frame.

:func:`compiled` is ``torch.compile`` as the recipes' ``--compile`` uses it: on the loss, and (through
``lean_policy(..., compile=True)``) on the collector's sampling step.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.nn.functional as F
from tensordict import NestedKey, TensorDict, TensorDictBase, is_tensor_collection
from tensordict.nn import TensorDictModule, TensorDictModuleBase, TensorDictSequential
from tensordict.nn.probabilistic import InteractionType, interaction_type
from tensordict.utils import expand_as_right
from torch import nn
from torch.nn.modules import module as torch_module
from torchrl.data import Bounded, Composite
from torchrl.modules import (
    MLP,
    AdditiveGaussianModule,
    EGreedyModule,
    ProbabilisticActor,
    QValueActor,
    QValueModule,
    SafeProbabilisticModule,
    TanhModule,
)
from torchrl.modules.distributions import IndependentNormal, TanhNormal
from torchrl.modules.distributions.utils import safetanh_noeps, sample_and_log_prob

from agents.linear import linear
from errors import InputError

CompiledT = TypeVar("CompiledT", bound=Callable)


def check_compile(device: str | torch.device) -> None:
    """Raise :class:`InputError` if ``torch.compile`` cannot build code for ``device`` here (on the CPU: no C++
    compiler)."""
    if torch.device(device).type == "cuda":
        from torch.utils._triton import has_triton

        if not has_triton():
            raise InputError(
                f"--compile on {device} needs Triton (pip install triton, which CUDA builds of torch bring) and it "
                "is not installed; install it or leave out --compile."
            )
        return
    if torch.device(device).type != "cpu":
        return
    from torch._inductor.cpp_builder import get_cpp_compiler
    from torch._inductor.exc import InvalidCxxCompiler

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler:
        raise InputError(
            "--compile on the CPU needs a C++ compiler (g++ or clang++; set CXX to choose one) and none was found; "
            "install one (e.g. apt install g++) or leave out --compile."
        ) from None


def compiled(function: CompiledT, enabled: bool = True) -> CompiledT:
    """``torch.compile(function)`` (``function`` itself when not ``enabled``: a run without ``--compile``), with
    random draws made by torch's eager kernels (Inductor's ``fallback_random``), so that a seeded run samples the
    same numbers compiled or not."""
    if not enabled:
        return function
    import torch._inductor.config

    torch._inductor.config.fallback_random = True
    # torch warns "No CUDA runtime is found" when it builds CPU kernels; nothing is wrong
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    return torch.compile(function)


def install() -> None:
    """Give ``TensorDict.from_any`` a fast path for tensors (once; later calls do nothing)."""
    original = TensorDictBase.from_any.__func__
    if getattr(original, "returns_tensors_at_once", False):
        return

    @functools.wraps(original)
    def from_any(cls, obj, **kwargs):
        if isinstance(obj, torch.Tensor) and not is_tensor_collection(obj):
            return obj
        return original(cls, obj, **kwargs)

    from_any.returns_tensors_at_once = True
    TensorDictBase.from_any = classmethod(from_any)


def unrolled(module: nn.Module) -> Callable[..., torch.Tensor]:
    """``module``'s forward as a function of its inputs that runs containers and simple layers as tensor
    operations, not module calls; it computes what ``module(*inputs)`` computes, with the same operations (large
    float32 products through oneDNN where :func:`agents.linear.linear` takes it: the same up to the order of sums).

    ``nn.Sequential`` and TorchRL ``MLP`` containers are flattened, ``nn.Linear`` runs as
    :func:`agents.linear.linear` on the layer's current weight and bias, ``nn.ReLU`` and ``nn.Tanh`` as their functions, ``nn.Identity`` not at
    all, and any other submodule (a normaliser, ``NormalParamExtractor``, a layer with parameters of another
    kind) is called as it is. A module with forward hooks is called as it is, and so is the whole network
    while global module hooks are registered (``torch.nn.modules.module.register_module_forward_hook``).
    Several inputs, and an ``MLP`` that reshapes its output, go through ``module`` itself. The function holds
    the modules themselves (not closures over them), so a deep copy of its owner computes with the copied
    modules.
    """
    return _Unrolled(module)


class _Unrolled:
    """What :func:`unrolled` returns: ``module`` and its steps, each a layer (``nn.Linear``: :func:`agents.linear.linear` on its
    parameters), an activation function, or a submodule to call."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.steps = _unrolled_steps(module)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        if len(inputs) != 1 or torch_module._global_forward_hooks or torch_module._global_forward_pre_hooks:
            return self.module(*inputs)
        x = inputs[0]
        for step in self.steps:
            x = linear(x, step.weight, step.bias) if type(step) is nn.Linear else step(x)
        return x


def _unrolled_steps(module: nn.Module) -> list[Callable[[torch.Tensor], torch.Tensor]]:
    if module._forward_hooks or module._forward_pre_hooks or module._backward_hooks:
        return [module.__call__]  # called with its hooks (a bound method, never mistaken for a bare layer)
    kind = type(module)
    if kind is nn.Linear:
        return [module]  # run as agents.linear.linear by _Unrolled
    if kind is nn.ReLU:
        return [torch.relu_ if module.inplace else torch.relu]
    if kind is nn.Tanh:
        return [torch.tanh]
    if kind is nn.Identity:
        return []
    if kind is nn.Sequential or (kind is MLP and not module._reshape_out):
        return [step for child in module for step in _unrolled_steps(child)]
    return [module]


class _LeanPolicy(TensorDictModuleBase):
    """What the lean policies share: under ``ExplorationType.RANDOM`` (collection) their ``act`` writes the
    entries, under any other exploration type the policy they run (``policy``) answers."""

    policy: TensorDictModuleBase
    network_in_key: NestedKey

    def act(self, observation: torch.Tensor, batch_shape: torch.Size) -> list[tuple[NestedKey, torch.Tensor]]:
        raise NotImplementedError

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if interaction_type() is not InteractionType.RANDOM:
            return self.policy(tensordict)
        for key, value in self.act(tensordict.get(self.network_in_key), tensordict.shape):
            tensordict.set(key, value)
        return tensordict


class LeanActor(_LeanPolicy):
    """A ``ProbabilisticActor`` of a network and a distribution, run in one call: what a collector calls.

    Under ``ExplorationType.RANDOM`` (collection) it reads the observation, runs the network, builds the
    distribution, draws the action and its log-probability with TorchRL's ``sample_and_log_prob`` (only the
    action, for an actor built without ``return_log_prob``) and writes the same entries as the actor, from the
    same random draws; it skips the per-call dispatch, key checks and
    context managers of the actor's three TensorDict modules. For an ``IndependentNormal`` policy (PPO's and
    A2C's unsquashed Gaussian) and a ``TanhNormal`` one with TorchRL's defaults (SAC's squashed Gaussian) it runs
    the draw's and the log-probability's arithmetic without building the distribution objects (for the Gaussian,
    :meth:`log_prob` and :meth:`log_prob_and_entropy` too), which at batch 1 cost as much as the network (a
    ``TanhNormal`` draw and its score: about 0.3 ms through the distribution, three times the network of 256
    units); so it does for a ``Categorical`` policy over logits (Gymnasium ``Discrete`` actions without a mask), for
    the draw, :meth:`log_prob` and :meth:`log_prob_and_entropy` (about 0.1 ms a call through
    ``torch.distributions.Categorical``, whose argument and sample checks are most of it). Any other exploration
    type calls the actor itself. It holds the actor's parameters, not copies, so training the actor trains it.

    With a ``critic``, every call also writes the critic's value of the observation, under any exploration type:
    what an on-policy recipe whose critic shares the actor's CNN trunk collects, so that its advantage step reads
    the values of the batch's observations instead of running the trunk over the batch again
    (:class:`agents.OneCallGAE` with ``collected_values``). The trunk runs once a step: the critic's call gets the
    features of the actor's call on the same observation tensor (:attr:`agents.NatureCNN.reuse_features`), and
    only the value head is added.

    Args:
        actor: a ``ProbabilisticActor`` of a ``TensorDictModule`` (the network) and a ``SafeProbabilisticModule``
            (:func:`agents.make_actor` builds these; :func:`agents.without_log_prob` the same without the
            log-probability); see :func:`lean_policy`.
        compile: run the sampling step (network, distribution, draw) through :func:`compiled`.
        critic: a ``TensorDictModule`` (e.g. :func:`agents.make_critic`'s ``ValueOperator``) reading the
            actor's network input alone and writing one entry.

    Raises:
        TypeError: ``critic`` is not a one-output ``TensorDictModule`` reading the actor's network input.
    """

    def __init__(
        self, actor: ProbabilisticActor, compile: bool = False, critic: TensorDictModule | None = None
    ):
        super().__init__()
        network, distribution = actor.module[0], actor.module[1]
        self.actor = actor
        self.network = network.module
        self._network = unrolled(self.network)
        self.in_keys, self.out_keys = list(actor.in_keys), list(actor.out_keys)
        self.network_in_key = network.in_keys[0]
        self.critic = critic
        if critic is not None:
            if not (
                isinstance(critic, TensorDictModule)
                and list(critic.in_keys) == [self.network_in_key]
                and len(critic.out_keys) == 1
            ):
                raise TypeError(
                    f"LeanActor: the critic must be a TensorDictModule reading {self.network_in_key!r} alone and "
                    "writing one entry (a ValueOperator from make_critic)."
                )
            self.value_key = critic.out_keys[0]
            self.out_keys.append(self.value_key)
        self.parameter_keys = list(network.out_keys)
        # which network output feeds which distribution argument
        self.arguments = [
            (key[-1] if isinstance(key, tuple) else key, self.parameter_keys.index(in_key))
            for key, in_key in zip(distribution.dist_keys, distribution.in_keys, strict=True)
        ]
        self.distribution_class = distribution.distribution_class
        self.distribution_kwargs = dict(distribution.distribution_kwargs)
        self.action_key = distribution.dist_sample_keys[0]
        # None: the actor returns no log-probability, and the draw skips it
        self.log_prob_key = distribution.log_prob_key if distribution.return_log_prob else None
        self._gaussian_event_dims = self._independent_normal_event_dims()
        self._tanh_normal = (
            tanh_normal_arguments(self.distribution_class, self.distribution_kwargs)
            if self.arguments == [("loc", 0), ("scale", 1)] and len(self.parameter_keys) == 2
            else None
        )
        # a Categorical over the network's one output, the logits, with torch's defaults
        self._categorical = (
            self.distribution_class is torch.distributions.Categorical
            and self.arguments == [("logits", 0)]
            and len(self.parameter_keys) == 1
            and not self.distribution_kwargs
        )
        self._sample = compiled(self.sample, compile)

    def _independent_normal_event_dims(self) -> int | None:
        """The event dims of an ``IndependentNormal`` built from the network's ``(loc, scale)`` with no other
        argument (then :func:`_gaussian_sample` draws what the distribution would); None for any other policy."""
        kwargs = dict(self.distribution_kwargs)
        event_dims = kwargs.pop("event_dim", 1)
        unread = {"tanh_loc", "upscale"}  # read by IndependentNormal.update only, not on construction
        if (
            self.distribution_class is not IndependentNormal
            or not set(kwargs) <= unread
            or self.arguments != [("loc", 0), ("scale", 1)]
            or len(self.parameter_keys) != 2
            or not isinstance(event_dims, int)
            or event_dims < 1
        ):
            return None
        return event_dims

    def parameters_and_distribution(
        self, observation: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.distributions.Distribution]:
        """The network's outputs (the distribution's parameters) for ``observation``, and the distribution."""
        outputs = self._network(observation)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        distribution = self.distribution_class(
            **{name: outputs[index] for name, index in self.arguments}, **self.distribution_kwargs
        )
        return outputs, distribution

    def distribution(self, observation: torch.Tensor) -> torch.distributions.Distribution:
        """The policy's action distribution for ``observation`` (what the actor's ``get_dist`` returns)."""
        return self.parameters_and_distribution(observation)[1]

    def log_prob(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """The log-probability of ``action`` under the policy's distribution for ``observation``: the
        distribution's ``log_prob`` (for an ``IndependentNormal`` policy, its arithmetic on the network's outputs)."""
        if self._gaussian_event_dims is not None:
            loc, scale = self._network(observation)
            return _gaussian_log_prob(loc, scale, action, self._gaussian_event_dims)
        if self._categorical:
            logits = self._network(observation)
            if action.shape == logits.shape[:-1]:
                return _categorical_log_prob(_categorical_log_pmf(logits), action)
            return self.distribution_class(logits=logits).log_prob(action)
        return self.distribution(observation).log_prob(action)

    def log_prob_and_entropy(
        self, observation: torch.Tensor, action: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | torch.distributions.Distribution]:
        """The log-probability of ``action`` and the policy's entropy for ``observation``, from one network call:
        for a ``Categorical`` or ``IndependentNormal`` policy the entropy itself (the distribution's closed form,
        its arithmetic), for any other the distribution, whose ``entropy`` (or a sampled estimate) the caller
        takes."""
        if self._gaussian_event_dims is not None:
            loc, scale = self._network(observation)
            return (
                _gaussian_log_prob(loc, scale, action, self._gaussian_event_dims),
                _gaussian_entropy(loc, scale, self._gaussian_event_dims),
            )
        if self._categorical:
            logits = self._network(observation)
            if action.shape == logits.shape[:-1]:
                log_pmf = _categorical_log_pmf(logits)
                return _categorical_log_prob(log_pmf, action), _categorical_entropy(log_pmf)
            distribution = self.distribution_class(logits=logits)
        else:
            distribution = self.distribution(observation)
        return distribution.log_prob(action), distribution

    def sample(
        self, observation: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor | None]:
        """The network's outputs for ``observation``, an action drawn from the distribution, its log-probability
        (None when the actor returns none: then only the draw runs)."""
        with_log_prob = self.log_prob_key is not None
        if self._gaussian_event_dims is not None:
            outputs = self._network(observation)
            if not with_log_prob:
                return outputs, _gaussian_draw(*outputs), None
            action, log_prob = _gaussian_sample(*outputs, self._gaussian_event_dims)
            return outputs, action, log_prob
        if self._tanh_normal is not None:
            outputs = self._network(observation)
            if not with_log_prob:
                return outputs, tanh_normal_draw(*outputs, self._tanh_normal[1])[1], None
            action, log_prob = tanh_normal_sample(*outputs, *self._tanh_normal)
            return outputs, action, log_prob
        if self._categorical:
            logits = self._network(observation)
            log_pmf = _categorical_log_pmf(logits)
            action = _categorical_draw(log_pmf)
            return (logits,), action, _categorical_log_prob(log_pmf, action) if with_log_prob else None
        outputs, distribution = self.parameters_and_distribution(observation)
        if not with_log_prob:  # the draw of ProbabilisticTensorDictModule under ExplorationType.RANDOM
            return (
                outputs,
                distribution.rsample() if distribution.has_rsample else distribution.sample(),
                None,
            )
        action, log_prob = sample_and_log_prob(distribution, reparameterize=distribution.has_rsample)
        return outputs, action, log_prob

    def act(self, observation: torch.Tensor, batch_shape: torch.Size) -> list[tuple[NestedKey, torch.Tensor]]:
        """The entries a collection call writes for ``observation`` (a batch of ``batch_shape``): the network's
        outputs, the action drawn and its log-probability."""
        outputs, action, log_prob = self._sample(observation)
        entries = [*zip(self.parameter_keys, outputs, strict=True), (self.action_key, action)]
        if log_prob is not None:
            entries.append((self.log_prob_key, log_prob))
        if self.critic is not None:  # after the actor's call, whose trunk features a shared CNN hands over
            entries.append((self.value_key, self.critic.module(observation)))
        return entries

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        tensordict = super().forward(tensordict)
        if self.critic is not None and interaction_type() is not InteractionType.RANDOM:
            tensordict = self.critic(tensordict)
        return tensordict

    @property
    def policy(self) -> ProbabilisticActor:
        """The actor this one runs."""
        return self.actor


def _gaussian_sample(
    loc: torch.Tensor, scale: torch.Tensor, event_dims: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised draw of ``IndependentNormal(loc, scale, event_dim=event_dims)`` and its log-probability:
    the operations ``rsample`` and ``log_prob`` of ``Independent(Normal)`` run (the same generator draw, the same
    arithmetic in the same order), without building the two distribution objects and their broadcast views."""
    action = _gaussian_draw(loc, scale)
    return action, _gaussian_log_prob(loc, scale, action, event_dims)


def _gaussian_draw(loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``Normal(loc, scale).rsample()``'s draw and arithmetic."""
    shape = loc.shape if loc.shape == scale.shape else torch.broadcast_shapes(loc.shape, scale.shape)
    noise = torch.empty(shape, dtype=loc.dtype, device=loc.device).normal_()
    return loc + noise * scale


def _gaussian_log_prob(
    loc: torch.Tensor, scale: torch.Tensor, value: torch.Tensor, event_dims: int
) -> torch.Tensor:
    """``IndependentNormal(loc, scale, event_dim=event_dims).log_prob(value)``: ``Normal.log_prob``'s arithmetic,
    summed over the event dims as ``Independent`` sums them."""
    return _sum_rightmost(-((value - loc) ** 2) / (2 * scale**2) - scale.log() - _LOG_SQRT_2PI, event_dims)


def _categorical_log_pmf(logits: torch.Tensor) -> torch.Tensor:
    """The normalised logits ``torch.distributions.Categorical(logits=logits)`` keeps as its ``logits``."""
    return logits - logits.logsumexp(dim=-1, keepdim=True)


def _categorical_draw(log_pmf: torch.Tensor) -> torch.Tensor:
    """``Categorical.sample()``'s draw from the normalised logits ``log_pmf``: the same probabilities, the same
    generator call."""
    probs = F.softmax(log_pmf, dim=-1)
    return torch.multinomial(probs.reshape(-1, log_pmf.shape[-1]), 1, True).T.reshape(log_pmf.shape[:-1])


def _categorical_log_prob(log_pmf: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
    """``Categorical.log_prob(action)`` for an ``action`` of the distribution's batch shape."""
    return log_pmf.gather(-1, action.long().unsqueeze(-1)).squeeze(-1)


def _categorical_entropy(log_pmf: torch.Tensor) -> torch.Tensor:
    """``Categorical.entropy()``: the normalised logits clamped above the dtype's lowest value (masked logits of
    -inf), times the probabilities, summed and negated."""
    clamped = torch.clamp(log_pmf, min=torch.finfo(log_pmf.dtype).min)
    return -(clamped * F.softmax(log_pmf, dim=-1)).sum(-1)


def _gaussian_entropy(loc: torch.Tensor, scale: torch.Tensor, event_dims: int) -> torch.Tensor:
    """``IndependentNormal(loc, scale, event_dim=event_dims).entropy()``: ``Normal.entropy``'s arithmetic on the
    scale broadcast against ``loc``, summed over the event dims."""
    if scale.shape != loc.shape:
        scale = scale.expand(torch.broadcast_shapes(loc.shape, scale.shape))
    return _sum_rightmost(0.5 + 0.5 * math.log(2 * math.pi) + torch.log(scale), event_dims)


# the torch dtypes NumPy holds as they are, with NumPy's (a tensor of one of these and a NumPy array share memory)
NUMPY_DTYPES = {
    dtype: torch.empty((), dtype=dtype).numpy().dtype
    for dtype in (torch.float16, torch.float32, torch.float64, torch.bool, torch.uint8)
    + (torch.int8, torch.int16, torch.int32, torch.int64)
}

_LOG_SQRT_2PI = math.log(math.sqrt(2 * math.pi))  # as torch.distributions.Normal.log_prob writes it


def tanh_normal_arguments(
    distribution_class: type, distribution_kwargs: dict
) -> tuple[int, tuple[torch.Tensor, torch.Tensor] | None] | None:
    """What :func:`tanh_normal_sample` needs to draw as ``distribution_class(loc, scale, **distribution_kwargs)``
    would, when that is a ``TanhNormal`` with TorchRL's defaults (``tanh_loc=False``, ``safe_tanh=True``): its
    event dims and the affine map after tanh (None for bounds -1 and 1); None for any other distribution."""
    kwargs = dict(distribution_kwargs)
    low, high = kwargs.pop("low", -1.0), kwargs.pop("high", 1.0)
    event_dims = kwargs.pop("event_dims", None)
    kwargs.pop("upscale", None)  # read only with tanh_loc
    if (
        distribution_class is not TanhNormal
        or kwargs.pop("tanh_loc", False) is not False
        or kwargs.pop("safe_tanh", True) is not True
        or kwargs
        or not (event_dims is None or (isinstance(event_dims, int) and event_dims >= 1))
    ):
        return None
    low, high = torch.as_tensor(low), torch.as_tensor(high)
    if not (high > low).all():
        return None  # TanhNormal refuses these bounds: the distribution says so
    trivial = not (high != 1.0).any() and not (low != -1.0).any()
    return event_dims or 1, None if trivial else ((high + low) / 2, (high - low) / 2)


def tanh_normal_sample(
    loc: torch.Tensor,
    scale: torch.Tensor,
    event_dims: int,
    affine: tuple[torch.Tensor, torch.Tensor] | None,
    epsilon: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A reparameterised draw of ``TanhNormal(loc, scale, low, high, event_dims)`` (``affine``: the map to
    ``[low, high]``, ``((high + low) / 2, (high - low) / 2)``, or None for -1 and 1) and its log-probability:
    the operations of ``TanhNormal.rsample_and_log_prob`` (the Gaussian draw, TorchRL's safe tanh, the affine map,
    each transform's log-determinant summed as ``ComposeTransform`` sums them), without the distribution and
    transform objects. With ``epsilon`` > 0 the tanh's log-determinant is ``log(1 - tanh(u)^2 + epsilon)``, as
    Stable-Baselines3 computes it, instead of the exact one."""
    preimage, action = tanh_normal_draw(loc, scale, affine)
    variance, log_scale = scale**2, scale.log()
    log_prob = _sum_rightmost(
        -((preimage - loc) ** 2) / (2 * variance) - log_scale - _LOG_SQRT_2PI, event_dims
    )
    if epsilon:
        jacobian = torch.log(1.0 - preimage.tanh() ** 2 + epsilon)
    else:
        jacobian = 2.0 * (math.log(2.0) - preimage - F.softplus(-2.0 * preimage))  # TanhTransform's
    if affine is not None:
        half_range = affine[1].to(preimage.device)
        jacobian = jacobian + torch.abs(half_range).log().expand(preimage.shape)  # AffineTransform's
    return action, log_prob - _sum_rightmost(jacobian, event_dims)


def tanh_normal_draw(
    loc: torch.Tensor, scale: torch.Tensor, affine: tuple[torch.Tensor, torch.Tensor] | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Gaussian draw of :func:`tanh_normal_sample` (``TanhNormal.rsample``'s) and the action it maps to:
    ``(preimage, action)``."""
    # in the distribution's order, so that backward accumulates each gradient in the same order too
    shape = loc.shape if loc.shape == scale.shape else torch.broadcast_shapes(loc.shape, scale.shape)
    preimage = loc + torch.empty(shape, dtype=loc.dtype, device=loc.device).normal_() * scale
    if preimage.requires_grad:
        action = safetanh_noeps(preimage)  # its backward is TorchRL's
    else:  # its forward, without the autograd.Function call (about 0.06 ms)
        limit = 1.0 - torch.finfo(preimage.dtype).resolution
        action = preimage.tanh().clamp(-limit, limit)
    if affine is not None:
        center, half_range = (part.to(preimage.device) for part in affine)
        action = center + half_range * action
    return preimage, action


def _sum_rightmost(value: torch.Tensor, dims: int) -> torch.Tensor:
    """``value`` summed over its last ``dims`` dimensions, as ``torch.distributions`` sums them."""
    return value.reshape(*value.shape[: value.dim() - dims], -1).sum(-1)


def flat_select(data: TensorDictBase, keys: Sequence[NestedKey]) -> TensorDictBase:
    """``data.select(*keys, strict=False).reshape(-1)``: the entries of ``keys`` that ``data`` holds, in that
    order, with the batch dimensions flattened into one (and, as ``reshape`` leaves them, no dimension names). A
    plain ``TensorDict`` of plain tensors (keys at most two deep) is rebuilt directly from reshaped views
    (:func:`flat_entries`); anything else goes through ``select`` and ``reshape``."""
    entries = flat_entries(data, keys)
    if entries is None:
        return data.select(*keys, strict=False).reshape(-1)
    batch_size, device = torch.Size([data.batch_size.numel()]), data.device
    selected: dict[str, torch.Tensor | dict[str, torch.Tensor]] = {}
    for path, value in entries:
        if len(path) == 1:
            selected[path[0]] = value
        else:
            selected.setdefault(path[0], {})[path[1]] = value
    return TensorDict._new_unsafe(
        {
            name: TensorDict._new_unsafe(value, batch_size=batch_size, device=device)
            if isinstance(value, dict)
            else value
            for name, value in selected.items()
        },
        batch_size=batch_size,
        device=device,
    )


def flat_entries(
    data: TensorDictBase, keys: Sequence[NestedKey]
) -> list[tuple[tuple[str, ...], torch.Tensor]] | None:
    """The entries of :func:`flat_select`'s result as ``(key path, tensor)`` pairs, each a view of ``data``'s
    tensor with the batch dimensions flattened into one, when ``data`` is a plain ``TensorDict`` of plain
    tensors (keys at most two deep) and no key is asked for both whole and nested; else None. (A collector's
    batches name their time dimension: flattening drops the names.)"""
    if type(data) is not TensorDict:
        return None
    batch_size, batch_dims = torch.Size([data.batch_size.numel()]), data.batch_dims
    entries, whole, nested = [], set(), set()
    for key in keys:
        path = (key,) if isinstance(key, str) else tuple(key)
        if not 1 <= len(path) <= 2:
            return None
        value = data._tensordict.get(path[0])
        if len(path) == 2:
            if value is None:
                continue
            if type(value) is not TensorDict or value.batch_size != data.batch_size:
                return None
            value = value._tensordict.get(path[1])
        if value is None:
            continue
        if type(value) is not torch.Tensor:
            return None
        (whole if len(path) == 1 else nested).add(path[0])
        entries.append((path, value.reshape(batch_size + value.shape[batch_dims:])))
    return None if whole & nested else entries  # a key both whole and nested: TensorDict's rules


class LeanQPolicy(_LeanPolicy):
    """An epsilon-greedy Q policy (``TensorDictSequential(QValueActor, EGreedyModule)``) run in one call.

    Under ``ExplorationType.RANDOM`` it computes the Q-values, the greedy action and its value with the
    ``QValueModule``'s own functions, then replaces each action by a uniformly random one with probability
    ``eps`` with the ``EGreedyModule``'s draws (``torch.rand`` for the choice, the action spec's ``rand`` for the
    action), and writes the same entries from the same random numbers; any other exploration type calls the
    policy itself. The parameters and the ``eps`` buffer are the policy's own.

    Args:
        policy: an epsilon-greedy Q policy without action masks (:func:`agents.make_q_actor` without noisy
            layers); see :func:`lean_policy`.
        compile: run the Q-network through :func:`compiled`.
    """

    def __init__(self, policy: TensorDictSequential, compile: bool = False):
        super().__init__()
        q_actor, exploration = policy.module
        self.policy = policy
        self.network_in_key = q_actor.module[0].in_keys[0]
        self.network = q_actor.module[0].module
        self._network = compiled(self.network.forward) if compile else unrolled(self.network)
        self.q_values = q_actor.module[1]
        self.exploration = exploration
        self.in_keys, self.out_keys = list(policy.in_keys), list(policy.out_keys)
        spec = exploration.spec
        self.action_spec = spec[exploration.action_key] if isinstance(spec, Composite) else spec
        self._random_actions: dict[torch.Size, object] = {}

    def act(self, observation: torch.Tensor, batch_shape: torch.Size) -> list[tuple[NestedKey, torch.Tensor]]:
        """The entries a collection call writes for ``observation`` (a batch of ``batch_shape``): the action, the
        Q-values and the chosen action's value."""
        q_values = self.q_values
        values = self._network(observation)
        action = q_values.action_func_mapping[q_values.action_space](values)
        value_of = q_values.action_value_func_mapping.get(
            q_values.action_space, q_values._default_action_value
        )
        chosen_value = value_of(values, action)
        eps = self.exploration.eps
        explore = expand_as_right(torch.rand(batch_shape, device=eps.device) < eps, action)
        spec = self._random_actions.get(action.shape)
        if spec is None:  # the spec whose rand() draws as the EGreedyModule's does, for a batch of this shape
            spec = (
                self.action_spec
                if self.action_spec.shape == action.shape
                else self.action_spec.expand(action.shape)
            )
            self._random_actions[action.shape] = spec
        action = torch.where(explore, spec.rand().to(eps.device), action)
        return list(zip(q_values.out_keys, (action, values, chosen_value), strict=True))


class LeanDeterministicPolicy(_LeanPolicy):
    """A deterministic actor with additive Gaussian exploration noise (``TensorDictSequential(TensorDictSequential(
    network, TanhModule), AdditiveGaussianModule)``, :func:`agents.make_deterministic_actor`) run in one call.

    Under ``ExplorationType.RANDOM`` it runs the network, maps its output into the action bounds as the
    ``TanhModule`` does (same operations, same attributes) and adds the ``AdditiveGaussianModule``'s noise with
    that module's own draw and projection, writing the same entries from the same random numbers; any other
    exploration type calls the policy itself. The parameters are the policy's own. The projection onto a
    ``Bounded`` action spec is the spec's clamp, without the bounds check before it (``project`` clamps only
    actions outside the box, and clamping one inside changes nothing): about 0.1 ms a step.

    Args:
        policy: such a policy (see :func:`lean_policy`).
        compile: run the network through :func:`compiled`.
    """

    def __init__(self, policy: TensorDictSequential, compile: bool = False):
        super().__init__()
        actor, exploration = policy.module
        network, squash = actor.module
        self.policy = policy
        self.network = network.module
        self._network = compiled(self.network.forward) if compile else unrolled(self.network)
        self.network_in_key, self.preactivation_key = network.in_keys[0], network.out_keys[0]
        self.squash, self.exploration = squash, exploration
        self.action_key = squash.out_keys[0]
        self.in_keys, self.out_keys = list(policy.in_keys), list(policy.out_keys)

    def act(self, observation: torch.Tensor, batch_shape: torch.Size) -> list[tuple[NestedKey, torch.Tensor]]:
        """The entries a collection call writes for ``observation`` (a batch of ``batch_shape``): the network's
        output and the noisy action."""
        preactivation = self._network(observation)
        squash = self.squash
        action = preactivation.tanh()  # TanhModule.forward, for its one key
        if squash.clamp:
            resolution = torch.finfo(action.dtype).resolution
            action = action.clamp(-1 + resolution, 1 - resolution)
        if squash.non_trivial:
            low, high = getattr(squash, f"{self.action_key}_low"), getattr(squash, f"{self.action_key}_high")
            action = low + (high - low) * (action + 1) / 2
        return [(self.preactivation_key, preactivation), (self.action_key, self._add_noise(action))]

    def _add_noise(self, action: torch.Tensor) -> torch.Tensor:
        """``AdditiveGaussianModule._add_noise(action)``: its draw, its sum and its spec's projection."""
        exploration = self.exploration
        spec = exploration.spec
        spec = spec[exploration.action_key] if spec is not None else None
        mean, std = exploration.mean, exploration.std
        if not (
            isinstance(spec, Bounded)
            and mean.dtype.is_floating_point
            and std.dtype.is_floating_point
            and action.dtype.is_floating_point
        ):
            return exploration._add_noise(action)
        noise = torch.normal(mean=mean.expand(action.shape), std=std.expand(action.shape))
        if noise.device != action.device:
            noise = noise.to(action.device)
        return spec._project(action + noise * exploration.sigma)


def lean_policy(
    policy: torch.nn.Module, compile: bool = False, critic: TensorDictModule | None = None
) -> torch.nn.Module:
    """A :class:`LeanActor` or :class:`LeanQPolicy` for a policy of exactly the shape it runs (``compile``: its
    sampling step through :func:`compiled`; ``critic``: a critic whose values a :class:`LeanActor` writes too),
    else the policy (which writes no values: ``critic`` is then unused).

    Covered: a ``ProbabilisticActor`` of one single-input ``TensorDictModule`` and a ``SafeProbabilisticModule``
    that samples once (with or without the log-probability), has no safety projection and no generator key; a
    ``TensorDictSequential`` of a ``QValueActor`` (one single-input network, a ``QValueModule``) and an
    ``EGreedyModule`` on its action, neither with an action mask; a ``TensorDictSequential`` of a deterministic
    actor (one single-input, single-output ``TensorDictModule`` and a one-key ``TanhModule`` reading it) and an
    ``AdditiveGaussianModule`` on its action.
    """
    if _is_epsilon_greedy_q_policy(policy):
        return LeanQPolicy(policy, compile)
    if _is_gaussian_deterministic_policy(policy):
        return LeanDeterministicPolicy(policy, compile)
    if type(policy) is not ProbabilisticActor or len(policy.module) != 2:
        return policy
    network, distribution = policy.module
    if not (
        type(network) is TensorDictModule
        and len(network.in_keys) == 1
        and type(distribution) is SafeProbabilisticModule
        and distribution.num_samples is None
        and not distribution.safe
        and distribution._generator is None
        and distribution._generator_key is None
        and set(distribution.in_keys) <= set(network.out_keys)
        and len(distribution.dist_sample_keys) == 1
    ):
        return policy
    return LeanActor(policy, compile, critic)


def _is_epsilon_greedy_q_policy(policy: torch.nn.Module) -> bool:
    if type(policy) is not TensorDictSequential or len(policy.module) != 2:
        return False
    q_actor, exploration = policy.module
    if type(q_actor) is not QValueActor or type(exploration) is not EGreedyModule or len(q_actor.module) != 2:
        return False
    network, q_values = q_actor.module
    return (
        type(network) is TensorDictModule
        and len(network.in_keys) == 1
        and type(q_values) is QValueModule
        and q_values.action_mask_key is None
        and exploration.action_mask_key is None
        and exploration.spec is not None
        and exploration.action_key == q_values.out_keys[0]
    )


def _is_gaussian_deterministic_policy(policy: torch.nn.Module) -> bool:
    if type(policy) is not TensorDictSequential or len(policy.module) != 2:
        return False
    actor, exploration = policy.module
    if type(actor) is not TensorDictSequential or len(actor.module) != 2:
        return False
    network, squash = actor.module
    return (
        type(network) is TensorDictModule
        and len(network.in_keys) == 1
        and len(network.out_keys) == 1
        and type(squash) is TanhModule
        and list(squash.in_keys) == list(network.out_keys)
        and len(squash.out_keys) == 1
        and isinstance(squash.out_keys[0], str)
        and type(exploration) is AdditiveGaussianModule
        and exploration.action_key == squash.out_keys[0]
        and exploration.spec is not None
    )
