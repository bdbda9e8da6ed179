"""Exact resume: the whole state of a training run in one file, ``resume.ckpt``, and the means to continue from it.

A recipe hands :class:`Run` a :class:`TrainingState` naming what it trains and how: the env, the collector,
the modules (the loss module holds the networks and their targets), the optimizers, the replay buffer, the
target updater and any counters of its loop. :class:`Run` writes ``resume.ckpt`` with ``--checkpoint-every``
and on SIGINT/SIGTERM, and ``--resume`` restores it before the first batch: weights, target networks,
optimizer moments, learning-rate and clip-range schedules (functions of the restored counters), the replay
buffer with its prioritized sampler's priorities, observation-normaliser statistics, Python/NumPy/torch RNG
states, the training envs mid-episode (their physical state and their generators: see
:mod:`envs.runtime_state`), the collector's frame count and pending observation, and the run's evaluation
history. The continued run then collects and updates exactly as the uninterrupted one would have.

The file is a TorchRL checkpoint archive of JSON and raw tensors, written beside its target and renamed over
it; loading it never unpickles anything.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import types
import typing
import uuid
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.checkpoint import Checkpoint, CheckpointError, GlobalRNGState
from torchrl.collectors import Collector
from torchrl.data import PrioritizedSampler, ReplayBuffer
from torchrl.envs import EnvBase

from agents.agent import check_archive
from envs.errors import InputError
from envs.runtime_state import env_runtime_state, load_env_runtime_state

RESUME_FILE = "resume.ckpt"
RESUME_FORMAT = "rlkit.resume"
RESUME_FORMAT_VERSION = 1

# options that change where and how a run reports, not what it computes: a resumed run may change them
REPORTING_OPTIONS = {
    "resume",
    "output_dir",
    "progress",
    "video",
    "logger",
    "wandb_project",
    "wandb_online",
    "checkpoint_every",
}


@dataclasses.dataclass
class TrainingState:
    """What a recipe trains, as one ``state_dict`` / ``load_state_dict`` object for ``resume.ckpt``.

    Args:
        env: the training env (its sub-envs' mid-episode state is saved when it can be, see
            :mod:`envs.runtime_state`).
        collector: the single-process TorchRL collector stepping ``env``.
        modules: modules whose ``state_dict`` holds trained state (the loss module: networks, target networks,
            entropy coefficient; add-ons).
        optimizers: the optimizers, by name.
        replay_buffer: the replay buffer (storage, writer, sampler; a prioritized sampler's priorities).
        target_updater: TorchRL's hard target updater (its step counter); soft updaters have no state.
        extras: further objects with ``state_dict`` (n-step return windows, exploration noise).
        counters: the loop's own counters (e.g. gradient steps taken); updated in place on resume.
    """

    env: EnvBase
    collector: Any
    modules: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    replay_buffer: ReplayBuffer | None = None
    target_updater: Any = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    counters: dict[str, int] = dataclasses.field(default_factory=dict)

    def check_resumable(self) -> None:
        """Raise :class:`InputError` when this run's collector keeps state that cannot be saved."""
        if not isinstance(self.collector, Collector):
            raise InputError(
                "Resume state is kept for --collector-backend single only (worker processes and Ray actors hold "
                "their envs' state out of reach); drop --collector-backend or --resume."
            )

    def state_dict(self) -> dict[str, Any]:
        env_state, reason = env_runtime_state(self.env)
        collector = self.collector
        collector_state = {
            "frames": collector._frames,
            "iter": collector._iter,
            "carrier": collector._carrier.to_dict(),
        }
        if collector.track_traj_ids:
            collector_state["traj_pool"] = collector._traj_pool.state_dict()
        return {
            "modules": {name: module.state_dict() for name, module in self.modules.items()},
            "optimizers": {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()},
            "replay_buffer": None if self.replay_buffer is None else _replay_buffer_state(self.replay_buffer),
            "target_updater": getattr(self.target_updater, "counter", None),
            "extras": {name: extra.state_dict() for name, extra in self.extras.items()},
            "counters": dict(self.counters),
            "collector": collector_state,
            "env": env_state,
            "env_not_saved_because": reason,
            "rng": GlobalRNGState().state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, module in self.modules.items():
            _load_module_state(module, state["modules"][name])
        for name, optimizer in self.optimizers.items():
            optimizer.load_state_dict(state["optimizers"][name])
        if self.replay_buffer is not None:
            _load_replay_buffer_state(self.replay_buffer, state["replay_buffer"])
        if state["target_updater"] is not None:
            self.target_updater.counter = state["target_updater"]
        for name, extra in self.extras.items():
            extra.load_state_dict(state["extras"][name])
        self.counters.update(state["counters"])
        collector, collector_state = self.collector, state["collector"]
        collector._frames, collector._iter = collector_state["frames"], collector_state["iter"]
        if "traj_pool" in collector_state:
            collector._traj_pool.load_state_dict(collector_state["traj_pool"])
        if state["env"] is None:
            warnings.warn(
                f"The training envs' state was not saved ({state['env_not_saved_because']}): the resumed run "
                "starts new episodes, so it continues the interrupted one closely but not exactly.",
                stacklevel=2,
            )
        else:
            load_env_runtime_state(self.env, state["env"])
            carrier = collector._carrier  # the pending observations, each put back on its tensor's device
            saved = TensorDict(collector_state["carrier"], batch_size=carrier.batch_size)
            for key, value in saved.items(True, True):
                current = carrier.get(key, None)
                carrier.set(key, value if current is None else value.to(current.device))
        GlobalRNGState().load_state_dict(state["rng"])


def _load_module_state(module: nn.Module, state: dict[str, Any]) -> None:
    """``module.load_state_dict``, first giving buffers that are still empty (statistics sized on the first
    batch, such as RND's running returns) the saved shape."""
    for name, buffer in list(module.named_buffers()):
        saved = state.get(name)
        if saved is not None and buffer.numel() == 0 and saved.shape != buffer.shape:
            owner_name, _, attribute = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            owner._buffers[attribute] = torch.empty(saved.shape, dtype=saved.dtype, device=buffer.device)
    module.load_state_dict(state)


def _replay_buffer_state(buffer: ReplayBuffer) -> dict[str, Any]:
    sampler = buffer._sampler
    if isinstance(sampler, PrioritizedSampler):
        leaves = torch.arange(sampler._max_capacity)
        sampler_state = {
            "sum_tree": torch.as_tensor(sampler._sum_tree[leaves]),
            "min_tree": torch.as_tensor(sampler._min_tree[leaves]),
            "max_priority": sampler._max_priority,
            "alpha": sampler._alpha,
            "beta": sampler._beta,
            "eps": sampler._eps,
        }
    else:
        sampler_state = sampler.state_dict()
    return {
        "storage": buffer._storage.state_dict(),
        "writer": buffer._writer.state_dict(),
        "sampler": sampler_state,
    }


def _load_replay_buffer_state(buffer: ReplayBuffer, state: dict[str, Any]) -> None:
    storage = buffer._storage
    storage.load_state_dict(state["storage"])
    device = getattr(storage, "device", None)
    if storage._storage is not None and device not in (None, "auto"):  # loaded onto the CPU
        storage._storage = storage._storage.to(device)
    buffer._writer.load_state_dict(state["writer"])
    sampler, sampler_state = buffer._sampler, state["sampler"]
    if isinstance(sampler, PrioritizedSampler):
        leaves = torch.arange(sampler._max_capacity)
        sampler._sum_tree[leaves] = sampler_state["sum_tree"]
        sampler._min_tree[leaves] = sampler_state["min_tree"]
        sampler._max_priority = sampler_state["max_priority"]
        sampler._alpha, sampler._beta, sampler._eps = (
            sampler_state["alpha"],
            sampler_state["beta"],
            sampler_state["eps"],
        )
    else:
        sampler.load_state_dict(sampler_state)


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
    temporary = path.with_name(f".{path.name}.writing-{uuid.uuid4().hex}")
    try:
        Checkpoint(format="archive", training=_StateComponent(state)).save(
            temporary,
            metadata={"format": RESUME_FORMAT, "format_version": RESUME_FORMAT_VERSION, **metadata},
        )
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def resume_path(path: str | Path) -> Path:
    """The resume checkpoint named by ``--resume``: a run directory (its ``resume.ckpt``) or the file itself."""
    path = Path(path)
    if path.is_dir():
        path = path / RESUME_FILE
    if not path.exists():
        raise InputError(
            f"No resume checkpoint at {path}. Runs write resume.ckpt with --checkpoint-every N and when stopped "
            "by SIGINT or SIGTERM."
        )
    return path


def read_resume_metadata(path: Path) -> dict[str, Any]:
    """The manifest metadata of a resume checkpoint; :class:`InputError` for anything else."""
    check_archive(path, "resume")
    try:
        metadata = Checkpoint.manifest(path).get("metadata", {})
    except (CheckpointError, OSError, ValueError, zipfile.BadZipFile) as error:
        raise InputError(f"{path} is not a readable resume checkpoint ({error}).") from None
    if metadata.get("format") != RESUME_FORMAT:
        raise InputError(
            f"{path} is not a resume checkpoint (an agent checkpoint such as agent.ckpt holds the policy only); "
            "pass the run directory or its resume.ckpt."
        )
    if metadata.get("format_version") != RESUME_FORMAT_VERSION:
        raise InputError(
            f"{path} has resume format version {metadata.get('format_version')}, expected {RESUME_FORMAT_VERSION}."
        )
    return metadata


def load_resume_checkpoint(path: Path) -> dict[str, Any]:
    """The training state saved in ``path`` (JSON and tensors only)."""
    component = _StateComponent()
    try:
        Checkpoint(training=component).load(path, map_location="cpu")
    except (
        CheckpointError,
        OSError,
        ValueError,
        RuntimeError,
        KeyError,
        TypeError,
        zipfile.BadZipFile,
    ) as error:
        raise InputError(f"Could not read the training state in {path}: {error}") from None
    return component.state


def config_differences(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``--option (saved X, now Y)`` for every option that differs, except the reporting ones."""
    differences = []
    for name in sorted(set(saved) | set(current)):
        if name in REPORTING_OPTIONS:
            continue
        old, new = saved.get(name), current.get(name)
        if isinstance(old, dict) and isinstance(new, dict):
            differences += config_differences(old, new)
        elif old != new:
            differences.append(f"--{name.replace('_', '-')} (saved {old!r}, now {new!r})")
    return differences


def config_from_dict(config_type: type, data: dict[str, Any]) -> Any:
    """Rebuild a (nested) config dataclass from its JSON form (``config_to_dict``)."""
    hints = typing.get_type_hints(config_type)
    values = {}
    for field in dataclasses.fields(config_type):
        if field.name not in data:
            continue
        values[field.name] = _field_value(hints[field.name], data[field.name])
    return config_type(**values)


def _field_value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return config_from_dict(hint, value)
    if origin in (typing.Union, types.UnionType):
        for option in typing.get_args(hint):
            if option is not type(None):
                return _field_value(option, value)
    if origin is tuple:
        return tuple(value)
    if hint is Path:
        return Path(value)
    return value


def explicit_options(argv: list[str]) -> set[str]:
    """The option names given on a command line (``--lr 1e-3`` and ``--no-progress`` give lr and progress)."""
    names = set()
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=", 1)[0].replace("-", "_")
            names.add(name.removeprefix("no_") if name.startswith("no_") else name)
    return names


def resumed_config(config_type: type, config: Any, argv: list[str] | None = None) -> Any:
    """The configuration of the run that ``config.run.resume`` continues, with the reporting options given on
    this command line; :class:`InputError` when other options are given (the saved ones apply)."""
    argv = sys.argv[1:] if argv is None else argv
    path = resume_path(config.run.resume)
    saved = read_resume_metadata(path)["config"]
    changed = sorted(explicit_options(argv) - REPORTING_OPTIONS - {"help"})
    if changed:
        raise InputError(
            "--resume continues the run with its saved options; drop "
            + ", ".join(f"--{name.replace('_', '-')}" for name in changed)
            + " (only "
            + ", ".join(f"--{name.replace('_', '-')}" for name in sorted(REPORTING_OPTIONS - {"resume"}))
            + " may change)."
        )
    resumed = config_from_dict(config_type, saved)
    resumed.run.output_dir = None  # the checkpoint's directory, wherever the run was moved (unless given)
    for name in explicit_options(argv) & REPORTING_OPTIONS:
        setattr(resumed.run, name, getattr(config.run, name))
    resumed.run.resume = config.run.resume
    return resumed


__all__ = [
    "RESUME_FILE",
    "TrainingState",
    "config_differences",
    "config_from_dict",
    "load_resume_checkpoint",
    "read_resume_metadata",
    "resume_path",
    "resumed_config",
    "save_resume_checkpoint",
]
