"""Headless rendering for Gymnasium's pygame renderers."""

from __future__ import annotations

import os


def use_headless_video_driver() -> None:
    """Let pygame render ``rgb_array`` frames without a display (and without its display warnings).

    Sets ``SDL_VIDEODRIVER=dummy`` unless a display is available or the variable is already set.
    """
    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
