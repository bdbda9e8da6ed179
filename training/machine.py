"""What this machine holds, for options that start threads or processes: its cores and its memory."""

from __future__ import annotations

import os
import warnings

from errors import InputError

# a worker process with torch, TorchRL and its envs loaded, as measured here
WORKER_PROCESS_BYTES = 400 * 2**20


def check_worker_processes(count: int) -> None:
    """Raise :class:`InputError` for more worker processes than this machine's memory holds (each loads torch:
    about 400 MB); warn for more than it has cores (they take turns)."""
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        memory = None
    if memory is not None and count * WORKER_PROCESS_BYTES > memory:
        raise InputError(
            f"--num-workers {count} would start {count} processes of about {WORKER_PROCESS_BYTES / 2**30:.1f} GB "
            f"each (torch in every one), more than this machine's {memory / 2**30:.0f} GB of memory; use at most "
            f"{memory // WORKER_PROCESS_BYTES}."
        )
    if count > (os.cpu_count() or 1):
        warnings.warn(
            f"--num-workers {count} is more than this machine's {os.cpu_count()} CPU cores: the workers take turns "
            "and collect no faster.",
            stacklevel=3,
        )


def check_threads(count: int) -> None:
    """Warn for more torch threads than this machine has cores: they take turns and each update runs slower."""
    if count > (os.cpu_count() or 1):
        warnings.warn(
            f"--threads {count} is more than this machine's {os.cpu_count()} CPU cores: the threads take turns on "
            "them and each update runs slower; use at most as many as there are cores.",
            stacklevel=3,
        )
