"""Test settings: headless rendering, offline W&B, quiet warnings, one torch thread per xdist worker."""

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture
def output_dir(tmp_path):
    return tmp_path / "run"


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster of two CPUs for the tests of a process (they run in one xdist group: "ray")."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()
