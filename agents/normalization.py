"""Observation normalisation whose statistics belong to the agent."""

from __future__ import annotations

import torch
from torch import nn
from torchrl.envs.transforms import RunningMeanStd


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


class RewardNormalizer(nn.Module):
    """Scales rewards by the running standard deviation of the discounted return, as Stable-Baselines3's
    ``VecNormalize(norm_reward=True)`` does: each env's return ``R <- gamma R + r`` (reset at episode ends) feeds
    running statistics, and rewards are divided by their standard deviation (not centred, which would change the
    task) and clipped to ``[-clip, clip]``. The critic then fits values of order one whatever the reward scale.

    Only the training batch is scaled: the logged episode returns and every evaluation keep the env's rewards.
    The statistics and the running returns are buffers, saved in resume checkpoints with the rest of the
    training state.

    Args:
        num_envs: envs stepped together (rows of the collected batch).
        gamma: discount of the running return (the algorithm's).
        clip: bound on the absolute scaled reward.
        epsilon: added to the variance before the square root.

    Examples:
        >>> normalizer = RewardNormalizer(num_envs=2, gamma=0.99)
        >>> reward = torch.full((2, 100, 1), 50.0)
        >>> scaled = normalizer(reward, torch.zeros(2, 100, 1, dtype=torch.bool))
        >>> bool(scaled.abs().max() < 10)
        True
    """

    def __init__(self, num_envs: int, gamma: float, clip: float = 10.0, epsilon: float = 1e-8):
        super().__init__()
        self.gamma = gamma
        self.clip = clip
        self.statistics = ObservationNormalizer((), clip=clip, epsilon=epsilon)
        self.register_buffer("returns", torch.zeros(num_envs, dtype=torch.float64))

    @torch.no_grad()
    def forward(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """The scaled rewards of a batch ``[envs, time, 1]`` (``done``: the episode ended at that step); updates
        the statistics with the batch's returns first."""
        rows = self.returns.shape[0]
        if reward.dim() < 2 or reward.shape[0] != rows:
            raise ValueError(
                f"RewardNormalizer expects rewards shaped [envs={rows}, time, ...], got {tuple(reward.shape)}."
            )
        steps = reward.reshape(rows, reward.shape[1], -1)[..., 0].to(torch.float64)
        ended = done.reshape(rows, done.shape[1], -1)[..., 0]
        returns = torch.empty_like(steps)
        running = self.returns.to(steps.device)
        for t in range(steps.shape[1]):
            running = running * self.gamma + steps[:, t]
            returns[:, t] = running
            running = running.masked_fill(ended[:, t], 0.0)
        self.returns.copy_(running)
        self.statistics.update(returns.reshape(-1))
        std = torch.sqrt(self.statistics.var + self.statistics.epsilon)
        return (reward / std.to(reward.dtype)).clamp(-self.clip, self.clip)

    def normalize(self, batch) -> None:
        """Scale a collected batch's ``("next", "reward")`` in place."""
        batch.set(("next", "reward"), self(batch.get(("next", "reward")), batch.get(("next", "done"))))


def invalid_statistics(module: nn.Module) -> str | None:
    """The name of the first running-statistics buffer in ``module`` (an :class:`ObservationNormalizer`'s or a
    TorchRL ``RunningMeanStd``'s variance, count or mean) that no run could have produced: NaN, Inf or, for a
    variance or a count, a negative value; None when all are sound. For statistics read from a file, whose
    negative variance would turn every normalised observation into NaN."""
    for name, child in module.named_modules():
        if not isinstance(child, (ObservationNormalizer, RunningMeanStd)):
            continue
        for buffer in ("mean", "var", "count"):
            value = getattr(child, buffer)
            if not torch.isfinite(value).all() or (buffer != "mean" and (value < 0).any()):
                return f"{name}.{buffer}" if name else buffer
    return None
