"""One training run, as a recipe's loop sees it: :class:`Run` takes each collected batch and the update's
metrics (:meth:`Run.record_batch`) and writes the outputs at the end (:meth:`Run.finish`)::

    OUTPUT_DIR/
      summary.json          algorithm, env, seed, frames, wall time, final evaluation, when it was solved
      evaluations.csv       one row per deterministic evaluation
      learning_curve.png    evaluation and training returns against frames
      agent.ckpt            the final agent (Agent.load reads it); best_agent.ckpt: the best evaluation's
      resume.ckpt           the whole training state (with --checkpoint-every, and on SIGINT/SIGTERM)
      video.mp4             one deterministic episode of the final agent (with --video)
      videos/               one episode after each evaluation, eval-FRAMES.mp4 (with --video-every-eval)
      config.json           the full configuration, with where the run came from ("source": version, commit)
      wandb/, csv/ or tensorboard/   the logger's files

Behind that surface each concern has its own part: :class:`training.metrics.Metrics` (frames, returns, logger,
progress bar), :class:`training.evaluation.EvaluationSchedule` (evaluations, early stop),
:class:`training.checkpoints.Checkpoints` (checkpoints and resume), :class:`training.signals.SignalWatcher` and the
user's :class:`training.callbacks.Callback` hooks.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from tensordict import TensorDictBase

from agents.agent import Agent
from agents.files import write_text
from envs.vector import registration
from errors import InputError, NonFiniteError
from training.callbacks import Callback, callback_name, check_callbacks, stops_run
from training.checkpoints import (
    AGENT_FILE,
    BEST_AGENT_FILE,
    Checkpoints,
    carry_records,
    check_resumed_form,
    read_resume,
    restore_training,
)
from training.collectors import warm_up_policy_normalizer
from training.config import RunConfig, config_to_dict
from training.evaluation import EvaluationSchedule, check_evaluation_env, record_video
from training.logger import close_logger, is_wandb, log_video, make_logger
from training.metrics import Metrics, find_non_finite
from training.outputs import abandon_run_folder, prepare_run_folder, release_run_folder
from training.plotting import plot_learning_curve
from training.provenance import run_source
from training.resume import RESUME_FILE
from training.signals import SignalWatcher
from training.state import TrainingState
from training.state_checks import Count, Maybe

# the form of a run's own state in resume.ckpt (:meth:`Run._run_state`), checked before a resumed run starts
RUN_STATE_FORM = {
    "frames": Count(),
    "elapsed_s": 0.0,
    "training_returns": [(Count(), 0.0)],
    "last_return": Maybe(0.0),
    "recent_returns": [0.0],
    "evaluations": [
        {"frames": Count(), "wall_time_s": 0.0, "return_mean": 0.0, "return_std": 0.0, "length_mean": 0.0}
    ],
    "best_return": 0.0,
    "solved_at_frames": Maybe(Count()),
    "solved_at_s": Maybe(0.0),
    "next_eval": Count(),
    "time_s": 0.0,
    "next_checkpoint": Maybe(Count()),
    "wandb_id": Maybe(""),
}


class Run:
    """Logging, evaluation, early stopping, checkpoints, resume and outputs of one training run.

    Args:
        algorithm: recipe name, e.g. ``"ppo"``.
        config: the recipe's full config dataclass (saved and logged).
        run: its :class:`RunConfig`.
        agent: the agent being trained (its policy is the one the collector uses).
        training: what the recipe trains (:class:`training.state.TrainingState`): saved in ``resume.ckpt`` with
            ``--checkpoint-every`` and on SIGINT/SIGTERM, and restored here with ``--resume``. Recipes without
            one refuse ``--resume``.
        callbacks: the user's :class:`training.callbacks.Callback` hooks (the recipe's ``main(config,
            callbacks=[...])``).
    """

    def __init__(
        self,
        algorithm: str,
        config: Any,
        run: RunConfig,
        agent: Agent,
        training: TrainingState | None = None,
        callbacks: Iterable[Callback] = (),
    ):
        self.callbacks = check_callbacks(callbacks)
        self.stopped_by_callback: str | None = None
        self._finishing = False  # from end_collection() on, a callback returning False has nothing to stop
        self.algorithm = algorithm
        self.run = run
        self.agent = agent
        self.config = config_to_dict(config)
        resumed = None if run.resume is None else read_resume(run.resume, algorithm, self.config, training)
        # before any folder is touched: a checkpoint that does not fit changes nothing
        if resumed is not None:
            restore_training(training, resumed["training"], run.resume)
            check_resumed_form(resumed["run"], RUN_STATE_FORM, "the run's state", run.resume)
        self.config["source"] = run_source()
        # the agent makes its evaluation envs as the run made its training envs
        agent.env_kwargs, agent.env_wrappers = run.env_make_kwargs, run.wrapper_specs
        agent.allowed_wrappers = run.allowed_wrappers
        self.eval_env_id, self.eval_env_kwargs = run.eval_env_options
        if self.eval_env_kwargs is not None:
            check_evaluation_env(agent, self.eval_env_id, self.eval_env_kwargs)
        if run.normalize_obs_warmup and resumed is None:  # a resumed run has its statistics
            warm_up_policy_normalizer(run, agent.policy, algorithm, agent.device)
        self.output_dir = prepare_run_folder(algorithm, run, resumed is not None)
        # the folder's lock, released when the run ends (or, should it fail, when it is collected)
        self._release_folder = weakref.finalize(self, release_run_folder, self.output_dir)
        try:
            self._start(training, resumed)
        except BaseException:  # the logger's or a callback's on_start: nothing trained, the claim is given up
            if hasattr(self, "metrics"):
                self.metrics.close_progress()
                close_logger(self.metrics.logger, failed=True)
            abandon_run_folder(self.output_dir, run)  # the same command can be given again
            self._release_folder()
            raise

    def _start(self, training: TrainingState | None, resumed: dict[str, Any] | None) -> None:
        """Everything a run sets up in its claimed folder: config.json, logger, evaluation, checkpoints, state."""
        run, agent = self.run, self.agent
        agent.config = self.config
        write_text(self.output_dir / "config.json", json.dumps(self.config, indent=2) + "\n")
        logger = make_logger(
            run, self.algorithm, self.output_dir, self.config, wandb_id=resumed and resumed["run"]["wandb_id"]
        )
        self.metrics = Metrics(logger, run.total_frames, run.progress)
        self.schedule = EvaluationSchedule(
            agent,
            run.eval_every,
            run.eval_episodes,
            run.seed,
            run.target_return,
            self.output_dir / "evaluations.csv",
            self.metrics.log,
            env_id=self.eval_env_id,
            env_kwargs=self.eval_env_kwargs,
        )
        self.checkpoints = Checkpoints(agent, self.output_dir, training, run.checkpoint_every)
        if resumed is not None:
            self._load_run_state(resumed["run"])
            carry_records(run.resume, self.output_dir, self.schedule, self.algorithm, self.config)
        # a resumed run that had ended (budget spent, target reached) trains no further: it collects nothing
        self.ended = resumed is not None and (
            self.frames >= run.total_frames or self.schedule.solved_at_frames is not None
        )
        if self.ended and training is not None:
            training.end_collection()
        self._video_failed = False
        self.signals = SignalWatcher()
        self.signals.install()
        self.metrics.start_progress()
        learner = training.extras.get("learner") if training is not None else None
        if learner is not None:  # a loss failing on diverged parameters stops the run as NaN checks do
            stop = weakref.WeakMethod(self._non_finite)  # held weakly: the learner never keeps the run alive
            learner.on_non_finite = lambda where: stop() is not None and stop()(where)
        for callback in self.callbacks:
            callback.on_start(self)
        if resumed is not None:  # last, so that nothing above draws from the restored generators
            training.restore_rng(resumed["training"])

    # ------------------------------------------------------------------ what the recipe's loop calls
    @property
    def frames(self) -> int:
        """Frames collected so far (a resumed run starts where it stopped)."""
        return self.metrics.frames

    @property
    def elapsed(self) -> float:
        return self.metrics.elapsed

    @property
    def interrupted_by(self) -> str | None:
        """``"SIGINT"`` or ``"SIGTERM"`` once one was received, else None."""
        return self.signals.interrupted_by

    def record_batch(self, batch: TensorDictBase, metrics: dict[str, float]) -> bool:
        """Account for a collected batch and its update's metrics; evaluate and checkpoint when due.

        Returns:
            True when training should stop (budget spent, target return reached, SIGINT or SIGTERM received, a
            callback returned False).

        Raises:
            NonFiniteError: NaN or Inf in the batch's observations or rewards, or in a metric (a loss).
        """
        self.metrics.frames += batch.numel()
        self.check_finite(batch, metrics)
        logged = self.metrics.record(batch, metrics)
        self.metrics.show(self.schedule.last_return)
        self._call("on_batch", batch, logged)
        frames = self.frames
        stop = self.schedule.due(frames) and self.evaluate()
        if self.checkpoints.due(frames):
            self.save_agent(AGENT_FILE)
            self.save_resume()
        stop = stop or frames >= self.run.total_frames or self.interrupted_by is not None
        if stop:  # the run ends at this batch anyway: no callback stopped it
            self.stopped_by_callback = None
        stop = stop or self.stopped_by_callback is not None
        if stop:
            self.end_collection()
        return stop

    def check_finite(self, batch: TensorDictBase, metrics: dict[str, float]) -> None:
        """Raise :class:`NonFiniteError` naming where NaN or Inf first appears: observations, rewards, or a metric."""
        where = find_non_finite(batch, metrics)
        if where is not None:
            self._non_finite(where)

    def evaluate(self) -> bool:
        """Evaluate deterministically, log, keep the best checkpoint; True if the target return is reached. An
        evaluation env that fails (NaN or Inf observations or rewards) stops the run with the agent saved."""
        start = time.perf_counter()
        try:
            improved, solved = self.schedule.evaluate(self.frames, self.elapsed)
        except InputError as error:  # the evaluation env's fault, not the training's: keep what was trained
            self.save_agent(AGENT_FILE)
            raise InputError(
                f"The evaluation at frame {self.frames} on {self.eval_env_id or self.run.env_id} failed: {error} "
                f"{self.output_dir / AGENT_FILE} holds the agent trained so far."
            ) from None
        if improved:
            self.save_agent(BEST_AGENT_FILE)
        if self.run.video_every_eval:
            self._record_video(self.output_dir / "videos" / f"eval-{self.frames:09d}.mp4")
        self.schedule.time_s += time.perf_counter() - start
        self.metrics.show(self.schedule.last_return, refresh=True)
        row = dict(self.schedule.evaluations[-1])  # a copy: the row evaluations.csv keeps
        self._call("on_evaluation", row)
        return solved

    def evaluate_last(self) -> bool:
        """Evaluate at the frames the run ends with unless that is done (after SIGINT or SIGTERM: unless any is);
        whether it did."""
        evaluations = self.schedule.evaluations
        due = not evaluations or (self.interrupted_by is None and evaluations[-1]["frames"] != self.frames)
        if due:
            self.evaluate()
        return due

    def end_collection(self) -> None:
        """The end of the run's collection (:meth:`record_batch` stopped it, or a loop of episodes ran out of
        them): the final evaluation, then ``resume.ckpt`` holding it (with ``--checkpoint-every``, or after
        SIGINT/SIGTERM) while the collector still holds its state, so that a continued ended run has it."""
        self._finishing = True
        evaluated = self.interrupted_by is None and self.evaluate_last()
        if self.interrupted_by is not None or self.run.checkpoint_every is not None:
            self.save_resume(again=evaluated)

    # ------------------------------------------------------------------ checkpoints
    def save_agent(self, name: str) -> None:
        """Save the agent as ``output_dir / name``, unless its parameters hold NaN or Inf (then stop the run);
        ``agent.ckpt`` is not written again at the frames it already holds."""
        if not self.checkpoints.agent_due(name, self.frames):
            return
        if not self.checkpoints.parameters_finite():
            self._non_finite("the agent's parameters")
        self.checkpoints.save_agent(name, self.frames)
        self._call("on_checkpoint", self.output_dir / name)

    def save_resume(self, again: bool = False) -> None:
        """Write ``resume.ckpt``: the training state and this run's, for ``--resume`` (single-process collector
        runs of recipes that provide a :class:`TrainingState`); ``again`` even if it holds these frames."""
        if not self.checkpoints.resume_due(self.frames, again):
            return
        if not self.checkpoints.parameters_finite():
            self._non_finite("the agent's parameters")
        metadata = {"algorithm": self.algorithm, "env_id": self.run.env_id, "config": self.config}
        metadata["env_registration"] = registration(self.run.env_id)
        self.checkpoints.save_resume(self.frames, self._run_state(), metadata, again)
        self._call("on_checkpoint", self.output_dir / RESUME_FILE)

    def _call(self, hook: str, *arguments: Any) -> None:
        """Call ``hook`` of every callback; the first that returns False stops the run."""
        for callback in self.callbacks:
            stops = stops_run(callback, hook, getattr(callback, hook)(self, *arguments))
            if stops and not self._finishing and self.stopped_by_callback is None:
                self.stopped_by_callback = callback_name(callback)

    def _run_state(self) -> dict[str, Any]:
        logger = self.metrics.logger
        return {
            **self.metrics.state_dict(),
            **self.schedule.state_dict(),
            "next_checkpoint": self.checkpoints.next_checkpoint,
            "wandb_id": logger.experiment.id if is_wandb(logger) else None,
        }

    def _load_run_state(self, state: dict[str, Any]) -> None:
        self.metrics.load_state_dict(state)
        self.schedule.load_state_dict(state)
        if self.run.checkpoint_every is not None:  # may be given anew on resume
            self.checkpoints.next_checkpoint = (
                state["next_checkpoint"] or self.frames + self.run.checkpoint_every
            )

    def _non_finite(self, where: str) -> NoReturn:
        self.signals.restore()
        self.metrics.close_progress()
        kept = ", ".join(self.checkpoints.written()) or "none written yet"
        close_logger(self.metrics.logger, failed=True)
        self._release_folder()
        raise NonFiniteError(
            f"NaN or Inf in {where} at frame {self.frames} of {self.algorithm} on {self.run.env_id}; training "
            f"stopped. Checkpoints kept (from before it appeared): {kept}."
        )

    # ------------------------------------------------------------------ the end
    def finish(self) -> dict[str, Any]:
        """Final evaluation, checkpoint, video, plot and summary.json; returns the summary.

        After SIGINT or SIGTERM the checkpoint is written first, and the final evaluation (if an earlier one
        exists) and the video are skipped.
        """
        self._finishing = True
        self.signals.restore()
        self.metrics.close_progress()
        interrupted = self.interrupted_by is not None
        if interrupted:
            self.save_agent(AGENT_FILE)
        self.evaluate_last()
        wall_time, evaluations = self.elapsed, self.schedule.evaluations
        self.save_agent(AGENT_FILE)
        if self.run.video and not interrupted:
            self._record_video(self.output_dir / "video.mp4")
        plot_learning_curve(
            evaluations,
            self.metrics.training_returns,
            self.output_dir / "learning_curve.png",
            title=f"{self.algorithm} on {self.run.env_id} (seed {self.run.seed})",
        )
        summary = self._summary(wall_time, evaluations[-1])
        write_text(self.output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        logger = self.metrics.logger
        if is_wandb(logger):
            logger.experiment.summary.update(summary)
        for callback in self.callbacks:
            callback.on_end(self, summary)
        close_logger(logger)
        self._release_folder()
        return summary

    def _record_video(self, path: Path) -> None:
        """One deterministic episode to ``path``, logged; a failure is warned once a run (see :func:`record_video`)."""
        if not self._video_failed:
            options = {"env_id": self.eval_env_id, "env_kwargs": self.eval_env_kwargs}
            self._video_failed = not record_video(self.agent, path, self.run.seed, self.run.env_id, **options)
            if not self._video_failed:
                log_video(self.metrics.logger, path, self.frames)

    def _summary(self, wall_time: float, final: dict[str, float]) -> dict[str, Any]:
        summary = {
            "algorithm": self.algorithm,
            "env_id": self.run.env_id,
            "eval_env_id": self.run.eval_env_id,  # null: the evaluations ran on env_id
            "seed": self.run.seed,
            "frames": self.frames,
            "wall_time_s": wall_time,
            "eval_time_s": self.schedule.time_s,  # of wall_time_s
            "fps": self.frames / max(wall_time, 1e-9),
            "eval_return_mean": final["return_mean"],
            "eval_return_std": final["return_std"],
            "eval_episodes": self.run.eval_episodes,
            "best_eval_return_mean": self.schedule.best_return,
            "target_return": self.schedule.target_return,
            "solved_at_frames": self.schedule.solved_at_frames,
            "solved_at_s": self.schedule.solved_at_s,
            "output_dir": str(self.output_dir),
            "interrupted_by": self.interrupted_by,
            "stopped_by_callback": self.stopped_by_callback,
            "resumed_from": None if self.run.resume is None else str(self.run.resume),
        }
        logger = self.metrics.logger
        if is_wandb(logger) and logger.offline:
            summary["wandb_offline_run"] = str(Path(logger.experiment.dir).parent)
        return summary
