"""Seeding and the process's torch settings in one place: Python, NumPy and torch seeds, threads, the precision
and kernels of matrix products (the envs and their action spaces are seeded by ``make_env``)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch
from torchrl.data import Composite, TensorSpec

from agents.linear import set_linear_kernels
from agents.networks import is_image_spec
from training.config import RunConfig


def prepare_process(run: RunConfig) -> None:
    """Seed Python, NumPy and torch with ``run.seed``, set torch's CPU threads (``run.threads``; 0 keeps
    torch's default), the precision of float32 matrix products and CPU convolutions (``run.matmul_precision``),
    whether CPU arithmetic flushes denormals to zero (``run.flush_denormal``), the kernels of large float32
    linear layers (``run.linear_kernels``, :func:`agents.linear.set_linear_kernels`); for the learner of a run on
    gradient workers, join or start Ray and check that it has their CPUs (an :class:`InputError` if not)."""
    torch.set_flush_denormal(run.flush_denormal)  # first: worker threads started later inherit it
    random.seed(run.seed)
    np.random.seed(run.seed)
    torch.manual_seed(run.seed)
    set_threads(run.threads)
    set_matmul_precision(run.matmul_precision)
    set_linear_kernels(run.linear_kernels)
    if run.learns_on_workers:  # Ray there, with a CPU per worker, before the run claims its output folder
        from training.distributed import init_ray

        init_ray(run.ray_address, run.gradient_workers, "--gradient-workers")


_threads_before_runs: int | None = None  # torch's thread count before a run of this process first set one


def set_threads(count: int) -> None:
    """Run torch's CPU operations on ``count`` threads; 0: torch's default, the count the process had before a run
    first set one (so that a run on torch's default after a one-thread run in the same process gets it back)."""
    global _threads_before_runs
    if count == 0:
        if _threads_before_runs is not None:
            torch.set_num_threads(_threads_before_runs)
        return
    if _threads_before_runs is None:
        _threads_before_runs = torch.get_num_threads()
    torch.set_num_threads(count)


def threads_for_observations(run: RunConfig, observation_spec: TensorSpec) -> None:
    """Torch's default threads (all cores) instead of one for a run whose observations are images (or hold one),
    where ``run.threads`` is the recipe's default of one, neither given nor set by a preset: the convolutional
    encoder's products gain from every core (PPO and DQN on Pong ran 1.4-1.6x faster on two threads than on one
    here), where one thread is the fastest for the small vector networks that default is chosen for. Records
    the choice in ``run`` (``threads`` 0), so that the run's config says what it ran with."""
    if takes_default_threads(run, observation_spec):
        run.assign("threads", 0)
        set_threads(0)


def takes_default_threads(run: RunConfig, observation_spec: TensorSpec) -> bool:
    """Whether :func:`threads_for_observations` gives this run torch's default threads: its observations hold an
    image and its one thread is the recipe's default, neither given nor set by a preset."""
    chosen = run.assigned | set((run.preset_applied or {}).get("set", {}))
    return run.threads == 1 and "threads" not in chosen and holds_image(observation_spec)


def core_share(processes: int) -> int:
    """Torch threads for each of ``processes`` processes side by side: the CPU's cores divided among them, at
    least one."""
    return max(1, (os.cpu_count() or 1) // processes)


def holds_image(observation_spec: TensorSpec) -> bool:
    """Whether observations of ``observation_spec`` are ``uint8`` images or a Dict holding one (the recipes'
    networks read them with a convolutional encoder)."""
    if isinstance(observation_spec, Composite):
        return any(holds_image(entry) for entry in observation_spec.values())
    return is_image_spec(observation_spec)


def set_matmul_precision(precision: str) -> None:
    """``torch.set_float32_matmul_precision(precision)``, and with ``"medium"`` oneDNN's CPU convolutions in
    bfloat16 as well (torch's setting leaves them at float32; any other precision puts them back)."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.mkldnn.conv.fp32_precision = "bf16" if precision == "medium" else "none"
