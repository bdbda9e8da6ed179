"""Pieces the policy-gradient recipes share: Monte-Carlo returns of complete episodes (bootstrapped at time
limits where a critic is at hand), a state-independent baseline, and a critic head on the actor's torso.

TorchRL's ``A2CLoss`` is ``-log pi(a|s) * advantage`` plus an entropy bonus and a value loss. With
``critic_coeff=None`` it has no value term and never calls its critic, but it still takes a critic module:
REINFORCE and VPG without a learned value hand it a :class:`ReturnBaseline`, the state-independent baseline
they actually use (zero, or a running mean of the returns).
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives.value.functional import reward2go

from agents.gsde import GSDEPolicyNet
from agents.networks import input_encoder
from errors import InputError


class ReturnBaseline(TensorDictModuleBase):
    """A baseline ``b(s)`` that ignores the state: a running mean of the returns of earlier updates.

    Writes ``"state_value"`` (shape ``[*batch, 1]``), like a critic, so that
    ``advantage = return - state_value`` reads the same whichever baseline is used. It starts at 0 and moves
    only when :meth:`update` is called: never updated, it is the zero baseline of plain REINFORCE.

    The mean is the plain average of the batch means seen so far until more than ``1 / rate`` updates have
    been made, then an exponential moving average with weight ``rate`` on the newest batch, so that it follows
    returns that grow as the policy improves. Calling :meth:`update` *after* computing a batch's advantages
    keeps the baseline independent of that batch's actions, so the policy gradient stays unbiased.

    Args:
        rate: weight of the newest batch's mean return once more than ``1 / rate`` batches were seen; in
            (0, 1].

    Examples:
        >>> from tensordict import TensorDict
        >>> baseline = ReturnBaseline(rate=0.5)
        >>> baseline.update(torch.tensor([[2.0], [4.0]]))
        >>> baseline(TensorDict({"observation": torch.zeros(3, 4)}, batch_size=[3]))["state_value"].flatten()
        tensor([3., 3., 3.])
    """

    def __init__(self, rate: float = 0.1):
        super().__init__()
        self.in_keys, self.out_keys = ["observation"], ["state_value"]
        if not 0 < rate <= 1:
            raise InputError(f"The baseline's rate must be in (0, 1], got {rate}.")
        self.rate = rate
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("updates", torch.zeros((), dtype=torch.int64))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        value = self.mean.to(tensordict.device or self.mean.device).expand(*tensordict.batch_size, 1)
        return tensordict.set("state_value", value.clone())

    @torch.no_grad()
    def update(self, returns: torch.Tensor) -> None:
        """Fold the mean of ``returns`` (one batch's returns-to-go) into the baseline."""
        self.updates += 1
        weight = max(self.rate, 1.0 / self.updates.item())
        self.mean += weight * (returns.mean().to(self.mean) - self.mean)


def returns_to_go(
    episodes: TensorDictBase, gamma: float, truncation_values: torch.Tensor | None = None
) -> torch.Tensor:
    """The discounted return-to-go ``G_t = r_t + gamma r_{t+1} + ...`` of every step of complete episodes.

    ``episodes`` holds whole episodes one after another along its only batch dim, as a collector built with
    ``trajs_per_batch=..., traj_format="cat"`` yields them: ``("next", "done")`` is True at the last step of
    each. The sum runs to the end of each episode, whether it terminated or was truncated by a time limit.
    Without ``truncation_values`` a truncated episode's returns are its discounted rewards until the cut (a
    Monte-Carlo return has nothing to bootstrap from); with them (see :func:`truncation_values`) the return
    goes on past the cut as ``gamma * V(s')`` of the observation the time limit cut off, as Spinning Up's VPG
    and Stable-Baselines3's on-policy algorithms bootstrap their timeouts. Computed by TorchRL's ``reward2go``.

    Args:
        episodes: a flat batch with ``("next", "reward")`` and ``("next", "done")`` of shape ``[T, 1]``.
        gamma: discount factor.
        truncation_values: shape ``[T, 1]``: ``V(s_{t+1})`` at the last step of each truncated episode, zero
            elsewhere; added to that step's reward, discounted by ``gamma``.

    Returns:
        A tensor of shape ``[T, 1]``.

    Raises:
        ValueError: the batch is not flat, or its last step does not end an episode (an unfinished episode's
            returns would be cut short silently).

    Examples:
        >>> from tensordict import TensorDict
        >>> done = torch.tensor([[False], [True], [False], [True]])
        >>> episodes = TensorDict({"next": {"reward": torch.ones(4, 1), "done": done}}, batch_size=[4])
        >>> returns_to_go(episodes, gamma=0.5).flatten()
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """
    if episodes.batch_dims != 1:
        raise ValueError(
            f"returns_to_go takes a flat batch of steps, got batch size {tuple(episodes.batch_size)}."
        )
    done = episodes.get(("next", "done"))
    if not done[-1].all():
        raise ValueError("The last step of the batch does not end an episode: pass complete episodes only.")
    reward = episodes.get(("next", "reward"))
    if truncation_values is not None:
        reward = reward + gamma * truncation_values.to(reward)
    return reward2go(reward, done, gamma, time_dim=-2)


@torch.no_grad()
def truncation_values(critic: nn.Module, episodes: TensorDictBase) -> torch.Tensor:
    """``V(s_{t+1})`` from ``critic`` at every step where a time limit cut an episode off (``("next",
    "truncated")`` set, ``("next", "terminated")`` not), zero at every other step: what
    :func:`returns_to_go` bootstraps a truncated episode's returns from.

    Args:
        critic: a module reading the next observation's entries (``in_keys``) and writing ``"state_value"``.
        episodes: a flat batch of complete episodes with ``("next", "reward")``, ``("next", "terminated")`` and,
            from an env with a time limit, ``("next", "truncated")`` (without it nothing is bootstrapped).

    Returns:
        A tensor shaped as ``("next", "reward")``.
    """
    reward = episodes.get(("next", "reward"))
    values = torch.zeros_like(reward)
    truncated = episodes.get(("next", "truncated"), None)
    if truncated is None:
        return values
    cut = (truncated & ~episodes.get(("next", "terminated"))).reshape(-1)
    if cut.any():
        next_steps = episodes.get("next").select(*critic.in_keys)[cut]  # the critic's entries, cut rows only
        values[cut] = critic(next_steps).get("state_value").to(values)
    return values


def make_shared_critic(actor: ProbabilisticActor) -> ValueOperator:
    """A state-value head on the hidden layers of an actor from :func:`agents.make_actor` or
    :func:`agents.make_gsde_actor`.

    The critic reuses (by reference) the actor's observation encoder and every layer of its MLP but the output
    layer, and adds one linear output of its own: actor and critic share their torso, as in the A3C paper
    (Mnih et al., 2016). Gradients of the value loss then shape the features the policy reads.

    Args:
        actor: a ``ProbabilisticActor`` from :func:`agents.make_actor` or :func:`agents.make_gsde_actor` with
            at least one hidden layer.

    Returns:
        A ``ValueOperator`` reading ``"observation"`` and writing ``"state_value"``.

    Raises:
        InputError: the actor has no hidden layer to share.
    """
    network = actor.module[0].module  # nn.Sequential(encoder, MLP, [scale module]) or a GSDEPolicyNet
    mlp = network[1]
    linears = [layer for layer in mlp.modules() if isinstance(layer, nn.Linear)]
    if isinstance(network, GSDEPolicyNet):  # the body already ends in the activated latent features
        if not linears:
            raise InputError(
                "A shared actor-critic network needs at least one hidden layer (--hidden-sizes)."
            )
        torso, width = mlp, linears[-1].out_features
    else:
        if len(linears) < 2:
            raise InputError(
                "A shared actor-critic network needs at least one hidden layer (--hidden-sizes)."
            )
        torso, width = nn.Sequential(*list(mlp)[:-1]), linears[-1].in_features  # all but the output layer
    head = nn.Linear(width, 1, device=linears[-1].weight.device)
    return ValueOperator(nn.Sequential(input_encoder(actor), torso, head), in_keys=["observation"])


__all__ = ["ReturnBaseline", "make_shared_critic", "returns_to_go", "truncation_values"]
