"""Q-value networks and actors for the DQN family, and n-step returns for its replay buffer."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictSequential
from torch import nn
from torchrl.data import Categorical, TensorSpec
from torchrl.data.postprocs.postprocs import _multi_step_func
from torchrl.envs.transforms import MultiStepTransform
from torchrl.modules import MLP, EGreedyModule, NoisyLinear, QValueActor
from torchrl.objectives import HardUpdate, LossModule, SoftUpdate, TargetNetUpdater

from agents.networks import ACTIVATIONS, observation_encoder
from envs.errors import InputError

DONE_KEYS = ("done", "terminated", "truncated")


class DuelingHead(nn.Module):
    """Dueling output layer (Wang et al., 2016, arXiv:1511.06581): ``Q = V + A - mean(A)``.

    Args:
        in_features: width of the features it reads.
        num_actions: number of discrete actions.
        layer_class: ``nn.Linear`` or ``NoisyLinear``.
    """

    def __init__(self, in_features: int, num_actions: int, layer_class: type[nn.Linear] = nn.Linear):
        super().__init__()
        self.value = layer_class(in_features, 1)
        self.advantage = layer_class(in_features, num_actions)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(-1, keepdim=True)


def make_q_network(
    observation_spec: TensorSpec,
    num_actions: int,
    hidden_sizes: Sequence[int] = (256, 256),
    activation: str = "relu",
    dueling: bool = False,
    noisy: bool = False,
    normalize_obs: bool = False,
) -> nn.Sequential:
    """A network mapping observations to one Q-value per action.

    Vector observations go through an MLP (after an optional :class:`~envs.ObservationNormalizer`), images
    through the encoder :func:`agents.networks.observation_encoder` picks for them.

    Args:
        observation_spec: the spec of ``"observation"`` (batched: the leading dim is the number of envs).
        num_actions: number of discrete actions.
        hidden_sizes: widths of the hidden layers.
        activation: ``"relu"``, ``"tanh"``, ``"elu"`` or ``"silu"``.
        dueling: end in separate state-value and advantage streams (:class:`DuelingHead`).
        noisy: use factorised-Gaussian ``NoisyLinear`` layers (Fortunato et al., 2018, arXiv:1706.10295)
            instead of linear ones; their noise is active under ``ExplorationType.RANDOM`` only.
        normalize_obs: put an observation normaliser in front of the network.
    """
    if activation not in ACTIVATIONS:
        raise InputError(f"Unknown activation {activation!r}; choose one of {sorted(ACTIVATIONS)}.")
    encoder, in_features = observation_encoder(observation_spec, normalize_obs)
    layer_class = NoisyLinear if noisy else nn.Linear
    if not dueling:
        body = MLP(
            in_features=in_features,
            out_features=num_actions,
            num_cells=list(hidden_sizes),
            activation_class=ACTIVATIONS[activation],
            layer_class=layer_class,
        )
        return nn.Sequential(encoder, body)
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
    layers.append(DuelingHead(in_features, num_actions, layer_class))
    return nn.Sequential(*layers)


def make_q_actor(
    observation_spec: TensorSpec,
    action_spec: TensorSpec,
    hidden_sizes: Sequence[int] = (256, 256),
    activation: str = "relu",
    dueling: bool = False,
    noisy: bool = False,
    normalize_obs: bool = False,
    epsilon: float = 0.0,
) -> TensorDictSequential:
    """Build an epsilon-greedy Q-value policy for a discrete action spec.

    The policy is a ``QValueActor`` (writing ``"action_value"``, ``"chosen_action_value"`` and the greedy
    ``"action"``) followed by an ``EGreedyModule`` whose ``eps`` buffer is saved with the agent. The
    epsilon-greedy step and noisy layers act only under ``ExplorationType.RANDOM`` (collection); evaluation
    and ``Agent.predict(deterministic=True)`` take the greedy action of the noise-free network.

    Args:
        observation_spec: the spec of ``"observation"`` (batched).
        action_spec: the env's action spec (batched); must be ``Categorical`` (Gymnasium ``Discrete``).
        hidden_sizes, activation, dueling, noisy, normalize_obs: see :func:`make_q_network`.
        epsilon: initial exploration rate of the epsilon-greedy module.

    Returns:
        ``TensorDictSequential(QValueActor, EGreedyModule)``; ``policy[0]`` is the Q-value actor a
        ``DQNLoss`` trains.

    Examples:
        >>> from envs import make_env
        >>> env = make_env("CartPole-v1", num_envs=2)
        >>> policy = make_q_actor(env.observation_spec["observation"], env.action_spec, dueling=True)
        >>> policy(env.reset())["action_value"].shape
        torch.Size([2, 2])
    """
    if not isinstance(action_spec, Categorical):
        raise InputError(
            f"DQN needs a Discrete action space, got a {type(action_spec).__name__} action spec; "
            "for Box (continuous) actions use recipes.ppo."
        )
    num_actions = action_spec.space.n
    network = make_q_network(
        observation_spec, num_actions, hidden_sizes, activation, dueling, noisy, normalize_obs
    )
    single_action_spec = action_spec[0] if action_spec.ndim else action_spec
    q_actor = QValueActor(network, in_keys=["observation"], spec=single_action_spec)
    exploration = EGreedyModule(single_action_spec, eps_init=epsilon, eps_end=epsilon)
    return TensorDictSequential(q_actor, exploration)


def make_target_updater(loss_module: LossModule, update_interval: int, tau: float = 1.0) -> TargetNetUpdater:
    """The target-network updater of a loss module with target parameters.

    Args:
        loss_module: e.g. a ``DQNLoss`` built with ``delay_value=True``.
        update_interval: with ``tau == 1``, copy the online parameters into the target every
            ``update_interval``-th call of ``step()``.
        tau: below 1, Polyak-average the target towards the online parameters by ``tau`` at every call instead.
    """
    if tau < 1:
        return SoftUpdate(loss_module, tau=tau)
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

    Call it on each collected batch of shape ``[num_envs, time]``: it returns the transitions whose window is
    complete (the last ``n_steps`` wait for the next batch), or None while fewer than ``n_steps + 1`` steps
    have been seen.

    Args:
        n_steps: the look-ahead ``n``.
        gamma: discount factor.
    """

    def __init__(self, n_steps: int, gamma: float):
        super().__init__(n_steps, gamma)

    def _inv_call(self, tensordict: TensorDictBase) -> TensorDictBase | None:
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
