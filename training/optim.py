"""Optimiser options shared by the off-policy actor-critic recipes (SAC, TD3, DDPG), the learning-rate schedule
every recipe's ``--anneal-lr`` uses, and the gradient step's two per-call shortcuts: :class:`LeanAdam` (torch's
fused Adam, stepped without its per-step bookkeeping) and :func:`clip_gradients` (``clip_grad_norm_`` in five
tensor operations)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from agents.options import Options
from errors import check_ranges


@dataclass
class OffPolicyOptimConfig(Options):
    """Adam for the critics (and SAC's entropy coefficient) and for the actor."""

    lr: float = 1e-3
    """Adam learning rate of the critics (SAC: and of the entropy coefficient), and of the actor unless
    --actor-lr is given."""
    actor_lr: float | None = None
    """Adam learning rate of the actor; default: --lr."""
    adam_eps: float = 1e-8
    """Adam's epsilon."""
    max_grad_norm: float = math.inf
    """Clip the actor's and the critics' gradient norms to this value, each on its own (inf: no clipping, as in
    the papers)."""
    anneal_lr: bool = False
    """Anneal the learning rates linearly to 0 over the budget (RL Zoo's lin_ schedules)."""

    def validate(self) -> None:
        check_ranges(
            lr=(self.lr, "(0, inf)"),
            actor_lr=(self.actor_lr, "(0, inf)"),
            adam_eps=(self.adam_eps, "(0, inf)"),
            max_grad_norm=(self.max_grad_norm, "> 0"),
        )

    @property
    def actor_learning_rate(self) -> float:
        return self.lr if self.actor_lr is None else self.actor_lr

    def adam(self, parameters: Iterable[torch.nn.Parameter], actor: bool = False) -> torch.optim.Adam:
        """An Adam optimiser of these options, at the actor's learning rate if ``actor``: :func:`fused_adam`."""
        return fused_adam(parameters, lr=self.actor_learning_rate if actor else self.lr, eps=self.adam_eps)


def fused_adam(parameters: Iterable[torch.nn.Parameter] | Iterable[dict], **kwargs) -> torch.optim.Adam:
    """Adam (``torch.optim.Adam``'s keyword arguments), fused (one kernel for all tensors) where every parameter
    is on a CPU or CUDA device: 0.18 ms a step instead of 0.45 ms for SAC's twin 256-unit critics on one CPU
    thread, with the same update. A :class:`LeanAdam`, so that the step skips Adam's per-step bookkeeping."""
    parameters = list(parameters)
    tensors = [
        tensor for entry in parameters for tensor in (entry["params"] if isinstance(entry, dict) else [entry])
    ]
    fused = all(tensor.device.type in ("cpu", "cuda") for tensor in tensors)
    return LeanAdam(parameters, fused=fused, **kwargs) if fused else torch.optim.Adam(parameters, **kwargs)


class LeanAdam(torch.optim.Adam):
    """``torch.optim.Adam(fused=True)`` whose ``step`` calls the fused kernel itself.

    Adam's ``step`` regroups the tensors by device and dtype, checks each parameter's state and options, bumps
    each parameter's step counter on its own and wraps the kernel in several context managers on every call:
    about 0.1 ms a step on a 2-core CPU, more than the kernel's own work for a 256x256 network. Once each
    parameter with a gradient has its state (after the first step) and while a group is on one device and dtype,
    with a float learning rate and neither ``capturable``, ``differentiable``, AMP's gradient scale, a closure,
    step hooks nor a running profiler, this ``step`` does what Adam's fused path does: it adds one to the step
    counters and calls ``_fused_adam_`` (or ``_fused_adamw_``) with the group's options; the parameters, moments
    and counters end as Adam's leave them (tests compare them). Every other case, the first step included, is
    Adam's own step, hooks and profiler label included.

    Where every parameter of a group has a gradient (tensors that need none, such as buffers handed over with a
    network's parameters, are left out, as Adam leaves them), the group's step counters are views of one tensor,
    bumped by one addition, and the tensors the kernel takes are kept from step to step (checked against the state
    by identity, rebuilt when the state changes, as ``load_state_dict`` does). ``state_dict`` gives each counter as a
    tensor of its own, as Adam's. :meth:`clip_and_step` also folds gradient-norm clipping into the kernel.
    """

    def __init__(self, params, **kwargs):
        if not kwargs.get("fused"):
            raise ValueError("LeanAdam is the fused Adam: pass fused=True (torch.optim.Adam otherwise).")
        super().__init__(params, **kwargs)
        self._plans: list[_GroupPlan | None] = []
        self.register_state_dict_post_hook(_separate_step_counters)

    def step(self, closure=None):
        if closure is not None or self._observed():
            return self._adam_step(closure)
        groups = self._lean_groups()
        if groups is None:
            return self._adam_step(closure)
        self._run(groups, None)
        return None

    # torch wraps an optimizer class's step once, for step hooks and the profiler's label; _adam_step runs the
    # wrapped step whenever either is in use
    step.hooked = True

    def clip_and_step(self, max_norm: float) -> torch.Tensor:
        """:func:`clip_gradients` on all the optimizer's parameters, then :meth:`step`; returns the gradients'
        norm before clipping. On the shortcut, the kernel divides the gradients by ``max(1, norm / max_norm)``
        as it reads them (the same update as multiplying them by ``min(1, max_norm / norm)`` first, up to
        rounding) and writes the clipped gradients back, as ``clip_grad_norm_`` leaves them (the CPU kernel, which
        the tests check, does); elsewhere it is ``clip_gradients`` then ``step``."""
        groups = None if self._observed() else self._lean_groups()
        if groups is not None:
            grads = [grad for _, tensors, _ in groups for grad in tensors[1]]
            # each group's tensors share one device and dtype (_group_tensors); the groups must share them too
            kinds = {(tensors[0][0].device, tensors[0][0].dtype) for _, tensors, _ in groups if tensors[0]}
            if grads and kinds == {(grads[0].device, torch.float32)}:
                with torch.no_grad():
                    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
                    scale = torch.clamp((total_norm + 1e-6) / float(max_norm), min=1.0)
                self._run(groups, scale)
                return total_norm
        return _clip_then_step(self, max_norm)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Adam's ``zero_grad``; with ``set_to_none`` (the default) each gradient is dropped directly."""
        if not set_to_none:
            return super().zero_grad(set_to_none)
        for group in self.param_groups:
            for parameter in group["params"]:
                parameter.grad = None
        return None

    def _observed(self) -> bool:
        """Whether step hooks, a profiler or AMP's gradient scale need Adam's own step."""
        return bool(
            self._optimizer_step_pre_hooks
            or self._optimizer_step_post_hooks
            or _global_optimizer_pre_hooks
            or _global_optimizer_post_hooks
            or torch.autograd._profiler_enabled()
            or getattr(self, "grad_scale", None) is not None
        )

    def _adam_step(self, closure):
        """Adam's step, with torch's wrapper for step hooks and the profiler."""
        step = torch.optim.Adam.step
        if not getattr(step, "hooked", False):  # no Adam made yet: its class's step is not wrapped yet
            step = torch.optim.Optimizer.profile_hook_step(step)
        return step(self, closure)

    def _run(self, groups: list, grad_scale: torch.Tensor | None) -> None:
        with torch.no_grad():
            for group, (params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps), plan in groups:
                if not params:
                    continue
                if plan is not None:
                    plan.counters.add_(1)
                else:
                    torch._foreach_add_(state_steps, 1)
                beta1, beta2 = group["betas"]
                kernel = torch._fused_adamw_ if group["decoupled_weight_decay"] else torch._fused_adam_
                kernel(
                    params,
                    grads,
                    exp_avgs,
                    exp_avg_sqs,
                    max_exp_avg_sqs,
                    state_steps,
                    amsgrad=group["amsgrad"],
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=group["maximize"],
                    grad_scale=grad_scale,
                    found_inf=None,
                )

    def _lean_groups(self) -> list | None:
        """Per group: the group, the tensors the kernel takes (:meth:`_group_tensors`) and the group's
        :class:`_GroupPlan` where every parameter that needs a gradient has one; None where Adam's own step must run."""
        if len(self._plans) != len(self.param_groups):
            self._plans = [None] * len(self.param_groups)
        groups = []
        for index, group in enumerate(self.param_groups):
            plan = self._plans[index]
            tensors = None if plan is None else plan.tensors(self.state, group)
            if tensors is None:
                plan = None
                tensors = self._group_tensors(group)
                if tensors is None:
                    return None
                if tensors[0] and all(
                    parameter.grad is not None or not parameter.requires_grad for parameter in group["params"]
                ):
                    plan = self._plans[index] = _GroupPlan(self.state, group, tensors)
                    tensors = (*tensors[:5], plan.steps)  # the counters now live in the plan's tensor
            groups.append((group, tensors, plan))
        return groups

    def _group_tensors(self, group: dict) -> tuple[list[torch.Tensor], ...] | None:
        """The group's parameters with a gradient, their gradients, moments and step counters, or None where
        Adam's own step must run (a parameter without state, several devices or dtypes, options the shortcut
        does not cover)."""
        if not _lean_options(group):
            return None
        amsgrad = group["amsgrad"]
        params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = [], [], [], [], [], []
        device = dtype = None
        for parameter in group["params"]:
            grad = parameter.grad
            if grad is None:
                continue
            state = self.state.get(parameter)
            if not state or grad.is_sparse or parameter.is_complex():
                return None
            if device is None:
                device, dtype = parameter.device, parameter.dtype
            elif parameter.device != device or parameter.dtype != dtype:
                return None
            params.append(parameter)
            grads.append(grad)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
            if amsgrad:
                max_exp_avg_sqs.append(state["max_exp_avg_sq"])
            state_steps.append(state["step"])
        if device is not None and device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None  # Adam's step raises its error for a capture without capturable=True
        return params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps


def _lean_options(group: dict) -> bool:
    """Whether a parameter group's options are ones the shortcut covers."""
    return bool(group["fused"]) and not (
        group["capturable"]
        or group["differentiable"]
        or isinstance(group["lr"], torch.Tensor)
        or isinstance(group["betas"][0], torch.Tensor)
        or isinstance(group["betas"][1], torch.Tensor)
    )


class _GroupPlan:
    """The kernel's tensors for a group whose every parameter that needs a gradient has one, kept from step to
    step.

    Built from :meth:`LeanAdam._group_tensors`' tensors; it makes the group's step counters views of one tensor
    (``counters``), so that one addition bumps them all.
    """

    def __init__(self, state: dict, group: dict, tensors: tuple[list[torch.Tensor], ...]):
        params, _, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps = tensors
        self.state, self.group, self.group_params = state, group, group["params"]
        # tensors that need no gradient (buffers handed over with a network's parameters): skipped, as Adam does
        self.idle = [parameter for parameter in group["params"] if parameter.grad is None]
        self.params, self.exp_avgs, self.exp_avg_sqs, self.max_exp_avg_sqs = (
            params,
            exp_avgs,
            exp_avg_sqs,
            max_exp_avg_sqs,
        )
        self.counters = torch.stack(state_steps)
        self.entries = [state[parameter] for parameter in params]
        for index, entry in enumerate(self.entries):
            entry["step"] = self.counters[index]
        self.steps = [entry["step"] for entry in self.entries]
        self.device = params[0].device

    def tensors(self, state: dict, group: dict) -> tuple[list[torch.Tensor], ...] | None:
        """The kernel's tensors for this step, or None where the plan no longer holds (another state or group,
        a parameter without a gradient or a skipped tensor with one, a state entry replaced) or the group's
        options need Adam's step."""
        if (
            state is not self.state
            or group is not self.group
            or group["params"] is not self.group_params
            or len(self.group_params) != len(self.params) + len(self.idle)
            or not _lean_options(group)
            or any(parameter.grad is not None for parameter in self.idle)
        ):
            return None
        grads = []
        for parameter, entry, counter in zip(self.params, self.entries, self.steps, strict=True):
            grad = parameter.grad
            if grad is None or state.get(parameter) is not entry or entry.get("step") is not counter:
                return None
            grads.append(grad)
        if self.device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        return self.params, grads, self.exp_avgs, self.exp_avg_sqs, self.max_exp_avg_sqs, self.steps


def _separate_step_counters(optimizer: torch.optim.Optimizer, state_dict: dict) -> dict:
    """``state_dict`` with each step counter a tensor of its own (LeanAdam keeps a group's counters as views of
    one tensor), as Adam's."""
    state_dict["state"] = {
        key: {**entry, "step": entry["step"].clone()}
        if isinstance(entry.get("step"), torch.Tensor) and entry["step"]._is_view()
        else entry
        for key, entry in state_dict["state"].items()
    }
    return state_dict


def clip_and_step(optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Clip the gradients of all of ``optimizer``'s parameters to a total 2-norm of ``max_norm``, then step it;
    returns the norm before clipping. :meth:`LeanAdam.clip_and_step` (the clipping in the kernel) for a
    :class:`LeanAdam`, :func:`clip_gradients` then ``step`` for any other optimizer."""
    if isinstance(optimizer, LeanAdam):
        return optimizer.clip_and_step(max_norm)
    return _clip_then_step(optimizer, max_norm)


def _clip_then_step(optimizer: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    total_norm = clip_gradients([p for group in optimizer.param_groups for p in group["params"]], max_norm)
    optimizer.step()
    return total_norm


def clip_gradients(parameters: Iterable[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(parameters, max_norm)`` (2-norm): scale the gradients in place so that
    their total norm is at most ``max_norm``; returns the norm before clipping. The same operations on the
    same values where the gradients share one device and dtype (``_foreach_norm``, the norm of their stack,
    the clamped coefficient, ``_foreach_mul_``), without the regrouping and checks of torch's function, which
    runs every other case."""
    parameters = list(parameters)
    grads = [parameter.grad for parameter in parameters if parameter.grad is not None]
    if (
        not grads
        or grads[0].device.type not in ("cpu", "cuda")
        or any(
            type(grad) is not torch.Tensor or grad.device != grads[0].device or grad.dtype != grads[0].dtype
            for grad in grads
        )
    ):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    with torch.no_grad():
        total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
        torch._foreach_mul_(grads, torch.clamp(float(max_norm) / (total_norm + 1e-6), max=1.0))
    return total_norm


def anneal_learning_rates(
    optimizers: Sequence[torch.optim.Optimizer], learning_rates: Sequence[float], progress: float
) -> None:
    """Set each optimizer's learning rate to its initial one times ``1 - progress`` (``progress`` in [0, 1], the
    fraction of the budget spent): the linear schedule of ``--anneal-lr``."""
    scale = 1.0 - min(max(progress, 0.0), 1.0)
    for optimizer, learning_rate in zip(optimizers, learning_rates, strict=True):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate * scale
