"""Networks of the off-policy actor-critic recipes (SAC, DDPG, TD3): Q critics and deterministic actors.

* :func:`make_qvalue_critic` builds the critic a TorchRL ``SACLoss``, ``DDPGLoss`` or ``TD3Loss`` copies into its
  (twin) Q networks: ``Q(s, a)`` for Box actions, or one value per action for Discrete actions (discrete SAC).
* :func:`make_deterministic_actor` builds the DDPG/TD3 policy: an MLP squashed by tanh into the Box bounds
  (TorchRL's ``TanhModule``), followed by exploration noise that acts only under random exploration, so that
  evaluation and ``Agent.predict(obs, deterministic=True)`` use the noiseless action.

The SAC actor is :func:`agents.networks.make_actor` with a state-dependent scale (a tanh-normal policy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from tensordict.nn import TensorDictModule, TensorDictSequential
from torch import nn
from torchrl.data import Bounded, Categorical, TensorSpec, Unbounded
from torchrl.envs import EnvBase, InitTracker, TransformedEnv
from torchrl.modules import AdditiveGaussianModule, OrnsteinUhlenbeckProcessModule, TanhModule, ValueOperator

from agents.networks import SharedNormalizer, make_mlp, observation_encoder
from agents.normalization import ObservationNormalizer
from errors import InputError

NoiseType = Literal["gaussian", "ou"]


def unbounded_box_message(algorithm: str) -> str:
    """The error for a Box action space with an infinite bound given to a policy that squashes into the bounds."""
    return (
        f"The {algorithm} policy squashes its actions into the Box's bounds, and this Box has an infinite bound: "
        "declare finite bounds in the env's action space, or use recipes.ppo, recipes.a2c, recipes.reinforce "
        "or recipes.vpg, whose Gaussian policy takes unbounded actions."
    )


def check_box_actions(action_spec: TensorSpec, algorithm: str) -> Bounded:
    """Return ``action_spec`` if it is a bounded one-dimensional Box; otherwise raise :class:`InputError`."""
    if isinstance(action_spec, Bounded) and action_spec.dtype.is_floating_point and action_spec.ndim == 2:
        if (
            not torch.isfinite(action_spec.space.low).all()
            or not torch.isfinite(action_spec.space.high).all()
        ):
            raise InputError(f"{algorithm} needs finite Box bounds to squash its actions into.")
        return action_spec
    if isinstance(action_spec, Unbounded) and action_spec.dtype.is_floating_point:
        raise InputError(unbounded_box_message(algorithm))
    if isinstance(action_spec, Categorical):
        raise InputError(
            f"{algorithm} needs a Box (continuous) action space; for Discrete actions use recipes.sac --discrete, "
            "recipes.dqn or recipes.ppo, for MultiDiscrete or MultiBinary actions recipes.ppo or recipes.a2c."
        )
    raise InputError(
        f"{algorithm} needs a one-dimensional Box action space, got a {type(action_spec).__name__} spec of shape "
        f"{tuple(action_spec.shape[1:])}."
    )


def action_half_range(action_spec: Bounded) -> torch.Tensor:
    """Half the width of each action dim of the Box (of one env, for a batched spec): noise scales are given
    relative to it, dim by dim, as in Stable-Baselines3, whose policies act in ``[-1, 1]``."""
    high, low = action_spec.space.high, action_spec.space.low
    return ((high - low) / 2).reshape(-1, high.shape[-1])[0]


def noise_scale(relative: float, action_spec: Bounded) -> float | torch.Tensor:
    """``relative`` times each action dim's half-width: a number when every dim has the same width (the form of
    every agent file of such a Box), else one scale per dim."""
    scale = relative * action_half_range(action_spec)
    return scale[0].item() if bool((scale == scale[0]).all()) else scale


def default_target_entropy(action_spec: Bounded) -> float:
    """SAC's target entropy for a Box: ``-dim(A)`` on actions rescaled to ``[-1, 1]`` (Haarnoja et al. 2018, "Soft
    Actor-Critic Algorithms and Applications", section 5; their code and Stable-Baselines3 act in ``[-1, 1]``),
    given in the units of the Box, in which the squashed policy's log-probability is computed (its affine map
    into ``[low, high]`` included): ``-dim(A) + sum log((high - low) / 2)``. For a ``[-1, 1]`` Box, ``-dim(A)``;
    for Humanoid's ``[-0.4, 0.4]^17``, about -32.6, the same exploration as Stable-Baselines3's -17 there."""
    return -float(action_spec.shape[-1]) + float(action_half_range(action_spec).log().sum())


class StateActionNet(nn.Module):
    """``Q(s, a)``: encode the observation, append the action, run an MLP to one value."""

    def __init__(self, encoder: nn.Module, mlp: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.mlp = mlp

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.encoder(observation), action], dim=-1))


def make_qvalue_critic(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (256, 256),
    activation: str = "relu",
    normalizer: ObservationNormalizer | None = None,
) -> ValueOperator:
    """Build a Q critic for the action spec.

    Box actions get ``Q(s, a)`` reading ``"observation"`` and ``"action"`` and writing ``"state_action_value"``
    (what ``SACLoss``, ``DDPGLoss`` and ``TD3Loss`` expect); Discrete actions get one value per action, written to
    ``"action_value"`` (``DiscreteSACLoss``). Observations go through
    :func:`agents.networks.observation_encoder` (Discrete observations one-hot, images through the Nature CNN).

    Args:
        observation_spec: the spec of ``"observation"`` (batched: the leading dim is the number of envs).
        action_spec: the env's action spec (batched likewise).
        hidden_sizes: widths of the hidden layers.
        activation: ``"tanh"``, ``"relu"``, ``"elu"`` or ``"silu"``.
        normalizer: the actor's observation normaliser, applied first (through :class:`SharedNormalizer`, so
            that the loss's copies of the critic follow its statistics).

    Examples:
        >>> from envs import make_env
        >>> env = make_env("Pendulum-v1", num_envs=2)
        >>> critic = make_qvalue_critic(env.observation_spec["observation"], env.action_spec)
        >>> critic(env.rand_step())["state_action_value"].shape
        torch.Size([2, 1])
    """
    encoder, in_features = observation_encoder(observation_spec, False)
    if normalizer is not None:
        encoder = nn.Sequential(SharedNormalizer(normalizer), encoder)
    if type(action_spec) is Categorical:  # Discrete actions: a value per action (discrete SAC)
        net = nn.Sequential(encoder, make_mlp(in_features, action_spec.space.n, hidden_sizes, activation))
        return ValueOperator(net, in_keys=["observation"], out_keys=["action_value"])
    action_dim = action_spec.shape[-1]
    mlp = make_mlp(in_features + action_dim, 1, hidden_sizes, activation)
    return ValueOperator(StateActionNet(encoder, mlp), in_keys=["observation", "action"])


def make_deterministic_actor(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (256, 256),
    activation: str = "relu",
    noise: NoiseType = "gaussian",
    noise_sigma: float = 0.1,
    ou_theta: float = 0.15,
    normalize_obs: bool = False,
) -> TensorDictSequential:
    """Build a deterministic policy ``a = mu(s)`` with exploration noise (DDPG, TD3).

    The MLP's output is squashed by ``tanh`` and scaled into the Box bounds (TorchRL's ``TanhModule``); then
    exploration noise is added under ``ExplorationType.RANDOM`` only (TorchRL's ``AdditiveGaussianModule`` or
    ``OrnsteinUhlenbeckProcessModule``) and the action is projected back into the bounds. ``noise_sigma`` is relative
    to each action dim's half-width (see :func:`noise_scale`): 0.1 on Pendulum's ``[-2, 2]`` is a standard deviation
    of 0.2.

    Ornstein-Uhlenbeck noise is temporally correlated per env: it is reset at episode starts, which it reads from
    the ``"is_init"`` flag of an env wrapped by :func:`make_exploration_env`. Without that flag (for example in
    ``Agent.predict(obs, deterministic=False)``) it raises; Gaussian noise needs nothing.

    Args:
        observation_spec: the spec of ``"observation"`` (batched).
        action_spec: a bounded Box action spec (batched).
        hidden_sizes: widths of the hidden layers.
        activation: activation name.
        noise: ``"gaussian"`` (independent per step) or ``"ou"`` (Ornstein-Uhlenbeck).
        noise_sigma: the noise standard deviation, relative to the Box half-width.
        ou_theta: the Ornstein-Uhlenbeck mean-reversion rate.
        normalize_obs: put an :class:`ObservationNormalizer` in front of the network (its statistics are saved
            with the policy; pass it to :func:`make_qvalue_critic` for the critic).

    Returns:
        ``TensorDictSequential(actor, noise)``: ``policy[0]`` is the deterministic actor the loss trains.
    """
    action_spec = check_box_actions(action_spec, "A deterministic actor")
    if noise not in ("gaussian", "ou"):
        raise InputError(f"Unknown exploration noise {noise!r}; choose 'gaussian' or 'ou'.")
    if not 0 <= noise_sigma < math.inf:
        raise InputError(f"--noise-sigma must be in [0, inf), got {noise_sigma}.")
    encoder, in_features = observation_encoder(observation_spec, normalize_obs)
    single_spec = action_spec[0]
    network = TensorDictModule(
        nn.Sequential(encoder, make_mlp(in_features, action_spec.shape[-1], hidden_sizes, activation)),
        in_keys=["observation"],
        out_keys=["action_preactivation"],
    )
    squash = TanhModule(in_keys=["action_preactivation"], out_keys=["action"], spec=single_spec)
    actor = TensorDictSequential(network, squash)
    std = noise_scale(noise_sigma, action_spec)
    if noise == "gaussian":
        std = std if isinstance(std, float) else std.tolist()  # the module makes a buffer of it
        exploration = AdditiveGaussianModule(single_spec, sigma_init=1.0, sigma_end=1.0, std=std)
    else:
        exploration = OrnsteinUhlenbeckProcessModule(
            single_spec, eps_init=1.0, eps_end=1.0, sigma=std, theta=ou_theta, safe=True
        )
    return TensorDictSequential(actor, exploration)


def make_exploration_env(env: EnvBase, noise: NoiseType) -> EnvBase:
    """Add the ``"is_init"`` flag that Ornstein-Uhlenbeck noise resets on; Gaussian noise needs no env state."""
    return TransformedEnv(env, InitTracker()) if noise == "ou" else env
