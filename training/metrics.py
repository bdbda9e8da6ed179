"""What a run measures as it trains: frames, training episode returns, the logged metrics, the progress bar, and
the NaN/Inf check of every batch and metric."""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from tqdm import tqdm

from envs.specs import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY

RECENT_EPISODES = 100  # train/episode_return_recent: the mean over this many last training episodes

# the batch entries checked for NaN and Inf, with the word that names them in the error
CHECKED_KEYS = (
    ("observation", "observations"),
    (("next", "observation"), "observations"),
    (("next", "reward"), "rewards"),
)


class Metrics:
    """Frames, wall time, training returns, the logger and the progress bar of one run.

    Args:
        logger: a TorchRL logger, or None.
        total_frames: the budget (the progress bar's length).
        progress: show the progress bar.
    """

    def __init__(self, logger: Any, total_frames: int, progress: bool):
        self.logger = logger
        self.frames = 0
        self.training_returns: list[tuple[int, float]] = []
        self.last_return: float | None = None
        self.recent_returns: deque[float] = deque(maxlen=RECENT_EPISODES)
        self._start = time.perf_counter()
        self._total_frames = total_frames
        self._show_progress = progress
        self._progress: tqdm | None = None

    @property
    def elapsed(self) -> float:
        """Seconds of training (a resumed run counts the time before it stopped)."""
        return time.perf_counter() - self._start

    def start_progress(self) -> None:
        self._progress = tqdm(
            total=self._total_frames,
            initial=self.frames,
            unit="frame",
            unit_scale=True,
            dynamic_ncols=True,
            disable=not self._show_progress,
        )

    def close_progress(self) -> None:
        if self._progress is not None:
            self._progress.close()

    def log(self, metrics: dict[str, float]) -> None:
        if self.logger is not None:
            self.logger.log_metrics({k: float(v) for k, v in metrics.items()}, step=self.frames)

    def record(self, batch: TensorDictBase, metrics: dict[str, float]) -> dict[str, float]:
        """Log a batch's metrics with its finished episodes' mean return and length, the mean return of the last
        100 training episodes, and the time; returns everything it logged."""
        done = batch.get(("next", "done"))
        if done.any():
            returns = batch.get(("next", EPISODE_RETURN_KEY))[done]
            lengths = batch.get(("next", EPISODE_LENGTH_KEY))[done]
            self.last_return = returns.mean().item()
            self.training_returns.append((self.frames, self.last_return))
            self.recent_returns.extend(returns.flatten().tolist())
            metrics = {
                **metrics,
                "train/episode_return": self.last_return,
                "train/episode_length": lengths.float().mean().item(),
                "train/episode_return_recent": sum(self.recent_returns) / len(self.recent_returns),
            }
        elapsed = self.elapsed
        metrics = {**metrics, "time/elapsed_s": elapsed, "time/fps": self.frames / max(elapsed, 1e-9)}
        self.log(metrics)
        if self._progress is not None:
            self._progress.update(batch.numel())
        return metrics

    def show(self, evaluation_return: float | None, refresh: bool = False) -> None:
        """Put the last training and evaluation returns beside the progress bar."""
        postfix = {}
        if self.last_return is not None:
            postfix["return"] = f"{self.last_return:.1f}"
        if evaluation_return is not None:
            postfix["eval"] = f"{evaluation_return:.1f}"
        if self._progress is not None:
            self._progress.set_postfix(postfix, refresh=refresh)

    def state_dict(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "elapsed_s": self.elapsed,
            "training_returns": self.training_returns,
            "last_return": self.last_return,
            "recent_returns": list(self.recent_returns),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.frames = state["frames"]
        self._start -= state["elapsed_s"]
        self.training_returns = [tuple(pair) for pair in state["training_returns"]]
        self.last_return = state["last_return"]
        self.recent_returns.extend(
            float(value) for value in state.get("recent_returns", ())
        )  # absent from older checkpoints


def all_finite(value: torch.Tensor) -> bool:
    """Whether every element of a floating-point tensor is finite. A CPU float32/float64 tensor is checked
    through its NumPy view: for the one-frame batches of off-policy recipes that costs a few microseconds where
    the three torch calls cost about 25."""
    if (
        value.device.type == "cpu"
        and value.dtype in (torch.float32, torch.float64)
        and not value.requires_grad
    ):
        return bool(np.isfinite(value.numpy()).all())
    return bool(torch.isfinite(value).all())


def find_non_finite(batch: TensorDictBase, metrics: dict[str, float]) -> str | None:
    """Where NaN or Inf first appears, observations, rewards or named metrics, or None if nowhere."""
    for key, where in CHECKED_KEYS:
        value = batch.get(key, None)
        # a Dict observation is a TensorDict: each of its float entries is checked
        leaves = value.values(True, True) if isinstance(value, TensorDictBase) else [value]
        if any(leaf is not None and leaf.is_floating_point() and not all_finite(leaf) for leaf in leaves):
            return where
    non_finite = [f"{name} ({value})" for name, value in metrics.items() if not math.isfinite(value)]
    return ", ".join(non_finite) or None
