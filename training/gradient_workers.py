"""Learning spread over Ray actors (``--gradient-workers N --collector-backend ray``): N gradient workers collect
and compute gradients, this process (the learner) applies them, synchronously (the N gradients of a step
averaged and applied once) or asynchronously (each applied as it arrives, unless more than ``max_staleness``
updates old).

A worker builds the recipe for itself: the recipe's ``main``, run with ``run.gradient_worker`` set, returns a
:class:`WorkerSession` (its share of the envs and of the options the recipe's ``GRADIENT_SPLIT`` names, its
collector, its :class:`training.learner.Learner`) instead of training. The batches workers report go through
the recipe's ``after_batch`` and :meth:`training.run.Run.record_batch` as in the single-process loop. A worker
that dies or hangs is replaced with newly seeded envs, up to :data:`MAX_WORKER_RESTARTS` times; the run stops with
an error only when no worker is left.
"""

from __future__ import annotations

import importlib
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from tensordict import TensorDictBase

from errors import InputError
from training.config import config_to_dict
from training.distributed import EPISODE_KEYS, init_ray, require_ray
from training.learner import Learner, MetricMeans, average_gradients
from training.run import Run
from training.worker_options import check_gradient_workers, recipe_location, refuse_loss_addons, worker_config

MAX_WORKER_RESTARTS = 3  # fresh replacements of one worker before it is given up
WORKER_REPLY_TIMEOUT_S = (
    600.0  # longest wait for one worker's gradients (the first includes building its envs)
)


class WorkerSession:
    """A gradient worker's side of a recipe: its learner (for the weights and gradients), its collector and the
    recipe's ``minibatches(batch)``, which turns a collected batch into the minibatches of its gradient steps
    (advantages, epochs, replay samples) and may go on working after each (replay priorities).

    :meth:`compute` is one request of the learner: load its weights, take the next minibatch (collecting a batch
    with those weights when the last one is used up), return its gradients.
    """

    def __init__(
        self, learner: Learner, collector: Any, minibatches: Callable[[TensorDictBase], Iterable[Any]]
    ):
        self.learner, self.collector, self.minibatches = learner, collector, minibatches
        self._batches = iter(collector)
        self._batch: TensorDictBase | None = None
        self._items: Iterator[TensorDictBase] = iter(())
        self._next: TensorDictBase | None = None  # the next minibatch of the current batch

    def compute(self, weights: dict[str, Any] | None) -> dict[str, Any]:
        """Load ``weights`` (None: keep the current ones) and return the next minibatch's gradients and metrics
        (None for a batch that gives no gradient step: random frames before learning starts), the step count of
        the weights they were computed with, and the batch's episode steps (``"report"``) once its last minibatch
        is done, else None; ``"collect_s"`` and ``"gradient_s"`` time this process's share of the work."""
        start = time.perf_counter()
        if weights is not None:
            self.learner.set_weights(weights)
        collect_s = 0.0
        if self._next is None:  # a new batch, collected with these weights
            self._batch = next(self._batches)
            self._items = iter(self.minibatches(self._batch))
            self._next = next(self._items, None)
            collect_s = time.perf_counter() - start  # collection and the recipe's batch work (advantages)
        reply = {
            "gradients": None,
            "metrics": None,
            "steps": self.learner.steps,
            "report": None,
            "samples": 0,
        }
        if self._next is not None:
            reply["samples"] = self._next.numel()  # what the learner weighs these gradients by
            reply["gradients"], reply["metrics"] = self.learner.compute_gradients(self._next)
            self._next = next(self._items, None)  # the recipe's work after the step, then the next minibatch
        if self._next is None:
            reply["report"] = self._batch.select(*EPISODE_KEYS, strict=False).to("cpu")
        reply["collect_s"] = collect_s
        reply["gradient_s"] = time.perf_counter() - start - collect_s
        return reply


def joined(reports: Sequence[TensorDictBase]) -> TensorDictBase:
    """The batches the workers reported in one step, as one batch: the learner's work after a step (observation
    statistics, VPG's running-mean baseline, DQN's exploration rate) runs once on their union, as in one process."""
    return reports[0] if len(reports) == 1 else torch.cat(list(reports))


class GradientWorker:
    """The Ray actor: the recipe ``module`` built with ``config`` (a worker's configuration, see
    :func:`worker_config`) in this process, serving :meth:`WorkerSession.compute`."""

    def __init__(self, module: str, config_type: str, config: dict[str, Any]):
        from training.resume import config_from_dict

        recipe = importlib.import_module(module)
        session = recipe.main(config_from_dict(getattr(recipe, config_type), config))
        if not isinstance(session, WorkerSession):
            raise TypeError(f"{module}.main did not hand a gradient worker its session.")
        self.session = session

    def compute(self, weights: dict[str, Any] | None) -> dict[str, Any]:
        return self.session.compute(weights)

    def pid(self) -> int:
        return os.getpid()

    def node(self) -> str:
        """The Ray node this worker runs on."""
        return importlib.import_module("ray").get_runtime_context().get_node_id()


class GradientWorkerPool:
    """``config.run.gradient_workers`` :class:`GradientWorker` actors on Ray for the recipe ``config`` configures
    (the learner's configuration; each worker's is :func:`worker_config`'s), replaced when they die."""

    def __init__(self, config: Any, start_frames: int = 0):
        run = config.run
        self.start_frames = start_frames  # a resumed run's: its workers' seeds move on by as much
        self.num_workers = run.gradient_workers
        self.split = type(config).GRADIENT_SPLIT
        self.errors: list[str] = []
        ray = require_ray()  # joined by the recipe's prepare_process already, which checked the CPUs
        self.ray = (
            ray if ray.is_initialized() else init_ray(run.ray_address, self.num_workers, "--gradient-workers")
        )
        self.module, self.config_type = recipe_location(config)
        self.config = config_to_dict(config)
        self.actor_class = self.ray.remote(num_cpus=1, max_restarts=0)(GradientWorker)
        self.generations = [0] * self.num_workers
        self.restarts = 0
        self.workers: dict[int, Any] = {index: self._start(index) for index in range(self.num_workers)}

    def _start(self, index: int) -> Any:
        config = worker_config(
            self.config, index, self.num_workers, self.split, self.generations[index], self.start_frames
        )
        return self.actor_class.remote(self.module, self.config_type, config)

    def request(self, index: int, weights: Any) -> Any:
        """Ask worker ``index`` for its next gradients (a Ray object reference)."""
        return self.workers[index].compute.remote(weights)

    def replace(self, index: int, error: BaseException | str) -> bool:
        """Stop worker ``index`` after ``error`` and start a fresh one in its place (new env seeds); False when it
        has been replaced :data:`MAX_WORKER_RESTARTS` times already (it is then given up)."""
        detail = str(error).strip().splitlines()
        self.errors.append(f"worker {index}: {detail[-1] if detail else type(error).__name__}")
        self.ray.kill(self.workers.pop(index), no_restart=True)
        bad_input = f"{InputError.__module__}.{InputError.__name__}: "
        if detail and detail[-1].startswith(bad_input):  # the same input fails every fresh worker: stop now
            raise InputError(
                f"Gradient worker {index} stopped on bad input: {detail[-1].removeprefix(bad_input)} (each worker "
                "builds the recipe in a process of its own: an env registered only in this process is unknown "
                "there; register it in a module and give its id as 'module:EnvId')."
            )
        if self.generations[index] >= MAX_WORKER_RESTARTS:
            warnings.warn(
                f"Gradient worker {index} failed {MAX_WORKER_RESTARTS + 1} times and is given up: {self.errors[-1]}",
                stacklevel=2,
            )
            if not self.workers:
                raise RuntimeError(
                    "Every gradient worker failed; the last errors: " + "; ".join(self.errors[-3:])
                )
            return False
        self.generations[index] += 1
        self.restarts += 1
        self.workers[index] = self._start(index)
        return True

    def gather(self, requests: dict[int, Any]) -> dict[int, dict[str, Any]]:
        """The replies to ``requests`` (worker index -> reference) of the workers that answered; a worker that
        died or did not answer within :data:`WORKER_REPLY_TIMEOUT_S` is replaced and left out."""
        references = list(requests.values())
        ready, _ = self.ray.wait(references, num_returns=len(references), timeout=WORKER_REPLY_TIMEOUT_S)
        ready = set(ready)
        replies = {}
        for index, reference in requests.items():
            if reference not in ready:
                self.replace(index, f"no reply within {WORKER_REPLY_TIMEOUT_S:.0f} s")
                continue
            try:
                replies[index] = self.ray.get(reference)
            except self.ray.exceptions.RayError as error:
                self.replace(index, error)
        return replies

    def shutdown(self) -> None:
        for worker in self.workers.values():
            self.ray.kill(worker, no_restart=True)
        self.workers = {}


def train_on_gradient_workers(
    run: Run, config: Any, learner: Learner, after_batch: Callable[[TensorDictBase], None] | None
) -> dict[str, Any]:
    """Train with ``config.run.gradient_workers`` Ray gradient workers and this process as the learner; returns
    the run summary (:meth:`Run.finish`).

    Args:
        run: this run's :class:`Run` (logging, evaluation, checkpoints, resume).
        config: the recipe's configuration.
        learner: the recipe's learner (its weights are what the workers compute with).
        after_batch: the learner's work on each batch a worker reports (e.g. updating the observation
            normaliser with its observations); None: nothing.
    """
    if run.ended:  # resumed after its budget or its target: nothing to train
        return run.finish()
    run_config = config.run
    pool = GradientWorkerPool(config, start_frames=run.frames)
    max_staleness = run_config.max_staleness
    max_staleness = run_config.gradient_workers if max_staleness is None else max_staleness
    step_metrics = MetricMeans()  # the applied steps' losses since the last report
    counters = {"dropped": 0, "staleness": 0, "applied": 0}
    # where a step's time goes, summed since the last logged batch: the workers' collection and gradients (per
    # reply), the learner's update and weights (per step), and each step's wall-clock time
    timings = dict.fromkeys(("replies", "steps", "collect", "gradient", "apply", "weights", "wait"), 0.0)

    def apply(replies: Sequence[dict[str, Any]]) -> None:
        start = time.perf_counter()
        timings["replies"] += len(replies)
        timings["collect"] += sum(reply["collect_s"] for reply in replies)
        timings["gradient"] += sum(reply["gradient_s"] for reply in replies)
        computed = [reply for reply in replies if reply["gradients"] is not None]
        if computed:
            grad_norm = learner.apply_gradients(
                average_gradients(
                    [reply["gradients"] for reply in computed],
                    [max(1, reply["samples"]) for reply in computed],
                )
            )
            metrics = torch.stack([reply["metrics"] for reply in replies if reply["metrics"] is not None])
            step_metrics.add(metrics.mean().set("grad_norm", grad_norm.detach().cpu()))
        timings["apply"] += time.perf_counter() - start

    def publish() -> Any:
        """The learner's weights in Ray's object store, for the next requests."""
        start = time.perf_counter()
        weights = pool.ray.put(learner.get_weights())
        timings["weights"] += time.perf_counter() - start
        timings["steps"] += 1
        return weights

    def timing_metrics() -> dict[str, float]:
        replies, steps = max(1.0, timings["replies"]), max(1.0, timings["steps"])
        metrics = {f"time/worker_{key}_s": timings[key] / replies for key in ("collect", "gradient")}
        metrics |= {f"time/learner_{key}_s": timings[key] / steps for key in ("apply", "weights", "wait")}
        timings.update(dict.fromkeys(timings, 0.0))
        return metrics

    def record(reports: Sequence[TensorDictBase]) -> bool:
        """Account for the workers' finished batches (the metrics since the last ones go with the first); True
        when the run should stop."""
        stop = False
        if after_batch is not None and reports:
            learner.set_frames(run.frames + sum(report.numel() for report in reports))
            after_batch(joined(reports))
        for number, report in enumerate(reports):
            learner.set_frames(run.frames + report.numel())  # this batch included, as the workers will see
            metrics = {
                "train/gradient_workers": len(pool.workers),
                "train/worker_restarts": pool.restarts,
                "train/dropped_gradients": counters["dropped"],
            }
            if number == 0:
                losses = step_metrics.result()
                metrics |= {f"train/{key}": value for key, value in losses.items()} | timing_metrics()
                metrics |= {
                    "train/lr": learner.optimizer.param_groups[0]["lr"],
                    "train/gradient_staleness": counters["staleness"] / max(1, counters["applied"]),
                    "train/weights_mb": weights_mb,
                }
            stop = run.record_batch(report, metrics) or stop
        return stop

    try:
        learner.set_frames(run.frames)  # a resumed run's
        weights_mb = sum(tensor.numel() * tensor.element_size() for tensor in learner.parameters) / 2**20
        weights = publish()
        if run_config.sync:
            while True:
                start = time.perf_counter()
                replies = pool.gather({index: pool.request(index, weights) for index in pool.workers})
                timings["wait"] += time.perf_counter() - start
                replies = [replies[index] for index in sorted(replies)]  # a fixed order: a reproducible mean
                apply(replies)
                stop = record([reply["report"] for reply in replies if reply["report"] is not None])
                weights = publish()
                if stop:
                    break
        else:
            pending = {pool.request(index, weights): index for index in pool.workers}
            while pending:
                start = time.perf_counter()
                ready, _ = pool.ray.wait(list(pending), num_returns=1, timeout=WORKER_REPLY_TIMEOUT_S)
                timings["wait"] += time.perf_counter() - start
                if not ready:  # none answered in time: replace them all
                    for reference, index in list(pending.items()):
                        del pending[reference]
                        if pool.replace(index, f"no reply within {WORKER_REPLY_TIMEOUT_S:.0f} s"):
                            pending[pool.request(index, weights)] = index
                    continue
                reference = ready[0]
                index = pending.pop(reference)
                try:
                    reply = pool.ray.get(reference)
                except pool.ray.exceptions.RayError as error:
                    if pool.replace(index, error):
                        pending[pool.request(index, weights)] = index
                    continue
                staleness = learner.steps - reply["steps"]
                if reply["gradients"] is not None and staleness > max_staleness:
                    counters["dropped"] += 1
                    reply["gradients"] = None
                elif reply["gradients"] is not None:
                    counters["applied"] += 1
                    counters["staleness"] += staleness
                apply([reply])
                stop = record([reply["report"]] if reply["report"] is not None else [])
                if stop:
                    break
                weights = publish()
                pending[pool.request(index, weights)] = index
    finally:
        pool.shutdown()
    # what the recipes' own loops warn of, in their words, when they run in one process
    if learner.steps == 0:
        warnings.warn(
            f"The run ended without a gradient step: its --total-frames {run_config.total_frames} ran out before "
            "the gradient workers had a minibatch to learn from (random frames before --learning-starts, or "
            "episodes not yet ended); the agent is untrained. Raise --total-frames.",
            stacklevel=2,
        )
    return run.finish()


__all__ = [
    "MAX_WORKER_RESTARTS",
    "GradientWorker",
    "GradientWorkerPool",
    "WorkerSession",
    "check_gradient_workers",
    "recipe_location",
    "refuse_loss_addons",
    "train_on_gradient_workers",
    "worker_config",
]
