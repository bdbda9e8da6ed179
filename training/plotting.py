"""The learning curve of a run: deterministic evaluations (mean ± std) and training episode returns."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agents.files import write_atomically


def plot_learning_curve(
    evaluations: list[dict[str, float]], training_returns: list[tuple[int, float]], path: Path, title: str
) -> Path:
    """Plot evaluation mean ± std and training episode returns against frames into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if training_returns:
        frames, returns = zip(*training_returns)
        ax.plot(
            frames, returns, color="tab:gray", alpha=0.5, linewidth=1, label="training episodes (batch mean)"
        )
    if evaluations:
        frames = np.array([row["frames"] for row in evaluations])
        mean = np.array([row["return_mean"] for row in evaluations])
        std = np.array([row["return_std"] for row in evaluations])
        ax.plot(frames, mean, marker="o", color="tab:blue", label="deterministic evaluation")
        ax.fill_between(frames, mean - std, mean + std, color="tab:blue", alpha=0.2)
    ax.set_xlabel("frames")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    try:
        write_atomically(path, lambda temporary: fig.savefig(temporary, format="png"))
    finally:
        plt.close(fig)
    return path
