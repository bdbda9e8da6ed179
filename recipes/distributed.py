"""Scale-out on Ray: joining or starting a cluster, and Evolution Strategies' population on Ray workers.

Ray is an optional dependency (``pip install -e .[ray]``), imported only when a run asks for it.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from tensordict import TensorDictBase

from agents.es import PopulationEvaluator, make_es_policy
from envs.errors import InputError
from envs.vector import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY, make_env

WORKER_SEED_STRIDE = 10_000  # worker i seeds its envs with seed + i * WORKER_SEED_STRIDE
# what a worker sends back of its episodes' steps: enough for logging and observation statistics
EPISODE_KEYS = ("observation", ("next", "done"), ("next", EPISODE_RETURN_KEY), ("next", EPISODE_LENGTH_KEY))


def require_ray():
    """Import Ray, or raise :class:`InputError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise InputError(
            "Running on Ray needs the optional Ray dependency: pip install -e '.[ray]' (or pip install ray)."
        ) from None
    return ray


def init_ray(address: str | None):
    """Connect to the Ray cluster at ``address``, or start a local one when None; returns the ``ray`` module."""
    ray = require_ray()
    if not ray.is_initialized():
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False, configure_logging=False)
        except ConnectionError as error:
            raise InputError(f"Could not join the Ray cluster at --ray-address {address}: {error}") from None
    return ray


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
    ):
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        env = make_env(env_id, num_envs, seed=seed, backend=backend)
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
        env_id, num_envs, backend, seed, policy_kwargs, steps_per_env, max_steps: the env (``num_envs`` in
            all, split over the workers), the policy builder's keyword arguments and the evaluator's settings.
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
    ):
        self.ray = init_ray(address)
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
            )
            for index in range(num_workers)
        ]

    def evaluate(
        self, population: torch.Tensor, normalizer_state: dict[str, torch.Tensor] | None = None
    ) -> tuple[TensorDictBase, torch.Tensor, torch.Tensor]:
        """Evaluate ``population`` (``[P, num_parameters]``), member rows split in order over the workers."""
        shares = population.cpu().chunk(len(self.workers))
        futures = [
            worker.evaluate.remote(share, normalizer_state) for worker, share in zip(self.workers, shares)
        ]
        results = []
        for index, future in enumerate(futures):
            try:
                results.append(self.ray.get(future, timeout=self.timeout_s))
            except self.ray.exceptions.GetTimeoutError:
                raise RuntimeError(
                    f"Ray worker {index} did not return its share of the population within {self.timeout_s:.0f} s "
                    "(--worker-timeout-s); is the cluster overloaded or a worker stuck?"
                ) from None
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


__all__ = ["PopulationWorker", "RayPopulationEvaluator", "init_ray", "require_ray"]
