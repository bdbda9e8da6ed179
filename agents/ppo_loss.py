"""TorchRL's ``ClipPPOLoss`` with its actor and critic called on the observation tensor.

``ClipPPOLoss.forward`` copies the minibatch, runs the actor's three TensorDict modules to get the distribution,
the critic's to get the value, and reduces a TensorDict of outputs with ``named_apply``: with 64-unit networks
and 64-sample minibatches that bookkeeping is most of a gradient step's forward pass. :class:`TensorClipPPOLoss`
keeps everything else of the parent (construction, parameters, keys, the clip bounds, advantage standardisation,
entropy, value clipping, reduction and masks, all through the parent's own tensor-level methods) and computes the
same losses, from the same random draws, with the networks called directly; a configuration it does not cover
(functional parameters, a delayed actor, importance-ratio caps, advantage scaling, composite or other policies)
runs the parent's forward unchanged. Tests check losses and gradients against the parent's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.modules import set_recurrent_mode
from torchrl.modules.distributions import TanhNormal
from torchrl.modules.distributions.utils import is_dynamo_compiling
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.utils import _clip_value_loss, distance_loss

from agents.actor_critic import SharedBuffers
from agents.fast_paths import LeanActor, lean_policy, unrolled


@dataclass
class _Networks:
    """The plain modules the loss calls (kept outside ``nn.Module`` registration: the loss's state dict and
    parameters stay the parent's): the actor, and the critic's network as :func:`agents.fast_paths.unrolled`
    runs it."""

    actor: LeanActor
    critic: Callable[..., torch.Tensor]


class TensorClipPPOLoss(SharedBuffers, ClipPPOLoss):
    """``ClipPPOLoss`` computed on tensors (same constructor, outputs and gradients; see the module docstring).

    Args:
        diagnostics: also return the parent's importance-weight diagnostics (``"ESS"``, ``"max_ratio"``,
            ``"mean_ratio"``); False leaves out these and nothing else (with ``log_explained_variance=False``, the
            explained variance too): a loop that logs neither saves their dozen small operations per step.
        args, kwargs: ``ClipPPOLoss``'s.
    """

    def __init__(self, *args, diagnostics: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.diagnostics = diagnostics
        self._networks = self._direct_networks()
        self._squashed = (
            any(  # a tanh-normal policy, whose collected actions rescore_squashed_actions scores again
                getattr(module, "distribution_class", None) is TanhNormal
                for module in self.actor_network.modules()
            )
        )

    def _direct_networks(self) -> _Networks | None:
        actor = lean_policy(self.actor_network)
        critic = self.critic_network
        covered = (
            isinstance(actor, LeanActor)
            and not self.functional
            and not self.delay_actor
            and getattr(self, "max_importance_ratio", None) is None
            and getattr(self, "advantage_norm", None) is None
            and getattr(self, "_entropy_coeff_map", None) is None
            and isinstance(critic, TensorDictModule)
            and list(critic.in_keys) == [actor.network_in_key]
            and list(critic.out_keys) == [self.tensor_keys.value]
            and self.tensor_keys.action == actor.action_key
            and self.tensor_keys.sample_log_prob == actor.log_prob_key
        )
        return _Networks(actor, unrolled(critic.module)) if covered else None

    @torch.no_grad()
    def rescore_squashed_actions(self, batch: TensorDictBase, sequences: bool = False) -> None:
        """For a tanh-normal policy, replace the log-probabilities its collector stored with the policy's
        log-probability of the stored actions, computed as :meth:`forward` computes it, so that every importance
        ratio of the first epoch is exactly 1. The collector scores its pre-tanh draw; the loss can only score the
        action, through atanh of the action clamped inside the bounds, and for a draw past the clamp (``|x| >
        7.2``, a policy pushing against its bounds) the two differ: with a pre-tanh mean of 6 and scale 1, 4% of
        the ratios would start more than 20% from 1 and be clipped for no reason. Call it on a collected batch,
        before any update and before the observation statistics move; it does nothing for other policies.

        Args:
            batch: the collected transitions, of any batch shape; with ``sequences``, ``[sequences, steps]`` of
                a recurrent policy, each sequence starting from its stored state.
            sequences: score the batch as the loss scores a recurrent policy's minibatches: in recurrent mode
                (``torchrl.modules.set_recurrent_mode``), each sequence unrolled from its stored state.
        """
        if not self._squashed:
            return
        keys = self.tensor_keys
        if sequences:
            if batch.ndim != 2:
                raise ValueError(
                    f"sequences=True scores [sequences, steps] batches; this one is {batch.shape}."
                )
            with set_recurrent_mode(True):
                log_prob = self.actor_network.get_dist(batch.copy()).log_prob(batch.get(keys.action))
            batch.set(keys.sample_log_prob, log_prob.reshape(batch.get(keys.sample_log_prob).shape))
            return
        flat = batch.reshape(-1)  # one batch dim, as the loss's minibatches have
        action = flat.get(keys.action)
        if self._networks is not None:
            actor = self._networks.actor
            log_prob = actor.log_prob(flat.get(actor.network_in_key), action)
        else:
            log_prob = self.actor_network.get_dist(flat.copy()).log_prob(action)
        batch.set(keys.sample_log_prob, log_prob.reshape(batch.get(keys.sample_log_prob).shape))

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        keys = self.tensor_keys
        advantage = tensordict.get(keys.advantage, None)
        if self._networks is None or advantage is None:
            return super().forward(tensordict)
        actor, critic = self._networks.actor, self._networks.critic
        advantage = self._maybe_normalize_advantage(advantage, tensordict, update_norm=False)
        observation = tensordict.get(actor.network_in_key)
        prev_log_prob = tensordict.get(keys.sample_log_prob)
        if prev_log_prob.requires_grad:
            raise RuntimeError(f"tensordict stored {keys.sample_log_prob} requires grad.")
        action = tensordict.get(keys.action)
        if action.requires_grad:
            raise RuntimeError(f"tensordict stored {keys.action} requires grad.")

        # the policy's log-probability of the collected actions, as _log_weight computes it, and where the entropy
        # is needed too, the entropy (a categorical or Gaussian policy's) or the distribution to take it from
        if self.entropy_bonus:
            log_prob, entropy = actor.log_prob_and_entropy(observation, action)
        else:
            log_prob, entropy = actor.log_prob(observation, action), None
        log_weight = (log_prob - prev_log_prob).unsqueeze(-1)
        kl_approx = (prev_log_prob - log_prob).unsqueeze(-1)
        gain1 = log_weight.exp() * advantage
        log_weight_clip = log_weight.clamp(*self._clip_bounds)
        clip_fraction = (log_weight_clip != log_weight).to(log_weight.dtype).mean()
        gain2 = log_weight_clip.exp() * advantage
        gain = torch.stack([gain1, gain2], -1).min(dim=-1).values
        outputs = {
            "loss_objective": -gain,
            "clip_fraction": clip_fraction,
            "kl_approx": kl_approx.detach().mean(),
        }
        if self.entropy_bonus:
            entropy = self._entropy(entropy, observation, adv_shape=advantage.shape[:-1])
            outputs["entropy"] = entropy.detach().mean()
            outputs["loss_entropy"] = self._weighted_loss_entropy(entropy)
        if self._has_critic:
            outputs |= self._critic_outputs(tensordict, critic(observation))
        if self.diagnostics:
            with torch.no_grad():
                lw = log_weight.squeeze(-1)
                ess = (2 * lw.logsumexp(0) - (2 * lw).logsumexp(0)).exp()
                outputs["ESS"] = ess / log_weight.shape[0]
                ratio = log_weight.exp()
                outputs["max_ratio"], outputs["mean_ratio"] = ratio.max(), ratio.mean()
        for name, value in outputs.items():
            if name.startswith("loss_"):
                outputs[name] = self._reduce_loss(value, tensordict).squeeze(-1)
        return TensorDict(outputs)

    def _entropy(
        self,
        entropy: torch.Tensor | torch.distributions.Distribution,
        observation: torch.Tensor,
        adv_shape: torch.Size,
    ) -> torch.Tensor:
        """What the parent's ``_get_entropy`` returns: a closed-form entropy as it is where finite (the parent
        keeps that too), otherwise the parent's own answer from the distribution (a sampled estimate where the
        closed form is not finite or, under ``torch.compile``, always)."""
        if isinstance(entropy, torch.Tensor):
            if not is_dynamo_compiling() and entropy.isfinite().all():
                return entropy.unsqueeze(-1)
            entropy = self._networks.actor.distribution(observation)
        return self._get_entropy(entropy, adv_shape=adv_shape)

    def _critic_outputs(
        self, tensordict: TensorDictBase, state_value: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """``loss_critic`` (and the value clip fraction and explained variance) as the parent's ``loss_critic``
        computes them from ``state_value``."""
        keys = self.tensor_keys
        target_return = tensordict.get(keys.value_target, None)
        if target_return is None:
            raise KeyError(f"the key {keys.value_target} was not found in the input tensordict.")
        if self.separate_losses:
            target_return = target_return.detach()
        loss_value = distance_loss(target_return, state_value, loss_function=self.loss_critic_type)
        outputs = {"loss_critic": None}  # first, as the parent's order of entries
        if self.clip_value:
            old_state_value = tensordict.get(keys.value, None)
            if old_state_value is None:
                raise KeyError(f"clip_value needs the key {keys.value} in the input tensordict.")
            loss_value, outputs["value_clip_fraction"] = _clip_value_loss(
                old_state_value,
                state_value,
                self.clip_value,
                target_return,
                loss_value,
                self.loss_critic_type,
            )
        if self.log_explained_variance:
            with torch.no_grad():
                target, prediction = target_return.detach(), state_value.detach()
                eps = torch.finfo(target.dtype).eps
                residual = torch.var(target - prediction, correction=0, dim=0)
                total = torch.var(target, correction=0, dim=0)
                outputs["explained_variance"] = 1.0 - residual / (total + eps)
        outputs["loss_critic"] = self.critic_coeff * loss_value
        return outputs
