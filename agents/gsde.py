"""Generalised State-Dependent Exploration (gSDE; Raffin, Kober and Stulp 2021, arXiv:2005.05719) for Box actions.

gSDE replaces the independent Gaussian noise of a policy by noise that is a function of the state: with
``z`` the policy's last hidden features (the "latent"), the action is ``a = mu(s) + (sigma * eps) @ z`` where the
noise matrix ``eps`` (``action_dim x latent_dim``, standard normal) is held fixed for a while, so that consecutive
actions are correlated and exploration is smooth. Given the state, ``a`` is Gaussian with mean ``mu`` and standard
deviation ``sqrt(sum_j (sigma_ij z_j)^2)``: the log-probability of an action is that of an independent Normal.

The pieces, on TorchRL's gSDE building blocks:

* :func:`make_gsde_actor` builds a ``ProbabilisticActor`` whose head runs TorchRL's ``gSDEModule`` and whose
  distribution is a :class:`StateDependentNormal`: an independent ``Normal(loc, scale)`` whose ``sample()`` returns
  the gSDE action computed by the module (a plain ``Normal`` or ``TanhNormal`` would draw a *new, independent*
  action under random exploration and throw the correlated one away). ``log_prob`` and ``entropy`` are the
  Normal's, which is what ``ClipPPOLoss``/``A2CLoss`` need; the deterministic action is ``loc``.
* :class:`GSDENoise` keeps the noise matrices ``"_eps_gSDE"`` (``[num_envs, action_dim, latent_dim]``) as env
  state, as TorchRL's ``gSDENoise`` primer does, and decides when they are resampled (see its docstring).
* :class:`ClipActionToBounds` clips the action sent to the env to the Box bounds while the collected data keeps
  the unclipped action, the one whose log-probability was recorded.
* :func:`make_gsde_env` puts both transforms on a training env.

Wiring an on-policy recipe (PPO, A2C) is two lines: build the agent with ``policy_builder="gsde_actor"`` and wrap
the training env with :func:`make_gsde_env`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import distributions as D
from torch import nn
from torchrl.data import Bounded, TensorSpec, Unbounded
from torchrl.envs import Compose, EnvBase, Transform, TransformedEnv
from torchrl.envs.transforms import gSDENoise
from torchrl.envs.utils import ExplorationType, exploration_type, set_exploration_type
from torchrl.modules import MLP, ProbabilisticActor
from torchrl.modules.models.exploration import gSDEModule

from agents.networks import (
    ACTIVATIONS,
    check_mlp_memory,
    check_mlp_options,
    encoder_width,
    is_float_box,
    observation_encoder,
)
from envs.specs import space_name
from envs.vector import GymnasiumVectorEnv
from errors import InputError

# TorchRL's key (gSDEModule, gSDENoise); collectors leave "_" keys out of the batches they return
GSDE_NOISE_KEY = "_eps_gSDE"
# the actor's last hidden features: the "state" gSDE multiplies the noise matrix with
GSDE_LATENT_KEY = "gsde_latent"
# mu + (sigma * eps) @ latent, which the distribution then hands out as "action"
GSDE_ACTION_KEY = "gsde_action"


class StateDependentNormal(D.Independent):
    """An independent Normal over the action dims whose samples are given: the gSDE action.

    Under gSDE the action ``mu + (sigma * eps) @ z`` is computed by the network with the env's current noise
    matrix ``eps``; given the state it is distributed as ``Normal(loc=mu, scale)`` with
    ``scale_i = sqrt(sum_j (sigma_ij z_j)^2)``. This distribution therefore scores actions (``log_prob``,
    ``entropy``) as that Normal, but ``sample()``/``rsample()`` return the precomputed gSDE action instead of drawing
    an independent one, so a ``ProbabilisticActor`` under ``ExplorationType.RANDOM`` emits the correlated action.
    ``mode``, ``mean`` and ``deterministic_sample`` are ``loc``.

    Args:
        loc: the mean action ``mu``, shape ``[..., action_dim]``.
        scale: the standard deviation of the gSDE action, same shape.
        action: the gSDE action, same shape.

    Examples:
        >>> loc, scale = torch.zeros(2, 1), torch.ones(2, 1)
        >>> dist = StateDependentNormal(loc, scale, action=torch.full((2, 1), 0.5))
        >>> dist.sample()
        tensor([[0.5000],
                [0.5000]])
        >>> dist.log_prob(torch.zeros(2, 1))
        tensor([-0.9189, -0.9189])
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, action: torch.Tensor, validate_args=None):
        super().__init__(D.Normal(loc, scale, validate_args=validate_args), 1, validate_args=validate_args)
        self.action = action

    def rsample(self, sample_shape: torch.Size | Sequence[int] = ()) -> torch.Tensor:
        """The gSDE action. With a non-empty ``sample_shape`` (Monte-Carlo estimates inside a loss), fresh draws
        from ``Normal(loc, scale)``: the distribution of the gSDE action under fresh noise matrices."""
        if len(sample_shape) > 0:
            return super().rsample(sample_shape)
        return self.action

    def sample(self, sample_shape: torch.Size | Sequence[int] = ()) -> torch.Tensor:
        with torch.no_grad():
            return self.rsample(sample_shape)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        return self.base_dist.loc

    @property
    def mode(self) -> torch.Tensor:
        return self.base_dist.loc


class SquashedStateDependentNormal(D.TransformedDistribution):
    """A :class:`StateDependentNormal` squashed by ``tanh`` and scaled into ``[low, high]`` (gSDE for SAC, as in
    Stable-Baselines3's ``SquashedDiagGaussianDistribution``-based gSDE).

    ``rsample()`` returns the squashed gSDE action; ``log_prob`` includes the change of variables (computed from
    the cached pre-squash value for the action just sampled, so it stays finite at the bounds); the deterministic
    action is the squashed mean.

    Args:
        loc, scale, action: as for :class:`StateDependentNormal`.
        low, high: the Box bounds.
    """

    def __init__(
        self,
        loc: torch.Tensor,
        scale: torch.Tensor,
        action: torch.Tensor,
        low: torch.Tensor,
        high: torch.Tensor,
        validate_args=None,
    ):
        # the bounds are the actor's distribution arguments, which stay on the CPU when the actor moves
        low, high = (torch.as_tensor(bound, device=loc.device, dtype=loc.dtype) for bound in (low, high))
        squash = [
            D.TanhTransform(cache_size=1),
            D.AffineTransform((high + low) / 2, (high - low) / 2, cache_size=1),
        ]
        super().__init__(StateDependentNormal(loc, scale, action), squash, validate_args=validate_args)

    @property
    def deterministic_sample(self) -> torch.Tensor:
        action = self.base_dist.mode
        for transform in self.transforms:
            action = transform(action)
        return action

    @property
    def mode(self) -> torch.Tensor:
        return self.deterministic_sample


class GSDEHead(nn.Module):
    """The gSDE head of a policy: a linear mean action and TorchRL's ``gSDEModule`` on the latent features.

    ``forward(latent, noise)`` returns ``(loc, scale, action, noise)``: ``loc = Linear(latent)``,
    ``scale = sqrt(sum_j (sigma_ij z_j)^2)`` and, under ``ExplorationType.RANDOM``,
    ``action = loc + (sigma * noise) @ z`` (``loc`` otherwise). A missing ``noise`` (None) is sampled afresh under
    random exploration (one matrix per batch element), as ``gSDEModule`` does. Outside any exploration context (a
    loss calling ``actor.get_dist``) the head acts as deterministic: ``loc`` and ``scale`` do not depend on it.

    Args:
        latent_dim: width of the latent features ``z``.
        action_dim: number of action dims.
        sigma_init: initial value of every ``sigma_ij`` (``gSDEModule`` parametrises ``sigma = softplus(log_sigma)``
            but starts ``log_sigma`` at 0, i.e. ``sigma = 0.69``, whatever its ``sigma_init``; this sets it).
            Stable-Baselines3 starts at ``exp(log_std_init=0) = 1``.
        detach_latent: feed ``z.detach()`` to the noise, so that the exploration scale does not train the features
            (Stable-Baselines3's default, ``learn_features=False``); the mean still trains them.
    """

    def __init__(self, latent_dim: int, action_dim: int, sigma_init: float = 1.0, detach_latent: bool = True):
        super().__init__()
        if sigma_init <= 0:
            raise InputError(f"The gSDE sigma_init must be > 0, got {sigma_init}.")
        self.mean = nn.Linear(latent_dim, action_dim)
        self.noise = gSDEModule(action_dim, latent_dim, learn_sigma=True)
        with torch.no_grad():
            # inverse softplus: softplus(log_sigma) == sigma_init
            self.noise.log_sigma.fill_(sigma_init + math.log(-math.expm1(-sigma_init)))
        self.detach_latent = detach_latent

    def forward(
        self, latent: torch.Tensor, noise: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        loc = self.mean(latent)
        state = latent.detach() if self.detach_latent else latent
        if exploration_type() is None:
            with set_exploration_type(ExplorationType.DETERMINISTIC):
                return self.noise(loc, state, noise)
        return self.noise(loc, state, noise)


class GSDEPolicyNet(nn.Sequential):
    """Encoder, MLP body and :class:`GSDEHead` of a gSDE policy, indexable like the ``nn.Sequential`` of
    :func:`agents.networks.make_actor` (``net[0]`` is the encoder a critic may share).

    ``forward(observation, noise)`` returns ``(latent, loc, scale, action, noise)``.
    """

    def __init__(self, encoder: nn.Module, body: nn.Module, head: GSDEHead):
        super().__init__(encoder, body, head)

    def forward(self, observation: torch.Tensor, noise: torch.Tensor | None):
        encoder, body, head = self
        latent = body(encoder(observation))
        return (latent, *head(latent, noise))


def find_gsde_head(actor: nn.Module) -> GSDEHead:
    """Return the :class:`GSDEHead` of an actor from :func:`make_gsde_actor`."""
    head = next((module for module in actor.modules() if isinstance(module, GSDEHead)), None)
    if head is None:
        raise InputError(
            "This actor has no gSDE head: build it with make_gsde_actor (policy_builder='gsde_actor')."
        )
    return head


def make_gsde_actor(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    normalize_obs: bool = False,
    sigma_init: float = 1.0,
    detach_latent: bool = True,
    encoder: nn.Module | None = None,
    squash: bool = False,
) -> ProbabilisticActor:
    """Build a gSDE policy for a Box action spec (registered as ``POLICY_BUILDERS["gsde_actor"]``).

    The network is the observation encoder (:func:`agents.networks.observation_encoder`), an MLP whose last hidden
    layer (activated) gives the latent features ``z``, and a :class:`GSDEHead`. The action distribution is a
    :class:`StateDependentNormal`; unless ``squash`` is set, actions are *not* squashed: as in Stable-Baselines3's
    gSDE PPO they are unbounded samples, clipped to the Box only on their way into the env (:func:`make_gsde_env`, and
    :meth:`agents.Agent.predict`), so the stored action is the one whose log-probability was recorded.

    Noise matrices are read from ``"_eps_gSDE"`` (kept by the env's :class:`GSDENoise`); without them, random
    exploration samples a fresh matrix per call (``Agent.predict(obs, deterministic=False)``).

    Args:
        observation_spec: the spec of ``"observation"`` (batched).
        action_spec: a ``Bounded`` float action spec with one dim per env (Gymnasium ``Box``).
        hidden_sizes: widths of the hidden layers; the last is the latent width. ``()`` uses the encoded
            observation as the latent.
        activation: ``"tanh"``, ``"relu"``, ``"elu"`` or ``"silu"``.
        normalize_obs: put an :class:`agents.normalization.ObservationNormalizer` in front of the network.
        sigma_init: initial ``sigma_ij`` (see :class:`GSDEHead`).
        detach_latent: stop the gradient of the exploration scale into the features (see :class:`GSDEHead`).
        encoder: an input module to share with a critic; built when None.
        squash: squash the action by ``tanh`` into the Box (:class:`SquashedStateDependentNormal`), as SAC needs:
            its entropy term would otherwise reward ever wider actions that the env clips anyway.

    Returns:
        A ``ProbabilisticActor`` reading ``"observation"`` (and ``"_eps_gSDE"`` when present) and writing
        ``"action"``, its log-probability, ``"loc"``, ``"scale"``, ``"gsde_latent"``, ``"gsde_action"`` and
        ``"_eps_gSDE"``. Its first module's ``module[0]`` is the encoder (:func:`agents.networks.input_encoder`).

    Raises:
        InputError: the action spec is not a one-dimensional float Box, or the activation is unknown.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("Pendulum-v1", num_envs=2)
        >>> actor = make_gsde_actor(env.observation_spec["observation"], env.action_spec)
        >>> actor(env.reset())["action"].shape
        torch.Size([2, 1])
    """
    if not (
        isinstance(action_spec, Bounded) and action_spec.dtype.is_floating_point and action_spec.ndim == 2
    ):
        raise InputError(
            "gSDE (--use-sde) needs a bounded one-dimensional Box action space, got "
            f"{space_name(action_spec)} of shape {tuple(action_spec.shape[1:])}."
        )
    check_mlp_options(hidden_sizes, activation)
    if encoder is None:
        encoder, in_features = observation_encoder(observation_spec, normalize_obs)
    else:
        in_features = encoder_width(observation_spec)
    check_mlp_memory(in_features, action_spec.shape[-1], hidden_sizes)
    hidden_sizes = list(hidden_sizes)
    if hidden_sizes:
        body = MLP(
            in_features=in_features,
            out_features=hidden_sizes[-1],
            num_cells=hidden_sizes[:-1],
            activation_class=ACTIVATIONS[activation],
            activate_last_layer=True,
        )
        latent_dim = hidden_sizes[-1]
    else:
        body, latent_dim = nn.Identity(), in_features
    action_dim = action_spec.shape[-1]
    net = GSDEPolicyNet(
        encoder, body, GSDEHead(latent_dim, action_dim, sigma_init=sigma_init, detach_latent=detach_latent)
    )
    module = TensorDictModule(
        net,
        in_keys=["observation", GSDE_NOISE_KEY],
        out_keys=[GSDE_LATENT_KEY, "loc", "scale", GSDE_ACTION_KEY, GSDE_NOISE_KEY],
    )
    distribution_kwargs = {}
    if squash:
        distribution_kwargs = {"low": action_spec.space.low[0], "high": action_spec.space.high[0]}
    return ProbabilisticActor(
        module,
        in_keys={"loc": "loc", "scale": "scale", "action": GSDE_ACTION_KEY},
        spec=action_spec,
        distribution_class=SquashedStateDependentNormal if squash else StateDependentNormal,
        distribution_kwargs=distribution_kwargs,
        return_log_prob=True,
    )


class GSDENoise(gSDENoise):
    """The gSDE noise matrices of a batched env, kept as env state under ``"_eps_gSDE"``.

    TorchRL's ``gSDENoise`` primer draws a fresh standard-normal matrix for every sub-env that resets (partial
    resets only touch the sub-envs that reset) and carries the current one from step to step; the policy reads it.
    This subclass also resamples the matrices of *all* sub-envs on a schedule counted in env steps since the last
    full reset, following Stable-Baselines3 (``OnPolicyAlgorithm.collect_rollouts``: ``policy.reset_noise()`` at the
    start of every rollout, and every ``sde_sample_freq`` steps of it when that is positive):

    * at every episode start of a sub-env (TorchRL's primer; the original SDE of Rueckstiess et al. 2008 draws
      one matrix per episode);
    * every ``rollout_length`` steps, i.e. at the start of every collected batch when ``rollout_length`` is the
      collector's steps per env (SB3's resample at rollout start);
    * if ``sample_freq > 0``, every ``sample_freq`` steps counted from the start of the rollout (SB3's
      ``n_steps % sde_sample_freq == 0``); ``-1`` resamples only at episode and rollout starts.

    The noise for the step after a resample is written to ``("next", "_eps_gSDE")``; the transition that was
    just taken keeps the noise that produced its action at the root.

    Args:
        action_dim: number of action dims.
        latent_dim: width of the policy's latent features.
        sample_freq: resample every this many steps (``> 0``), or ``-1``.
        rollout_length: steps per env of one collected batch, or None to never resample at batch starts.
    """

    def __init__(
        self, action_dim: int, latent_dim: int, sample_freq: int = -1, rollout_length: int | None = None
    ):
        if sample_freq != -1 and sample_freq < 1:
            raise InputError(f"--sde-sample-freq must be -1 or a positive integer, got {sample_freq}.")
        if rollout_length is not None and rollout_length < 1:
            raise InputError(f"The gSDE rollout length must be positive, got {rollout_length}.")
        super().__init__(state_dim=latent_dim, action_dim=action_dim, expand_specs=True)
        self.sample_freq = sample_freq
        self.rollout_length = rollout_length
        self.steps = 0  # env steps since the last full reset

    def _resample_due(self) -> bool:
        steps = self.steps if self.rollout_length is None else self.steps % self.rollout_length
        return (self.rollout_length is not None and steps == 0) or (
            self.sample_freq > 0 and steps % self.sample_freq == 0
        )

    def _step(self, tensordict: TensorDictBase, next_tensordict: TensorDictBase) -> TensorDictBase:
        next_tensordict = super()._step(tensordict, next_tensordict)
        self.steps += 1
        if self._resample_due():
            noise = next_tensordict.get(GSDE_NOISE_KEY)
            next_tensordict.set(GSDE_NOISE_KEY, torch.randn_like(noise))
        return next_tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        if tensordict is None or tensordict.get("_reset", None) is None:
            self.steps = 0  # a full reset (not the partial reset of finished sub-envs) restarts the schedule
        return super()._reset(tensordict, tensordict_reset)


class ClipActionToBounds(Transform):
    """Clip ``"action"`` to ``[low, high]`` on its way into the env; the tensordict keeps the unclipped action.

    TorchRL's ``ClipTransform`` takes scalar bounds only; a Box may have per-dim (asymmetric) bounds. Inverse
    transforms of a ``TransformedEnv`` work on a shallow copy of the step's input, so the collected ``"action"`` is
    the policy's sample, consistent with its recorded log-probability (Stable-Baselines3 stores the unclipped
    action in its rollout buffer and clips a copy for ``env.step`` likewise).

    Args:
        low: lower bounds, broadcastable to the action.
        high: upper bounds, likewise.
    """

    def __init__(self, low: torch.Tensor, high: torch.Tensor):
        super().__init__(in_keys_inv=["action"], out_keys_inv=["action"])
        self.register_buffer("low", torch.as_tensor(low).clone())
        self.register_buffer("high", torch.as_tensor(high).clone())

    def _inv_apply_transform(self, action: torch.Tensor) -> torch.Tensor:
        return torch.clamp(action, self.low, self.high)


def clip_env_actions(env: EnvBase) -> EnvBase:
    """Make a batched training env clip the actions going in to its Box bounds: the env side of an unsquashed
    policy (``make_actor(..., squash=False)``). A Gymnasium env (:class:`envs.vector.GymnasiumVectorEnv`) clips
    in NumPy inside its step and is returned itself (a ``TransformedEnv`` layer would cost about 0.2 ms a
    step); any other env is wrapped with :class:`ClipActionToBounds`. Either way the tensordict keeps the
    policy's unclipped action.

    Examples:
        >>> from envs import make_env
        >>> env = clip_env_actions(make_env("Pendulum-v1", num_envs=2, seed=0))
        >>> env.rand_step(env.reset())["action"].shape
        torch.Size([2, 1])
    """
    action_spec = env.action_spec
    if not is_float_box(action_spec):
        raise InputError(f"Clipping actions needs a bounded Box action space, got {space_name(action_spec)}.")
    if isinstance(env, GymnasiumVectorEnv):  # the Gymnasium Box's own bounds, infinite ones included
        env.clip_actions = True
        return env
    if isinstance(action_spec, Unbounded):  # a spec without bounds: nothing to clip to
        return env
    return TransformedEnv(env, ClipActionToBounds(action_spec.space.low[0], action_spec.space.high[0]))


def clips_actions(env: EnvBase) -> bool:
    """Whether ``env`` clips its actions to the Box bounds (:func:`clip_env_actions` or a gSDE env)."""
    if isinstance(env, TransformedEnv):
        if any(isinstance(transform, ClipActionToBounds) for transform in env.transform.modules()):
            return True
        env = env.base_env
    return isinstance(env, GymnasiumVectorEnv) and env.clip_actions


def check_sde_options(use_sde: bool, sample_freq: int) -> None:
    """Raise :class:`InputError` for ``--sde-sample-freq`` given without ``--use-sde``, which would be ignored."""
    if sample_freq != -1 and not use_sde:
        raise InputError(
            f"--sde-sample-freq {sample_freq} only applies with --use-sde: add --use-sde or drop it."
        )


def make_gsde_env(
    env: EnvBase, actor: ProbabilisticActor, sample_freq: int = -1, rollout_length: int | None = None
) -> TransformedEnv:
    """Wrap a batched training env for a gSDE actor: noise matrices as env state, actions clipped to the Box.

    Args:
        env: a batched env from :func:`envs.make_env` with a ``Bounded`` action spec.
        actor: the actor from :func:`make_gsde_actor` (its head gives the noise shape).
        sample_freq: ``--sde-sample-freq``: resample the noise every this many steps, or ``-1`` (see
            :class:`GSDENoise`).
        rollout_length: the collector's steps per env per batch, so that every batch starts with fresh noise
            (Stable-Baselines3); None to skip that.

    Returns:
        A ``TransformedEnv`` with a :class:`GSDENoise` and a :class:`ClipActionToBounds`; its ``single_*_space``
        attributes are the base env's.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("Pendulum-v1", num_envs=4, seed=0)
        >>> actor = make_gsde_actor(env.observation_spec["observation"], env.action_spec)
        >>> env = make_gsde_env(env, actor, sample_freq=4, rollout_length=128)
        >>> env.reset()["_eps_gSDE"].shape
        torch.Size([4, 1, 64])
    """
    head = find_gsde_head(actor).noise
    action_spec = env.action_spec
    if not isinstance(action_spec, Bounded):
        raise InputError(f"gSDE needs a bounded Box action space, got {space_name(action_spec)}.")
    noise = GSDENoise(head.action_dim, head.state_dim, sample_freq=sample_freq, rollout_length=rollout_length)
    clip = ClipActionToBounds(action_spec.space.low[0], action_spec.space.high[0])
    return TransformedEnv(env, Compose(noise, clip))


__all__ = [
    "GSDE_ACTION_KEY",
    "GSDE_LATENT_KEY",
    "GSDE_NOISE_KEY",
    "ClipActionToBounds",
    "GSDEHead",
    "GSDENoise",
    "GSDEPolicyNet",
    "StateDependentNormal",
    "check_sde_options",
    "clip_env_actions",
    "clips_actions",
    "find_gsde_head",
    "make_gsde_actor",
    "make_gsde_env",
]
