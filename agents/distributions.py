"""Policy distributions for factorised discrete actions: Gymnasium's ``MultiDiscrete`` (one categorical per
component) and ``MultiBinary`` (one Bernoulli per component), each from one vector of logits.

Both follow ``torch.distributions`` (``sample``, ``log_prob``, ``entropy``, ``mode``) and TorchRL's
``deterministic_sample``, so :class:`torchrl.modules.ProbabilisticActor` and the policy-gradient losses use them
like any other: the log-probability and entropy of an action are the sums over its components.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import distributions as D


class FactorisedCategorical(D.Distribution):
    """Independent categorical distributions over the components of a ``MultiDiscrete`` action.

    Args:
        logits: ``[..., sum(nvec)]``: each component's logits, one after the other.
        nvec: the number of values of each component.

    Examples:
        >>> dist = FactorisedCategorical(torch.zeros(2, 5), nvec=[2, 3])
        >>> dist.sample().shape, dist.log_prob(torch.tensor([[0, 2], [1, 0]])).shape
        (torch.Size([2, 2]), torch.Size([2]))
    """

    arg_constraints: dict = {}  # noqa: RUF012 - torch.distributions' class attribute

    def __init__(self, logits: torch.Tensor, nvec: Sequence[int]):
        self.nvec = [int(n) for n in nvec]
        if logits.shape[-1] != sum(self.nvec):
            raise ValueError(
                f"FactorisedCategorical: {logits.shape[-1]} logits for components of sizes {self.nvec}."
            )
        self.logits = logits
        self.components = [D.Categorical(logits=part) for part in logits.split(self.nvec, dim=-1)]
        super().__init__(batch_shape=logits.shape[:-1], event_shape=(len(self.nvec),), validate_args=False)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008 - torch's signature
        return torch.stack([component.sample(sample_shape) for component in self.components], dim=-1)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        value = value.long()
        return sum(
            component.log_prob(part)
            for component, part in zip(self.components, value.unbind(-1), strict=True)
        )

    def entropy(self) -> torch.Tensor:
        return sum(component.entropy() for component in self.components)

    @property
    def mode(self) -> torch.Tensor:
        return torch.stack([component.logits.argmax(-1) for component in self.components], dim=-1)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.mode


class FactorisedBernoulli(D.Distribution):
    """Independent Bernoulli distributions over the components of a ``MultiBinary`` action.

    Args:
        logits: ``[..., n]``: the log-odds of each component being 1.

    Examples:
        >>> dist = FactorisedBernoulli(torch.zeros(2, 3))
        >>> dist.sample().shape, dist.log_prob(torch.ones(2, 3)).shape
        (torch.Size([2, 3]), torch.Size([2]))
    """

    arg_constraints: dict = {}  # noqa: RUF012 - torch.distributions' class attribute

    def __init__(self, logits: torch.Tensor):
        self.logits = logits
        self.base = D.Bernoulli(logits=logits, validate_args=False)
        super().__init__(batch_shape=logits.shape[:-1], event_shape=logits.shape[-1:], validate_args=False)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008 - torch's signature
        return self.base.sample(sample_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.base.log_prob(value.to(self.logits.dtype)).sum(-1)

    def entropy(self) -> torch.Tensor:
        return self.base.entropy().sum(-1)

    @property
    def mode(self) -> torch.Tensor:
        return (self.logits > 0).to(self.logits.dtype)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.mode


__all__ = ["FactorisedBernoulli", "FactorisedCategorical"]
