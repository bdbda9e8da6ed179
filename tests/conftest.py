"""Test settings: headless rendering, offline W&B, quiet warnings, one torch thread per xdist worker."""

import os

os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_SILENT", "true")

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _restore_linear_kernels():
    """Each test starts with the process's choice of linear kernels (agents.linear) and leaves it as it was: a
    recipe's run sets them for the whole process."""
    import agents.linear

    before = agents.linear.onednn_min_multiply_adds()
    yield
    agents.linear._onednn_from = before


@pytest.fixture
def torch_linear_kernels():
    """torch's own float32 products (F.linear) in every linear layer, for tests that compare a shortcut with the
    module path it replaces bit for bit (oneDNN's products sum in another order)."""
    from agents.linear import set_linear_kernels

    set_linear_kernels("torch")


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
