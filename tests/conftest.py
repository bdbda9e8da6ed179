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
