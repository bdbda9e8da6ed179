"""Actor and critic builders that read the env's specs."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict.nn import AddStateIndependentNormalScale, NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Bounded, Categorical, TensorSpec
from torchrl.modules import MLP, ProbabilisticActor, TanhNormal, ValueOperator

from envs.errors import InputError
from envs.normalization import ObservationNormalizer

ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU, "elu": nn.ELU, "silu": nn.SiLU}


class OneHot(nn.Module):
    """Encodes integer observations of a ``Discrete(n)`` space as one-hot float vectors."""

    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(observation.long(), self.n).float()


def observation_encoder(observation_spec: TensorSpec, normalize: bool) -> tuple[nn.Module, int]:
    """Return the input layer for observations of ``observation_spec`` and the width it outputs.

    Box observations are flattened (and normalised by an :class:`ObservationNormalizer` when ``normalize``);
    Discrete observations are one-hot encoded.
    """
    if isinstance(observation_spec, Categorical):
        if normalize:
            raise InputError("Observation normalisation needs Box observations; drop --normalize-obs.")
        n = observation_spec.space.n
        return OneHot(n), n
    if not observation_spec.dtype.is_floating_point:
        raise InputError(
            f"Observations of dtype {observation_spec.dtype} are not supported by the MLP builders."
        )
    shape = observation_spec.shape[1:]
    layers: list[nn.Module] = [ObservationNormalizer(shape)] if normalize else []
    layers.append(nn.Flatten(-len(shape)) if len(shape) > 1 else nn.Identity())
    return nn.Sequential(*layers), int(torch.Size(shape).numel())


def input_encoder(actor: ProbabilisticActor) -> nn.Module:
    """Return the observation encoder of an actor from :func:`make_actor`, to share it with a critic."""
    return actor.module[0].module[0]


def find_normalizer(module: nn.Module) -> ObservationNormalizer | None:
    """Return the first :class:`ObservationNormalizer` inside ``module``, if any."""
    return next((m for m in module.modules() if isinstance(m, ObservationNormalizer)), None)


def make_mlp(in_features: int, out_features: int, hidden_sizes: Sequence[int], activation: str) -> MLP:
    """A TorchRL ``MLP`` with the named activation between layers and none on the output."""
    if activation not in ACTIVATIONS:
        raise InputError(f"Unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}.")
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
) -> ProbabilisticActor:
    """Build a stochastic MLP policy for the env's action spec.

    A ``Categorical`` action spec (Gymnasium ``Discrete``) gets a categorical distribution over logits; a
    ``Bounded`` spec (Gymnasium ``Box``) gets a tanh-normal distribution scaled to the action bounds, with a
    learned state-independent scale (PPO's usual choice) or a state-dependent one.

    Args:
        observation_spec: the spec of ``"observation"`` (batched: the leading dim is the number of envs).
        action_spec: the env's action spec (batched likewise).
        hidden_sizes: widths of the hidden layers.
        activation: ``"tanh"``, ``"relu"``, ``"elu"`` or ``"silu"``.
        normalize_obs: put an :class:`ObservationNormalizer` in front of the network.
        state_dependent_scale: let the network output the tanh-normal scale.
        encoder: an input module to share with a critic (from :func:`observation_encoder`); built when None.

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
        in_features = observation_encoder(observation_spec, False)[1]
    if isinstance(action_spec, Categorical):
        net = nn.Sequential(encoder, make_mlp(in_features, action_spec.space.n, hidden_sizes, activation))
        module = TensorDictModule(net, in_keys=["observation"], out_keys=["logits"])
        return ProbabilisticActor(
            module,
            in_keys=["logits"],
            spec=action_spec,
            distribution_class=torch.distributions.Categorical,
            return_log_prob=True,
        )
    if isinstance(action_spec, Bounded) and action_spec.dtype.is_floating_point:
        if action_spec.ndim != 2:
            raise InputError(
                f"Box actions must be one-dimensional per env, got shape {tuple(action_spec.shape[1:])}."
            )
        action_dim = action_spec.shape[-1]
        if state_dependent_scale:
            head = [make_mlp(in_features, 2 * action_dim, hidden_sizes, activation), NormalParamExtractor()]
        else:
            head = [
                make_mlp(in_features, action_dim, hidden_sizes, activation),
                AddStateIndependentNormalScale(action_dim),
            ]
        module = TensorDictModule(
            nn.Sequential(encoder, *head), in_keys=["observation"], out_keys=["loc", "scale"]
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
        "it builds policies for Discrete and bounded Box action spaces."
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
        encoder: an input module shared with the actor (so both see the same normalised observations).
    """
    default_encoder, in_features = observation_encoder(observation_spec, False)
    net = nn.Sequential(encoder or default_encoder, make_mlp(in_features, 1, hidden_sizes, activation))
    return ValueOperator(net, in_keys=["observation"])
