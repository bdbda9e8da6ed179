"""Extra policy-loss terms for the on-policy recipes, such as a KL penalty towards a reference policy.

A loss add-on is a module, typically a TorchRL ``LossModule``, that takes a training minibatch (a TensorDict with
``"observation"``, ``"action"``, ...) and returns a TensorDict of scalars: every entry named ``loss_*`` is added to
the loss the recipe optimises, and every entry is logged as ``train/addon<i>_<name>``. An add-on usually needs the
actor being trained, which the recipe builds, so recipes take add-on *factories*: callables that receive the actor
and return the module::

    from functools import partial
    from agents import Agent, KLPenalty
    from recipes import ppo

    reference = Agent.load("runs/pretrained/agent.ckpt").policy
    ppo.main(ppo.PPOConfig(), loss_addons=[partial(KLPenalty, reference_actor=reference, coef=0.1)])

Parameters of an add-on that require gradients (a learned multiplier, say) join the recipe's optimizer; the
actor's are there already. From the command line, :class:`LossAddonConfig` (``--kl-to RUN --kl-coef 0.1``) gives the
KL penalty to PPO, A2C, RND-PPO, REINFORCE, VPG and SAC.
"""

from __future__ import annotations

import copy
import functools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torch.distributions.kl import _dispatch_kl
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import LossModule

from agents.options import Options
from agents.recurrent import is_recurrent
from errors import InputError

LossAddon = Callable[[ProbabilisticActor], nn.Module]
"""A factory: given the actor being trained, return a module mapping a minibatch to a TensorDict of ``loss_*``
terms (and other scalars to log)."""


def build_loss_addons(factories: Sequence[LossAddon], actor: ProbabilisticActor) -> nn.ModuleList:
    """Call each factory with the actor and check that it gave a module.

    Raises:
        InputError: a factory returned something other than a ``torch.nn.Module``.
    """
    addons = nn.ModuleList()
    for factory in factories:
        addon = factory(actor)
        if not isinstance(addon, nn.Module):
            raise InputError(
                f"A loss add-on factory returned {type(addon).__name__}, not a torch.nn.Module: pass callables "
                "that take the actor and return a module, e.g. functools.partial(KLPenalty, reference_actor=..., "
                "coef=...)."
            )
        addons.append(addon)
    return addons


def addon_losses(
    addons: Iterable[nn.Module], minibatch: TensorDictBase
) -> tuple[torch.Tensor | float, TensorDict]:
    """Run every add-on on a minibatch.

    Returns:
        The sum of every add-on's ``loss_*`` terms (0.0 when there are none), and all their outputs, detached, named
        ``addon<i>_<name>`` for logging.

    Raises:
        InputError: an add-on returned a ``loss_*`` term that is not a scalar.
    """
    total: torch.Tensor | float = 0.0
    logged = {}
    for index, addon in enumerate(addons):
        for name, value in addon(minibatch).items():
            if name.startswith("loss_"):
                if value.ndim != 0:
                    raise InputError(
                        f"Loss add-on {type(addon).__name__} returned {name} of shape {tuple(value.shape)}; loss "
                        "terms must be scalars (reduce them, e.g. with .mean())."
                    )
                total = total + value
            logged[f"addon{index}_{name}"] = value.detach()
    return total, TensorDict(logged)


def trainable_parameters(*modules: nn.Module) -> list[nn.Parameter]:
    """The parameters of ``modules`` that require gradients, each once (modules may share networks)."""
    seen: set[int] = set()
    parameters = []
    for module in modules:
        for parameter in module.parameters():
            if parameter.requires_grad and id(parameter) not in seen:
                seen.add(id(parameter))
                parameters.append(parameter)
    return parameters


def split_parameters(
    first: list[nn.Module], rest: list[nn.Module]
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """The trainable parameters of the ``first`` modules, and those of the ``rest`` that are not among them: e.g.
    an actor's and a critic's, for separate learning rates when the loss module holds both (a shared encoder
    goes with the first)."""
    first_parameters = trainable_parameters(*first)
    seen = {id(parameter) for parameter in first_parameters}
    return first_parameters, [
        parameter for parameter in trainable_parameters(*rest) if id(parameter) not in seen
    ]


class KLPenalty(LossModule):
    """Penalise the divergence of the trained policy from a fixed reference policy.

    The penalty is ``coef * KL(pi(.|s) || pi_ref(.|s))``, averaged over the minibatch's observations, with the
    KL in closed form (categorical and tanh-normal policies). It pulls the policy back towards the reference:
    fine-tuning a pretrained agent without forgetting it, or regularising towards a prior behaviour.

    Keys: reads the actors' input keys (``"observation"``); writes ``"loss_kl"`` (the weighted penalty) and
    ``"kl"`` (the mean KL, detached).

    Args:
        actor: the policy being trained (the recipe passes it).
        reference_actor: the policy to stay near, with the same action space. It is copied and frozen: the
            reference never changes, even if the module passed in is trained afterwards.
        coef: weight of the penalty (>= 0).

    Examples:
        >>> from functools import partial
        >>> from envs import make_env
        >>> from agents import make_actor
        >>> env = make_env("CartPole-v1", num_envs=4, seed=0)
        >>> spec = env.observation_spec["observation"]
        >>> actor, reference = make_actor(spec, env.action_spec), make_actor(spec, env.action_spec)
        >>> penalty = KLPenalty(actor, reference, coef=0.5)
        >>> penalty(env.reset())["loss_kl"].backward()  # gradients reach the actor only
        >>> addon = partial(KLPenalty, reference_actor=reference, coef=0.5)  # for main(config, loss_addons=[addon])
    """

    def __init__(self, actor: ProbabilisticActor, reference_actor: ProbabilisticActor, coef: float = 1.0):
        if coef < 0:
            raise InputError(f"KLPenalty coef must be >= 0, got {coef}.")
        current, reference = _distribution_class(actor), _distribution_class(reference_actor)
        if (
            current is not None
            and reference is not None
            and _dispatch_kl(current, reference) is NotImplemented
        ):
            raise InputError(_no_closed_form(current, reference))  # before any frame is collected
        super().__init__()
        self.actor = actor
        self.reference_actor = copy.deepcopy(reference_actor).requires_grad_(False)
        self.coef = coef

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        # strict=False: collected batches lack the actors' private "_" inputs (gSDE's noise), which get_dist ignores
        current = self.actor.get_dist(tensordict.select(*self.actor.in_keys, strict=False))
        with torch.no_grad():
            reference = self.reference_actor.get_dist(
                tensordict.select(*self.reference_actor.in_keys, strict=False)
            )
        try:
            kl = torch.distributions.kl_divergence(current, reference).mean()
        except NotImplementedError:
            raise InputError(_no_closed_form(type(current), type(reference))) from None
        return TensorDict({"loss_kl": self.coef * kl, "kl": kl.detach()})


def _distribution_class(actor: nn.Module) -> type | None:
    """The distribution class of a ``ProbabilisticActor`` (its last module's), if it is a class."""
    modules = getattr(actor, "module", None)
    last = modules[-1] if isinstance(modules, nn.ModuleList) and len(modules) else None
    distribution_class = getattr(last, "distribution_class", None)
    return distribution_class if isinstance(distribution_class, type) else None


def _no_closed_form(current: type, reference: type) -> str:
    return (
        f"KLPenalty needs a closed-form KL between {current.__name__} and {reference.__name__} distributions "
        "(torch.distributions.kl_divergence has none): give the policy the reference's kind of distribution (the same "
        "--use-sde and --squash / --no-squash)."
    )


@dataclass
class LossAddonConfig(Options):
    """Policy-loss add-ons given as options (the command line's way to :class:`KLPenalty`)."""

    kl_to: Path | None = None
    """Add coef * KL(pi || pi_ref) to the policy loss, pi_ref the policy of this agent (a run directory or agent
    checkpoint trained on the same observation and action spaces): fine-tune near a pretrained agent."""
    kl_coef: float = 0.1
    """Weight of the --kl-to penalty."""

    def validate(self) -> None:
        """Raise :class:`InputError` for a negative or non-finite weight."""
        if not (math.isfinite(self.kl_coef) and self.kl_coef >= 0):
            raise InputError(f"--kl-coef must be a finite number >= 0, got {self.kl_coef}.")

    def factories(self, observation_space: Any, action_space: Any) -> list[LossAddon]:
        """The add-on factories these options ask for, for an env with these (single-env) spaces.

        Raises:
            InputError: the --kl-to agent cannot be loaded, acts on other spaces, or has no action distribution.
        """
        if self.kl_to is None:
            return []
        from agents.agent import Agent  # the agent module builds policies from this package's neighbours

        reference = Agent.load(self.kl_to)
        if reference.observation_space != observation_space or reference.action_space != action_space:
            raise InputError(
                f"--kl-to {self.kl_to}: that agent acts on observations {reference.observation_space} and actions "
                f"{reference.action_space}, this run's env on {observation_space} and {action_space}."
            )
        if not isinstance(reference.policy, ProbabilisticActor) or is_recurrent(reference.policy):
            raise InputError(
                f"--kl-to {self.kl_to}: a {reference.algorithm} agent's policy ({type(reference.policy).__name__}) "
                "has no action distribution to compare with; name an agent trained by ppo, a2c, rnd_ppo, "
                "reinforce, vpg or sac."
            )
        return [functools.partial(KLPenalty, reference_actor=reference.policy, coef=self.kl_coef)]


__all__ = [
    "KLPenalty",
    "LossAddon",
    "LossAddonConfig",
    "addon_losses",
    "build_loss_addons",
    "trainable_parameters",
]
