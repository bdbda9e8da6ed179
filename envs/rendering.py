"""Headless rendering: Gymnasium's pygame renderers and MuJoCo's OpenGL renderer without a display."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


def _has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def use_headless_video_driver() -> None:
    """Let pygame render ``rgb_array`` frames without a display (and without its display warnings).

    Sets ``SDL_VIDEODRIVER=dummy`` unless a display is available or the variable is already set.
    """
    if not _has_display():
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


@contextlib.contextmanager
def headless_rendering() -> Iterator[None]:
    """Draw frames without a display while inside: pygame through SDL's dummy driver (see
    :func:`use_headless_video_driver`) and MuJoCo offscreen through EGL (``MUJOCO_GL=egl``, unless a display is
    available or the variable is set; Gymnasium reads it when an env first renders).

    ``MUJOCO_GL`` is put back on exit: MuJoCo reads it when it is imported, and a process started later (a worker)
    on a machine without an EGL library would otherwise fail to import it. Without EGL (``libegl1``), or OSMesa
    with ``MUJOCO_GL=osmesa``, MuJoCo cannot draw: rendering raises, and runs skip the video with a warning.
    """
    use_headless_video_driver()
    if _has_display() or "MUJOCO_GL" in os.environ:
        yield
        return
    os.environ["MUJOCO_GL"] = "egl"
    try:
        yield
    finally:
        os.environ.pop("MUJOCO_GL", None)
