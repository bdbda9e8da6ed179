"""The evaluation schedule: a deterministic evaluation every ``eval_every`` frames, its row in evaluations.csv and
the logger, the best return so far, and early stop at the target return."""

from __future__ import annotations

import csv
import io
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents.agent import Agent, EvaluationResult
from agents.archive import first_line
from agents.files import write_text
from errors import InputError, WriteError

EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes are seeded apart from the training envs


def evaluation_seed(seed: int) -> int:
    """The seed of a run's evaluation episodes (episode ``i`` resets with it plus ``i``), in Gymnasium's
    ``[0, 2**32)`` for every run seed."""
    return (seed + EVAL_SEED_OFFSET) % 2**32


def run_deterministic(agent: Agent, episodes: int, seed: int, **options: Any) -> EvaluationResult:
    """Evaluate ``agent`` deterministically on the evaluation seeds of a run seeded ``seed``, leaving its
    train/eval mode as it was."""
    was_training = agent.training
    agent.eval()
    try:
        return agent.evaluate(episodes=episodes, deterministic=True, seed=evaluation_seed(seed), **options)
    finally:
        agent.train(was_training)


def record_video(
    agent: Agent,
    path: Path,
    seed: int,
    run_env_id: str,
    env_id: str | None,
    env_kwargs: dict[str, Any] | None,
) -> bool:
    """Write one deterministic episode of a run seeded ``seed`` to ``path`` (in ``env_id`` with ``env_kwargs``,
    the agent's own env for None); whether it could. Failing to render (an env that does not, a missing OpenGL
    backend) is a warning in one line: a video is never worth the rest of a run's outputs. A failed write raises
    :class:`errors.WriteError`."""
    try:
        run_deterministic(agent, 1, seed, video_path=path, env=env_id, env_kwargs=env_kwargs)
    except WriteError:
        raise
    except Exception as error:  # noqa: BLE001 - renderers fail in many ways (TypeError, OpenGL, missing libs)
        warnings.warn(
            f"No {path.name}: {run_env_id} could not be rendered ({type(error).__name__}: {first_line(error)}). "
            "Everything else of the run is saved; an env renders for videos when it takes "
            "render_mode='rgb_array' (MuJoCo on a machine without a display: set MUJOCO_GL=egl or osmesa), or "
            "pass --no-video (and no --video-every-eval).",
            stacklevel=4,
        )
        return False
    return True


def check_evaluation_env(agent: Agent, env_id: str | None, env_kwargs: dict[str, Any]) -> None:
    """Build the evaluation env once and check that the agent acts in it (same spaces): a mistake in
    ``--eval-env-id`` or ``--eval-env-kwargs`` is an :class:`InputError` before training, not at the first
    evaluation."""
    try:
        env = agent.make_env(env_id, env_kwargs)
    except InputError:
        raise
    except Exception as error:  # noqa: BLE001 - a constructor given a wrong keyword fails in many ways
        raise InputError(
            f"The evaluation env ({env_id or agent.env_id} with {env_kwargs}) cannot be made: "
            f"{type(error).__name__}: {first_line(error)}. Check --eval-env-id and --eval-env-kwargs."
        ) from None
    try:
        agent.check_spaces(env)
    finally:
        env.close()


class EvaluationSchedule:
    """When to evaluate, what each evaluation found, and whether the target return is reached.

    Args:
        agent: the agent being trained.
        every: frames between evaluations.
        episodes: episodes per evaluation.
        seed: the run's seed (evaluations use :func:`evaluation_seed`).
        target_return: the mean return that ends training early, or None.
        csv_path: where the rows are written after each evaluation.
        log: called with each evaluation's ``eval/...`` metrics.
        env_id, env_kwargs: the evaluation env (``--eval-env-id``, ``--eval-env-kwargs``); default: the agent's own.
    """

    def __init__(
        self,
        agent: Agent,
        every: int,
        episodes: int,
        seed: int,
        target_return: float | None,
        csv_path: Path,
        log: Callable[[dict[str, float]], None],
        env_id: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ):
        self.agent = agent
        self.env_id, self.env_kwargs = env_id, env_kwargs
        self.every, self.episodes, self.seed = every, episodes, seed
        self.target_return = target_return
        self.csv_path = csv_path
        self._log = log
        self.evaluations: list[dict[str, float]] = []
        self.best_return = -math.inf
        self.solved_at_frames: int | None = None
        self.solved_at_s: float | None = None
        self.next_eval = every
        self.time_s = 0.0
        """Seconds spent evaluating (with the best checkpoints and videos that follow), counted by the run."""

    @property
    def last_return(self) -> float | None:
        return self.evaluations[-1]["return_mean"] if self.evaluations else None

    def due(self, frames: int) -> bool:
        """Whether an evaluation is due at ``frames``; if so, the next one is scheduled (skipping any that a large
        batch jumped over)."""
        if frames < self.next_eval:
            return False
        self.next_eval += self.every * max(1, (frames - self.next_eval) // self.every + 1)
        return True

    def evaluate(self, frames: int, elapsed_s: float) -> tuple[bool, bool]:
        """Evaluate deterministically, log and write the row.

        Returns:
            ``(improved, solved)``: whether this is the best mean return so far, and whether it reaches the target.
        """
        result = run_deterministic(
            self.agent, self.episodes, self.seed, env=self.env_id, env_kwargs=self.env_kwargs
        )
        if not math.isfinite(result.mean):
            raise InputError("NaN or Inf in the evaluation env's rewards; check the env or its wrappers.")
        row = {
            "frames": frames,
            "wall_time_s": elapsed_s,
            "return_mean": result.mean,
            "return_std": result.std,
            "length_mean": float(result.lengths.mean()),
        }
        self.evaluations.append(row)
        self._log(
            {
                "eval/return_mean": result.mean,
                "eval/return_std": result.std,
                "eval/length_mean": row["length_mean"],
            }
        )
        self.write_csv()
        improved = result.mean > self.best_return
        if improved:
            self.best_return = result.mean
        solved = self.target_return is not None and result.mean >= self.target_return
        if solved and self.solved_at_frames is None:
            self.solved_at_frames, self.solved_at_s = frames, elapsed_s
        return improved, solved

    def write_csv(self) -> None:
        rows = io.StringIO(newline="")
        writer = csv.DictWriter(rows, fieldnames=list(self.evaluations[0]))
        writer.writeheader()
        writer.writerows(self.evaluations)
        write_text(self.csv_path, rows.getvalue())

    def state_dict(self) -> dict[str, Any]:
        return {
            "evaluations": self.evaluations,
            "best_return": self.best_return,
            "solved_at_frames": self.solved_at_frames,
            "solved_at_s": self.solved_at_s,
            "next_eval": self.next_eval,
            "time_s": self.time_s,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.evaluations = [dict(row) for row in state["evaluations"]]
        self.best_return = state["best_return"]
        self.solved_at_frames, self.solved_at_s = state["solved_at_frames"], state["solved_at_s"]
        self.next_eval = state["next_eval"]
        self.time_s = float(state.get("time_s", 0.0))
