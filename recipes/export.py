"""Export a saved agent's deterministic policy to a file that runs without this toolkit.

    python -m recipes.export runs/demo                          # writes runs/demo/policy.onnx
    python -m recipes.export runs/demo/best_agent.ckpt --output best.onnx

The ONNX model takes a batch of observations as the Gymnasium env returns them and gives the env's actions, with
the observation normalisation and action scaling inside (see ``agents.export``); run it with ``onnxruntime``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import tyro

from agents import Agent
from agents.export import DeterministicPolicy, export_onnx
from errors import InputError
from training.cli import run_command


@dataclass
class ExportConfig:
    """Export a saved agent."""

    path: Annotated[Path, tyro.conf.Positional]
    """A run directory (its agent.ckpt is used) or an agent checkpoint file."""
    format: Literal["onnx"] = "onnx"
    """File format."""
    output: Path | None = None
    """Where to write the model (a folder: policy.onnx in it); default: policy.onnx beside the checkpoint."""


def main(config: ExportConfig) -> dict:
    """Export and return a summary: the file, its inputs and outputs."""
    if config.format != "onnx":
        raise InputError(f"--format must be onnx, got {config.format!r}.")
    checkpoint = config.path / "agent.ckpt" if config.path.is_dir() else config.path
    agent = Agent.load(checkpoint)
    output = config.output or checkpoint.parent / "policy.onnx"
    if output.is_dir():
        output = output / "policy.onnx"
    export_onnx(agent, output)
    module = DeterministicPolicy(agent)
    return {
        "checkpoint": str(checkpoint),
        "output": str(output),
        "inputs": module.input_names,
        "outputs": module.output_names,
    }


if __name__ == "__main__":
    run_command(main, ExportConfig, __doc__)
