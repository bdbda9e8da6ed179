"""Random Network Distillation (Burda et al. 2018, "Exploration by Random Network Distillation", arXiv:1810.12894).

An exploration bonus for any on-policy recipe: a fixed, randomly initialised *target* network embeds each
observation, a *predictor* network is trained to reproduce that embedding, and the prediction error is the
intrinsic reward. Observations seen often are predicted well and stop paying; new ones pay. The loss is TorchRL's
:class:`~torchrl.objectives.RNDLoss`; :class:`RandomNetworkDistillation` adds what the paper does around it:
observation normalisation, and intrinsic rewards written into a collected batch and normalised by a running
standard deviation of the intrinsic returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.data import Categorical, TensorSpec
from torchrl.envs.transforms import RunningMeanStd
from torchrl.objectives import RNDLoss

from agents.networks import (
    NatureCNN,
    OneHot,
    as_vector,
    image_layout,
    make_mlp,
    require_observation_values,
)
from errors import InputError, NonFiniteError

INTRINSIC_REWARD_KEY = "intrinsic_reward"
OBSERVATION_CLIP = 5.0  # Burda et al. 2018, section 2.4: normalised observations are clipped to [-5, 5]


def make_rnd_networks(
    observation_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (64, 64),
    embedding_dim: int = 64,
    activation: str = "relu",
) -> tuple[nn.Module, nn.Module]:
    """Build the target and predictor networks of RND for Box observations (integer ones, MultiDiscrete and
    MultiBinary read as floats), Discrete ones (one-hot encoded first: a new state is a new input unit, and the
    bonus fades as a count-based one would) and ``uint8`` images in any layout :func:`agents.networks.image_layout`
    reads (stacked Atari frames, channels-last RGB, ...).

    As in the paper, the predictor is deeper than the target (one more hidden layer), so that it can fit the
    target's features on the states it is trained on without being a copy of it. Images go first through a
    Nature CNN of each network's own (the paper's three convolutions, here with a 512-unit ReLU layer after
    them; ReLU where the paper has leaky ReLU), reading the normalised, clipped pixels
    (:class:`RandomNetworkDistillation` keeps their statistics per pixel, as the paper does), then through the
    MLP of ``hidden_sizes``. The paper's networks read the newest frame of a stack only; these read every frame.

    Args:
        observation_spec: the spec of ``"observation"`` (batched: the leading dim is the number of envs); Box
            observations of any shape and real dtype, flattened (the loss normalises them to floats first), or
            Discrete ones (:func:`normalizes_observations` is False for them: the loss hands over the index).
        hidden_sizes: hidden layer widths of the target; the predictor gets one more layer of the last width.
        embedding_dim: width of the embedding the predictor learns to reproduce.
        activation: ``"tanh"``, ``"relu"``, ``"elu"`` or ``"silu"``.

    Returns:
        ``(target_network, predictor_network)``, plain modules mapping observations to embeddings.

    Raises:
        InputError: for empty observations, images smaller than the CNN's 36x36 pixels and observations that are
            not real numbers.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("rlkit/DeepSea-v0", num_envs=2)
        >>> target, predictor = make_rnd_networks(env.observation_spec["observation"], embedding_dim=32)
        >>> predictor(env.reset()["observation"]).shape
        torch.Size([2, 32])
    """
    require_observation_values(observation_spec, "RND")
    predictor_sizes = [*hidden_sizes, hidden_sizes[-1]] if hidden_sizes else [embedding_dim]
    if not normalizes_observations(observation_spec):  # Discrete: each network reads the one-hot vector
        n = observation_spec.space.n
        encoders, in_features = (OneHot(n), OneHot(n)), n
    elif (layout := image_layout(observation_spec)) is not None:
        shape = observation_spec.shape[1:]  # normalised pixels, through a Nature CNN of each network's own
        encoders = tuple(NatureCNN(shape, layout, divisor=1.0) for _ in range(2))
        in_features = NatureCNN.out_features
    else:
        if observation_spec.dtype.is_complex or observation_spec.dtype == torch.bool:
            raise InputError(f"RND reads observations of real numbers, got {observation_spec.dtype}.")
        shape = observation_spec.shape[1:]
        encoders, in_features = (as_vector(shape), as_vector(shape)), int(torch.Size(shape).numel())
    target = nn.Sequential(encoders[0], make_mlp(in_features, embedding_dim, hidden_sizes, activation))
    predictor = nn.Sequential(encoders[1], make_mlp(in_features, embedding_dim, predictor_sizes, activation))
    return target, predictor


def normalizes_observations(observation_spec: TensorSpec) -> bool:
    """Whether RND normalises these observations with running statistics: all but Discrete ones, whose index is
    one-hot encoded by the networks instead (a normalised index would not be one)."""
    return type(observation_spec) is not Categorical  # not its subclasses MultiCategorical and Binary


class RandomNetworkDistillation(RNDLoss):
    """RND as a TorchRL loss module that also writes intrinsic rewards into collected batches.

    :meth:`forward` is TorchRL's :class:`~torchrl.objectives.RNDLoss`: the mean squared error between predictor
    and target embeddings of normalised next observations, as ``"loss_predictor"``; only the predictor receives
    gradients. :meth:`add_intrinsic_reward` computes the same error without gradients for every step of a batch
    and writes it, divided by a running standard deviation of the discounted intrinsic returns (the paper's
    reward normalisation), as the intrinsic reward.

    Observations are normalised with running mean and variance (updated by :meth:`add_intrinsic_reward`, before
    the batch's rewards are computed) and clipped to ``[-5, 5]``, unless ``normalize_observations`` is False
    (Discrete observations, which the networks one-hot encode). The paper first runs a random agent for a while
    to initialise these statistics: fold its observations into ``obs_rms`` (``obs_rms.update``) before the first
    batch, as ``recipes.rnd_ppo --rnd-obs-warmup`` does; otherwise the first collected batch plays that role.

    Keys (change them with ``set_keys``):
        observation: read, ``("next", "observation")``.
        intrinsic_reward: written by :meth:`add_intrinsic_reward`, ``("next", "intrinsic_reward")``, shaped like
            the env's reward (a trailing dim of 1).

    Args:
        target_network: the fixed random network; its parameters are frozen (``requires_grad=False``) here and
            never change.
        predictor_network: the trained network, with the target's output width.
        observation_shape: shape of one observation, for the running statistics.
        gamma: discount of the intrinsic returns whose standard deviation normalises the rewards (accumulated
            per env across episode ends, as the paper's ``RewardForwardFilter`` does).
        normalize_reward: divide intrinsic rewards by that standard deviation.
        update_fraction: fraction of each minibatch that trains the predictor, drawn at random; below 1 it slows
            the predictor down, so that novelty fades more slowly (the paper: 0.25).
        normalize_observations: keep running observation statistics and normalise by them (False: the networks
            read the observations as they are; :func:`normalizes_observations` says which).

    Examples:
        >>> from envs import make_env
        >>> env = make_env("rlkit/DeepSea-v0", num_envs=4, seed=0)
        >>> spec = env.observation_spec["observation"]
        >>> rnd = RandomNetworkDistillation(*make_rnd_networks(spec), observation_shape=spec.shape[1:])
        >>> batch = rnd.add_intrinsic_reward(env.rollout(10, break_when_any_done=False))
        >>> batch["next", "intrinsic_reward"].shape
        torch.Size([4, 10, 1])
        >>> rnd(batch)["loss_predictor"].backward()
    """

    @dataclass
    class _AcceptedKeys(RNDLoss._AcceptedKeys):
        """Configurable keys: ``observation`` (read) and ``intrinsic_reward`` (written)."""

        intrinsic_reward: NestedKey = ("next", INTRINSIC_REWARD_KEY)

    default_keys = _AcceptedKeys
    tensor_keys: _AcceptedKeys

    def __init__(
        self,
        target_network: nn.Module,
        predictor_network: nn.Module,
        observation_shape: Sequence[int] | torch.Size,
        gamma: float = 0.99,
        normalize_reward: bool = True,
        update_fraction: float = 0.25,
        normalize_observations: bool = True,
    ):
        if not 0 < gamma <= 1:
            raise InputError(f"RND gamma must be in (0, 1], got {gamma}.")
        if not 0 < update_fraction <= 1:
            raise InputError(f"RND update fraction must be in (0, 1], got {update_fraction}.")
        super().__init__(
            predictor_network,
            target_network,
            obs_rms=RunningMeanStd(tuple(observation_shape)) if normalize_observations else None,
            obs_clip=OBSERVATION_CLIP,
            update_fraction=update_fraction,
        )
        self.gamma = gamma
        self.normalize_reward = normalize_reward
        self.return_rms = RunningMeanStd(())
        # discounted intrinsic return of each env so far, carried from batch to batch (never reset: non-episodic)
        self.register_buffer("running_return", torch.zeros(0))

    @torch.no_grad()
    def prediction_error(self, observation: torch.Tensor) -> torch.Tensor:
        """The unnormalised intrinsic reward of each observation, with a trailing dim of 1 (no statistics change).

        Args:
            observation: observations with any leading batch dims.

        Returns:
            The mean squared difference of predictor and target embeddings, shape ``(*batch, 1)``.
        """
        if self.obs_rms is None:
            normalized = observation.float()  # as RNDLoss.forward reads it
        else:
            normalized = self.obs_rms.normalize(observation).clamp(-self.obs_clip, self.obs_clip)
        error = self.predictor_network(normalized) - self.target_network(normalized)
        return error.pow(2).mean(-1, keepdim=True)

    @torch.no_grad()
    def add_intrinsic_reward(
        self, tensordict: TensorDictBase, update_statistics: bool = True
    ) -> TensorDictBase:
        """Write the intrinsic reward of every step of a collected batch.

        Args:
            tensordict: a batch of shape ``[num_envs, time]`` (as collectors return for batched envs) or
                ``[time]``; the last batch dim must be time, so that the intrinsic returns can be accumulated.
            update_statistics: fold the batch's observations into the observation statistics first, and its
                intrinsic returns into the reward-normalisation statistics. False evaluates with the current ones.

        Returns:
            ``tensordict``, with the intrinsic reward under the ``intrinsic_reward`` key.
        """
        if tensordict.batch_dims not in (1, 2):
            raise InputError(
                f"add_intrinsic_reward takes a batch of shape [num_envs, time] or [time], got {tensordict.batch_size}."
            )
        observation = tensordict.get(self.tensor_keys.observation)
        if update_statistics and self.obs_rms is not None:
            self.obs_rms.update(observation)
        reward = self.prediction_error(observation)
        if not torch.isfinite(reward).all():  # before it reaches the advantages, the update and the weights
            raise NonFiniteError(
                "NaN or Inf in RND's intrinsic reward: the observations are not finite, or so large (about 1e19 "
                "or more) that their running variance overflows float32; scale them down (a gymnasium."
                "wrappers.TransformObservation)."
            )
        if self.normalize_reward:
            if update_statistics:
                self._update_return_statistics(reward.reshape(-1, tensordict.shape[-1]))
            reward = reward / self.return_rms.var.clamp_min(1e-8).sqrt()
        tensordict.set(self.tensor_keys.intrinsic_reward, reward)
        return tensordict

    def _update_return_statistics(self, rewards_ET: torch.Tensor) -> None:
        """Accumulate each env's discounted intrinsic return over the batch's steps (the paper's
        ``RewardForwardFilter``) and fold every step's return into the running statistics."""
        if self.running_return.shape != rewards_ET.shape[:1]:
            self.running_return = torch.zeros_like(rewards_ET[:, 0])
        returns_ET = torch.empty_like(rewards_ET)
        running = self.running_return
        for step in range(rewards_ET.shape[1]):
            running = self.gamma * running + rewards_ET[:, step]
            returns_ET[:, step] = running
        self.running_return = running
        self.return_rms.update(returns_ET)


__all__ = [
    "INTRINSIC_REWARD_KEY",
    "RandomNetworkDistillation",
    "make_rnd_networks",
    "normalizes_observations",
]
