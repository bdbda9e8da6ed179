"""Seeding in one place: Python, NumPy and torch (the envs and their action spaces are seeded by ``make_env``)."""

from __future__ import annotations

import random

import numpy as np
import torch

from training.config import RunConfig


def prepare_process(run: RunConfig) -> None:
    """Seed Python, NumPy and torch with ``run.seed`` and set torch's CPU threads (``run.threads``; 0 keeps
    torch's default)."""
    random.seed(run.seed)
    np.random.seed(run.seed)
    torch.manual_seed(run.seed)
    if run.threads > 0:
        torch.set_num_threads(run.threads)
