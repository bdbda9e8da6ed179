"""Exact resume: the whole state of a training run in one file, ``resume.ckpt``, and the means to continue from it.

:class:`training.run.Run` writes ``resume.ckpt`` (its :class:`training.state.TrainingState` and the run's own
state: frames, evaluation history, W&B run id) with ``--checkpoint-every`` and on SIGINT/SIGTERM, and ``--resume``
restores it before the first batch. This module holds the file (written atomically, read only after its format
is checked) and the options of a resumed run (the saved ones; only the reporting options may change).

The file is a TorchRL checkpoint archive of JSON and raw tensors, written beside its target and renamed over
it; loading it never unpickles anything.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any

from torchrl.checkpoint import Checkpoint

from agents.agent import RESUME_FORMAT
from agents.archive import check_archive, first_line, nbytes, read_manifest_metadata
from agents.files import write_atomically
from errors import InputError

RESUME_FILE = "resume.ckpt"
RESUME_FORMAT_VERSION = 1

ENV_ID_OPTIONS = {"env_id", "eval_env_id"}  # a resumed run may restate them, as saved, to allow their modules
# options that change where and how a run reports, not what it computes: a resumed run may change them
REPORTING_OPTIONS = {
    "resume",
    "output_dir",
    "progress",
    "video",
    "video_every_eval",
    "allow_wrappers",
    "logger",
    "wandb_project",
    "wandb_online",
    "checkpoint_every",
    "overwrite",
}


class _StateComponent:
    """A ``state_dict`` holder for TorchRL's checkpoint: what is saved, or what was loaded."""

    def __init__(self, state: dict[str, Any] | None = None):
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


def save_resume_checkpoint(path: Path, state: dict[str, Any], metadata: dict[str, Any]) -> None:
    """Write ``state`` to ``path`` atomically (beside it, then renamed over it)."""
    checkpoint = Checkpoint(format="archive", training=_StateComponent(state))
    metadata = {"format": RESUME_FORMAT, "format_version": RESUME_FORMAT_VERSION, **metadata}
    write_atomically(path, lambda temporary: checkpoint.save(temporary, metadata=metadata))


def resume_path(path: str | Path) -> Path:
    """The resume checkpoint named by ``--resume``: a run directory (its ``resume.ckpt``) or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / RESUME_FILE
    if not path.exists():
        raise InputError(
            f"No resume checkpoint at {path}. Runs with the single-process collector write resume.ckpt with "
            "--checkpoint-every N and when stopped by SIGINT or SIGTERM (worker collectors keep no resume state)."
        )
    return path


def read_resume_metadata(path: Path) -> dict[str, Any]:
    """The manifest metadata of a resume checkpoint; :class:`InputError` for anything else."""
    return _checked_metadata(path)[0]


def _checked_metadata(path: Path) -> tuple[dict[str, Any], int]:
    """The manifest metadata of a resume checkpoint and the bytes of tensors it holds."""
    held = sum(nbytes(tensors) for tensors in check_archive(path, "resume").values())
    metadata = read_manifest_metadata(path, "resume")
    if metadata.get("format") != RESUME_FORMAT:
        raise InputError(
            f"{path} is not a resume checkpoint (an agent checkpoint such as agent.ckpt holds the policy only); "
            "pass the run directory or its resume.ckpt."
        )
    if metadata.get("format_version") != RESUME_FORMAT_VERSION:
        raise InputError(
            f"{path} has resume format version {metadata.get('format_version')}, expected {RESUME_FORMAT_VERSION}."
        )
    if not (
        isinstance(metadata.get("algorithm"), str)
        and isinstance(metadata.get("env_id"), str)
        and isinstance(metadata.get("config"), dict)
    ):
        raise InputError(
            f"{path} has an incomplete description (algorithm, env_id, config); it is damaged or forged."
        )
    return metadata, held


def network_floor(config: Any) -> int:
    """The fewest parameters the networks that ``config``'s options describe can have: the products of neighbouring
    widths of every ``*hidden_sizes`` option and three square matrices of a ``--recurrent`` layer (a GRU's; an
    LSTM has four). Every network's parameters are in a resume checkpoint, so a file holding fewer bytes of tensors
    than this in float32 describes networks it does not hold."""
    total = 0
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if dataclasses.is_dataclass(value):
            total += network_floor(value)
        elif field.name.endswith("hidden_sizes") and isinstance(value, tuple):
            total += sum(width * next_width for width, next_width in itertools.pairwise(value))
        elif field.name == "recurrent_size" and getattr(config, "recurrent", None) and isinstance(value, int):
            total += 3 * value * value
    return total


def load_resume_checkpoint(path: Path) -> dict[str, Any]:
    """The training state saved in ``path`` (JSON and tensors only)."""
    component = _StateComponent()
    try:
        Checkpoint(training=component).load(path, map_location="cpu")
    except Exception as error:  # noqa: BLE001 - damaged archives fail TorchRL's reader in many ways
        raise InputError(
            f"Could not read the training state in {path}: {type(error).__name__}: {first_line(error)}"
        ) from None
    return component.state


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``--option (saved X, now Y)`` for every option that differs, except the reporting ones and the options a
    checkpoint written by an earlier version does not hold (a resumed run gives them their defaults)."""
    differences = []
    for name in sorted(set(saved) | set(current)):
        if name in REPORTING_OPTIONS or name in ("preset_applied", "source") or name not in saved:
            continue
        old, new = saved.get(name), current.get(name)
        if isinstance(old, dict) and isinstance(new, dict):
            differences += config_differences(old, new)
        elif old != new:
            differences.append(f"--{name.replace('_', '-')} (saved {old!r}, now {new!r})")
    return differences


def config_from_dict(config_type: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Rebuild a (nested) config dataclass from its JSON form (``config_to_dict``); :class:`InputError` naming the
    option for a value that is not of its option's type (a damaged or forged file)."""
    if not isinstance(data, dict):
        raise InputError(f"the saved options{f' of {prefix}' if prefix else ''} are not a mapping")
    hints = typing.get_type_hints(config_type)
    values = {}
    for field in dataclasses.fields(config_type):
        if field.name in data:
            values[field.name] = _field_value(hints[field.name], data[field.name], prefix + field.name)
    return config_type(**values)


def _field_value(hint: Any, value: Any, name: str) -> Any:
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return config_from_dict(hint, value, f"{name}.")
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in arguments:
            return None
        (option,) = (option for option in arguments if option is not type(None))
        return _field_value(option, value, name)
    if origin is tuple:
        fits = isinstance(value, (list, tuple))
        value = tuple(_field_value(arguments[0], item, name) for item in value) if fits else value
    elif origin is typing.Literal:
        fits = any(type(value) is type(choice) and value == choice for choice in arguments)
    elif origin is dict or hint is dict:
        fits = isinstance(value, dict)
    elif hint in (int, float):  # JSON has no int/float distinction for a float option holding 1
        fits = isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
        value = hint(value) if fits else value
    elif hint in (bool, str):
        fits = isinstance(value, hint)
    elif hint is Path:
        fits = isinstance(value, str)
        value = Path(value) if fits else value
    else:
        raise TypeError(f"config_from_dict cannot check options of type {hint}")
    if not fits:
        raise InputError(f"the saved option {name} holds {value!r:.80}, not {_type_name(hint)}")
    return value


def _type_name(hint: Any) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return "one of " + ", ".join(repr(choice) for choice in typing.get_args(hint))
    if typing.get_origin(hint) is tuple:
        return f"a list of {_type_name(typing.get_args(hint)[0])}"
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def explicit_options(argv: list[str]) -> set[str]:
    """The option names given on a command line (``--lr 1e-3`` and ``--no-progress`` give lr and progress)."""
    names = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            names.add(name.removeprefix("no_") if name.startswith("no_") else name)
    return names


def check_algorithm(path: Path, metadata: dict[str, Any], algorithm: str) -> None:
    """Raise :class:`InputError` naming the recipe to use when the resume checkpoint at ``path`` (its manifest
    ``metadata``) was written by another recipe than ``algorithm``."""
    if metadata["algorithm"] != algorithm:
        raise InputError(
            f"{path} was written by recipes.{metadata['algorithm']}; resume it with "
            f"python -m recipes.{metadata['algorithm']} --resume {path}."
        )


MAX_RUN_RECORD_BYTES = 2**20  # config.json and summary.json: a few kB in every run


def run_record(path: Path) -> dict[str, Any]:
    """The JSON object in the run folder's file ``path`` (config.json, summary.json); empty when there is none
    that could be read (missing, not a regular file, larger than a run writes, damaged): it names nothing then."""
    try:
        if not path.is_file() or path.stat().st_size > MAX_RUN_RECORD_BYTES:
            return {}
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def check_own_folder(path: Path, metadata: dict[str, Any]) -> None:
    """Raise :class:`InputError` when the resume checkpoint at ``path`` is not its folder's run, so that continuing
    it there would replace another run's files: a link to a checkpoint elsewhere, or a checkpoint of another
    algorithm, env, env kwargs or seed than the run the folder's config.json and summary.json describe. Warn when
    config.json holds other options than the checkpoint (edited by hand: a resumed run reads the checkpoint's)."""
    if path.is_symlink():
        raise InputError(
            f"{path} is a link to {os.path.realpath(path)}: a run continues in the folder its resume.ckpt is in, "
            "and the checkpoint a link points at may be another run's. Put the file itself in place of the link, "
            "resume the run from the folder the file is in, or give --output-dir to continue it in a new one."
        )
    saved_run = metadata["config"].get("run")
    saved_run = saved_run if isinstance(saved_run, dict) else {}
    config = run_record(path.parent / "config.json")
    run = config.get("run") if isinstance(config.get("run"), dict) else {}
    summary = run_record(path.parent / "summary.json")
    found = {
        "algorithm": (summary.get("algorithm"), metadata["algorithm"]),
        "env": (run.get("env_id", summary.get("env_id")), metadata["env_id"]),
        "env kwargs": (run.get("env_kwargs"), saved_run.get("env_kwargs")),
        "seed": (run.get("seed", summary.get("seed")), saved_run.get("seed")),
    }
    differ = [name for name, (held, saved) in found.items() if held is not None and held != saved]
    if differ:
        held = ", ".join(f"{name} {found[name][0]!r:.80}" for name in differ)
        saved = ", ".join(f"{name} {found[name][1]!r:.80}" for name in differ)
        raise InputError(
            f"{path} is the checkpoint of a run of {saved}, but its folder holds a run of {held}: the checkpoint "
            "was copied in from another run, and continuing it here would replace this run's files. Resume that "
            "run from its own folder, or give --output-dir to continue it in a new one."
        )
    if edited := config_differences(metadata["config"], config) if run else []:
        warnings.warn(
            f"{path.parent / 'config.json'} holds other options than {path.name}: "
            + ", ".join(edited[:5]).replace("(saved", "(checkpoint").replace(", now", ", config.json")
            + (f" and {len(edited) - 5} more" if len(edited) > 5 else "")
            + "; a resumed run continues with the checkpoint's options (config.json only records them, and is "
            "written again): start a new run to change them.",
            stacklevel=2,
        )


def resumed_config(config_type: type, config: Any, argv: list[str] | None = None) -> Any:
    """The configuration of the run that ``config.run.resume`` continues, with the reporting options given on
    this command line; :class:`InputError` when other options are given (the saved ones apply). The saved
    ``allow_wrappers`` is never read: which wrapper modules may be imported is ``config``'s own (the command
    line's) to say, whatever the file claims."""
    argv = sys.argv[1:] if argv is None else argv
    path = resume_path(config.run.resume)
    metadata, held = _checked_metadata(path)
    # the recipe's module by its import name (recipes.ppo, also when it runs as __main__ under python -m)
    module = sys.modules.get(config_type.__module__)
    name = getattr(getattr(module, "__spec__", None), "name", None) or config_type.__module__
    package, _, algorithm = name.rpartition(".")
    if package == "recipes":  # before the options are read as this recipe's (another's do not fit)
        check_algorithm(path, metadata, algorithm)
    saved = metadata["config"]
    given = explicit_options(argv)
    saved_run = saved.get("run") if isinstance(saved.get("run"), dict) else {}
    # an env id restated as saved: the user names its module, which the run may then import
    restated = {name for name in ENV_ID_OPTIONS & given if getattr(config.run, name) == saved_run.get(name)}
    changed = sorted(given - REPORTING_OPTIONS - restated - {"help"})
    if changed:
        raise InputError(
            "--resume continues the run with its saved options; drop "
            + ", ".join(f"--{name.replace('_', '-')}" for name in changed)
            + " (only "
            + ", ".join(f"--{name.replace('_', '-')}" for name in sorted(REPORTING_OPTIONS - {"resume"}))
            + " may change)."
        )
    try:
        resumed = config_from_dict(config_type, saved)
    except InputError as error:
        raise InputError(f"{path} cannot be resumed: {error}; the file is damaged or forged.") from None
    floor = network_floor(resumed)
    if 4 * floor > held:  # checked before anything is built from the options
        raise InputError(
            f"{path} cannot be resumed: its saved options describe networks of at least {floor:,} parameters "
            f"({4 * floor / 2**20:,.1f} MiB) where it holds {held / 2**20:,.1f} MiB of tensors; the file is damaged "
            "or forged."
        )
    for name in sorted(ENV_ID_OPTIONS - restated):  # a module named by the file is never imported from it
        env_id = getattr(resumed.run, name)
        if env_id is not None and not _imported_or_unnamed(env_id):
            raise InputError(
                f"{path} continues a run on {env_id}, whose module this toolkit does not import because a file "
                f"names it (importing a module runs its code). If you trust it, name it yourself: --resume "
                f"{config.run.resume} --{name.replace('_', '-')} {env_id}."
            )
    resumed.run.output_dir = None  # the checkpoint's directory, wherever the run was moved (unless given)
    # the wrappers a resumed run may import are this command line's to allow, never the file's
    resumed.run.allow_wrappers = config.run.allow_wrappers
    for name in explicit_options(argv) & REPORTING_OPTIONS:
        setattr(resumed.run, name, getattr(config.run, name))
    resumed.run.resume = config.run.resume
    return resumed


def _imported_or_unnamed(env_id: Any) -> bool:
    """Whether ``env_id`` names no module (``"CartPole-v1"``) or one already imported (``"module:EnvId"``)."""
    module, separator, _ = str(env_id).rpartition(":")
    return not separator or module in sys.modules


__all__ = [
    "RESUME_FILE",
    "check_algorithm",
    "check_own_folder",
    "config_differences",
    "config_from_dict",
    "load_resume_checkpoint",
    "read_resume_metadata",
    "resume_path",
    "resumed_config",
    "save_resume_checkpoint",
]
