"""A run's checkpoints: ``agent.ckpt`` and ``best_agent.ckpt`` (the policy, for ``Agent.load``), ``resume.ckpt``
(the whole training state, for ``--resume``), when they are due, and reading a run back to resume it."""

from __future__ import annotations

import shutil
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
from torchrl.collectors import Collector

from agents.agent import Agent
from agents.archive import holds_only_its_entries, read_manifest_metadata
from agents.files import write_atomically
from envs.vector import registration
from errors import InputError
from training.evaluation import EvaluationSchedule
from training.outputs import resume_folder
from training.resume import (
    RESUME_FILE,
    check_algorithm,
    check_own_folder,
    config_differences,
    load_resume_checkpoint,
    read_resume_metadata,
    resume_path,
    save_resume_checkpoint,
)
from training.state import TrainingState
from training.state_checks import check_form

AGENT_FILE = "agent.ckpt"
BEST_AGENT_FILE = "best_agent.ckpt"


class Checkpoints:
    """Writes a run's checkpoints into ``output_dir``.

    Args:
        agent: the agent being trained.
        output_dir: the run's folder.
        training: the recipe's training state, or None (then no ``resume.ckpt`` is written).
        every: frames between periodic checkpoints, or None (the agent is saved at the end only).
    """

    def __init__(self, agent: Agent, output_dir: Path, training: TrainingState | None, every: int | None):
        self.agent = agent
        self.output_dir = output_dir
        self.training = training
        self.every = every
        self.next_checkpoint = every
        self._resume_saved_at: int | None = None
        self._agent_saved_at: int | None = None  # frames of the last agent.ckpt
        if every is not None and training is not None and not self.resumable:
            warnings.warn(
                "--checkpoint-every writes agent.ckpt only with worker collectors: resume.ckpt (for --resume) needs "
                "--collector-backend single.",
                stacklevel=4,
            )

    @property
    def resumable(self) -> bool:
        """Whether ``resume.ckpt`` can be written: a training state with a single-process collector, or the
        learner's of a run on gradient workers (no collector)."""
        return self.training is not None and (
            self.training.collector is None or isinstance(self.training.collector, Collector)
        )

    def resume_due(self, frames: int, again: bool = False) -> bool:
        """Whether ``resume.ckpt`` can be written and does not already hold the state at ``frames`` (``again``: is
        to be written even so, the run's state having changed since at the same frames)."""
        return self.resumable and (again or self._resume_saved_at != frames)

    def agent_due(self, name: str, frames: int) -> bool:
        """Whether the agent checkpoint ``name`` is to be written at ``frames``: ``agent.ckpt`` not again at the
        frames it already holds (the last batch's periodic checkpoint and the end's), the best one always."""
        return name != AGENT_FILE or self._agent_saved_at != frames

    def due(self, frames: int) -> bool:
        """Whether a periodic checkpoint is due at ``frames``; if so, the next one is scheduled."""
        if self.next_checkpoint is None or frames < self.next_checkpoint:
            return False
        self.next_checkpoint += self.every * max(1, (frames - self.next_checkpoint) // self.every + 1)
        return True

    def parameters_finite(self) -> bool:
        """Whether the agent's floating-point parameters and buffers are free of NaN and Inf."""
        return all(
            torch.isfinite(tensor).all()
            for tensor in self.agent.state_dict().values()
            if tensor.is_floating_point()
        )

    def save_agent(self, name: str, frames: int) -> None:
        """Save the agent, trained on ``frames`` frames, as ``output_dir / name`` (atomically: see ``Agent.save``)."""
        self.agent.save(self.output_dir / name)
        if name == AGENT_FILE:
            self._agent_saved_at = frames

    def save_resume(
        self, frames: int, run_state: dict[str, Any], metadata: dict[str, Any], again: bool = False
    ) -> None:
        """Write ``resume.ckpt``: the training state and the run's, unless already written at ``frames`` (and not
        ``again``)."""
        if not self.resume_due(frames, again):
            return
        save_resume_checkpoint(
            self.output_dir / RESUME_FILE,
            {"training": self.training.state_dict(), "run": run_state},
            {**metadata, "frames": frames},
        )
        self._resume_saved_at = frames

    def written(self) -> list[str]:
        """The agent checkpoints written so far."""
        paths = (self.output_dir / AGENT_FILE, self.output_dir / BEST_AGENT_FILE)
        return [str(path) for path in paths if path.exists()]


def carry_records(
    resume: Path, output_dir: Path, schedule: EvaluationSchedule, algorithm: str, config: dict[str, Any]
) -> None:
    """When a run is continued in another folder than the one it stopped in (``--resume OLD --output-dir NEW``),
    write its evaluations.csv there from the saved rows and copy the best evaluation's ``best_agent.ckpt`` when it
    is this run's (``algorithm``, and the env, env kwargs and seed of ``config``) and holds only its archive's bytes
    (:func:`agents.archive.holds_only_its_entries`): the new folder holds the whole run, as the summary it ends with
    describes it."""
    source = resume_folder(resume)
    if source.resolve() == output_dir.resolve():
        return
    if schedule.evaluations:
        schedule.write_csv()
    best = source / BEST_AGENT_FILE
    if not best.is_file() or best.is_symlink() or not _is_agent_of(best, algorithm, config):
        return
    if not holds_only_its_entries(best):
        warnings.warn(
            f"{best} holds more bytes than its entries (padded, or not written by this toolkit): not copied into "
            f"{output_dir}; its best agent stays in {source}.",
            stacklevel=2,
        )
        return
    write_atomically(output_dir / BEST_AGENT_FILE, lambda temporary: shutil.copyfile(best, temporary))


def _is_agent_of(path: Path, algorithm: str, config: dict[str, Any]) -> bool:
    """Whether the agent checkpoint at ``path`` was saved by an ``algorithm`` run of ``config``'s env and seed."""
    try:
        metadata = read_manifest_metadata(path, "agent")
    except (InputError, OSError, zipfile.BadZipFile, ValueError, RecursionError):
        return False
    saved = metadata.get("config") if isinstance(metadata.get("config"), dict) else {}
    saved_run = saved.get("run") if isinstance(saved.get("run"), dict) else {}
    run = config["run"]
    same = metadata.get("algorithm") == algorithm
    return same and all(saved_run.get(name) == run.get(name) for name in ("env_id", "env_kwargs", "seed"))


def read_resume(
    path: Path, algorithm: str, config: dict[str, Any], training: TrainingState | None
) -> dict[str, Any]:
    """The saved state that ``--resume path`` names, after checking it belongs to this recipe and config."""
    if training is None:
        raise InputError(f"recipes.{algorithm} cannot resume a run; drop --resume.")
    training.check_resumable()
    path = resume_path(path)
    metadata = read_resume_metadata(path)
    check_algorithm(path, metadata, algorithm)
    output_dir = config["run"].get("output_dir")
    # a run that goes on in its checkpoint's folder: is it that folder's run?
    if output_dir is None or Path(output_dir).resolve() == path.parent.resolve():
        check_own_folder(path, metadata)
    differences = config_differences(metadata["config"], config)
    if differences:
        raise InputError(
            f"{path} was written by a run with other options: {'; '.join(differences)}. A resumed run "
            "keeps the saved options (on the command line, give --resume alone)."
        )
    if metadata["env_id"] != config["run"].get("env_id"):  # the run's env is its config's, checked above
        raise InputError(
            f"{path} names the env {metadata['env_id']!r:.80} beside a config on "
            f"{config['run'].get('env_id')!r:.80}; the file is damaged or forged."
        )
    saved, current = metadata.get("env_registration"), registration(config["run"]["env_id"])
    if saved is not None and not isinstance(saved, dict):
        raise InputError(
            f"{path} holds a damaged env registration ({saved!r:.40}); the file is damaged or forged."
        )
    if saved is not None and saved != current:
        changed = ", ".join(
            f"{key} (saved {saved.get(key)!r}, now {current.get(key)!r})"
            for key in sorted(set(saved) | set(current))
            if saved.get(key) != current.get(key)
        )
        raise InputError(
            f"{metadata['env_id']} is registered with other settings than when {path} was saved: {changed}. A resumed "
            "run continues the saved envs with the saved settings: register the env as it was, or start a new run."
        )
    return load_resume_checkpoint(path)


def check_resumed_form(saved: Any, form: Any, where: str, path: Path) -> None:
    """:func:`training.state.check_form`, naming the checkpoint ``path`` in its error."""
    try:
        check_form(saved, form, where)
    except InputError as error:
        raise InputError(
            f"{resume_path(path)} cannot be resumed: {error}; the file is damaged or forged."
        ) from None


def restore_training(training: TrainingState, state: dict[str, Any], path: Path) -> None:
    """Load ``state`` into ``training``, or raise :class:`InputError` saying the checkpoint does not fit this run
    (a damaged file, or one written by other code): called before the run writes anything."""
    # the envs' state is checked as it is loaded (envs.runtime_state): a fresh env's may not be capturable yet
    form = training.state_dict() | {"env": None, "env_not_saved_because": None}
    check_resumed_form(state, form, "the training state", path)
    try:
        training.load_state_dict(state)
    except InputError as error:
        reason = str(error).rstrip(" .")
        raise InputError(
            f"The training state in {resume_path(path)} does not fit this run: {reason}; nothing in the run folder "
            "was changed."
        ) from None
    except (
        KeyError,
        RuntimeError,
        TypeError,
        ValueError,
        IndexError,
        AttributeError,
        OverflowError,
    ) as error:
        detail = str(error).splitlines()[0] if str(error) else "no detail"
        raise InputError(
            f"The training state in {resume_path(path)} does not fit this run ({type(error).__name__}: {detail}); "
            "nothing in the run folder was changed."
        ) from None
