"""Writing files the safe way: complete or not at all, never through a link, and no temporary file left for ever.

Every file the toolkit writes is first written to a hidden temporary file in the same folder, then renamed over its
final path in one step (``os.replace``). At every moment the path holds the previous complete file or the new one;
a link planted at the path is replaced, not followed, so nothing outside the folder is written. A temporary file
carries the id of the process writing it: one whose process is gone (a run killed mid-write) is removed at the next
write into the same folder; another live process's never is. Files the toolkit reads must be regular files
(:func:`require_regular_file`): a device or a pipe named in their place is refused before anything is read.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import socket
import stat
import time
import uuid
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from errors import InputError, WriteError

# ".NAME.writing-HOST-PID-HEX.SUFFIX", and TorchRL's staging folder for it, "..NAME.writing-...SUFFIX.stage-HEX"
_TEMPORARY = re.compile(
    r"\.\.?.+\.writing-(?:(?P<host>[0-9a-f]{8})-)?(?:(?P<pid>\d+)-)?[0-9a-f]{32}(?:\.\w+)?(?:\.stage-[0-9a-f]{32})?"
)
# this machine, as temporary names carry it (a process id means something only on the machine that issued it)
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
DEAD_STALE_AFTER_S = (
    60.0  # a dead process's temporary must also be this long untouched (another PID namespace)
)
UNKNOWN_STALE_AFTER_S = 600.0  # another machine's, or one named without a process, once untouched this long


def require_regular_file(path: str | Path, what: str) -> None:
    """Raise :class:`InputError` unless ``path`` is a regular file (or a link to one): reading a device such as
    ``/dev/zero`` would never end, and a pipe or socket would wait for a writer. ``what`` names the file for the
    message ("agent checkpoint", "preset file")."""
    try:
        mode = os.stat(path).st_mode
    except OSError as error:
        raise InputError(f"Could not read the {what} {path}: {error.strerror}.") from None
    if not stat.S_ISREG(mode):
        kind = "a folder" if stat.S_ISDIR(mode) else "not a regular file (a device, pipe or socket)"
        raise InputError(f"The {what} {path} is {kind}; name a file.")


def require_replaceable(path: Path, what: str, is_own: Callable[[Path], bool]) -> None:
    """Raise :class:`InputError` unless writing ``what`` at ``path`` replaces nothing but a file of its own kind
    (``is_own(path)``): a device or pipe there would be swapped for a regular file, and a user's other file (notes,
    code, another run's config.json) lost. A link at ``path`` is replaced, never followed, and may stand there."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as error:
        raise InputError(f"Cannot write the {what} {path}: {error.strerror}.") from None
    if stat.S_ISLNK(mode):
        return
    if not stat.S_ISREG(mode):
        raise InputError(
            f"{path} is not a regular file (a device, pipe or socket); writing the {what} would replace it: "
            "name a file or a folder."
        )
    if not is_own(path):
        raise InputError(
            f"{path} is a file that is not an {what}; writing one would replace it: choose another path, or move "
            "that file away first."
        )


def is_checkpoint_archive(path: Path) -> bool:
    """Whether ``path`` looks like a checkpoint this toolkit writes (an agent's or a run's resume state: an
    archive with a manifest), without loading it."""
    try:
        with zipfile.ZipFile(path) as archive:
            return "manifest.json" in archive.namelist()
    except (OSError, zipfile.BadZipFile, ValueError):
        return False


def probe_writable(folder: Path) -> None:
    """Raise ``OSError`` unless a new file can be made in ``folder``, before any work whose outputs would then be
    lost: a new file of its own, opened with ``O_EXCL | O_NOFOLLOW`` and removed at once, never one through a link
    left under its name."""
    probe = Path(folder) / f".write-test-{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        os.close(os.open(probe, flags, 0o600))
    except FileExistsError:  # a probe left behind (or a link put there): removed, not followed
        probe.unlink()
        os.close(os.open(probe, flags, 0o600))
    probe.unlink()


def check_writable(folder: Path, what: str, fix: str) -> None:
    """Raise :class:`InputError` naming ``folder`` (the ``what`` of the message, with the ``fix``) unless a new file
    can be made in it (:func:`probe_writable`)."""
    try:
        probe_writable(folder)
    except OSError as error:
        raise InputError(f"Cannot write in the {what} {folder} ({error.strerror}); {fix}.") from None


def temporary_path(path: Path) -> Path:
    """A hidden path beside ``path`` that names this machine and process (see :func:`remove_stale_temporaries`)
    and ends with ``path``'s suffix (writers that choose a format by it, such as video encoders, see the same one)."""
    return path.with_name(f".{path.name}.writing-{_HOST}-{os.getpid()}-{uuid.uuid4().hex}{path.suffix}")


def write_atomically(path: str | Path, write: Callable[[Path], object]) -> Path:
    """Call ``write(temporary)`` to write the file's content, then rename it over ``path`` in one step; a missing
    parent folder is created first.

    Raises:
        WriteError: the write failed (a full disk, a read-only folder); the message names ``path`` and says that
            the previous file, if any, is intact. The temporary file is removed.
    """
    with atomic_write(path) as temporary, write_errors(path):
        write(temporary)
    return Path(path)


@contextlib.contextmanager
def atomic_write(path: str | Path) -> Iterator[Path]:
    """:func:`write_atomically` for content written over a block: yields the temporary path to write, renamed over
    ``path`` when the block ends without an exception and removed in every case, so that an exception in the block
    leaves ``path`` as it was. The block's own exceptions propagate as they are (wrap its writes in
    :func:`write_errors` to report them as failed writes); a failure to create the folder or to rename raises
    :class:`WriteError`."""
    path = Path(path)
    temporary = temporary_path(path)
    try:
        with write_errors(path):
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(path.parent)
        yield temporary
        with write_errors(path):
            os.replace(temporary, path)
    finally:
        _remove(temporary)


@contextlib.contextmanager
def write_errors(path: str | Path) -> Iterator[None]:
    """Report a failed write to ``path`` in the block (an ``OSError``, or PyTorch's ``RuntimeError`` for one) as
    :class:`WriteError` naming the path and saying whether a previous file there is intact; any other exception
    propagates as it is."""
    try:
        yield
    except (OSError, RuntimeError) as error:
        code, reason = _failed_write(error)
        if code is None:
            raise
        path = Path(path)
        kept = f"the previous {path.name} is intact" if path.exists() else f"no {path.name} was written"
        raise WriteError(code, f"Could not write {path} ({reason}); {kept}.") from None


# how PyTorch reports a failed write to a file (``torch.from_file``, memory-mapped storages) in a RuntimeError:
# "unable to write to file </path>: No space left on device (28)"
_TORCH_FILE_ERROR = re.compile(r"unable to .*file.*: (?P<reason>[^:]+?) \((?P<errno>\d+)\)")


def _failed_write(error: OSError | RuntimeError) -> tuple[int | None, str]:
    """The errno and reason of a failed write; ``(None, "")`` for a RuntimeError that is not PyTorch's report
    of one (a bug in the writer, which should surface as it is)."""
    if isinstance(
        error, OSError
    ):  # the first line: an encoder's error carries its whole command line after it
        return error.errno or errno.EIO, (error.strerror or str(error) or "no detail").splitlines()[0]
    match = _TORCH_FILE_ERROR.search(str(error).split("\n", 1)[0])
    return (int(match["errno"]), match["reason"]) if match else (None, "")


def write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` atomically (see :func:`write_atomically`)."""
    return write_atomically(path, lambda temporary: temporary.write_text(text))


def remove_stale_temporaries(folder: str | Path) -> list[Path]:
    """Remove the temporary files and staging folders that interrupted writes left in ``folder``; returns them.

    One is stale when the process that wrote it, on this machine, is gone and it has been untouched for a minute
    (a process in another PID namespace may use the same number), or, written on another machine or named without
    a process, when it has been untouched for ten minutes. This process's own are kept (it may be writing them now).
    """
    folder = Path(folder)
    removed = []
    try:
        entries = list(folder.iterdir())
    except OSError:
        return removed
    for entry in entries:
        match = _TEMPORARY.fullmatch(entry.name)
        if match is None or not _is_stale(entry, match.group("host"), match.group("pid")):
            continue
        _remove(entry)
        removed.append(entry)
    return removed


def _is_stale(entry: Path, host: str | None, pid: str | None) -> bool:
    age = time.time() - _last_touched(entry)
    if pid is None or host != _HOST:
        return age > UNKNOWN_STALE_AFTER_S
    if int(pid) == os.getpid() or age <= DEAD_STALE_AFTER_S:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, ValueError):
        return False  # alive under another user, or not a process id at all: leave it
    return False


def _last_touched(entry: Path) -> float:
    """The newest modification time of ``entry`` and, for a staging folder, of what it holds."""
    try:
        times = [entry.lstat().st_mtime]
        if entry.is_dir() and not entry.is_symlink():
            times += [path.lstat().st_mtime for path in entry.rglob("*")]
    except OSError:
        return time.time()  # vanishing as we look: someone is at work on it
    return max(times)


def _remove(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
