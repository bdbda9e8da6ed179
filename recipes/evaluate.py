"""Evaluate a saved agent: per-episode returns and lengths, optionally a video.

    python -m recipes.evaluate runs/demo --episodes 20 --video
    python -m recipes.evaluate runs/demo/best_agent.ckpt --env-id CartPole-v1 --stochastic
    python -m recipes.evaluate runs/demo --episodes 3 --render      # in a window, where a display exists

The agent runs in the env it was trained on, with its env kwargs, wrappers and observation statistics from the
checkpoint; prints JSON: the mean and standard deviation of the returns, and each episode's return and length.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import tyro

from agents import Agent
from envs.rendering import check_display
from envs.vector import check_device, check_env_id
from errors import InputError, RenderError, WriteError
from training.cli import run_command


@dataclass
class EvaluateConfig:
    """Evaluate a saved agent."""

    path: Annotated[Path, tyro.conf.Positional]
    """A run directory (its agent.ckpt is used) or an agent checkpoint file."""
    episodes: int = 20
    """Number of episodes."""
    seed: int | None = 0
    """Base seed of the episodes' resets (episode k uses seed + k); None for unseeded."""
    env_id: str | None = None
    """Evaluate in this Gymnasium env instead of the one the agent was trained on (same spaces needed)."""
    stochastic: bool = False
    """Sample actions instead of taking the policy's mode."""
    video: bool = False
    """Record the first episode to CHECKPOINT-evaluation.mp4 beside the checkpoint (agent-evaluation.mp4 for a run's
    agent.ckpt; the run's own video.mp4 is left alone), or at --video-path."""
    video_path: Path | None = None
    """Where to write the video (a .mp4, .mkv, .mov or .avi file, or a folder for video.mp4); implies --video."""
    render: bool = False
    """Show the episodes in a window (render_mode='human'), one after another; an error where no display exists."""
    allow_wrappers: tuple[str, ...] = ()
    """Env wrapper import paths the checkpoint names that may be imported besides Gymnasium's and this toolkit's
    (importing a module runs its code: name only those you trust)."""
    device: str = "cpu"
    """Device to run the policy on."""


def main(config: EvaluateConfig) -> dict:
    """Evaluate and return a summary with per-episode returns and lengths."""
    if config.episodes < 1:
        raise InputError(f"--episodes must be a positive integer, got {config.episodes}.")
    check_device(config.device)
    if config.env_id is not None:
        check_env_id(config.env_id)
    if config.render:
        if config.video or config.video_path is not None:
            raise InputError("--render shows the episodes in a window; record a video without it (--video).")
        check_display()
    checkpoint = config.path / "agent.ckpt" if config.path.is_dir() else config.path
    agent = Agent.load(checkpoint, device=config.device, allow_wrappers=config.allow_wrappers)
    video_path = None
    if config.video or config.video_path is not None:
        # its own name beside the checkpoint: the run's video.mp4 stays the run's
        video_path = config.video_path or checkpoint.parent / f"{checkpoint.stem}-evaluation.mp4"
    options = {
        "episodes": config.episodes,
        "deterministic": not config.stochastic,
        "seed": config.seed,
        "render": config.render,
    }
    try:
        result = agent.evaluate(config.env_id, video_path=video_path, **options)
    except RenderError as error:
        if video_path is None:
            raise
        warnings.warn(f"No video: {error} Evaluating without one.", stacklevel=2)
        video_path = None
        result = agent.evaluate(config.env_id, **options)
    except (InputError, WriteError):
        raise
    except Exception as error:
        if video_path is None:
            raise
        detail = str(error).splitlines()[0] if str(error) else type(error).__name__
        warnings.warn(
            f"No video: the env could not be rendered ({type(error).__name__}: {detail}); evaluating without one "
            "(MuJoCo on a machine without a display: set MUJOCO_GL=egl or osmesa).",
            stacklevel=2,
        )
        video_path = None
        result = agent.evaluate(config.env_id, **options)
    return {
        "checkpoint": str(checkpoint),
        "env_id": config.env_id or agent.env_id,
        "episodes": config.episodes,
        "return_mean": result.mean,
        "return_std": result.std,
        "returns": result.returns.tolist(),
        "lengths": result.lengths.tolist(),
        "video": None if result.video_path is None else str(result.video_path),
    }


if __name__ == "__main__":
    run_command(main, EvaluateConfig, __doc__)
