"""Run plumbing shared by every recipe, one module per concern.

=================  ==========================================================================================
``config``         :class:`RunConfig` (the options every recipe takes), range checks, ``quiet`` for scripts
``seeding``        seeding Python, NumPy and torch in one place
``collectors``     the training env, the collector of ``--collector-backend``, the off-policy collector config
``distributed``    worker processes and Ray: worker collectors, Evolution Strategies' population on Ray
``logger``         W&B or CSV logging with the W&B -> CSV fallback
``metrics``        frames, training returns, progress bar, NaN/Inf checks
``evaluation``     the evaluation schedule, evaluations.csv, early stop at the target return
``checkpoints``    agent.ckpt, best_agent.ckpt, resume.ckpt and reading a run back
``state``          :class:`TrainingState`: what a recipe trains, saved and restored exactly
``resume``         the resume file and the options of a resumed run
``signals``        SIGINT/SIGTERM: finish the batch, save, stop; handlers restored
``plotting``       the learning curve
``run``            :class:`Run`, what a recipe's loop calls: ``record_batch`` and ``finish``
``callbacks``      :class:`Callback`: a Python user's hooks after each batch, evaluation and checkpoint
``provenance``     where a run came from: the project's version, git commit and dirty flag
``tuning``         Optuna search spaces, trials reporting evaluations to their pruner, the best trial as a preset
``learner``        :class:`Learner`: a recipe's update as compute_gradients / apply_gradients / weights / parameters
``gradient_workers`` learning on Ray gradient workers (``--gradient-workers``), synchronous or asynchronous
``worker_options`` a gradient worker's configuration, and the checks of ``--gradient-workers`` against other options
``optim``          the off-policy recipes' optimiser options, the --anneal-lr schedule, the lean fused Adam step
                   and gradient clipping
``frame_storage``  a replay storage that keeps each frame of stacked image observations once (Atari)
``presets``        hyperparameters per (recipe, env) from the recipes' preset tables
``cli``            the command line and its exit codes
=================  ==========================================================================================
"""

import envs  # noqa: F401  (first: it unsets an unusable MUJOCO_GL before TorchRL imports MuJoCo)
from errors import check_ranges, require_positive
from training.callbacks import Callback
from training.cli import run_cli
from training.collectors import (
    OffPolicyCollectorConfig,
    check_batch_fits_buffer,
    make_collector,
    make_off_policy_collector,
    make_training_env,
    single_collector_only,
    warn_if_never_updated,
    warn_if_no_whole_episodes,
)
from training.config import RunConfig, config_to_dict, quiet
from training.evaluation import EVAL_SEED_OFFSET, evaluation_seed
from training.frame_storage import FrameStackStorage
from training.gradient_workers import (
    WorkerSession,
    check_gradient_workers,
    refuse_loss_addons,
    train_on_gradient_workers,
)
from training.lean_collector import LeanCollector
from training.learner import (
    EpochMinibatches,
    Learner,
    MetricMeans,
    average_gradients,
    mean_metrics,
    set_learning_rates,
)
from training.optim import (
    LeanAdam,
    OffPolicyOptimConfig,
    anneal_learning_rates,
    clip_and_step,
    clip_gradients,
    fused_adam,
)
from training.presets import apply_preset, preset_note
from training.replay import LeanReplayBuffer, check_replay_memory, off_policy_storage
from training.run import Run
from training.seeding import prepare_process
from training.signals import recipe_main
from training.state import TrainingState

__all__ = [
    "EVAL_SEED_OFFSET",
    "Callback",
    "EpochMinibatches",
    "FrameStackStorage",
    "LeanAdam",
    "LeanCollector",
    "LeanReplayBuffer",
    "Learner",
    "MetricMeans",
    "OffPolicyCollectorConfig",
    "OffPolicyOptimConfig",
    "Run",
    "RunConfig",
    "TrainingState",
    "WorkerSession",
    "anneal_learning_rates",
    "apply_preset",
    "average_gradients",
    "check_batch_fits_buffer",
    "check_gradient_workers",
    "check_ranges",
    "check_replay_memory",
    "clip_and_step",
    "clip_gradients",
    "config_to_dict",
    "evaluation_seed",
    "fused_adam",
    "make_collector",
    "make_off_policy_collector",
    "make_training_env",
    "mean_metrics",
    "off_policy_storage",
    "prepare_process",
    "preset_note",
    "quiet",
    "recipe_main",
    "refuse_loss_addons",
    "require_positive",
    "run_cli",
    "set_learning_rates",
    "single_collector_only",
    "train_on_gradient_workers",
    "warn_if_never_updated",
    "warn_if_no_whole_episodes",
]
