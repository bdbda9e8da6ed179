"""Shortcuts around per-call costs in TensorDict that do not change what any call returns.

:class:`LeanActor` (through :func:`lean_policy`) runs a stochastic policy built by :func:`agents.make_actor` in
one call for collection: about 0.1 ms of the 0.25 ms a MuJoCo policy step costs through ``ProbabilisticActor``.

``TensorDictModule`` passes every output tensor of its module through ``TensorDict.from_any``, which asks
``importlib.util.find_spec("pandas")`` (a search of ``sys.path`` on disk) before it gives a plain tensor back
unchanged. That lookup costs about 0.1 ms per output, several per policy call: a tenth of an off-policy recipe's
collection time on a MuJoCo task. :func:`install` makes ``from_any`` return tensors at once, the value it returns
for them anyway (a tensor is no dict, tuple, dataclass, array, DataFrame or HDF5 file); every other input takes
TensorDict's own path. Importing :mod:`agents` installs it.
"""

from __future__ import annotations

import functools

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.nn import TensorDictModule, TensorDictModuleBase
from tensordict.nn.probabilistic import InteractionType, interaction_type
from torchrl.modules import ProbabilisticActor, SafeProbabilisticModule
from torchrl.modules.distributions.utils import sample_and_log_prob


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


class LeanActor(TensorDictModuleBase):
    """A ``ProbabilisticActor`` of a network and a distribution, run in one call: what a collector calls.

    Under ``ExplorationType.RANDOM`` (collection) it reads the observation, runs the network, builds the
    distribution, draws the action and its log-probability with TorchRL's ``sample_and_log_prob`` and writes
    the same entries as the actor, from the same random draws; it skips the per-call dispatch, key checks and
    context managers of the actor's three TensorDict modules. Any other exploration type calls the actor
    itself. It holds the actor's parameters, not copies, so training the actor trains it.

    Args:
        actor: a ``ProbabilisticActor`` of a ``TensorDictModule`` (the network) and a ``SafeProbabilisticModule``
            that returns the log-probability (:func:`agents.make_actor` builds these); see :func:`lean_policy`.
    """

    def __init__(self, actor: ProbabilisticActor):
        super().__init__()
        network, distribution = actor.module[0], actor.module[1]
        self.actor = actor
        self.network = network.module
        self.in_keys, self.out_keys = list(actor.in_keys), list(actor.out_keys)
        self.network_in_key = network.in_keys[0]
        self.parameter_keys = list(network.out_keys)
        # which network output feeds which distribution argument
        self.arguments = [
            (key[-1] if isinstance(key, tuple) else key, self.parameter_keys.index(in_key))
            for key, in_key in zip(distribution.dist_keys, distribution.in_keys, strict=True)
        ]
        self.distribution_class = distribution.distribution_class
        self.distribution_kwargs = dict(distribution.distribution_kwargs)
        self.action_key, self.log_prob_key = distribution.dist_sample_keys[0], distribution.log_prob_key

    def parameters_and_distribution(
        self, observation: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.distributions.Distribution]:
        """The network's outputs (the distribution's parameters) for ``observation``, and the distribution."""
        outputs = self.network(observation)
        if isinstance(outputs, torch.Tensor):
            outputs = (outputs,)
        distribution = self.distribution_class(
            **{name: outputs[index] for name, index in self.arguments}, **self.distribution_kwargs
        )
        return outputs, distribution

    def distribution(self, observation: torch.Tensor) -> torch.distributions.Distribution:
        """The policy's action distribution for ``observation`` (what the actor's ``get_dist`` returns)."""
        return self.parameters_and_distribution(observation)[1]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if interaction_type() is not InteractionType.RANDOM:
            return self.actor(tensordict)
        outputs, distribution = self.parameters_and_distribution(tensordict.get(self.network_in_key))
        action, log_prob = sample_and_log_prob(distribution, reparameterize=distribution.has_rsample)
        for key, value in zip(self.parameter_keys, outputs, strict=True):
            tensordict.set(key, value)
        tensordict.set(self.action_key, action)
        tensordict.set(self.log_prob_key, log_prob)
        return tensordict


def lean_policy(policy: torch.nn.Module) -> torch.nn.Module:
    """A :class:`LeanActor` for a policy of exactly the shape it runs (a ``ProbabilisticActor`` of one
    single-input ``TensorDictModule`` and a ``SafeProbabilisticModule`` that samples once, returns the
    log-probability, has no safety projection and no generator key); any other policy is returned as it is."""
    if type(policy) is not ProbabilisticActor or len(policy.module) != 2:
        return policy
    network, distribution = policy.module
    if not (
        type(network) is TensorDictModule
        and len(network.in_keys) == 1
        and type(distribution) is SafeProbabilisticModule
        and distribution.return_log_prob
        and distribution.num_samples is None
        and not distribution.safe
        and distribution._generator is None
        and distribution._generator_key is None
        and set(distribution.in_keys) <= set(network.out_keys)
        and len(distribution.dist_sample_keys) == 1
    ):
        return policy
    return LeanActor(policy)
