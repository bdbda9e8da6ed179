"""The update side of a recipe as one object: :class:`Learner`.

A recipe states its loss (``minibatch -> (total loss, metrics)``), its optimizer, gradient clipping, the modules
that hold its weights, and its named hyperparameters with the schedule that turns them (and the number of steps
taken) into the values the optimizer and the loss use. The single-process loop calls :meth:`Learner.step`; a
distributed one (:mod:`training.gradient_workers`) splits that step in two, :meth:`Learner.compute_gradients`
where the data is and :meth:`Learner.apply_gradients` where the optimizer is, with :meth:`Learner.get_weights` /
:meth:`Learner.set_weights` carrying the result back::

    grads, metrics = worker_learner.compute_gradients(minibatch)     # on each worker, returned on the CPU
    learner.apply_gradients(average(all_grads))                      # on the learner: clip, optimizer step
    worker_learner.set_weights(learner.get_weights())                # weights, steps, hyperparameters

Both halves together do exactly what :meth:`Learner.step` does on one minibatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

from errors import InputError, NonFiniteError
from training.optim import clip_and_step
from training.replay import gather_rows, plain_entries

LossFunction = Callable[[TensorDictBase], tuple[torch.Tensor, TensorDictBase]]
"""``minibatch -> (total loss to minimise, detached metrics to log)``."""
Schedule = Callable[["Learner"], None]
"""Sets the values the next step uses (learning rates, clip range, ...) from ``learner.hyperparameters`` and
``learner.steps``."""


class Learner:
    """Gradients, their application, weights and hyperparameters of one recipe's update.

    Args:
        loss: ``minibatch -> (total loss, metrics)``: the recipe's objective; the metrics are detached scalars.
        optimizer: the optimizer stepping the trained parameters (its parameter groups, in order, are the
            parameters whose gradients :meth:`compute_gradients` returns).
        modules: the modules whose state is the learner's weights, by name (the loss module holds the actor,
            critic, target networks, observation normaliser and loss coefficients).
        max_grad_norm: clip the global gradient norm to this before each step; None: no clipping.
        hyperparameters: the values :meth:`update_algorithm_parameter` may change while training, by name (e.g.
            ``{"lr": 3e-4, "entropy_coef": 0.01}``); ``schedule`` turns them into what the optimizer and the loss use.
        schedule: called with the learner after every step, after a change of a hyperparameter or of the frame
            count and after its state is loaded, to set the values of the next step (e.g. learning rates annealed with
            ``learner.steps``); None: the hyperparameters go to no schedule (then there should be none).
        after_step: called after every optimizer step (e.g. a target network update); its effects travel with
            the weights.
        local_state: state-dict keys, as ``"module name.key prefix"`` (e.g. ``"rnd.obs_rms"``), that stay with
            each process and are not part of the weights (statistics a worker keeps of its own data).

    Examples:
        >>> learner = Learner(loss, optimizer, {"loss": loss_module}, max_grad_norm=0.5,
        ...                   hyperparameters={"lr": 3e-4}, schedule=set_learning_rate)
        >>> metrics, grad_norm = learner.step(minibatch)
        >>> learner.update_algorithm_parameter("lr", 1e-4)    # the next step uses it
    """

    def __init__(
        self,
        loss: LossFunction,
        optimizer: torch.optim.Optimizer,
        modules: Mapping[str, nn.Module],
        *,
        max_grad_norm: float | None = None,
        hyperparameters: Mapping[str, float] | None = None,
        schedule: Schedule | None = None,
        after_step: Callable[[], None] | None = None,
        local_state: Sequence[str] = (),
    ):
        self.loss = loss
        self.optimizer = optimizer
        self.modules = dict(modules)
        self.max_grad_norm = max_grad_norm
        self.hyperparameters = dict(hyperparameters or {})
        if self.hyperparameters and schedule is None:
            raise ValueError("Learner: hyperparameters need a schedule that applies them.")
        self.schedule = schedule
        self.after_step = after_step
        self.local_state = tuple(local_state)
        self.parameters = [parameter for group in optimizer.param_groups for parameter in group["params"]]
        self.steps = 0
        """Optimizer steps taken (counted across a resumed run)."""
        self.frames = 0
        """Frames collected so far, for schedules that follow the budget (epsilon, learning starts): set by the
        loop with :meth:`set_frames`; on a gradient worker, those of all workers as the learner last counted."""
        self.on_non_finite: Callable[[str], NoReturn] | None = None
        """Called with where NaN or Inf appeared when the loss fails on diverged parameters (a :class:`training.Run`
        sets its own, which stops the run as its other NaN checks do); None: raise :class:`NonFiniteError`."""
        self._apply_schedule()

    # ------------------------------------------------------------------ one process
    def step(self, minibatch: TensorDictBase) -> tuple[TensorDictBase, torch.Tensor]:
        """One gradient step on ``minibatch``: loss, backward pass, clipping, optimizer step; returns the loss's
        metrics and the gradient norm before clipping."""
        total, metrics = self._loss(minibatch)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        return metrics, self._finish_step()

    def _loss(self, minibatch: TensorDictBase) -> tuple[torch.Tensor, TensorDictBase]:
        """The loss of ``minibatch``; when it fails on parameters that an earlier step of the same batch made NaN or
        Inf (a distribution refusing NaN probabilities, before the batch's metrics are checked), that is reported
        as the divergence it is, not as the distribution's error."""
        try:
            return self.loss(minibatch)
        except (RuntimeError, ValueError) as error:
            if all(torch.isfinite(parameter).all() for parameter in self.parameters):
                raise
            cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
            where = (
                f"the trained parameters after gradient step {self.steps} (the next loss failed: {cause}; a "
                "learning rate or a loss weight too large for this task makes them diverge)"
            )
            if self.on_non_finite is not None:
                self.on_non_finite(where)
            raise NonFiniteError(f"NaN or Inf in {where}.") from error

    def set_frames(self, frames: int) -> None:
        """Record that ``frames`` frames have been collected in all (the schedule sees the new count)."""
        self.frames = int(frames)
        self._apply_schedule()

    # ------------------------------------------------------------------ split over processes
    def compute_gradients(
        self, minibatch: TensorDictBase
    ) -> tuple[list[torch.Tensor | None], TensorDictBase]:
        """The gradients of the loss on ``minibatch``, one per trained parameter (in the optimizer's order; None
        where the loss does not reach it), on the CPU, with the loss's metrics; nothing is applied."""
        total, metrics = self._loss(minibatch)
        self.optimizer.zero_grad(set_to_none=True)
        total.backward()
        gradients = [
            None if parameter.grad is None else parameter.grad.detach().to("cpu", copy=True)
            for parameter in self.parameters
        ]
        self.optimizer.zero_grad(set_to_none=True)
        return gradients, metrics.detach().to("cpu")

    def apply_gradients(self, gradients: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Clip ``gradients`` (from :meth:`compute_gradients`, or an average of several) as :meth:`step` would and
        take the optimizer step; returns the gradient norm before clipping.

        Raises:
            ValueError: a gradient list that does not match the trained parameters.
        """
        if len(gradients) != len(self.parameters):
            raise ValueError(
                f"apply_gradients: {len(gradients)} gradients for {len(self.parameters)} trained parameters."
            )
        for parameter, gradient in zip(self.parameters, gradients, strict=True):
            if gradient is not None and gradient.shape != parameter.shape:
                raise ValueError(
                    f"apply_gradients: a gradient of shape {tuple(gradient.shape)} for a parameter of shape "
                    f"{tuple(parameter.shape)}."
                )
            parameter.grad = None if gradient is None else gradient.to(parameter.device, parameter.dtype)
        return self._finish_step()

    def _finish_step(self) -> torch.Tensor:
        if self.max_grad_norm is None:
            grad_norm = torch.nn.utils.get_total_norm(
                [parameter.grad for parameter in self.parameters if parameter.grad is not None]
            )
            self.optimizer.step()
        else:  # a LeanAdam clips in its kernel
            grad_norm = clip_and_step(self.optimizer, self.max_grad_norm)
        self.steps += 1
        if self.after_step is not None:
            self.after_step()
        self._apply_schedule()
        return grad_norm

    # ------------------------------------------------------------------ weights
    def get_weights(self) -> dict[str, Any]:
        """What a worker needs to compute the next gradients as this learner would: the modules' state (on the
        CPU, copied; without ``local_state``), the step and frame counts and the hyperparameters."""
        return {
            "modules": {
                name: {
                    key: value.detach().to("cpu", copy=True)
                    for key, value in module.state_dict().items()
                    if not self._is_local(name, key)
                }
                for name, module in self.modules.items()
            },
            "steps": self.steps,
            "frames": self.frames,
            "hyperparameters": dict(self.hyperparameters),
        }

    def set_weights(self, weights: Mapping[str, Any]) -> None:
        """Load what :meth:`get_weights` returned (in place: collectors and policies holding these modules act
        with the new weights)."""
        for name, module in self.modules.items():
            missing, unexpected = module.load_state_dict(weights["modules"][name], strict=False)
            missing = [key for key in missing if not self._is_local(name, key)]
            if missing or unexpected:
                raise ValueError(f"set_weights: {name} is missing {missing} and does not have {unexpected}.")
        self.steps, self.frames = int(weights["steps"]), int(weights["frames"])
        # the values the learner's schedule set and the loss reads (clip range, entropy weight) came with the
        # modules' state; learning rates matter only where gradients are applied
        self.hyperparameters.update(weights["hyperparameters"])

    def _is_local(self, name: str, key: str) -> bool:
        return any(f"{name}.{key}".startswith(prefix) for prefix in self.local_state)

    # ------------------------------------------------------------------ hyperparameters
    def update_algorithm_parameter(self, name: str, value: float) -> None:
        """Change the hyperparameter ``name`` (e.g. ``"lr"``, ``"entropy_coef"``, ``"clip_epsilon"``); the next
        gradient step uses it (through the schedule: an annealed learning rate anneals from the new value).

        Raises:
            InputError: a name this learner does not have, or a value that is not a finite number >= 0.
        """
        if name not in self.hyperparameters:
            known = ", ".join(sorted(self.hyperparameters)) or "none"
            raise InputError(f"This learner has no algorithm parameter {name!r}; it has: {known}.")
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise InputError(f"Algorithm parameter {name} must be a finite number >= 0, got {value!r}.")
        self.hyperparameters[name] = float(value)
        self._apply_schedule()

    def _apply_schedule(self) -> None:
        if self.schedule is not None:
            self.schedule(self)

    # ------------------------------------------------------------------ resume
    def state_dict(self) -> dict[str, Any]:
        """The step and frame counts and the hyperparameters (the weights and optimizer are saved with the
        modules)."""
        return {"steps": self.steps, "frames": self.frames, "hyperparameters": dict(self.hyperparameters)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.steps, self.frames = int(state["steps"]), int(state["frames"])
        self.hyperparameters.update(
            {
                name: float(value)
                for name, value in state["hyperparameters"].items()
                if name in self.hyperparameters
            }
        )
        self._apply_schedule()


class EpochMinibatches:
    """The minibatches of the epochs over one collected batch, drawn without replacement: each epoch a permutation
    of the batch's items cut into ``size`` pieces, a remainder shorter than ``size`` dropped.

    The same indices, from the same random draws, as TorchRL's ``SamplerWithoutReplacement(drop_last=True)``
    over a ``LazyTensorStorage`` holding the batch (the next permutation is drawn as soon as one runs out, and a
    pending one carries over to the next batch of the same size), without copying the batch into a storage first
    and indexing it through the replay buffer on every sample: a fifth of a small-network PPO step. Where the
    items are plain tensors in plain TensorDicts, each minibatch is gathered entry by entry with ``index_select``
    (what ``items[index]`` returns, about 0.1 ms sooner for PPO's dozen entries). Its state (the pending
    permutation) is saved for resume.

    Examples:
        >>> minibatches = EpochMinibatches(64)
        >>> for minibatch in minibatches(batch.reshape(-1), num_epochs * (batch.numel() // 64)):
        ...     learner.step(minibatch)
    """

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"EpochMinibatches: size must be >= 1, got {size}.")
        self.size = size
        self._pending: torch.Tensor | None = None
        self._length = 0

    def __call__(self, items: TensorDictBase, count: int) -> Iterable[TensorDictBase]:
        """``count`` minibatches of ``items`` (indexed along their first dimension), one after the other."""
        length = items.shape[0]
        if length < self.size:
            raise ValueError(f"EpochMinibatches: {length} items cannot fill a minibatch of {self.size}.")
        if self._pending is not None and self._pending.device != items.device:  # resumed onto another device
            self._pending = self._pending.to(items.device)
        # plain tensors in plain TensorDicts: each entry gathered with index_select, as items[index] gathers them
        plain = type(items) is TensorDict and plain_entries(items, items.batch_size) is not None
        for _ in range(count):
            if self._pending is None or self._length != length:
                self._pending, self._length = torch.randperm(length, device=items.device), length
            index, self._pending = self._pending[: self.size], self._pending[self.size :]
            if len(self._pending) < self.size:  # the epoch is over: the next one's permutation, drawn now
                self._pending = torch.randperm(length, device=self._pending.device)
            yield gather_rows(items, index) if plain else items[index]

    def state_dict(self) -> dict[str, Any]:
        return {"pending": self._pending, "length": self._length}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pending, length = state["pending"], int(state["length"])
        if pending is not None and (
            not isinstance(pending, torch.Tensor)
            or pending.dtype != torch.int64
            or pending.ndim != 1
            or len(pending) > length
            or (len(pending) > 0 and (pending.min() < 0 or pending.max() >= length))
        ):
            raise ValueError("EpochMinibatches: the saved pending permutation is not a permutation's tail.")
        self._pending, self._length = pending, length


def average_gradients(
    gradient_lists: Iterable[Sequence[torch.Tensor | None]], samples: Sequence[int] | None = None
) -> list[torch.Tensor | None]:
    """The element-wise mean of several workers' gradient lists, each weighted by its minibatch's ``samples``
    (None: equally): the gradient of a loss averaged over all their samples together, as one process would take it
    from their union (REINFORCE's and VPG's minibatches are whole episodes, of different lengths per worker). A
    parameter no worker reached stays None; one that some reached averages over those."""
    gradient_lists = list(gradient_lists)
    if not gradient_lists:
        raise ValueError("average_gradients: no gradients.")
    samples = [1] * len(gradient_lists) if samples is None else list(samples)
    if len(samples) != len(gradient_lists) or min(samples) < 1:
        raise ValueError("average_gradients: one positive sample count per gradient list.")
    averaged: list[torch.Tensor | None] = []
    for gradients in zip(*gradient_lists, strict=True):
        present = [(gradient, count) for gradient, count in zip(gradients, samples) if gradient is not None]
        if not present:
            averaged.append(None)
            continue
        total = sum(count for _, count in present)
        averaged.append(sum(gradient * (count / total) for gradient, count in present))
    return averaged


def set_learning_rates(optimizer: torch.optim.Optimizer, rates: Sequence[float], scale: float = 1.0) -> None:
    """Set each parameter group's learning rate, in order, to ``rate * scale``."""
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate * scale


class MetricMeans:
    """The running mean of each metric (the first step's keys) over the steps added since the last ``result``, in
    constant memory however many steps a batch holds: one stack and one add per step, one host copy per result (a
    stack, a mean and a host copy per metric cost more than the arithmetic when each step is one frame's update).
    A metric of several values counts as its mean."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._keys: list[str] | None = None
        self._total: torch.Tensor | None = None
        self._count = 0

    def add(self, step: Mapping[str, torch.Tensor]) -> None:
        if self._keys is None:
            self._keys = list(step.keys())
        values = torch.stack([step[key] if step[key].ndim == 0 else step[key].mean() for key in self._keys])
        # a float32 total of 10k steps drifts in its fourth digit; MPS has no float64
        if values.device.type != "mps":
            values = values.double()
        self._total = values if self._total is None else self._total + values
        self._count += 1

    def result(self) -> dict[str, float]:
        """The means since the last result (empty if no step was added), under ``prefix + key``; starts afresh."""
        if self._total is None:
            return {}
        values = (self._total / self._count).tolist()
        means = {self.prefix + key: value for key, value in zip(self._keys, values, strict=True)}
        self._keys, self._total, self._count = None, None, 0
        return means


def mean_metrics(steps: Iterable[Mapping[str, torch.Tensor]], prefix: str = "") -> dict[str, float]:
    """The mean over ``steps`` of each metric (the first step's keys), as floats under ``prefix + key``."""
    means = MetricMeans(prefix)
    for step in steps:
        means.add(step)
    return means.result()


__all__ = [
    "EpochMinibatches",
    "Learner",
    "LossFunction",
    "MetricMeans",
    "Schedule",
    "average_gradients",
    "mean_metrics",
    "set_learning_rates",
]
