"""Run plumbing shared by every recipe: CLI, seeding, logging, evaluation, checkpoints, summary, plot, video.

A recipe builds its env, modules, loss, collector and optimizer, then hands each collected batch to a
:class:`Run`, which logs it, evaluates the agent every ``eval_every`` frames, keeps the best checkpoint, stops
early at the target return and writes the run's outputs::

    OUTPUT_DIR/
      summary.json          algorithm, env, seed, frames, wall time, final evaluation, when it was solved
      evaluations.csv       one row per deterministic evaluation
      learning_curve.png    evaluation and training returns against frames
      agent.ckpt            the final agent (Agent.load reads it); best_agent.ckpt: the best evaluation's
      video.mp4             one deterministic episode of the final agent (with --video)
      config.json           the full configuration
      wandb/ or csv/        the logger's files
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gc
import json
import math
import os
import random
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal, TypeVar

import gymnasium as gym
import numpy as np
import torch
import tyro
from tensordict import TensorDictBase
from torch import nn
from torchrl.collectors import Collector
from torchrl.envs import EnvBase
from tqdm import tqdm

from agents.agent import Agent
from envs.classic import torch_env_class
from envs.errors import InputError, NonFiniteError
from envs.vector import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY, check_device, check_env_id, make_env
from recipes.resume import (
    RESUME_FILE,
    TrainingState,
    config_differences,
    explicit_options,
    load_resume_checkpoint,
    read_resume_metadata,
    resume_path,
    resumed_config,
    save_resume_checkpoint,
)

LoggerName = Literal["wandb", "csv", "none"]
EVAL_SEED_OFFSET = 1_000_000  # evaluation episodes are seeded apart from the training envs


@dataclass
class RunConfig:
    """Options every recipe accepts."""

    env_id: str = "CartPole-v1"
    """Gymnasium environment id."""
    num_envs: int = 8
    """Number of environments stepped together by the collector."""
    env_backend: Literal["gymnasium", "torch"] = "gymnasium"
    """'gymnasium': any Gymnasium env, stepped on the CPU; 'torch': the batched torch classic-control envs
    (CartPole-v1, Pendulum-v1, MountainCar-v0, MountainCarContinuous-v0, Acrobot-v1), stepped on --device."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium backend: step sub-envs in this process ('sync') or one process each ('async')."""
    seed: int = 0
    """Seed for Python, NumPy, torch, the envs and their action spaces."""
    total_frames: int = 100_000
    """Training budget in environment steps (summed over all envs)."""
    device: str = "cpu"
    """Device of the networks and the loss: 'cpu', 'cuda', 'cuda:1', ... (Gymnasium envs step on the CPU, torch
    envs on this device)."""
    output_dir: Path | None = None
    """Where the run writes its outputs; default runs/ALGORITHM-ENV-SEED-TIMESTAMP."""
    logger: LoggerName = "csv"
    """Metrics logger: Weights & Biases, CSV files, or none (evaluations.csv and summary.json are always written)."""
    wandb_project: str = "rlkit"
    """Weights & Biases project."""
    wandb_online: bool = False
    """Sync the W&B run to the server while training (default: offline, upload later with 'wandb sync')."""
    eval_every: int = 10_000
    """Run a deterministic evaluation every this many frames (and at the end)."""
    eval_episodes: int = 20
    """Episodes per evaluation."""
    stop_at_return: float | None = None
    """Stop once the evaluation mean return reaches this; default: the env's registered reward threshold
    (475 for CartPole-v1, none for Pendulum-v1). Pass inf to never stop early."""
    video: bool = True
    """Record one deterministic episode of the final agent to video.mp4."""
    progress: bool = True
    """Show a progress bar."""
    threads: int = 1
    """Torch CPU threads; 1 is fastest and steadiest for small networks on a few cores; 0 keeps torch's default."""
    checkpoint_every: int | None = None
    """Also save agent.ckpt and resume.ckpt (the whole training state, for --resume) every this many frames
    (default: agent.ckpt at the end; both on SIGINT/SIGTERM)."""
    collector_backend: Literal["single", "multiprocess", "ray"] = "single"
    """Where the envs step: in this process ('single'), in --num-workers processes (TorchRL's multi-process
    collector) or on --num-workers Ray actors ('ray'; ES: its population). --num-envs is split over the workers."""
    num_workers: int = 2
    """Collector workers for --collector-backend multiprocess or ray."""
    ray_address: str | None = None
    """Address of a running Ray cluster to join (e.g. 'ray://head:10001' or 'head:6379'); default: start a local
    one."""
    resume: Path | None = None
    """Continue the run saved in this run directory (its resume.ckpt, written with --checkpoint-every and on
    SIGINT/SIGTERM) or resume checkpoint, with its saved options, exactly where it stopped."""

    def validate(self) -> None:
        """Raise :class:`InputError` for out-of-range values."""
        if self.threads < 0:
            raise InputError(f"--threads must be 0 (torch's default) or positive, got {self.threads}.")
        require_positive(
            num_envs=self.num_envs,
            total_frames=self.total_frames,
            eval_every=self.eval_every,
            eval_episodes=self.eval_episodes,
        )
        if self.checkpoint_every is not None:
            require_positive(checkpoint_every=self.checkpoint_every)
        if self.stop_at_return is not None and math.isnan(self.stop_at_return):
            raise InputError("--stop-at-return must be a number, got nan.")
        if self.collector_backend != "single":
            if self.device != "cpu":
                raise InputError(
                    f"--device {self.device} with --collector-backend {self.collector_backend} is not supported: worker "
                    "collectors run on the CPU (their weights arrive through shared CPU memory or Ray); use --device "
                    f"cpu, or --collector-backend single to train on {self.device}."
                )
            require_positive(num_workers=self.num_workers)
            if self.num_envs % self.num_workers:
                raise InputError(
                    f"--num-envs {self.num_envs} must split evenly over --num-workers {self.num_workers}."
                )
        check_device(self.device)
        check_env_id(self.env_id)
        if self.env_backend == "torch":
            torch_env_class(self.env_id)  # raises if there is no torch implementation

    @property
    def target_return(self) -> float | None:
        """The evaluation return that ends training early, if any."""
        if self.stop_at_return is not None:
            return None if math.isinf(self.stop_at_return) else self.stop_at_return
        return gym.spec(self.env_id).reward_threshold


@dataclass
class ExplorationConfig:
    """Epsilon-greedy exploration annealed linearly (value-based recipes)."""

    initial_epsilon: float = 1.0
    """Epsilon-greedy rate at the start."""
    final_epsilon: float = 0.05
    """Epsilon-greedy rate after annealing."""
    exploration_fraction: float = 0.5
    """Fraction of the budget over which epsilon is annealed linearly."""

    def validate(self) -> None:
        """Raise :class:`InputError` for rates outside [0, 1] or a schedule that increases."""
        for flag, value in (
            ("--initial-epsilon", self.initial_epsilon),
            ("--final-epsilon", self.final_epsilon),
        ):
            if not 0 <= value <= 1:
                raise InputError(f"{flag} must be in [0, 1], got {value}.")
        if not 0 < self.exploration_fraction <= 1:
            raise InputError(f"--exploration-fraction must be in (0, 1], got {self.exploration_fraction}.")
        if self.final_epsilon > self.initial_epsilon:
            raise InputError("--final-epsilon must not exceed --initial-epsilon.")

    def epsilon(self, frames: int, total_frames: int) -> float:
        """The rate after ``frames`` of a ``total_frames`` budget."""
        progress = min(1.0, frames / max(1.0, self.exploration_fraction * total_frames))
        return self.initial_epsilon + (self.final_epsilon - self.initial_epsilon) * progress


# what an off-policy recipe stores of a transition (fewer keys: cheaper sampling and loss calls)
TRANSITION_KEYS = ("observation", "action", ("next", "observation"), ("next", "reward")) + tuple(
    ("next", key) for key in ("done", "terminated", "truncated")
)


@dataclass
class OffPolicyCollectorConfig:
    """Collection of the off-policy actor-critic recipes (SAC, TD3, DDPG)."""

    steps_per_env: int = 8
    """Steps each env takes per collected batch (frames per batch = num_envs * steps_per_env)."""
    updates_per_frame: float = 1.0
    """Gradient steps (TD3: critic updates) per collected frame, the update-to-data ratio."""
    learning_starts: int = 1_000
    """Frames of uniformly random actions collected before the first update."""

    def updates_per_batch(self, frames_per_batch: int) -> int:
        """Gradient steps after each batch of ``frames_per_batch`` frames (at least one)."""
        return max(1, round(frames_per_batch * self.updates_per_frame))


def check_off_policy_ranges(lr: float, gamma: float, tau: float, collector: OffPolicyCollectorConfig) -> None:
    """Raise :class:`InputError` for the shared off-policy hyperparameters outside their meaningful range."""
    require_positive(steps_per_env=collector.steps_per_env)
    checks = [
        ("--lr", lr, lr > 0, "> 0"),
        ("--gamma", gamma, 0 < gamma <= 1, "in (0, 1]"),
        ("--tau", tau, 0 < tau <= 1, "in (0, 1]"),
        ("--updates-per-frame", collector.updates_per_frame, collector.updates_per_frame > 0, "> 0"),
        ("--learning-starts", collector.learning_starts, collector.learning_starts >= 0, ">= 0"),
    ]
    for flag, value, valid, expected in checks:
        if not valid:
            raise InputError(f"{flag} must be {expected}, got {value}.")


def make_collector(
    run: RunConfig,
    env: EnvBase,
    policy: nn.Module,
    device: torch.device,
    frames_per_batch: int,
    total_frames: int,
    **options: Any,
):
    """The collector of ``run.collector_backend``: TorchRL's ``Collector`` stepping ``env`` here, or one over
    ``run.num_workers`` processes or Ray actors, each building its share of the envs (worker ``i`` seeded
    ``seed + WORKER_SEED_STRIDE * i``) and iterated like the single one (see :class:`WorkerCollector`).

    Args:
        run: the run's options (env id, backend, seed, workers).
        env: the training env (stepped by the single-process collector; its spec is what workers rebuild).
        policy: the policy that acts.
        device: device of the policy and of the batches.
        frames_per_batch: frames per batch, over all envs.
        total_frames: the collection budget.
        options: further collector arguments (``init_random_frames``, ``trajs_per_batch``, ``traj_format``).
    """
    if run.collector_backend == "single":
        return Collector(
            env,
            policy,
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            env_device=env.device,
            policy_device=device,
            storing_device=device,
            track_traj_ids="trajs_per_batch" in options,  # episodes are stitched by trajectory id
            auto_register_policy_transforms=False,
            **options,
        )
    from recipes.distributed import WORKER_SEED_STRIDE, make_worker_collector, make_worker_env

    env_factories = [
        functools.partial(
            make_worker_env,
            os.getpid(),
            run.env_id,
            run.num_envs // run.num_workers,
            device=env.device,
            seed=run.seed + WORKER_SEED_STRIDE * index,
            vectorization=run.vectorization,
            backend=run.env_backend,
        )
        for index in range(run.num_workers)
    ]
    return make_worker_collector(
        run.collector_backend,
        env_factories,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        device=device,
        ray_address=run.ray_address,
        **options,
    )


def single_collector_only(run: RunConfig, feature: str) -> None:
    """Raise :class:`InputError` when ``feature`` (which keeps per-env state outside the env) meets workers."""
    if run.collector_backend != "single":
        raise InputError(
            f"{feature} keeps exploration state beside the training env and runs with --collector-backend single "
            f"only; drop --collector-backend {run.collector_backend} or {feature}."
        )


def make_off_policy_collector(
    run: RunConfig,
    env: EnvBase,
    policy: nn.Module,
    frames_per_batch: int,
    learning_starts: int,
    device: torch.device,
):
    """The collector of an off-policy recipe: uniformly random actions for the first ``learning_starts`` frames,
    then ``policy``; batches of ``frames_per_batch`` on ``device`` until ``run.total_frames`` (rounded up to whole
    batches)."""
    num_batches = -(-run.total_frames // frames_per_batch)
    return make_collector(
        run,
        env,
        policy,
        device,
        frames_per_batch,
        num_batches * frames_per_batch,
        init_random_frames=learning_starts,
    )


def make_training_env(run: RunConfig, device: torch.device, num_envs: int | None = None):
    """The batched training env of ``run`` (``num_envs`` envs, default ``run.num_envs``): Gymnasium envs on the
    CPU, or torch envs on ``device``."""
    return make_env(
        run.env_id,
        num_envs or run.num_envs,
        device=device if run.env_backend == "torch" else "cpu",
        seed=run.seed,
        vectorization=run.vectorization,
        backend=run.env_backend,
    )


def require_positive(**values: int) -> None:
    """Raise :class:`InputError` naming the first option whose value is below 1."""
    for name, value in values.items():
        if value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}.")


def prepare_process(run: RunConfig) -> None:
    """Seed Python, NumPy and torch (envs are seeded by ``make_env``) and set torch's CPU threads."""
    random.seed(run.seed)
    np.random.seed(run.seed)
    torch.manual_seed(run.seed)
    if run.threads > 0:
        torch.set_num_threads(run.threads)


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-compatible copy of a (nested) config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def make_logger(
    run: RunConfig, algorithm: str, output_dir: Path, config: dict[str, Any], wandb_id: str | None = None
):
    """Build the TorchRL logger chosen by ``run.logger`` (None for 'none') and log the config to it.

    W&B that fails to start or to take the config never stops training: online -> offline -> CSV files, each
    step with a warning. ``wandb_id`` continues that W&B run (a resumed run).
    """
    from torchrl.record.loggers import CSVLogger

    if run.logger == "none":
        return None

    def csv_logger():
        logger = CSVLogger(exp_name="csv", log_dir=str(output_dir))
        logger.log_hparams(config)
        return logger

    if run.logger == "csv":
        return csv_logger()
    from torchrl.record.loggers import WandbLogger

    def wandb_logger(offline: bool):
        logger = WandbLogger(
            exp_name=output_dir.name,
            offline=offline,
            save_dir=str(output_dir),
            project=run.wandb_project,
            config=config,
            group=algorithm,
            log_env_packages=False,
            settings={"silent": True},
            id=wandb_id,
        )
        logger.log_hparams(config)
        return logger

    attempts = [("online W&B", False)] if run.wandb_online else []
    attempts.append(("offline W&B", True))
    for index, (name, offline) in enumerate(attempts):
        try:
            return wandb_logger(offline)
        except Exception as error:  # noqa: BLE001 - wandb raises many kinds (network, auth, filesystem)
            fallback = attempts[index + 1][0] if index + 1 < len(attempts) else "CSV"
            warnings.warn(
                f"{name} failed to start ({error!r}); training goes on with {fallback} logging.", stacklevel=2
            )
    return csv_logger()


class Run:
    """Logging, evaluation, early stopping, checkpoints, resume and outputs of one training run.

    Args:
        algorithm: recipe name, e.g. ``"ppo"``.
        config: the recipe's full config dataclass (saved and logged).
        run: its :class:`RunConfig`.
        agent: the agent being trained (its policy is the one the collector uses).
        training: what the recipe trains (:class:`recipes.resume.TrainingState`): saved in ``resume.ckpt`` with
            ``--checkpoint-every`` and on SIGINT/SIGTERM, and restored here with ``--resume``. Recipes without
            one refuse ``--resume``.
    """

    def __init__(
        self, algorithm: str, config: Any, run: RunConfig, agent: Agent, training: TrainingState | None = None
    ):
        self.algorithm = algorithm
        self.run = run
        self.agent = agent
        self.training = training
        self.config = config_to_dict(config)
        resumed = self._read_resume(run) if run.resume is not None else None
        stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
        if run.output_dir is not None:
            self.output_dir = Path(run.output_dir)
        elif resumed is not None:
            self.output_dir = Path(run.resume) if Path(run.resume).is_dir() else Path(run.resume).parent
        else:
            self.output_dir = Path(f"runs/{algorithm}-{run.env_id}-{run.seed}-{stamp}")
        self.output_dir.mkdir(parents=True, exist_ok=True)
        agent.config = self.config
        (self.output_dir / "config.json").write_text(json.dumps(self.config, indent=2) + "\n")
        self.logger = make_logger(
            run, algorithm, self.output_dir, self.config, wandb_id=resumed and resumed["run"]["wandb_id"]
        )
        self._wandb = type(self.logger).__name__ == "WandbLogger"
        self.target_return = run.target_return
        self.frames = 0
        self.evaluations: list[dict[str, float]] = []
        self.training_returns: list[tuple[int, float]] = []
        self.best_return = -math.inf
        self.solved_at_frames: int | None = None
        self.solved_at_s: float | None = None
        self._next_eval = run.eval_every
        self._next_checkpoint = run.checkpoint_every
        self.interrupted_by: str | None = None
        self._last_return: float | None = None
        self._resume_saved_at: int | None = None
        self._start = time.perf_counter()
        if resumed is not None:
            self._load_run_state(resumed["run"])
        self._signal_handlers = {}
        if (
            threading.current_thread() is threading.main_thread()
        ):  # Python delivers signals to the main thread
            for number in (signal.SIGINT, signal.SIGTERM):
                self._signal_handlers[number] = signal.signal(number, self._on_signal)
        self._progress = tqdm(
            total=run.total_frames,
            initial=self.frames,
            unit="frame",
            unit_scale=True,
            dynamic_ncols=True,
            disable=not run.progress,
        )
        if (
            run.checkpoint_every is not None
            and training is not None
            and not isinstance(training.collector, Collector)
        ):
            warnings.warn(
                "--checkpoint-every writes agent.ckpt only with worker collectors: resume.ckpt (for --resume) needs "
                "--collector-backend single.",
                stacklevel=2,
            )
        if resumed is not None:  # last: the RNG states are restored here
            training.load_state_dict(resumed["training"])

    def _read_resume(self, run: RunConfig) -> dict[str, Any]:
        """The saved state that ``run.resume`` names, after checking it belongs to this recipe and config."""
        if self.training is None:
            raise InputError(f"recipes.{self.algorithm} cannot resume a run; drop --resume.")
        self.training.check_resumable()
        path = resume_path(run.resume)
        metadata = read_resume_metadata(path)
        if metadata["algorithm"] != self.algorithm:
            raise InputError(
                f"{path} was written by recipes.{metadata['algorithm']}; resume it with "
                f"python -m recipes.{metadata['algorithm']} --resume {path}."
            )
        differences = config_differences(metadata["config"], self.config)
        if differences:
            raise InputError(
                f"{path} was written by a run with other options: {'; '.join(differences)}. A resumed run "
                "keeps the saved options (on the command line, give --resume alone)."
            )
        return load_resume_checkpoint(path)

    def _run_state(self) -> dict[str, Any]:
        return {
            "frames": self.frames,
            "elapsed_s": self.elapsed,
            "evaluations": self.evaluations,
            "training_returns": self.training_returns,
            "best_return": self.best_return,
            "solved_at_frames": self.solved_at_frames,
            "solved_at_s": self.solved_at_s,
            "next_eval": self._next_eval,
            "next_checkpoint": self._next_checkpoint,
            "last_return": self._last_return,
            "wandb_id": self.logger.experiment.id if self._wandb else None,
        }

    def _load_run_state(self, state: dict[str, Any]) -> None:
        self.frames = state["frames"]
        self._start -= state["elapsed_s"]
        self.evaluations = [dict(row) for row in state["evaluations"]]
        self.training_returns = [tuple(pair) for pair in state["training_returns"]]
        self.best_return = state["best_return"]
        self.solved_at_frames, self.solved_at_s = state["solved_at_frames"], state["solved_at_s"]
        self._next_eval = state["next_eval"]
        if self.run.checkpoint_every is not None:  # may be given anew on resume
            self._next_checkpoint = state["next_checkpoint"] or self.frames + self.run.checkpoint_every
        self._last_return = state["last_return"]

    def save_resume(self) -> None:
        """Write ``resume.ckpt``: the training state and this run's, for ``--resume`` (single-process collector
        runs of recipes that provide a :class:`TrainingState`)."""
        if self.training is None or not isinstance(self.training.collector, Collector):
            return
        if self._resume_saved_at == self.frames:
            return
        self._check_parameters()
        save_resume_checkpoint(
            self.output_dir / RESUME_FILE,
            {"training": self.training.state_dict(), "run": self._run_state()},
            {
                "algorithm": self.algorithm,
                "env_id": self.run.env_id,
                "frames": self.frames,
                "config": self.config,
            },
        )
        self._resume_saved_at = self.frames

    def _on_signal(self, number: int, frame: Any) -> None:
        """SIGINT or SIGTERM: finish the current batch, then save and stop (a second signal acts as usual)."""
        self.interrupted_by = signal.Signals(number).name
        self._restore_signal_handlers()

    def _restore_signal_handlers(self) -> None:
        for number, handler in self._signal_handlers.items():
            signal.signal(number, handler)
        self._signal_handlers = {}

    def checkpoints(self) -> list[str]:
        """The agent checkpoints written so far."""
        return [
            str(path)
            for path in (self.output_dir / "agent.ckpt", self.output_dir / "best_agent.ckpt")
            if path.exists()
        ]

    def check_finite(self, batch: TensorDictBase, metrics: dict[str, float]) -> None:
        """Raise :class:`NonFiniteError` naming where NaN or Inf first appears: observations, rewards, or a metric."""
        checked = (
            ("observation", "observations"),
            (("next", "observation"), "observations"),
            (("next", "reward"), "rewards"),
        )
        for key, where in checked:
            value = batch.get(key, None)
            if value is not None and value.is_floating_point() and not torch.isfinite(value).all():
                self._non_finite(where)
        non_finite = [f"{name} ({value})" for name, value in metrics.items() if not math.isfinite(value)]
        if non_finite:
            self._non_finite(", ".join(non_finite))

    def _check_parameters(self) -> None:
        """Stop the run (:class:`NonFiniteError`) if the agent's parameters hold NaN or Inf."""
        if not all(
            torch.isfinite(tensor).all()
            for tensor in self.agent.state_dict().values()
            if tensor.is_floating_point()
        ):
            self._non_finite("the agent's parameters")

    def save_agent(self, name: str) -> None:
        """Save the agent as ``output_dir / name``, unless its parameters hold NaN or Inf (then stop the run)."""
        self._check_parameters()
        self.agent.save(self.output_dir / name)

    def _non_finite(self, where: str) -> None:
        self._restore_signal_handlers()
        self._progress.close()
        kept = ", ".join(self.checkpoints()) or "none written yet"
        raise NonFiniteError(
            f"NaN or Inf in {where} at frame {self.frames} of {self.algorithm} on {self.run.env_id}; training "
            f"stopped. Checkpoints kept (from before it appeared): {kept}."
        )

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    def log(self, metrics: dict[str, float]) -> None:
        if self.logger is not None:
            self.logger.log_metrics({k: float(v) for k, v in metrics.items()}, step=self.frames)

    def record_batch(self, batch: TensorDictBase, metrics: dict[str, float]) -> bool:
        """Account for a collected batch and its update's metrics; evaluate when due.

        Returns:
            True when training should stop (budget spent, target return reached, SIGINT or SIGTERM received).

        Raises:
            NonFiniteError: NaN or Inf in the batch's observations or rewards, or in a metric (a loss).
        """
        self.frames += batch.numel()
        self.check_finite(batch, metrics)
        done = batch.get(("next", "done"))
        if done.any():
            returns = batch.get(("next", EPISODE_RETURN_KEY))[done]
            lengths = batch.get(("next", EPISODE_LENGTH_KEY))[done]
            self._last_return = returns.mean().item()
            self.training_returns.append((self.frames, self._last_return))
            metrics = {
                **metrics,
                "train/episode_return": self._last_return,
                "train/episode_length": lengths.float().mean().item(),
            }
        elapsed = self.elapsed
        metrics = {**metrics, "time/elapsed_s": elapsed, "time/fps": self.frames / max(elapsed, 1e-9)}
        self.log(metrics)
        self._progress.update(batch.numel())
        self._progress.set_postfix(self._postfix(), refresh=False)
        stop = False
        if self.frames >= self._next_eval:
            self._next_eval += self.run.eval_every * max(
                1, (self.frames - self._next_eval) // self.run.eval_every + 1
            )
            stop = self.evaluate()
        if self._next_checkpoint is not None and self.frames >= self._next_checkpoint:
            self._next_checkpoint += self.run.checkpoint_every * max(
                1, (self.frames - self._next_checkpoint) // self.run.checkpoint_every + 1
            )
            self.save_agent("agent.ckpt")
            self.save_resume()
        stop = stop or self.frames >= self.run.total_frames or self.interrupted_by is not None
        if stop and (self.interrupted_by is not None or self.run.checkpoint_every is not None):
            self.save_resume()  # while the collector still holds its state
        return stop

    def _postfix(self) -> dict[str, str]:
        postfix = {}
        if self._last_return is not None:
            postfix["return"] = f"{self._last_return:.1f}"
        if self.evaluations:
            postfix["eval"] = f"{self.evaluations[-1]['return_mean']:.1f}"
        return postfix

    def evaluate(self) -> bool:
        """Evaluate deterministically, log, keep the best checkpoint; True if the target return is reached."""
        was_training = self.agent.training
        self.agent.eval()
        result = self.agent.evaluate(
            episodes=self.run.eval_episodes, deterministic=True, seed=self.run.seed + EVAL_SEED_OFFSET
        )
        self.agent.train(was_training)
        row = {
            "frames": self.frames,
            "wall_time_s": self.elapsed,
            "return_mean": result.mean,
            "return_std": result.std,
            "length_mean": float(result.lengths.mean()),
        }
        self.evaluations.append(row)
        self.log(
            {
                "eval/return_mean": result.mean,
                "eval/return_std": result.std,
                "eval/length_mean": row["length_mean"],
            }
        )
        self._write_evaluations()
        if result.mean > self.best_return:
            self.best_return = result.mean
            self.save_agent("best_agent.ckpt")
        self._progress.set_postfix(self._postfix())
        solved = self.target_return is not None and result.mean >= self.target_return
        if solved and self.solved_at_frames is None:
            self.solved_at_frames, self.solved_at_s = self.frames, row["wall_time_s"]
        return solved

    def _write_evaluations(self) -> None:
        path = self.output_dir / "evaluations.csv"
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(self.evaluations[0]))
            writer.writeheader()
            writer.writerows(self.evaluations)

    def finish(self) -> dict[str, Any]:
        """Final evaluation, checkpoint, video, plot and summary.json; returns the summary.

        After SIGINT or SIGTERM the checkpoint is written first, and the final evaluation (if an earlier one
        exists) and the video are skipped.
        """
        self._restore_signal_handlers()
        self._progress.close()
        interrupted = self.interrupted_by is not None
        if interrupted:
            self.save_agent("agent.ckpt")
        if not self.evaluations or (not interrupted and self.evaluations[-1]["frames"] != self.frames):
            self.evaluate()
        wall_time = self.elapsed
        final = self.evaluations[-1]
        self.save_agent("agent.ckpt")
        if self.run.video and not interrupted:
            self.agent.evaluate(
                episodes=1, seed=self.run.seed + EVAL_SEED_OFFSET, video_path=self.output_dir / "video.mp4"
            )
        plot_learning_curve(
            self.evaluations,
            self.training_returns,
            self.output_dir / "learning_curve.png",
            title=f"{self.algorithm} on {self.run.env_id} (seed {self.run.seed})",
        )
        summary = {
            "algorithm": self.algorithm,
            "env_id": self.run.env_id,
            "seed": self.run.seed,
            "frames": self.frames,
            "wall_time_s": wall_time,
            "fps": self.frames / max(wall_time, 1e-9),
            "eval_return_mean": final["return_mean"],
            "eval_return_std": final["return_std"],
            "eval_episodes": self.run.eval_episodes,
            "best_eval_return_mean": self.best_return,
            "target_return": self.target_return,
            "solved_at_frames": self.solved_at_frames,
            "solved_at_s": self.solved_at_s,
            "output_dir": str(self.output_dir),
            "interrupted_by": self.interrupted_by,
            "resumed_from": None if self.run.resume is None else str(self.run.resume),
        }
        if self._wandb and self.logger.offline:
            summary["wandb_offline_run"] = str(Path(self.logger.experiment.dir).parent)
        (self.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        if self._wandb:
            self.logger.experiment.summary.update(summary)
            self.logger.experiment.finish()
        return summary


def plot_learning_curve(
    evaluations: list[dict[str, float]], training_returns: list[tuple[int, float]], path: Path, title: str
) -> Path:
    """Plot evaluation mean ± std and training episode returns against frames."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if training_returns:
        frames, returns = zip(*training_returns)
        ax.plot(
            frames, returns, color="tab:gray", alpha=0.5, linewidth=1, label="training episodes (batch mean)"
        )
    if evaluations:
        frames = np.array([row["frames"] for row in evaluations])
        mean = np.array([row["return_mean"] for row in evaluations])
        std = np.array([row["return_std"] for row in evaluations])
        ax.plot(frames, mean, marker="o", color="tab:blue", label="deterministic evaluation")
        ax.fill_between(frames, mean - std, mean + std, color="tab:blue", alpha=0.2)
    ax.set_xlabel("frames")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


ConfigT = TypeVar("ConfigT")


def recipe_main(main: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Decorate a recipe's ``main``: however it ends (a summary, an error), the SIGINT and SIGTERM handlers are
    those it started with, so a failed run never leaves its own handler behind in the caller (a notebook, a
    test session)."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> dict[str, Any]:
        if threading.current_thread() is not threading.main_thread():
            return main(*args, **kwargs)
        handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
        try:
            return main(*args, **kwargs)
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)

    return wrapper


def run_cli(
    main: Callable[[ConfigT], dict[str, Any]],
    config_type: type[ConfigT],
    description: str,
    adjust: Callable[[ConfigT, set[str]], ConfigT] | None = None,
) -> None:
    """Parse the command line into ``config_type`` (flat flags), run ``main`` and report where results are.

    ``adjust(config, given)`` may change the parsed config, knowing the option names given on the command line
    (a recipe's settings for a kind of task, applied to the options the user left at their defaults). Bad input
    ends with a one-line ``error: ...`` on stderr and exit status 2.
    """
    config = tyro.cli(config_type, description=description, config=(tyro.conf.OmitArgPrefixes,))
    if adjust is not None and config.run.resume is None:
        config = adjust(config, explicit_options(sys.argv[1:]))
    warnings.filterwarnings("ignore", module="pygame")
    status = 0
    try:
        if config.run.resume is not None:
            config = resumed_config(config_type, config)
        summary = main(config)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        status = 2
    except NonFiniteError as error:
        print(f"error: {error}", file=sys.stderr)
        status = 1
    except Exception:  # noqa: BLE001 - an env's or a worker's own error: its traceback, then a prompt exit
        traceback.print_exc()
        status = 1
    if status:
        # Free the failed run's objects while the interpreter is fully alive: left to its exit, the clean-up of
        # TorchRL's multi-process collectors can deadlock (it starts a thread to stop its workers).
        gc.collect()
        raise SystemExit(status)
    solved = summary["solved_at_frames"]
    print(
        f"{summary['algorithm']} on {summary['env_id']}: evaluation return {summary['eval_return_mean']:.1f} "
        f"± {summary['eval_return_std']:.1f} over {summary['eval_episodes']} episodes after {summary['frames']} frames "
        f"in {summary['wall_time_s']:.1f} s"
        + (f"; reached the target at {solved} frames ({summary['solved_at_s']:.1f} s)" if solved else "")
    )
    print(
        f"results in {summary['output_dir']}/ (summary.json, learning_curve.png, agent.ckpt"
        + (", video.mp4" if (Path(summary["output_dir"]) / "video.mp4").exists() else "")
        + ")"
    )
    if "wandb_offline_run" in summary:
        print(
            f"W&B offline run: {summary['wandb_offline_run']} (upload it with: wandb sync {summary['wandb_offline_run']})"
        )
    if summary["interrupted_by"] is not None:
        saved = (
            "agent.ckpt and resume.ckpt"
            if (Path(summary["output_dir"]) / RESUME_FILE).exists()
            else "agent.ckpt"
        )
        print(f"stopped by {summary['interrupted_by']} after {summary['frames']} frames; {saved} saved")
        if saved != "agent.ckpt":
            print(f"continue with: --resume {summary['output_dir']}")
        raise SystemExit(128 + signal.Signals[summary["interrupted_by"]].value)


__all__ = [
    "TRANSITION_KEYS",
    "ExplorationConfig",
    "OffPolicyCollectorConfig",
    "Run",
    "RunConfig",
    "TrainingState",
    "check_off_policy_ranges",
    "config_to_dict",
    "make_collector",
    "make_off_policy_collector",
    "make_training_env",
    "prepare_process",
    "recipe_main",
    "require_positive",
    "run_cli",
    "single_collector_only",
]
