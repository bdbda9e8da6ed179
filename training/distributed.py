"""Scale-out: TorchRL's multi-process and Ray collectors, and Evolution Strategies' population on Ray workers.

Ray is an optional dependency (``pip install -e .[ray]``), imported only when a run asks for it.
"""

from __future__ import annotations

import os
import random
import time
import warnings
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Literal

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import EnvBase

from agents.es import PopulationEvaluator, make_es_policy
from agents.gsde import clip_env_actions
from envs.specs import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY
from envs.vector import make_env, sigint_ignored_by_children
from errors import InputError

RAY_CPU_WAIT_S = 15.0  # how long to wait for enough free CPUs on the Ray cluster before giving up
WORKER_SEED_STRIDE = 10_000  # worker i seeds its envs with seed + i * WORKER_SEED_STRIDE
# what a worker sends back of its episodes' steps: enough for logging and observation statistics
EPISODE_KEYS = (
    "observation",
    ("next", "reward"),
    ("next", "done"),
    ("next", EPISODE_RETURN_KEY),
    ("next", EPISODE_LENGTH_KEY),
)


def require_ray():
    """Import Ray, or raise :class:`InputError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "Running on Ray needs the optional Ray dependency: pip install -e '.[ray]' (or pip install ray)."
        ) from None
    return ray


def init_ray(address: str | None, num_workers: int, option: str = "--num-workers"):
    """Connect to the Ray cluster at ``address``, or start a local one when None, and check that it has a CPU for
    each of ``num_workers`` workers (Ray would otherwise wait for them forever; ``option`` names their count in the
    error); returns the ``ray`` module."""
    ray = require_ray()
    if ray.is_initialized() and address is not None:
        warnings.warn(
            f"Ray is already initialised in this process (cluster {ray.get_runtime_context().gcs_address}); "
            f"--ray-address {address} is not used. Call ray.shutdown() first to join another cluster.",
            stacklevel=2,
        )
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except ConnectionError as error:
            raise InputError(f"Could not join the Ray cluster at --ray-address {address}: {error}") from None
    deadline = time.monotonic() + RAY_CPU_WAIT_S  # CPUs of actors just stopped are released asynchronously
    while (cpus := ray.available_resources().get("CPU", 0)) < num_workers and time.monotonic() < deadline:
        time.sleep(0.5)
    if cpus < num_workers:
        raise InputError(
            f"{option} {num_workers} needs one CPU per Ray worker; the Ray cluster has {cpus:g} free. "
            "Use fewer workers or a larger cluster (--ray-address)."
        )
    return ray


def make_worker_env(
    parent_pid: int, env_id: str, num_envs: int, *, seed: int, clip_actions: bool = False, **options: Any
) -> EnvBase:
    """A collector worker's envs (``envs.make_env``), with actions clipped to the Box when ``clip_actions``
    (:func:`agents.gsde.clip_env_actions`, for an unsquashed policy); in a worker process it also seeds Python,
    NumPy and torch with the worker's ``seed``, so that workers draw different random actions and noise (they
    would otherwise all start from the same state)."""
    if os.getpid() != parent_pid:
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
    env = make_env(env_id, num_envs, seed=seed, **options)
    return clip_env_actions(env) if clip_actions else env


class WorkerCollector:
    """A multi-worker TorchRL collector used like the single-process one.

    Batches come as ``[num_envs, time]`` (the workers' ``[workers, envs, time]`` merged; flat episode batches
    pass unchanged) with the keys of the single-process collector (trajectory ids only for episode batches).
    Every batch is collected with the policy's current weights (parameters and buffers: normaliser statistics,
    exploration rates): shared memory with worker processes, sent to Ray workers before each batch. A worker that dies stops the run with a
    ``RuntimeError`` naming the backend (TorchRL raises within seconds; the run never hangs on a dead worker).
    """

    def __init__(self, collector, backend: str, policy: nn.Module, keep_traj_ids: bool = False):
        self.collector = collector
        self.backend = backend
        self.keep_traj_ids = keep_traj_ids
        # TorchRL's process backend moves the policy's tensors into shared memory: in-place updates (optimizer
        # steps, normaliser statistics, epsilon) reach the workers without a call, and a call would wait forever
        # for the acknowledgement of a dead worker
        shared = all(tensor.is_shared() for tensor in TensorDict.from_module(policy).values(True, True))
        self.push_weights = backend == "ray" or not shared

    def __iter__(self) -> Iterator[TensorDictBase]:
        ray_errors = _ray_errors() if self.backend == "ray" else ()
        try:
            if self.push_weights:
                self.collector.update_policy_weights_()
            for batch in self.collector:
                if not self.keep_traj_ids:  # the single-process collector of a recipe does not track them
                    batch = batch.exclude("collector")
                yield batch.reshape(-1, batch.shape[-1]) if batch.ndim == 3 else batch
                if self.push_weights:
                    self.collector.update_policy_weights_()
        except ray_errors as error:
            self.shutdown()
            raise RuntimeError(f"A Ray collector worker died: {error}") from None
        except ValueError as error:
            self.shutdown()
            if "Cannot close a process while it is still running" in str(error):
                # TorchRL found a dead worker and stops the others, but closes each 0.1 s after terminating it:
                # on a loaded machine one is still exiting then
                raise RuntimeError(
                    "A collector worker process failed; the other workers were stopped."
                ) from None
            raise
        except BaseException:
            # stop the workers now: left to the interpreter's exit, TorchRL's clean-up can wait forever on them
            self.shutdown()
            raise

    def shutdown(self) -> None:
        if self.collector is not None:
            collector, self.collector = self.collector, None
            collector.shutdown()
            # a worker process whose env raised can stay alive in TorchRL's clean-up at its exit, and the
            # interpreter would wait for it at ours: give each a moment, then kill it
            for process in getattr(collector, "procs", ()):
                try:
                    process.join(timeout=5)
                    if process.is_alive():
                        process.kill()
                except ValueError:  # already closed by TorchRL
                    pass


def _ray_errors() -> tuple[type[Exception], ...]:
    import ray

    return (ray.exceptions.RayActorError,)


def make_worker_collector(
    backend: Literal["multiprocess", "ray"],
    env_factories: list[Callable[[], EnvBase]],
    policy: nn.Module,
    *,
    frames_per_batch: int,
    total_frames: int,
    device: torch.device,
    ray_address: str | None = None,
    **options: Any,
) -> WorkerCollector:
    """TorchRL's collector over one env per worker: worker processes (``"multiprocess"``) or Ray actors with one
    CPU each (``"ray"``, on the cluster at ``ray_address`` or a local one), synchronous, so that every batch is
    collected with the latest weights.

    Args:
        backend: ``"multiprocess"`` or ``"ray"``.
        env_factories: one picklable env constructor per worker.
        policy: the policy being trained (its weights are sent to the workers).
        frames_per_batch: frames of each batch, summed over the workers.
        total_frames: the collection budget.
        device: device of the policy and of the batches.
        ray_address: the Ray cluster to join (``"ray"`` only).
        options: further collector arguments (``init_random_frames``, ``trajs_per_batch``, ...).
    """
    common = {
        "frames_per_batch": frames_per_batch,
        "total_frames": total_frames,
        "policy_device": device,
        "storing_device": device,
        "num_collectors": len(env_factories),
        "sync": True,
    }
    if backend == "multiprocess":
        # SIGTERM keeps its default: TorchRL stops the remaining workers of a failed run with it
        with sigint_ignored_by_children():
            collector = Collector(
                env_factories,
                policy,
                backend="process",
                auto_register_policy_transforms=False,
                **common,
                **options,
            )
    else:
        if "trajs_per_batch" in options:
            raise InputError(
                "TorchRL's Ray collector cannot assemble complete episodes (REINFORCE, VPG) from its workers: "
                "use --collector-backend multiprocess or single."
            )
        init_ray(ray_address, len(env_factories))
        allow_slow_weight_sync(WORKER_START_TIMEOUT_S)
        collector = Collector(
            env_factories,
            policy,
            backend="ray",
            backend_options={
                "remote_configs": {"num_cpus": 1},
                "collector_kwargs": {"auto_register_policy_transforms": False, "track_traj_ids": False},
            },
            **common,
            **options,
        )
        # the first weight update connects to every worker: start it only once all workers are up (importing
        # torch on a loaded machine can take a while)
        ray = require_ray()
        try:
            ray.get(
                [worker.__ray_ready__.remote() for worker in collector.remote_collectors],
                timeout=WORKER_START_TIMEOUT_S,
            )
        except ray.exceptions.GetTimeoutError:
            collector.shutdown()
            raise RuntimeError(
                f"The Ray collector workers did not start within {WORKER_START_TIMEOUT_S} s."
            ) from None
    return WorkerCollector(collector, backend, policy, keep_traj_ids="trajs_per_batch" in options)


WORKER_START_TIMEOUT_S = 300  # longest wait for Ray collector workers to start and join the weight sync


def allow_slow_weight_sync(seconds: float) -> None:
    """Let TorchRL's Ray weight sync wait ``seconds`` for every worker to join its process group.

    TorchRL 0.14 fixes that wait at 60 s in a module constant (``torchrl.weight_update._ray._DIST_TIMEOUT``, read
    when the group is made); on a loaded machine a worker still busy with its envs can take longer, and the first
    weight update then fails with ``DistStoreError: wait timeout``. Raised here for the learner's side (the
    workers' own waits keep TorchRL's value), never lowered; a TorchRL without the constant is left alone.
    """
    from torchrl.weight_update import _ray as ray_weight_sync

    current = getattr(ray_weight_sync, "_DIST_TIMEOUT", None)
    if isinstance(current, timedelta) and current.total_seconds() < seconds:
        ray_weight_sync._DIST_TIMEOUT = timedelta(seconds=seconds)


class PopulationWorker:
    """A Ray actor running a share of the ES population on its own batched env (:class:`PopulationEvaluator`)."""

    def __init__(
        self,
        env_id: str,
        num_envs: int,
        backend: str,
        seed: int,
        policy_kwargs: dict[str, Any],
        steps_per_env: int,
        max_steps: int,
        env_options: dict[str, Any] | None = None,
    ):
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        env = make_env(env_id, num_envs, seed=seed, backend=backend, **(env_options or {}))
        policy = make_es_policy(env.observation_spec["observation"], env.action_spec, **policy_kwargs)
        self.evaluator = PopulationEvaluator(env, policy, steps_per_env, max_steps)

    def evaluate(
        self, population: torch.Tensor, normalizer_state: dict[str, torch.Tensor] | None
    ) -> tuple[TensorDictBase, torch.Tensor, torch.Tensor]:
        steps, returns, lengths = self.evaluator.evaluate(population, normalizer_state)
        return steps.select(*EPISODE_KEYS), returns, lengths

    def pid(self) -> int:
        return os.getpid()


class RayPopulationEvaluator:
    """An ES population split evenly over ``num_workers`` Ray actors, with the interface of
    :class:`agents.es.PopulationEvaluator`.

    A worker that dies is restarted by Ray and its share rerun, up to ``max_restarts`` times per worker; after
    that, or when a generation takes longer than ``timeout_s``, :meth:`evaluate` raises ``RuntimeError``
    naming the worker, so a lost worker never hangs the run.

    Args:
        num_workers: Ray actors; the population size must be a multiple of it.
        address: a running cluster's address, or None to start a local cluster.
        timeout_s: longest wait for one generation.
        max_restarts: restarts Ray may make of each worker.
        env_id, num_envs, backend, seed, policy_kwargs, steps_per_env, max_steps, env_options: the env
            (``num_envs`` in all, split over the workers, built with ``make_env``'s further ``env_options``), the
            policy builder's keyword arguments and the evaluator's settings.
    """

    def __init__(
        self,
        num_workers: int,
        address: str | None,
        timeout_s: float,
        *,
        env_id: str,
        num_envs: int,
        backend: str,
        seed: int,
        policy_kwargs: dict[str, Any],
        steps_per_env: int,
        max_steps: int,
        max_restarts: int = 1,
        env_options: dict[str, Any] | None = None,
    ):
        self.ray = init_ray(address, num_workers)
        self.timeout_s = timeout_s
        worker_class = self.ray.remote(num_cpus=1, max_restarts=max_restarts, max_task_retries=max_restarts)(
            PopulationWorker
        )
        self.workers = [
            worker_class.remote(
                env_id,
                num_envs // num_workers,
                backend,
                seed + index * WORKER_SEED_STRIDE,
                policy_kwargs,
                steps_per_env,
                max_steps,
                env_options,
            )
            for index in range(num_workers)
        ]

    def evaluate(
        self, population: torch.Tensor, normalizer_state: dict[str, torch.Tensor] | None = None
    ) -> tuple[TensorDictBase, torch.Tensor, torch.Tensor]:
        """Evaluate ``population`` (``[P, num_parameters]``), member rows split in order over the workers."""
        shares = population.cpu().chunk(len(self.workers))
        if normalizer_state is not None:  # workers have no GPU
            normalizer_state = {key: value.cpu() for key, value in normalizer_state.items()}
        futures = [
            worker.evaluate.remote(share, normalizer_state) for worker, share in zip(self.workers, shares)
        ]
        ready, _ = self.ray.wait(futures, num_returns=len(futures), timeout=self.timeout_s)
        results = []
        for index, future in enumerate(futures):
            if future not in ready:
                raise RuntimeError(
                    f"Ray worker {index} did not return its share of the population within {self.timeout_s:.0f} s "
                    "(--worker-timeout-s); is the cluster overloaded or a worker stuck?"
                )
            try:
                results.append(self.ray.get(future))
            except self.ray.exceptions.RayActorError as error:
                raise RuntimeError(
                    f"Ray worker {index} died and could not be restarted (--worker-restarts): {error}"
                ) from None
        device = population.device
        steps = torch.cat([steps for steps, _, _ in results]).to(device)
        returns = torch.cat([returns for _, returns, _ in results]).to(device)
        lengths = torch.cat([lengths for _, _, lengths in results]).to(device)
        return steps, returns, lengths

    def worker_pids(self) -> list[int]:
        """Process ids of the workers (for monitoring)."""
        return self.ray.get([worker.pid.remote() for worker in self.workers], timeout=self.timeout_s)

    def close(self) -> None:
        for worker in self.workers:
            self.ray.kill(worker)
        self.workers = []


__all__ = [
    "PopulationWorker",
    "RayPopulationEvaluator",
    "WorkerCollector",
    "init_ray",
    "make_worker_collector",
    "require_ray",
]
