"""Export a saved agent's deterministic policy to a file that runs without this toolkit.

    python -m recipes.export runs/demo                          # writes runs/demo/policy.onnx
    python -m recipes.export runs/demo/best_agent.ckpt --output best.onnx
    python -m recipes.export runs/demo --output exports/                # a folder (made): exports/policy.onnx

An existing output file is replaced only if it is an ONNX model (an earlier export); the checkpoint itself or any
other file is refused.

The ONNX model takes a batch of observations as the Gymnasium env returns them and gives the env's actions, with
the observation normalisation and action scaling inside (see ``agents.export``); run it with ``onnxruntime``.
"""

from __future__ import annotations

import os
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
    output: str | None = None
    """Where to write the model: a file, or a folder (an existing one, or any path ending in /) to write policy.onnx
    in; default: policy.onnx beside the checkpoint. An existing file is replaced only if it is an ONNX model."""


def main(config: ExportConfig) -> dict:
    """Export and return a summary: the file, its inputs and outputs."""
    if config.format != "onnx":
        raise InputError(f"--format must be onnx, got {config.format!r}.")
    checkpoint = config.path / "agent.ckpt" if config.path.is_dir() else config.path
    agent = Agent.load(checkpoint)
    output = output_path(config.output, checkpoint)
    export_onnx(agent, output)
    module = DeterministicPolicy(agent)
    return {
        "checkpoint": str(checkpoint),
        "output": str(output),
        "inputs": module.input_names,
        "outputs": module.output_names,
    }


def output_path(output: str | None, checkpoint: Path) -> Path:
    """The file to write: ``output``, or policy.onnx in it for a folder (an existing one, or a path ending in a
    separator, made if missing), or beside ``checkpoint`` by default.

    Raises:
        InputError: a file not named ``*.onnx``, the checkpoint itself, or an existing file that is not an ONNX model (see
            :func:`is_onnx_file`): export replaces only an earlier export.
    """
    separators = tuple(separator for separator in (os.sep, os.altsep) if separator)
    if output is not None and not str(output):
        raise InputError("--output is empty; name a .onnx file or a folder for policy.onnx.")
    path = checkpoint.parent / "policy.onnx" if output is None else Path(output)
    for parent in path.parents:  # a file where a folder of the path should be: mkdir would say "File exists"
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"--output {path}: {parent} is a file, not a folder; give another --output.")
            break
    if path.is_dir() or (isinstance(output, str) and output.endswith(separators)):  # a Path has lost its /
        path = path / "policy.onnx"
    if path.exists() and path.samefile(checkpoint):
        raise InputError(
            f"--output {path} is the agent checkpoint being exported; give another --output, e.g. "
            f"{checkpoint.parent / 'policy.onnx'}."
        )
    if path.suffix.lower() != ".onnx":  # so that the next export recognises the file as its own to replace
        raise InputError(
            f"--output {path}: name a file ending in .onnx, or a folder (an existing one, or a path ending in "
            f"{os.sep}) for policy.onnx."
        )
    if (path.exists() or path.is_symlink()) and not is_onnx_file(path):
        raise InputError(
            f"--output {path} exists and is not an ONNX model (a .onnx file), so export will not replace it; "
            "give another --output or remove that file first."
        )
    return path


def is_onnx_file(path: Path) -> bool:
    """Whether ``path`` is a regular file named ``*.onnx`` and is empty or starts as an ONNX model does: byte
    0x08, the protobuf tag of ``ModelProto.ir_version`` (field 1, which writers put first); a PyTorch checkpoint
    (a zip, ``PK``), a pickle, a text file, a pipe or a dangling link does not.

    Raises:
        InputError: the file cannot be read (its permissions).
    """
    if path.suffix.lower() != ".onnx" or not path.is_file():
        return False
    try:
        with path.open("rb") as file:
            start = file.read(1)
    except OSError as error:
        raise InputError(
            f"--output {path} exists and cannot be read ({error.strerror}), so export cannot tell whether it is an "
            "earlier export to replace; give another --output or remove that file first."
        ) from None
    return start in (b"", b"\x08")


if __name__ == "__main__":
    run_command(main, ExportConfig, __doc__)
