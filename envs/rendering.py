"""Headless rendering: Gymnasium's pygame renderers and MuJoCo's OpenGL renderer without a display."""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys
import warnings
from collections.abc import Iterator

from errors import InputError

# MuJoCo's headless OpenGL backends and the system library each one loads (through PyOpenGL)
MUJOCO_GL_LIBRARIES = {"egl": "EGL", "osmesa": "OSMesa"}


def _has_display() -> bool:
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))


def check_display() -> None:
    """Raise :class:`InputError` when a window cannot open: on Linux, neither ``DISPLAY`` nor ``WAYLAND_DISPLAY``
    is set (a server, a container, an SSH session without forwarding)."""
    if sys.platform.startswith("linux") and not _has_display():
        raise InputError(
            "--render shows the agent in a window, and this machine has no display (DISPLAY and WAYLAND_DISPLAY are "
            "unset); record a video instead (--video), or run where a display exists."
        )


def use_headless_video_driver() -> None:
    """Let pygame render ``rgb_array`` frames without a display (and without its display warnings).

    Sets ``SDL_VIDEODRIVER=dummy`` unless a display is available or the variable is already set.
    """
    if not _has_display():
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")


def drop_unusable_mujoco_gl() -> None:
    """Unset ``MUJOCO_GL`` (and a matching ``PYOPENGL_PLATFORM``) when it names a headless backend whose system
    library is not installed, with a one-line warning.

    MuJoCo picks its OpenGL backend when it is imported (TorchRL imports it with ``torchrl.envs``), and a backend
    whose library is missing (``MUJOCO_GL=osmesa`` without libOSMesa) breaks that import with an error deep inside
    PyOpenGL, taking every recipe down with it, MuJoCo or not. Without the variable MuJoCo imports as usual and
    trains, and :func:`headless_rendering` draws videos through EGL where it is installed (elsewhere runs skip the
    video with a warning). Called when :mod:`envs` is imported, before TorchRL.
    """
    backend = os.environ.get("MUJOCO_GL", "").lower()
    library = MUJOCO_GL_LIBRARIES.get(backend)
    if library is None or ctypes.util.find_library(library) is not None:
        return
    os.environ.pop("MUJOCO_GL")
    if os.environ.get("PYOPENGL_PLATFORM", "").lower() == backend:
        os.environ.pop("PYOPENGL_PLATFORM")
    package = {"egl": "libegl1", "osmesa": "libosmesa6"}[backend]
    warnings.warn(
        f"MUJOCO_GL={backend} was unset: its library lib{library} is not installed and MuJoCo would fail to import. "
        f"Runs train as usual; videos render through EGL where it is installed. To use {backend}, install "
        f"{package} (Debian).",
        stacklevel=2,
    )


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


def check_mujoco_camera(env) -> None:
    """Raise :class:`InputError` when a MuJoCo env's ``camera_id`` names no camera of its model.

    MuJoCo's renderer meets such an id as a C-level fatal error that ends the process (no Python exception a run
    could catch), so a video of it would take the run's last outputs with it. ``-1`` is the free camera; ids
    ``0 .. model.ncam - 1`` are the model's own. Other envs pass as they are."""
    base = getattr(env, "unwrapped", env)
    renderer, model = getattr(base, "mujoco_renderer", None), getattr(base, "model", None)
    camera_id, cameras = getattr(renderer, "camera_id", None), getattr(model, "ncam", None)
    if not isinstance(camera_id, int) or not isinstance(cameras, int) or -1 <= camera_id < cameras:
        return
    ids = {0: "only -1", 1: "id 0, or -1"}.get(cameras, f"ids 0 to {cameras - 1}, or -1")
    raise InputError(
        f"camera_id={camera_id} names no camera of this MuJoCo model (it has {cameras}: {ids} for the free camera), "
        "and MuJoCo's renderer would end the process on it; pass one of those (--env-kwargs camera_id=N) or a "
        "camera_name."
    )
