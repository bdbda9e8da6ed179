"""Observation normalisation whose statistics belong to the agent."""

from __future__ import annotations

import torch
from torch import nn


class ObservationNormalizer(nn.Module):
    """Normalises observations with running mean and variance kept as module buffers.

    The statistics live in the networks' ``state_dict``, so they are saved and loaded with the agent and moved
    with it between devices. They change only when the training loop calls :meth:`update`; evaluation and
    ``predict`` never update them. Means and variances are combined with Chan et al.'s parallel algorithm in
    float64, and normalised values are clipped to ``[-clip, clip]`` (Stable-Baselines3's ``VecNormalize``). Before the
    first update the statistics are mean 0 and variance 1: the identity, up to clipping.

    Args:
        shape: shape of one observation.
        clip: bound on the absolute normalised value.
        epsilon: added to the variance before the square root.

    Examples:
        >>> normalizer = ObservationNormalizer((3,))
        >>> normalizer.update(torch.randn(100, 3) * 5 + 2)
        >>> normalizer(torch.full((1, 3), 2.0)).abs().max() < 0.5
        tensor(True)
    """

    def __init__(self, shape: tuple[int, ...] | torch.Size, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.clip = clip
        self.epsilon = epsilon
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))

    @torch.no_grad()
    def update(self, observations: torch.Tensor) -> None:
        """Fold a batch of observations (any leading batch dims) into the running statistics."""
        batch = observations.detach().reshape(-1, *self.mean.shape).to(torch.float64)
        batch_count = batch.shape[0]
        if batch_count == 0:
            return
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        total = self.count + batch_count
        delta = batch_mean - self.mean
        self.mean += delta * batch_count / total
        self.var.copy_(
            (self.var * self.count + batch_var * batch_count + delta**2 * self.count * batch_count / total)
            / total
        )
        self.count.copy_(total)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        mean = self.mean.to(observation.dtype)
        std = torch.sqrt(self.var + self.epsilon).to(observation.dtype)
        return ((observation - mean) / std).clamp(-self.clip, self.clip)
