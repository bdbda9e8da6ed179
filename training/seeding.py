"""Seeding in one place: Python, NumPy and torch (the envs and their action spaces are seeded by ``make_env``)."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from agents.linear import set_linear_kernels
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
    if run.threads > 0:
        torch.set_num_threads(run.threads)
    set_matmul_precision(run.matmul_precision)
    set_linear_kernels(run.linear_kernels)
    if run.learns_on_workers:  # Ray there, with a CPU per worker, before the run claims its output folder
        from training.distributed import init_ray

        init_ray(run.ray_address, run.gradient_workers, "--gradient-workers")


def core_share(processes: int) -> int:
    """Torch threads for each of ``processes`` processes side by side: the CPU's cores divided among them, at
    least one."""
    return max(1, (os.cpu_count() or 1) // processes)


def set_matmul_precision(precision: str) -> None:
    """``torch.set_float32_matmul_precision(precision)``, and with ``"medium"`` oneDNN's CPU convolutions in
    bfloat16 as well (torch's setting leaves them at float32; any other precision puts them back)."""
    torch.set_float32_matmul_precision(precision)
    torch.backends.mkldnn.conv.fp32_precision = "bf16" if precision == "medium" else "none"
