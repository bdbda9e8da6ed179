"""Q-value networks and actors for the DQN family, their epsilon-greedy schedule, and n-step returns for the
replay buffers of the off-policy recipes."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase, TensorDictSequential
from torch import nn
from torchrl.data import Categorical, PrioritizedSampler, ReplayBuffer, TensorSpec
from torchrl.data.postprocs.postprocs import _multi_step_func
from torchrl.data.replay_buffers.samplers import prioritized as prioritized_module
from torchrl.envs.transforms import MultiStepTransform
from torchrl.envs.utils import ExplorationType, exploration_type
from torchrl.modules import (
    MLP,
    DistributionalQValueActor,
    EGreedyModule,
    NoisyLinear,
    QValueActor,
    reset_noise,
)
from torchrl.objectives import (
    DistributionalDQNLoss,
    DQNLoss,
    HardUpdate,
    LossModule,
    TargetNetUpdater,
)
from torchrl.objectives.utils import distance_loss
from torchrl.objectives.value import TD0Estimator
from torchrl.objectives.value.functional import td0_return_estimate

from agents.actor_critic import ForeachSoftUpdate, SharedBuffers
from agents.fast_paths import flat_select, unrolled
from agents.networks import ACTIVATIONS, check_mlp_memory, check_mlp_options, observation_encoder
from agents.options import Options
from envs.specs import ACTION_MASK_KEY
from errors import InputError, check_ranges

DONE_KEYS = ("done", "terminated", "truncated")
# what an off-policy recipe stores of a transition (fewer keys: cheaper sampling and loss calls)
TRANSITION_KEYS = ("observation", "action", ("next", "observation"), ("next", "reward")) + tuple(
    ("next", key) for key in DONE_KEYS
)
# what NStepReturns adds to a transition that the losses do not read
N_STEP_WORKING_KEYS = ("gamma", "nonterminal", ("next", "original_reward"))


@dataclass
class ExplorationConfig(Options):
    """Epsilon-greedy exploration annealed linearly or decayed multiplicatively (value-based recipes)."""

    initial_epsilon: float = 1.0
    """Epsilon-greedy rate at the start."""
    final_epsilon: float = 0.05
    """Epsilon-greedy rate after annealing (the floor of a multiplicative decay)."""
    exploration_fraction: float = 0.5
    """Fraction of the budget over which epsilon is annealed linearly."""
    epsilon_schedule: Literal["linear", "multiplicative"] = "linear"
    """'linear': from --initial-epsilon to --final-epsilon over --exploration-fraction of the budget;
    'multiplicative': epsilon times --epsilon-decay after every step or finished training episode
    (--epsilon-decay-unit), never below --final-epsilon (rlib's epsilon_decay)."""
    epsilon_decay: float = 0.999
    """Multiplicative schedule: the factor applied per --epsilon-decay-unit."""
    epsilon_decay_unit: Literal["step", "episode"] = "step"
    """Multiplicative schedule: decay after every env step (summed over envs) or every finished episode."""

    def validate(self) -> None:
        """Raise :class:`InputError` for rates outside [0, 1] or a schedule that increases."""
        check_ranges(
            initial_epsilon=(self.initial_epsilon, "[0, 1]"),
            final_epsilon=(self.final_epsilon, "[0, 1]"),
            exploration_fraction=(self.exploration_fraction, "(0, 1]"),
            epsilon_decay=(self.epsilon_decay, "(0, 1]"),
        )
        for name, choices in (
            ("schedule", ("linear", "multiplicative")),
            ("decay_unit", ("step", "episode")),
        ):
            if getattr(self, f"epsilon_{name}") not in choices:
                raise InputError(
                    f"--epsilon-{name.replace('_', '-')} must be one of {', '.join(choices)}; "
                    f"got {getattr(self, f'epsilon_{name}')!r}."
                )
        if self.final_epsilon > self.initial_epsilon:
            raise InputError("--final-epsilon must not exceed --initial-epsilon.")

    def options_given(self, preset: dict[str, Any]) -> list[str]:
        """The command-line names of the options set apart from their defaults and from what ``preset`` (a
        preset record's ``"set"``) filled in: what the user asked for."""
        defaults = type(self)()
        return [
            f"--{name.replace('_', '-')}"
            for name in self.__dataclass_fields__
            if getattr(self, name) != getattr(defaults, name) and name not in preset
        ]

    def epsilon(self, frames: int, total_frames: int) -> float:
        """The linear schedule's rate after ``frames`` of a ``total_frames`` budget."""
        progress = min(1.0, frames / max(1.0, self.exploration_fraction * total_frames))
        return self.initial_epsilon + (self.final_epsilon - self.initial_epsilon) * progress

    def next_epsilon(self, epsilon: float, frames: int, total_frames: int, batch: TensorDictBase) -> float:
        """The rate for the batch after ``batch``: the linear schedule's at ``frames`` (this batch's included), or
        ``epsilon`` (the current rate, saved with the policy) decayed once per step or finished episode of
        ``batch``."""
        if self.epsilon_schedule == "linear":
            return self.epsilon(frames, total_frames)
        count = batch.numel() if self.epsilon_decay_unit == "step" else int(batch.get(("next", "done")).sum())
        return max(self.final_epsilon, epsilon * self.epsilon_decay**count)


class IndependentNoisyLinear(NoisyLinear):
    """``NoisyLinear`` with independent Gaussian noise (Fortunato et al., 2018, arXiv:1706.10295, section 3.2):
    every weight and bias draws its own standard normal noise (TorchRL's ``NoisyLinear`` factorises it into one
    vector per input and one per output); means start uniform in ``±sqrt(3 / in_features)`` and standard
    deviations at ``std_init`` (the paper's 0.017). Lightning Bolts' noisy layers are of this kind.
    """

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, std_init: float = 0.017, **kwargs
    ):
        super().__init__(in_features, out_features, bias=bias, std_init=std_init, **kwargs)

    def reset_parameters(self) -> None:
        bound = math.sqrt(3 / self.in_features)
        self.weight_mu.data.uniform_(-bound, bound)
        self.weight_sigma.data.fill_(self.std_init)
        if self.bias_mu is not None:
            self.bias_mu.data.uniform_(-bound, bound)
            self.bias_sigma.data.fill_(self.std_init)

    def reset_noise(self) -> None:
        self.weight_epsilon.normal_()
        if self.bias_mu is not None:
            self.bias_epsilon.normal_()


NOISY_LAYERS = {"factorised": NoisyLinear, "independent": IndependentNoisyLinear}


class DuelingHead(nn.Module):
    """Dueling output layer (Wang et al., 2016, arXiv:1511.06581): ``Q = V + A - mean(A)``, per atom of a
    distributional network (Hessel et al., 2018: the streams' logits are combined before the softmax).

    Args:
        in_features: width of the features it reads.
        num_actions: number of discrete actions.
        layer_class: ``nn.Linear`` or a noisy layer.
        num_atoms: atoms of a distributional network (output ``[..., atoms, actions]``), or None (``[..., actions]``).
    """

    def __init__(
        self,
        in_features: int,
        num_actions: int,
        layer_class: type[nn.Linear] = nn.Linear,
        num_atoms: int | None = None,
    ):
        super().__init__()
        self.num_atoms = num_atoms
        self.value = layer_class(in_features, num_atoms or 1)
        self.advantage = layer_class(in_features, (num_atoms or 1) * num_actions)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        advantage, value = self.advantage(features), self.value(features)
        if self.num_atoms is not None:
            advantage = advantage.unflatten(-1, (self.num_atoms, -1))
            value = value.unsqueeze(-1)
        return value + advantage - advantage.mean(-1, keepdim=True)


def make_q_network(
    observation_spec: TensorSpec,
    num_actions: int,
    hidden_sizes: Sequence[int] = (256, 256),
    activation: str = "relu",
    dueling: bool = False,
    noisy: bool = False,
    normalize_obs: bool = False,
    noisy_type: str = "factorised",
    num_atoms: int | None = None,
) -> nn.Sequential:
    """A network mapping observations to one Q-value per action (or, with ``num_atoms``, to the logits of a
    distribution over ``num_atoms`` return values per action: ``[..., atoms, actions]``).

    Vector observations go through an MLP (after an optional :class:`~agents.ObservationNormalizer`), images
    through the encoder :func:`agents.networks.observation_encoder` picks for them.

    Args:
        observation_spec: the spec of ``"observation"`` (batched: the leading dim is the number of envs).
        num_actions: number of discrete actions.
        hidden_sizes: widths of the hidden layers.
        activation: ``"relu"``, ``"tanh"``, ``"elu"`` or ``"silu"``.
        dueling: end in separate state-value and advantage streams (:class:`DuelingHead`).
        noisy: use noisy layers (Fortunato et al., 2018, arXiv:1706.10295) instead of linear ones; their noise
            is active under ``ExplorationType.RANDOM`` only.
        normalize_obs: put an observation normaliser in front of the network.
        noisy_type: ``"factorised"`` (TorchRL's ``NoisyLinear``, the paper's choice for DQN) or
            ``"independent"`` (:class:`IndependentNoisyLinear`) Gaussian noise.
        num_atoms: the atoms of a distributional (C51) network; None for one value per action.
    """
    check_mlp_options(hidden_sizes, activation)
    if noisy_type not in NOISY_LAYERS:
        raise InputError(f"Unknown noisy type {noisy_type!r}; choose one of {sorted(NOISY_LAYERS)}.")
    encoder, in_features = observation_encoder(observation_spec, normalize_obs)
    check_mlp_memory(in_features, num_actions * (num_atoms or 1), hidden_sizes)
    layer_class = NOISY_LAYERS[noisy_type] if noisy else nn.Linear
    if not dueling:
        body = MLP(
            in_features=in_features,
            out_features=num_actions * (num_atoms or 1),
            num_cells=list(hidden_sizes),
            activation_class=ACTIVATIONS[activation],
            layer_class=layer_class,
        )
        if num_atoms is None:
            return nn.Sequential(encoder, body)
        return nn.Sequential(encoder, body, nn.Unflatten(-1, (num_atoms, num_actions)))
    layers: list[nn.Module] = [encoder]
    if hidden_sizes:
        layers.append(
            MLP(
                in_features=in_features,
                out_features=hidden_sizes[-1],
                num_cells=list(hidden_sizes[:-1]),
                activation_class=ACTIVATIONS[activation],
                activate_last_layer=True,
                layer_class=layer_class,
            )
        )
        in_features = hidden_sizes[-1]
    layers.append(DuelingHead(in_features, num_actions, layer_class, num_atoms))
    return nn.Sequential(*layers)


class NoiseResampler(TensorDictModuleBase):
    """Draws fresh NoisyNet noise after every exploratory call of a policy.

    NoisyNet-DQN acts with a new noise sample at every step (Fortunato et al., 2018, arXiv:1706.10295,
    Algorithm 1); TorchRL's ``NoisyLinear`` only resamples when told to. Placed last in the policy, this
    module resamples the noise of ``network``'s noisy layers after each call under
    ``ExplorationType.RANDOM`` (collection, ``predict(deterministic=False)``), so the next action uses new
    noise. It reads and writes no keys and holds no parameters; loss modules never call it.

    Args:
        network: the module whose ``NoisyLinear`` layers it resamples.
    """

    def __init__(self, network: nn.Module):
        super().__init__()
        self.in_keys, self.out_keys = [], []
        # a plain attribute, not a submodule: the layers belong to the Q-network and are saved there
        self.__dict__["noisy_layers"] = tuple(m for m in network.modules() if isinstance(m, NoisyLinear))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        if exploration_type() is ExplorationType.RANDOM:
            for layer in self.noisy_layers:
                layer.reset_noise()
        return tensordict


# what DQN's refusal of a non-Discrete action space recommends instead
OTHER_RECIPES = (
    "For Box (continuous) actions use recipes.sac, recipes.td3, recipes.ddpg or recipes.ppo, for MultiDiscrete or "
    "MultiBinary actions recipes.ppo or recipes.a2c."
)


def make_q_actor(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (256, 256),
    activation: str = "relu",
    dueling: bool = False,
    noisy: bool = False,
    normalize_obs: bool = False,
    epsilon: float = 0.0,
    action_mask: bool = False,
    noisy_type: str = "factorised",
    distributional: bool = False,
    num_atoms: int = 51,
    v_min: float = -10.0,
    v_max: float = 10.0,
) -> TensorDictSequential:
    """Build an epsilon-greedy Q-value policy for a discrete action spec.

    The policy is a ``QValueActor`` (writing ``"action_value"``, ``"chosen_action_value"`` and the greedy
    ``"action"``) followed by an ``EGreedyModule`` whose ``eps`` buffer is saved with the agent, and, for noisy
    networks, a :class:`NoiseResampler` that draws new noise after every exploratory action. The
    epsilon-greedy step and noisy layers act only under ``ExplorationType.RANDOM`` (collection); evaluation
    and ``Agent.predict(deterministic=True)`` take the greedy action of the noise-free network.

    Args:
        observation_spec: the spec of ``"observation"`` (batched).
        action_spec: the env's action spec (batched); must be ``Categorical`` (Gymnasium ``Discrete``).
        hidden_sizes, activation, dueling, noisy, normalize_obs, noisy_type: see :func:`make_q_network`.
        epsilon: initial exploration rate of the epsilon-greedy module.
        action_mask: the env gives the allowed actions (``"action_mask"``): greedy and random actions are drawn
            from those.
        distributional: a C51 network (Bellemare et al., 2017, arXiv:1707.06887) in TorchRL's
            ``DistributionalQValueActor``: log-probabilities of ``num_atoms`` returns evenly spaced over
            ``[v_min, v_max]`` per action (``"action_value"``, ``[..., atoms, actions]``), acting greedily on
            their expectation; ``DistributionalDQNLoss`` trains it.

    Returns:
        ``TensorDictSequential(QValueActor, EGreedyModule[, NoiseResampler])``; ``policy[0]`` is the Q-value
        actor a ``DQNLoss`` trains.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("CartPole-v1", num_envs=2)
        >>> policy = make_q_actor(env.observation_spec["observation"], env.action_spec, dueling=True)
        >>> policy(env.reset())["action_value"].shape
        torch.Size([2, 2])
    """
    if type(action_spec) is not Categorical:  # not its subclasses MultiCategorical and Binary
        raise InputError(
            f"DQN needs a Discrete action space, got a {type(action_spec).__name__} action spec. {OTHER_RECIPES}"
        )
    num_actions = action_spec.space.n
    if distributional:
        check_support(num_atoms, v_min, v_max, action_mask)
    network = make_q_network(
        observation_spec,
        num_actions,
        hidden_sizes,
        activation,
        dueling,
        noisy,
        normalize_obs,
        noisy_type,
        num_atoms if distributional else None,
    )
    single_action_spec = action_spec[0] if action_spec.ndim else action_spec
    mask_key = ACTION_MASK_KEY if action_mask else None
    if distributional:
        support = torch.linspace(v_min, v_max, num_atoms)
        q_actor = DistributionalQValueActor(
            network, support, in_keys=["observation"], spec=single_action_spec
        )
    else:
        q_actor = QValueActor(
            network, in_keys=["observation"], spec=single_action_spec, action_mask_key=mask_key
        )
    exploration = EGreedyModule(
        single_action_spec, eps_init=epsilon, eps_end=epsilon, action_mask_key=mask_key
    )
    if noisy:
        return TensorDictSequential(q_actor, exploration, NoiseResampler(network))
    return TensorDictSequential(q_actor, exploration)


def check_support(num_atoms: int, v_min: float, v_max: float, action_mask: bool = False) -> None:
    """Raise :class:`InputError` unless ``num_atoms >= 2`` returns span ``v_min < v_max`` (finite), and for
    action masks, which TorchRL's distributional module does not apply correctly (a masked action's expected
    value becomes 0, not minus infinity)."""
    if not isinstance(num_atoms, int) or not 2 <= num_atoms <= 1024:
        raise InputError(f"--num-atoms must be an integer in [2, 1024], got {num_atoms!r}.")
    if not (math.isfinite(v_min) and math.isfinite(v_max) and v_min < v_max):
        raise InputError(f"--v-min must be below --v-max (both finite), got {v_min} and {v_max}.")
    if action_mask:
        raise InputError(
            "--distributional does not take action masks (the env gives info['action_mask']); train without "
            "--distributional (and --variant rainbow), or drop the mask."
        )


class MaxNormalisedPriorityWeights:
    """Prioritized replay's importance weights applied as Schaul et al. (2016, arXiv:1511.05952, Algorithm 1) and
    Dopamine's Rainbow apply them: the loss is ``mean(w_i * loss_i)`` with the weights the sampler gives,
    ``(p_i / p_min) ** -beta``, normalised by the largest weight so that they only scale updates down. TorchRL's
    reduction computes ``sum(w_i * loss_i) / sum(w_i)`` instead, which cancels that normalisation (every update keeps
    the size of an unweighted one, whatever beta is). Losses with masks, and other reductions, are TorchRL's."""

    def _reduce_loss(self, loss, tensordict=None, *, mask=None, reduction=None, weights=None):
        weighted = (
            weights is not None
            and mask is None
            and (reduction or self.reduction) == "mean"
            and loss.ndim >= 1
            and weights.numel() == loss.shape[0]
            and not (
                tensordict is not None
                and any(tensordict.get(key, None) is not None for key in self._loss_mask_keys())
            )
        )
        if weighted:
            return (loss * weights.reshape(-1, *(1,) * (loss.ndim - 1))).mean()
        return super()._reduce_loss(loss, tensordict, mask=mask, reduction=reduction, weights=weights)


def reset_target_noise(loss_module: nn.Module) -> None:
    """Draw new noise for the noisy layers of a DQN loss's target network. NoisyNet-DQN evaluates its targets with
    noise of their own, drawn anew at every step (Fortunato et al., 2018, arXiv:1706.10295, Algorithm 1), not with
    the sample copied at the last target update (which a soft update would average towards zero)."""
    network = loss_module.value_network
    with loss_module.target_value_network_params.to_module(network):
        network.apply(reset_noise)


class TensorDQNLoss(SharedBuffers, MaxNormalisedPriorityWeights, DQNLoss):
    """TorchRL's ``DQNLoss``, computed on the observation tensors instead of through TensorDict modules.

    ``DQNLoss`` runs the Q-value actor as a TensorDict module for the online values and again, through its
    TD(0) value estimator, for the target values; each pass copies the input, writes three entries and swaps
    the parameters in and out. For the small networks of classic-control tasks that bookkeeping costs more
    than the network itself. This subclass keeps everything else of ``DQNLoss``: construction, the online and
    target parameters (so ``HardUpdate`` and ``SoftUpdate`` work unchanged), the keys, the discount of the
    TD(0) estimator (``gamma ** steps_to_next_obs`` for n-step transitions), Double DQN, the loss function
    and the squared TD error written to the priority key; importance weights scale the loss as
    :class:`MaxNormalisedPriorityWeights` says. It calls the actor's network directly for the online values, and a
    copy of it that computes with the target parameters for the bootstrap (plus the online argmax for Double DQN).
    The tests check that loss, gradients and priorities equal ``DQNLoss``'s (with that reduction).

    Args:
        value_network: a ``QValueActor`` (as built by :func:`make_q_actor`).
        **kwargs: as for ``DQNLoss``; ``delay_value`` defaults to True.

    Reads:
        ``"observation"`` (the actor's in_keys), ``"action"``, ``("next", "observation")``, ``("next", "reward")``,
        ``("next", "terminated")``, optionally ``"steps_to_next_obs"`` and the priority weight.

    Writes:
        the squared TD error under the priority key (``"td_error"``) of the input; returns ``TensorDict(loss=...)``.
    """

    def __init__(self, value_network: QValueActor, **kwargs):
        if not isinstance(value_network, QValueActor):
            raise InputError(
                f"TensorDQNLoss needs a QValueActor, got {type(value_network).__name__}; use DQNLoss for other modules."
            )
        # SharedBuffers: the target network normalises with the online network's statistics
        super().__init__(value_network, **{"delay_value": True, **kwargs})
        q_module = value_network[0]
        self._q_network = q_module.module
        self._q_forward = unrolled(self._q_network)  # the network's forward without a module call per layer
        self._observation_keys = list(q_module.in_keys)
        self._target_network: nn.Module | None = None  # see _target
        self._target()

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)
        if self.__dict__.get("_target_network") is not None:
            self._target()  # rebuilt on the moved target tensors, ready for a compiled forward
        return module

    def _target(self) -> Callable[..., torch.Tensor]:
        """The forward (:func:`agents.fast_paths.unrolled`) of a copy of the Q-network whose parameters and
        buffers are the target tensors themselves.

        Target updaters and ``load_state_dict`` write those tensors in place, so the copy always computes with
        the current target values, without swapping parameters in and out on every call. It is rebuilt if the
        target tensors were replaced (the loss moved to another device) when called eagerly; a compiled forward
        (``--compile``) uses the copy as it is, since building one inside a compiled graph would break it.
        """
        if torch.compiler.is_compiling():
            return self._target_forward
        # the target tensors themselves (the attribute would warn while no target updater is attached yet)
        target_params = self._modules["target_value_network_params"]
        tensor = next(iter(target_params.values(True, True)))
        anchor = (tensor, tensor.data_ptr(), tensor.dtype, tensor.device)  # .to() may swap a tensor's data
        if (
            self._target_network is None
            or self._target_anchor[0] is not tensor
            or self._target_anchor[1:] != anchor[1:]
        ):
            actor = copy.deepcopy(self.value_network)
            target_params.to_module(actor)
            # kept out of the module tree: its tensors are already the loss module's target parameters
            object.__setattr__(self, "_target_network", actor[0].module)
            object.__setattr__(self, "_target_forward", unrolled(actor[0].module))
            object.__setattr__(self, "_target_anchor", anchor)
        if self._target_network.training != self._q_network.training:
            self._target_network.train(self._q_network.training)
        return self._target_forward

    def _chosen(self, action_values: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        if self.action_space == "categorical":
            if action.ndim != action_values.ndim:
                action = action.unsqueeze(-1)
            return action_values.gather(-1, action).squeeze(-1)
        return (action_values * action.to(action_values.dtype)).sum(-1)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """The DQN loss of a batch of transitions; writes the squared TD errors as priorities."""
        if not isinstance(self.value_estimator, TD0Estimator):
            raise InputError(
                "TensorDQNLoss computes TD(0) targets only; use DQNLoss for other value estimators."
            )
        if self.value_estimator.average_rewards:
            raise InputError(
                "TensorDQNLoss does not standardise rewards; use DQNLoss for average_rewards=True."
            )
        keys = self.tensor_keys
        target_network = self._target()
        observations = [tensordict.get(key) for key in self._observation_keys]
        next_observations = [tensordict.get(("next", key)) for key in self._observation_keys]
        chosen_value_B = self._chosen(self._q_forward(*observations), tensordict.get(keys.action))

        with torch.no_grad():
            # the next state's allowed actions, when the env gives them: the bootstrap takes the best of those
            next_mask_BA = tensordict.get(("next", ACTION_MASK_KEY), None)

            def allowed(values_BA: torch.Tensor) -> torch.Tensor:
                return values_BA if next_mask_BA is None else values_BA.masked_fill(~next_mask_BA, -torch.inf)

            if self.double_dqn:  # the online network picks the next action, the target network values it
                next_action_B1 = allowed(self._q_forward(*next_observations)).argmax(-1, keepdim=True)
            next_values_BA = target_network(*next_observations)
            if self.double_dqn:
                next_value_B1 = next_values_BA.gather(-1, next_action_B1)
            else:
                next_value_B1 = allowed(next_values_BA).max(-1, keepdim=True).values
            reward_B1 = tensordict.get(("next", keys.reward))
            estimator = self.value_estimator
            gamma = estimator.gamma.to(reward_B1.device)
            steps_to_next_obs = tensordict.get(estimator.tensor_keys.steps_to_next_obs, None)
            if steps_to_next_obs is not None:
                gamma = gamma ** steps_to_next_obs.view_as(reward_B1)
            target_value_B = td0_return_estimate(
                gamma, next_value_B1, reward_B1, tensordict.get(("next", keys.terminated))
            ).squeeze(-1)
            tensordict.set(
                keys.priority, (chosen_value_B - target_value_B).pow(2).unsqueeze(-1), inplace=True
            )

        loss_B = distance_loss(chosen_value_B, target_value_B, self.loss_function)
        weights = None
        if self.use_prioritized_weights in (True, "auto") and keys.priority_weight in tensordict.keys():  # noqa: SIM118 (TensorDict has no __contains__)
            weights = tensordict.get(keys.priority_weight)
        return TensorDict(loss=self._reduce_loss(loss_B, tensordict=tensordict, weights=weights))


class NStepDistributionalDQNLoss(SharedBuffers, MaxNormalisedPriorityWeights, DistributionalDQNLoss):
    """TorchRL's ``DistributionalDQNLoss`` (C51's cross-entropy to the projected target distribution, with the
    next action picked by the online network) on the transitions :class:`NStepReturns` stores.

    Their ``"steps_to_next_obs"`` holds one number per transition (``[B]``), which the parent would broadcast
    against the rewards (``[B, 1]``) into a ``[B, B]`` discount; this subclass gives it the rewards' shape and
    leaves everything else to the parent, including the priority it writes into the input (the per-sample
    cross-entropy, under ``"td_error"``). Its target network reads the online network's buffers (the observation
    statistics; :func:`agents.actor_critic.share_target_buffers`).
    """

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        steps = tensordict.get("steps_to_next_obs", None)
        if steps is None or steps.ndim != 1:
            return super().forward(tensordict)
        shaped = tensordict.copy()  # shallow: the sample's tensors, one entry replaced
        shaped.set("steps_to_next_obs", steps.unsqueeze(-1))
        output = super().forward(shaped)
        priority_key = self.tensor_keys.priority
        tensordict.set(priority_key, shaped.get(priority_key), inplace=priority_key in tensordict.keys())  # noqa: SIM118
        return output


def make_target_updater(loss_module: LossModule, update_interval: int, tau: float = 1.0) -> TargetNetUpdater:
    """The target-network updater of a loss module with target parameters.

    Args:
        loss_module: e.g. a ``DQNLoss`` built with ``delay_value=True``.
        update_interval: with ``tau == 1``, copy the online parameters into the target every
            ``update_interval``-th call of ``step()``.
        tau: below 1, Polyak-average the target towards the online parameters by ``tau`` at every call instead.
    """
    if tau < 1:
        return ForeachSoftUpdate(loss_module, tau=tau)
    # TorchRL's HardUpdate copies on the (value_network_update_interval + 1)-th call
    return HardUpdate(loss_module, value_network_update_interval=update_interval - 1)


class NStepReturns(MultiStepTransform):
    """N-step returns for a replay buffer, cut at episode ends (Sutton, 1988; Hessel et al., 2018).

    TorchRL's ``MultiStepTransform`` with one correction: the done flags of a transition are those of the
    last step of its window, so a window that ends in a termination does not bootstrap, and one that ends in
    a truncation bootstraps from the true final observation. Each stored transition then reads

    ``reward = sum_k gamma^k r_{t+k}``, ``next observation = s_{t+m}``, ``steps_to_next_obs = m``,
    ``terminated = terminated_{t+m-1}``, with ``m <= n`` steps that stay inside one episode. ``DQNLoss``
    discounts the bootstrap by ``gamma ** steps_to_next_obs``.

    Call it on each collected batch of shape ``[num_envs, time]`` (``n_step_returns(batch)``, or its inverse
    ``n_step_returns.inv(batch)``, the same): it returns the transitions whose window is complete (the last
    ``n_steps`` wait for the next batch), or None while fewer than ``n_steps + 1`` steps have been seen. With
    ``n_steps=1`` it returns each batch as it is (one-step transitions). :meth:`extend` does that and stores the
    result in a replay buffer. It keeps its window between calls, so it is not a transform to attach to an env
    or a replay buffer: attached to either, it raises.

    Args:
        n_steps: the look-ahead ``n``.
        gamma: discount factor.

    Examples:
        >>> n_step_returns = NStepReturns(3, gamma=0.99)
        >>> for batch in collector:
        ...     n_step_returns.extend(replay_buffer, batch)
    """

    def __init__(self, n_steps: int, gamma: float):
        super().__init__(n_steps, gamma)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        """The n-step transitions of a collected batch (see the class docstring)."""
        return self.inv(tensordict)

    def _call(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise RuntimeError(
            "NStepReturns windows collected batches and keeps state between them: call it on each batch "
            "(n_step_returns.extend(replay_buffer, batch)) instead of attaching it to an env or a replay buffer."
        )

    def extend(self, replay_buffer: ReplayBuffer, batch: TensorDictBase) -> int:
        """Store the n-step transitions of a collected ``[num_envs, time]`` batch in ``replay_buffer`` (only the
        keys the losses read: :data:`TRANSITION_KEYS`, the next action mask if any, ``steps_to_next_obs``).

        Returns:
            The number of transitions stored (0 while the first window is incomplete).
        """
        keys = (*TRANSITION_KEYS, ("next", ACTION_MASK_KEY))
        if self.n_steps == 1:  # one-step transitions are the batch's own
            extend_selected = getattr(replay_buffer, "extend_selected", None)  # training.LeanReplayBuffer's
            if extend_selected is not None:
                extend_selected(batch, keys)
                return batch.numel()
            transitions = flat_select(batch, keys)
        else:
            transitions = self.inv(batch.select(*keys, strict=False))
            if transitions is None:
                return 0
            transitions = transitions.exclude(*N_STEP_WORKING_KEYS).reshape(-1)
        replay_buffer.extend(transitions)
        return transitions.numel()

    def get_extra_state(self) -> dict:
        """The last ``n_steps`` steps of each env, still waiting for their windows (saved by exact resume)."""
        buffer = self._buffer
        return {
            "buffer": None if buffer is None else buffer.to_dict(),
            "batch_size": list(getattr(buffer, "batch_size", [])),
        }

    def set_extra_state(self, state: dict) -> None:
        buffer = state["buffer"]
        self._buffer = None if buffer is None else TensorDict(buffer, batch_size=state["batch_size"])

    def end_episodes(self) -> None:
        """End each env's episode at its last step seen, as a truncation: the pending windows stop there and
        bootstrap from that step's next observation (for a resumed run whose envs start new episodes)."""
        if self._buffer is None:
            return
        self._buffer = self._buffer.clone()  # its tensors may be views of a collected batch
        time_dim = self._buffer.batch_dims - 1
        done = self._buffer.get(("next", "done")).select(time_dim, -1)
        truncated = self._buffer.get(("next", "truncated")).select(time_dim, -1)
        truncated |= ~done  # an episode that had ended stays as it ended
        done.fill_(True)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase | None:
        if self.__dict__.get("_container") is not None:  # attached to an env or a replay buffer: refuse
            self._call(tensordict)
        if self.n_steps == 1:
            return tensordict
        steps = self._append_tensordict(tensordict)
        length = steps.shape[-1]
        if length <= self.n_steps:
            return None
        transitions = _multi_step_func(
            steps,
            done_key="done",
            done_keys=list(DONE_KEYS),
            reward_keys=["reward"],
            mask_key=None,
            n_steps=self.n_steps,
            gamma=self.gamma,
        )
        last_step = torch.arange(length, device=steps.device) + transitions.get("steps_to_next_obs") - 1
        transitions.get("next").update(steps.get("next").select(*DONE_KEYS).gather(-1, last_step))
        return transitions[..., : -self.n_steps]


def prioritized_sampler(capacity: int, alpha: float, beta: float) -> PrioritizedSampler:
    """TorchRL's :class:`~torchrl.data.PrioritizedSampler` (Schaul et al. 2016), or an :class:`InputError` saying
    why not when TorchRL's compiled segment trees did not load (a torch other than the one it was built for)."""
    if prioritized_module.SumSegmentTreeFp32 is None or prioritized_module.MinSegmentTreeFp32 is None:
        raise InputError(
            f"Prioritized replay needs TorchRL's compiled extension (torchrl._torchrl), which did not load with "
            f"torch {torch.__version__}: install the torch this project pins (torch>=2.14,<2.15 with "
            "torchrl==0.14.1), or train without --prioritized (and without --variant rainbow)."
        )
    return PrioritizedSampler(capacity, alpha=alpha, beta=beta)
