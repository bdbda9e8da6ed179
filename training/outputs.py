"""The run folder: which one a run writes into, never another run's unless asked, and the files a run leaves there.

A new run writes into ``--output-dir`` only if that folder holds no run yet (none of :data:`RUN_RECORDS`, each
recognised by its content); with ``--overwrite`` it first removes the run's files and log folders (and nothing else
the folder holds). A file named as a run's that is not one (another program's ``summary.json``) is never replaced
nor taken for a run: the run is refused. Without ``--output-dir`` it
claims a fresh ``runs/ALGORITHM-ENV-SEED-TIMESTAMP`` folder, with a ``-2``, ``-3``, ... suffix when another run
took that name in the same second. A resumed run writes into the folder it continues.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from datetime import datetime
from pathlib import Path

from agents.files import check_writable, is_checkpoint_archive, remove_stale_temporaries
from errors import InputError
from training.config import RunConfig
from training.resume import MAX_RUN_RECORD_BYTES, run_record

# what a run writes into its folder: finding any of them means the folder holds a run
RUN_FILES = (
    "config.json",
    "summary.json",
    "evaluations.csv",
    "learning_curve.png",
    "agent.ckpt",
    "best_agent.ckpt",
    "resume.ckpt",
    "video.mp4",
)
RUN_FOLDERS = ("csv", "wandb", "tensorboard", "videos")  # the loggers' files, the evaluations' videos
EVALUATIONS_HEADER = b"frames,wall_time_s,return_mean,"
# the run's files recognised by their content: a folder holding one of them holds a run
RUN_RECORDS = (
    "config.json",
    "summary.json",
    "evaluations.csv",
    "agent.ckpt",
    "best_agent.ckpt",
    "resume.ckpt",
)


def run_files(folder: Path) -> list[str]:
    """The names of the run outputs ``folder`` holds: when it holds a run (a run's config.json, summary.json,
    evaluations.csv or checkpoint, by content, not by name alone), the files (or links) of :data:`RUN_FILES` there,
    and then the loggers' :data:`RUN_FOLDERS` beside them (a ``csv/`` or ``wandb/`` folder alone is not a run: it
    may be anyone's)."""
    if not any(_is_run_record(folder / name) for name in RUN_RECORDS):
        return []
    return [name for name in (*RUN_FILES, *RUN_FOLDERS) if _present(folder / name)]


def _present(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _is_run_record(path: Path) -> bool:
    """Whether ``path`` (one of :data:`RUN_RECORDS`) is what a run writes under its name."""
    if path.name == "config.json":
        return _is_run_config(path.parent)
    if not path.is_file() or path.is_symlink():  # a link alone is no run: it is replaced, never followed
        return False
    if path.suffix == ".ckpt":
        return is_checkpoint_archive(path)
    if path.name == "evaluations.csv":  # the header of the evaluation rows, whatever the rows after it
        try:
            with path.open("rb") as file:
                return file.read(len(EVALUATIONS_HEADER)) == EVALUATIONS_HEADER
        except OSError:
            return False
    return {"algorithm", "env_id", "frames"} <= run_record(path).keys()  # summary.json


def _is_run_config(folder: Path) -> bool:
    """Whether ``folder``'s config.json is a run's: empty (claimed by a run that stopped before writing it) or a
    JSON object with the run's options under "run"; not a file of the same name that something else wrote."""
    path = folder / "config.json"
    try:
        if path.is_symlink():  # a link in place of a run's file: clear_run removes the link, never its target
            return True
        if not path.is_file():
            return False
        if path.stat().st_size > MAX_RUN_RECORD_BYTES:  # a run's config.json is a few kilobytes
            return False
        text = path.read_text()
        return not text or isinstance(json.loads(text).get("run"), dict)
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _foreign_file(folder: Path) -> Path | None:
    """The first entry of ``folder`` named as a run's file that is not one and that a new run would replace: a
    run's record by name only (a summary.json of another program), a folder or pipe under such a name, or (in
    a folder holding no run) a learning_curve.png or video.mp4, which alone show no run."""
    holds_run = any(_is_run_record(folder / name) for name in RUN_RECORDS)
    for name in RUN_FILES:
        path = folder / name
        if path.is_symlink() or not path.exists():
            continue
        if not path.is_file() or (name in RUN_RECORDS and not _is_run_record(path)) or not holds_run:
            return path
    return None


def prepare_run_folder(algorithm: str, run: RunConfig, resumed: bool) -> Path:
    """The folder this run writes into, created and checked: a folder (not a file), writable, and holding no other
    run (or cleared of it with ``run.overwrite``).

    Raises:
        InputError: the folder is a file, cannot be created or written, or holds another run.
    """
    if run.output_dir is not None:
        # '~/runs' given in quotes: the home folder, as TorchRL's checkpoint writer reads it too
        folder = Path(run.output_dir).expanduser()
        if folder.resolve() == Path(folder.resolve().anchor):
            raise InputError(
                f"--output-dir {run.output_dir} is the filesystem's root; name a folder for the run."
            )
    elif resumed:  # beside the checkpoint, wherever the run was moved
        resume = Path(run.resume)
        folder = resume if resume.is_dir() else resume.parent
    else:
        return _fresh_folder(algorithm, run)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--output-dir {folder} is a file; name a folder for the run's outputs.")
    _make_folder(folder)
    lock_run_folder(folder)  # before anything there is looked at or removed: no other run is writing into it
    try:
        _check_run_folder(folder, run, resumed)
    except BaseException:
        release_run_folder(folder)
        raise
    return folder


def _check_run_folder(folder: Path, run: RunConfig, resumed: bool) -> None:
    """Check (and with ``run.overwrite`` clear) the locked ``folder`` as :func:`prepare_run_folder` describes."""
    continues_here = resumed and folder.resolve() == resume_folder(run.resume).resolve()
    foreign = _foreign_file(folder)
    if foreign is not None:
        what = "configuration" if foreign.name == "config.json" else "file"
        raise InputError(
            f"{foreign} is not a run's {what}, and a run writes its own {foreign.name} there; move it away or "
            "choose another --output-dir."
        )
    existing = [] if continues_here else run_files(folder)
    if existing and not run.overwrite:
        continuation = (
            f"continue it with --resume {folder}"
            if "resume.ckpt" in existing
            else "it cannot be continued (it wrote no resume.ckpt)"
        )
        raise InputError(
            f"{folder} already holds a run ({', '.join(existing)}); {continuation}, replace it with --overwrite, or "
            "choose another --output-dir."
        )
    if existing:
        clear_run(folder)
    check_writable(folder, "run folder", "choose another --output-dir")
    _refuse_links_in_log_folders(folder, run.logger == "wandb")
    if not continues_here:
        _claim(folder)


def _claim(folder: Path) -> None:
    """Create ``config.json`` exclusively (the run replaces it with its content): of two runs started at once on
    the same folder, one gets it and the other is refused."""
    try:
        os.close(os.open(folder / "config.json", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        raise InputError(
            f"{folder} already holds a run (another run has just claimed it); choose another --output-dir."
        ) from None


def clear_run(folder: Path) -> None:
    """Remove a run's outputs from ``folder`` (those :func:`run_files` finds, links among them included), leaving
    everything else there."""
    for name in run_files(folder):
        path = folder / name
        if path.is_symlink() or path.is_file():
            path.unlink()
        elif path.is_dir():
            shutil.rmtree(path)
    remove_stale_temporaries(folder)


def abandon_run_folder(folder: Path, run: RunConfig) -> None:
    """Give up the claim on ``folder`` of a run that failed before training (a logger that could not start, a
    callback's ``on_start`` raising), unless it continues the run already there: the run files it wrote (its
    config.json; a run continued from another folder, the evaluations.csv and best_agent.ckpt it carried over)
    go, so that the folder holds no run and the same command can be given again. A new run's folder held none of
    them before (another run's it refused or removed). The loggers' folders are left: they may have been there
    before, and alone show no run."""
    if run.resume is not None and resume_folder(run.resume).resolve() == folder.resolve():
        return
    for name in RUN_FILES:
        with contextlib.suppress(OSError):  # a folder under that name: refused before, left alone here
            (folder / name).unlink()


def _refuse_links_in_log_folders(folder: Path, wandb: bool) -> None:
    """The CSV and TensorBoard loggers append to the files of a continued run, and videos are written into
    videos/: a link among them would be followed out of the folder, so it is refused (the files the run replaces
    whole are written atomically instead). With ``wandb`` (``--logger wandb``) so is a link in place of the
    wandb/ folder, where W&B writes its run folders and logs (links inside it W&B replaces, not follows)."""
    for name in ("csv", "tensorboard", "videos", *(["wandb"] if wandb else [])):
        log_folder = folder / name
        links = [log_folder] if log_folder.is_symlink() else []
        if log_folder.is_dir() and not links and name != "wandb":
            links = [path for path in log_folder.rglob("*") if path.is_symlink()]
        if links:
            raise InputError(
                f"{links[0]} is a symbolic link; a run writes its logs and videos only to files inside its folder. "
                "Remove the link (or pass --logger none and no --video-every-eval)."
            )


def resume_folder(resume: Path) -> Path:
    resume = Path(resume)
    return resume if resume.is_dir() else resume.parent


def _fresh_folder(algorithm: str, run: RunConfig) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path("runs") / f"{algorithm}-{run.env_id.replace('/', '_')}-{run.seed}-{stamp}"
    _make_folder(base.parent)
    for index in range(1, 1000):
        folder = base if index == 1 else base.with_name(f"{base.name}-{index}")
        try:
            folder.mkdir()  # claims the name: another run starting this second gets the next one
        except FileExistsError:
            continue
        except OSError as error:
            raise InputError(
                f"Cannot create the run folder {folder} ({error.strerror}); pass --output-dir."
            ) from None
        _claim(folder)
        lock_run_folder(folder)
        return folder
    raise InputError(f"Too many runs named {base}-N; pass --output-dir.")


LOCK_FILE = ".run.lock"
# run folder (resolved) -> [descriptor of its lock file, runs of this process holding it]
_LOCKS: dict[Path, list[int]] = {}


def lock_run_folder(folder: Path) -> None:
    """Take the run folder's lock (``flock`` on its ``.run.lock``, which the system releases when the process
    ends), held until :func:`release_run_folder`: a second run, even one given ``--overwrite`` or ``--resume``,
    cannot write into a folder that a live run is writing into. Runs of this process share it.

    Raises:
        InputError: another process holds the lock, or the lock file cannot be made (a link stands there).
    """
    key = folder.resolve()
    if key in _LOCKS:
        _LOCKS[key][1] += 1
        return
    path = folder / LOCK_FILE
    try:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:  # ELOOP: a link planted there; EACCES: a read-only folder
        raise InputError(
            f"Cannot make the run folder's lock {path} ({error.strerror}); remove what stands there or choose "
            "another --output-dir."
        ) from None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        raise InputError(
            f"Another run is writing into {folder} right now; wait for it to end, or choose another --output-dir."
        ) from None
    _LOCKS[key] = [descriptor, 1]


def release_run_folder(folder: Path) -> None:
    """Release a run's hold on its folder's lock (see :func:`lock_run_folder`); the last run of this process that
    held it unlocks it."""
    held = _LOCKS.get(folder.resolve())
    if held is None:
        return
    held[1] -= 1
    if held[1] == 0:
        del _LOCKS[folder.resolve()]
        os.close(held[0])  # closing the descriptor releases the flock


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise InputError(f"--output-dir {folder}: a file stands in its path; name another folder.") from None
    except OSError as error:
        raise InputError(
            f"Cannot create the run folder {folder} ({error.strerror}); choose another --output-dir."
        ) from None
