"""Where a run came from: the project's version and, when it runs from a git checkout, the commit and whether the
tree had uncommitted changes. Saved as ``"source"`` in config.json, the W&B config and the agent's checkpoint."""

from __future__ import annotations

import os
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any

PROJECT = "rlkit"
PROJECT_ROOT = Path(__file__).resolve().parents[1]


@cache
def run_source() -> dict[str, Any]:
    """``{"version": "0.1.0", "commit": "5c6e...", "dirty": False}``; commit and dirty are None outside a git
    checkout (an installed wheel) or without git, version None when the project is not installed."""
    try:
        version = metadata.version(PROJECT)
    except metadata.PackageNotFoundError:
        version = None
    commit = _git("rev-parse", "HEAD")
    status = None if commit is None else _git("status", "--porcelain", "--untracked-files=no")
    return {"version": version, "commit": commit, "dirty": None if status is None else bool(status)}


def _git(*arguments: str) -> str | None:
    """Git's output in the project's folder, or None when git is missing, fails or takes over 5 s."""
    try:
        result = subprocess.run(
            ["git", "-C", str(PROJECT_ROOT), *arguments],
            capture_output=True,
            text=True,
            timeout=5,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # a status must not take the index lock
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None
