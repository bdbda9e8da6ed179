"""Checks of the training state read from ``resume.ckpt`` (:class:`training.state.TrainingState`): a checkpoint may
be damaged or forged, so every value that the run would index, divide or allocate by is checked before it is used,
and a misfit raises :class:`InputError` naming it."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.data import PrioritizedSampler, ReplayBuffer

from errors import INT64_MAX, InputError


class Maybe:
    """In a form for :func:`check_form`: None, or a value of the form ``form``."""

    def __init__(self, form: Any):
        self.form = form


class Count:
    """In a form for :func:`check_form`: a whole number from 0 to the largest 64-bit integer (a frame count, a
    frame number to act at)."""


def check_form(saved: Any, form: Any, where: str) -> None:
    """Raise :class:`InputError` unless ``saved`` (read from a checkpoint) has the form of ``form``: a fresh run's
    own state, or a template. Mappings are checked key by key for the keys both hold, tuples item by item, lists
    item by item against the form's first item, tensors and arrays by dtype and shape (any shape where the form's
    is empty: a buffer sized by the first batch), numbers as numbers (a whole number where the form holds one;
    never NaN), text and flags by type. None in ``form`` admits anything; :class:`Maybe` admits None or its form,
    :class:`Count` a whole number from 0 to ``INT64_MAX``."""
    if isinstance(form, Maybe):
        if saved is not None:
            check_form(saved, form.form, where)
        return
    if form is None:
        return
    if isinstance(form, dict):
        fits = isinstance(saved, dict)
        if fits:
            for key in form.keys() & saved.keys():
                check_form(saved[key], form[key], f"{where}.{key}")
    elif isinstance(form, (tuple, list)):
        fits = isinstance(saved, (tuple, list)) and (isinstance(form, list) or len(saved) == len(form))
        for index, item in enumerate(saved if fits else ()):
            check_form(
                item,
                form[index] if isinstance(form, tuple) else form[0] if form else None,
                f"{where}[{index}]",
            )
    elif isinstance(form, (torch.Tensor, np.ndarray)):
        fits = (
            type(saved) is type(form)
            and saved.dtype == form.dtype
            and (saved.shape == form.shape or math.prod(form.shape) == 0)  # empty: sized by the first batch
        )
    elif isinstance(form, Count):
        fits = (
            isinstance(saved, (int, np.integer)) and not isinstance(saved, bool) and 0 <= saved <= INT64_MAX
        )
        if not fits:
            raise InputError(
                f"{where} holds {saved!r:.60} where this run keeps a count from 0 to {INT64_MAX:,}"
            )
    elif isinstance(form, bool):
        fits = isinstance(saved, bool)
    elif isinstance(form, (int, np.integer)):
        fits = isinstance(saved, (int, np.integer)) and not isinstance(saved, bool)
    elif isinstance(form, (float, np.floating)):
        fits = (
            isinstance(saved, (int, float, np.integer, np.floating))
            and not isinstance(saved, bool)
            and not math.isnan(saved)  # no count, return or option a run keeps is NaN
        )
    else:
        fits = type(saved) is type(form)
    if not fits:
        found = (
            f"{type(saved).__name__} {tuple(saved.shape)}" if hasattr(saved, "shape") else repr(saved)[:60]
        )
        expected = (
            f"{type(form).__name__} {tuple(form.shape)}" if hasattr(form, "shape") else type(form).__name__
        )
        raise InputError(f"{where} holds {found} where this run keeps {expected}")


# per-parameter optimizer state that is a running mean of squares: never negative (its square root divides)
SQUARES = {"exp_avg_sq", "max_exp_avg_sq", "square_avg"}


def check_optimizer_state(optimizer: torch.optim.Optimizer, name: str) -> None:
    """Raise :class:`InputError` unless every loaded per-parameter state holds what ``optimizer``'s step reads
    (Adam's moments, RMSprop's average, as the group's options ask) with its parameter's shape, finite, and
    running means of squares and step counts not negative, and each group's learning rate is a finite number
    of at least 0."""
    for group in optimizer.param_groups:
        lr = group["lr"]
        lr = lr.item() if isinstance(lr, torch.Tensor) and lr.numel() == 1 else lr
        if not isinstance(lr, (int, float)) or isinstance(lr, bool) or not 0 <= lr < math.inf:
            raise InputError(f"the {name} optimizer's learning rate is {lr!r:.40}, not a finite number >= 0")
        required = {"step"}
        if isinstance(optimizer, torch.optim.Adam):
            required |= {"exp_avg", "exp_avg_sq"} | ({"max_exp_avg_sq"} if group.get("amsgrad") else set())
        elif isinstance(optimizer, torch.optim.RMSprop):
            required |= {"square_avg"} | ({"grad_avg"} if group.get("centered") else set())
            required |= {"momentum_buffer"} if group.get("momentum", 0) > 0 else set()
        else:
            required = set()
        for parameter in group["params"]:
            state = optimizer.state.get(parameter)
            if not state:
                continue  # a parameter the run has not stepped yet
            if missing := required - state.keys():
                raise InputError(f"the {name} optimizer's state lacks {sorted(missing)} for a parameter")
            for key, value in state.items():
                if not isinstance(value, torch.Tensor):
                    continue
                if key != "step" and value.shape != parameter.shape:
                    raise InputError(
                        f"the {name} optimizer's {key} has shape {tuple(value.shape)} for a parameter of shape "
                        f"{tuple(parameter.shape)}"
                    )
                if value.is_floating_point() and (
                    not torch.isfinite(value).all() or (key in SQUARES | {"step"} and (value < 0).any())
                ):
                    raise InputError(f"the {name} optimizer's {key} holds NaN, Inf or a negative value")


def checked_count(value: Any, what: str, minimum: int = 0) -> int:
    """``value`` if it is a whole number of at least ``minimum``; :class:`InputError` naming ``what`` otherwise."""
    if not isinstance(value, int) or isinstance(value, bool) or not minimum <= value <= INT64_MAX:
        raise InputError(f"{what} is {value!r:.40}, not a whole number from {minimum} to {INT64_MAX:,}")
    return value


def check_storage_rows(state: dict[str, Any], capacity: int) -> None:
    """Raise :class:`InputError` unless every row tensor of a saved storage state (its entries; a frame storage's
    frame references) has one row per transition of this run's buffer, ``capacity``."""
    frames = state.get("frames")
    rows = [
        *tensors(state.get("_storage")),
        *tensors(frames.get("refs") if isinstance(frames, dict) else None),
    ]
    for tensor in rows:
        if (tensor.shape[0] if tensor.ndim else 0) != capacity:
            raise InputError(
                f"the replay buffer holds {tensor.shape[0] if tensor.ndim else 0} rows of storage, not its "
                f"capacity {capacity}"
            )


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in ``value``: a tensor, or a (nested) mapping of them."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [tensor for item in value.values() for tensor in tensors(item)] if isinstance(value, dict) else []


def check_priorities(sampler: PrioritizedSampler, state: dict[str, Any]) -> None:
    """Raise :class:`InputError` unless a saved prioritized sampler's state is one a run could leave: its
    priority exponent and offset this run's own, its importance exponent in [0, 1], its largest priority (value
    and index) finite and not negative, at a stored transition, its sum tree's leaves finite and its min tree's
    not negative (Inf marks an empty leaf)."""
    alpha, beta, eps, largest = state["alpha"], state["beta"], state["eps"], state["max_priority"]
    if alpha != sampler._alpha or eps != sampler._eps:
        raise InputError(
            f"the replay buffer's priority exponent and offset ({alpha!r:.30}, {eps!r:.30}) are not this run's "
            f"({sampler._alpha}, {sampler._eps})"
        )
    if not 0 <= beta <= 1:
        raise InputError(f"the replay buffer's importance exponent {beta!r:.30} is not in [0, 1]")
    value, index = largest if isinstance(largest, (tuple, list)) and len(largest) == 2 else (largest, -1)
    value = value.item() if isinstance(value, torch.Tensor) and value.numel() == 1 else value
    index = index.item() if isinstance(index, torch.Tensor) and index.numel() == 1 else index
    if (value, index) != (None, None) and not (
        isinstance(value, (int, float))
        and 0 <= value < math.inf
        and isinstance(index, int)
        and 0 <= index < sampler._max_capacity
    ):
        raise InputError(
            f"the replay buffer's largest priority {largest!r:.40} is not a finite priority of a stored transition"
        )
    sums, minima = state["sum_tree"], state["min_tree"]
    if not torch.isfinite(sums).all() or (sums < 0).any() or minima.isnan().any() or (minima < 0).any():
        raise InputError("the replay buffer's priorities hold NaN, Inf or negative values")


def check_stored_actions(buffer: ReplayBuffer, action_spec: Any) -> None:
    """Raise :class:`InputError` when a restored replay buffer holds a Discrete action (an index) outside the env's
    action space, which would index out of bounds at the first update (the replay recipes' discrete actions are
    Discrete: DQN's and discrete SAC's)."""
    bound = getattr(getattr(action_spec, "space", None), "n", None)
    stored = buffer._storage._storage
    if bound is None or not isinstance(stored, TensorDictBase) or "action" not in stored.keys():  # noqa: SIM118 - a TensorDict's keys
        return
    actions = stored.get("action")[: len(buffer._storage)]
    if actions.is_floating_point() or actions.dtype == torch.bool:
        return  # one-hot or Box actions: no index to check
    if actions.numel() and ((actions < 0) | (actions >= bound)).any():
        raise InputError("the replay buffer holds actions outside the env's action space")
