"""Tune a recipe's hyperparameters with Optuna (TPE sampler; median, Hyperband or threshold pruning fed with each
trial's periodic evaluations), in a study stored in a database that the same command continues.

    python -m recipes.tune ppo --env-id CartPole-v1 --trials 30 --frames-per-trial 50000
    python -m recipes.tune dqn --env-id LunarLander-v3 --trials 50 --frames-per-trial 100000 \\
        --storage sqlite:///tune.db --study-name dqn-lunar --jobs 2
    python -m recipes.ppo --env-id CartPole-v1 --preset-file runs/tune-ppo-CartPole-v1/best_preset.json

Each trial samples the recipe's search space (recipes/presets/search_spaces.toml, or --search-space FILE),
trains for --frames-per-trial frames in OUTPUT_DIR/trials/trial-NNNN (kept), reports every evaluation to its
pruner and scores the mean return of its last evaluation; with --seeds-per-trial N it trains N seeds one
after another (trial-NNNN/seed-S) and scores the mean of their last evaluations, so that one lucky seed does
not win the study. --jobs processes run trials side by side (default 2: both cores here). The study ends once
it holds --trials complete or pruned trials, or once --trials of this command's trials have failed (options
that do not combine, diverging runs); Ctrl-C or SIGTERM marks the running trials failed and stops, and the
same command continues the study (its samplers drawing anew). The folder belongs to one study. The results go to
OUTPUT_DIR: results.md (the best trials), optimization_history.png, param_importances.png and best_preset.json, a
preset every recipe takes with --preset-file (--list-presets shows it).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gc
import importlib
import json
import math
import multiprocessing
import os
import signal
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from agents.files import check_writable, require_regular_file, write_atomically, write_text
from errors import InputError, NonFiniteError, require_positive
from training.cli import run_command
from training.config import parse_env_kwargs
from training.seeding import core_share
from training.tuning import (
    ReportEvaluations,
    best_preset,
    check_space_continues,
    check_space_fits,
    distribution,
    read_search_space,
    set_options,
    suggest,
)

RECIPES = {
    "ppo": "PPOConfig",
    "a2c": "A2CConfig",
    "rnd_ppo": "RNDPPOConfig",
    "reinforce": "ReinforceConfig",
    "vpg": "VPGConfig",
    "dqn": "DQNConfig",
    "sac": "SACConfig",
    "td3": "TD3Config",
    "ddpg": "DDPGConfig",
    "qlearning": "QLearningConfig",
    "es": "ESConfig",
}


@dataclass
class TuneConfig:
    """Tune a recipe's hyperparameters with Optuna."""

    algorithm: Annotated[Literal[tuple(RECIPES)], tyro.conf.Positional]  # type: ignore[valid-type]
    """The recipe to tune."""
    env_id: str = "CartPole-v1"
    """Gymnasium environment id."""
    env_kwargs: tuple[str, ...] = ()
    """The env constructor's keyword arguments as KEY=VALUE (as the recipes' --env-kwargs)."""
    trials: int = 20
    """Complete or pruned trials the study should hold (a continued study runs the ones missing)."""
    frames_per_trial: int = 50_000
    """Training budget of each trial."""
    eval_every: int | None = None
    """Frames between a trial's evaluations (each reported to the pruner); default: a tenth of its frames."""
    eval_episodes: int = 10
    """Episodes per evaluation."""
    stop_at_return: float = float("inf")
    """End a trial's run once an evaluation reaches this return (scored by that evaluation); default: never, so
    that every trial is scored after the same frames (the recipes' own default, the env's reward threshold, would
    end a run at its first evaluation above it and score one lucky evaluation)."""
    storage: str | None = None
    """Optuna storage URL (e.g. sqlite:///tune.db); default: sqlite:///OUTPUT_DIR/study.db."""
    study_name: str | None = None
    """Study name in the storage; default: ALGORITHM-ENV."""
    jobs: int = 2
    """Processes running trials side by side; a trial whose recipe keeps torch's default threads (the SAC, TD3
    and DDPG recipes' 256-unit and larger networks) gets its process's share of the cores."""
    pruner: Literal["median", "hyperband", "threshold", "none"] = "median"
    """Stop trials early: below the median of earlier trials at the same frames, Hyperband's successive halving,
    below --prune-below, or never."""
    prune_below: float | None = None
    """--pruner threshold: stop a trial whose evaluation return falls below this."""
    search_space: Path | None = None
    """A search space file (TOML, or JSON) replacing the recipe's own (recipes/presets/search_spaces.toml)."""
    preset: str = "auto"
    """The recipe preset each trial starts from ('auto': the env's; 'none'); the sampled options win."""
    output_dir: Path | None = None
    """Where the study writes (trials/, results); default: runs/tune-STUDY."""
    seeds_per_trial: int = 1
    """Seeds each trial trains, one run after another; the trial scores the mean of their last evaluations."""
    seed: int = 0
    """Seed of the sampler (worker i: seed + i) and of the trials (trial n, its k-th run: seed + n * N + k, N the
    seeds per trial), in [0, 2**32); the seeds derived from it wrap around to 0 past 2**32 - 1."""

    @property
    def name(self) -> str:
        return self.study_name or f"{self.algorithm}-{self.env_id.replace('/', '_')}"

    @property
    def folder(self) -> Path:
        return self.output_dir or Path("runs") / f"tune-{self.name}"

    @property
    def trial_frames(self) -> int:
        """Frames a whole trial trains, over all its seeds: the pruners' steps run up to it."""
        return self.frames_per_trial * self.seeds_per_trial

    @property
    def storage_url(self) -> str:
        return self.storage or f"sqlite:///{self.folder / 'study.db'}"

    def validate(self) -> None:
        if not 0 <= self.seed < 2**32:
            raise InputError(f"--seed must be in [0, 2**32), got {self.seed}.")
        if math.isnan(self.stop_at_return):
            raise InputError("--stop-at-return must be a number (inf: never stop a trial early), not nan.")
        require_positive(
            trials=self.trials,
            frames_per_trial=self.frames_per_trial,
            seeds_per_trial=self.seeds_per_trial,
            jobs=self.jobs,
            eval_episodes=self.eval_episodes,
        )
        if self.eval_every is not None:
            require_positive(eval_every=self.eval_every)
        if self.pruner == "threshold" and self.prune_below is None:
            raise InputError("--pruner threshold needs --prune-below: the return a trial must keep above.")
        if self.pruner != "threshold" and self.prune_below is not None:
            raise InputError("--prune-below is for --pruner threshold; add it, or drop --prune-below.")
        parse_env_kwargs(self.env_kwargs)


class Stop(KeyboardInterrupt):
    """SIGINT or SIGTERM: the running trials end as failed and the study stops (the same command continues it)."""

    def __init__(self, name: str = "SIGINT"):
        super().__init__(name)
        self.name = name


def raise_stop(number: int, frame: Any) -> None:
    raise Stop(signal.Signals(number).name)


def recipe_config(config: TuneConfig) -> Any:
    """A fresh config of the tuned recipe."""
    module = importlib.import_module(f"recipes.{config.algorithm}")
    return getattr(module, RECIPES[config.algorithm])()


def make_pruner(config: TuneConfig) -> Any:
    import optuna

    eval_every = config.eval_every or max(1, config.frames_per_trial // 10)
    if config.pruner == "median":  # RL Zoo's: 5 whole trials set the medians; none pruned in its first third
        return optuna.pruners.MedianPruner(
            n_startup_trials=5, n_warmup_steps=max(eval_every, config.trial_frames // 3)
        )
    if config.pruner == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=eval_every, max_resource=config.trial_frames)
    if config.pruner == "threshold":
        return optuna.pruners.ThresholdPruner(lower=config.prune_below)
    return optuna.pruners.NopPruner()


def objective(config: TuneConfig, space: dict[str, Any], trial: Any) -> float:
    """One trial: a recipe run with sampled options per seed, scored by the mean over its seeds of the last
    evaluation's mean return."""
    import optuna

    params = suggest(trial, space)
    main = importlib.import_module(f"recipes.{config.algorithm}").main
    reporter = ReportEvaluations(trial)  # steps count the frames of the trial's earlier seeds too
    folder = config.folder / "trials" / f"trial-{trial.number:04d}"
    for place in (folder.parent, folder):  # a trial's run replaces its folder's files: never through a link
        if place.is_symlink():
            error = f"{place} is a link; the study writes its trials there. Remove the link."
            trial.set_user_attr("error", error)
            raise InputError(error)
    returns = []
    for index in range(config.seeds_per_trial):
        run_config = recipe_config(config)
        run = run_config.run
        run.env_id, run.env_kwargs, run.preset = config.env_id, tuple(config.env_kwargs), config.preset
        run.seed = (config.seed + trial.number * config.seeds_per_trial + index) % 2**32  # Gymnasium's range
        run.total_frames = config.frames_per_trial
        run.eval_every = config.eval_every or max(1, config.frames_per_trial // 10)
        run.eval_episodes, run.stop_at_return = config.eval_episodes, config.stop_at_return
        run.logger, run.video, run.progress = "none", False, False
        run.output_dir = folder if config.seeds_per_trial == 1 else folder / f"seed-{run.seed}"
        run.overwrite = True
        set_options(run_config, params)
        reporter.frames_before = index * config.frames_per_trial
        try:
            summary = main(run_config, callbacks=[reporter])
        except (
            InputError,
            NonFiniteError,
        ) as error:  # options that do not combine, or a diverging run: failed
            trial.set_user_attr("error", str(error))
            raise
        trial.set_user_attr("frames", summary["frames"])
        trial.set_user_attr(
            "preset_set", run.preset_applied["set"]
        )  # what the base preset set beside the sample
        trial.set_user_attr("output_dir", str(folder))
        if summary["interrupted_by"] is not None:
            # Optuna marks the trial failed; the study goes on next time
            raise Stop(summary["interrupted_by"])
        if reporter.pruned:
            raise optuna.TrialPruned()
        returns.append(summary["eval_return_mean"])
        trial.set_user_attr("returns", returns)
    return sum(returns) / len(returns)


def run_worker(config: TuneConfig, index: int, first_trial: int = 0) -> str | None:
    """Run trials until the study holds ``config.trials`` complete or pruned ones (one process's share); returns
    the signal that stopped them first (``"SIGINT"``, ``"SIGTERM"``), else None.

    A worker takes a trial only while the finished trials and those running in this invocation (numbered from
    ``first_trial`` on; older running ones were cut off by a crash) are fewer than ``config.trials``, deciding
    under a lock on a file in the study folder, so that the workers together run exactly that many. Failed trials
    do not count towards them, so it also stops once ``config.trials`` trials of this invocation have failed:
    options that never combine, or runs that always diverge, would otherwise take trials for ever."""
    import numpy as np
    import optuna
    import torch

    if config.jobs > 1:  # a trial whose recipe keeps torch's default threads (0) takes this process's share
        torch.set_num_threads(core_share(config.jobs))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore")
    # SIGTERM as Ctrl-C: the trial ends as failed (its run saves on its own)
    signal.signal(signal.SIGTERM, raise_stop)
    # a continued study draws anew: TPE's first samples are random draws, the same again from the same seed
    seed = (config.seed + index) % 2**32
    if first_trial:
        seed = int(np.random.SeedSequence([config.seed, index, first_trial]).generate_state(1)[0])
    with storage_errors(config):
        study = optuna.load_study(
            study_name=config.name,
            storage=config.storage_url,
            sampler=optuna.samplers.TPESampler(seed=seed),
            pruner=make_pruner(config),
        )
    space = read_search_space(config.algorithm, config.search_space)
    states = optuna.trial.TrialState
    while True:
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW  # never through a link planted there
        try:
            with (
                open(os.open(config.folder / ".trials.lock", flags, 0o644), "a") as lock,
                storage_errors(config),
            ):
                fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
                trials = study.get_trials(deepcopy=False)
                finished = sum(trial.state in (states.COMPLETE, states.PRUNED) for trial in trials)
                running = sum(
                    trial.state == states.RUNNING and trial.number >= first_trial for trial in trials
                )
                failed = sum(trial.state == states.FAIL and trial.number >= first_trial for trial in trials)
                if finished + running >= config.trials or failed >= config.trials:
                    return None
                trial = study.ask()
        except KeyboardInterrupt as stop:  # between trials
            return getattr(stop, "name", "SIGINT")
        outcome: dict[str, Any] = {"state": states.FAIL}
        try:
            outcome = {"values": objective(config, space, trial)}
        except optuna.TrialPruned:
            outcome = {"state": states.PRUNED}  # scored by its last report
        except (InputError, NonFiniteError):  # options that do not combine, a diverging run: goes on
            pass
        except KeyboardInterrupt as stop:
            with storage_errors(config):
                study.tell(trial, **outcome)
            return getattr(stop, "name", "SIGINT")
        except BaseException:  # the run's own error is the one to see, not the storage's in its place
            study.tell(trial, **outcome)
            raise
        with storage_errors(config):
            study.tell(trial, **outcome)
        gc.collect()


def main(config: TuneConfig) -> dict[str, Any]:
    """Create or continue the study, run its trials, and write the results; returns a summary."""
    config.validate()
    try:
        import optuna
    except ImportError:
        raise InputError("recipes.tune needs Optuna: pip install -e '.[tune]'.") from None
    space = read_search_space(config.algorithm, config.search_space)
    check_space_fits(space, recipe_config(config), str(config.search_space or "the recipe's search space"))
    # each a distribution Optuna can sample, refused before the study exists
    distributions = {name: distribution(name, entry) for name, entry in space.items()}
    try:
        config.folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise InputError(f"--output-dir {config.folder} cannot be a folder ({error.strerror}).") from None
    # written in place, so a link there would be written through
    for name in ("study.db", ".trials.lock", "trials", ".study"):
        if (config.folder / name).is_symlink():
            raise InputError(
                f"{config.folder / name} is a link; the study writes its own files there. Remove the link or give "
                "another --output-dir."
            )
    lock = config.folder / ".trials.lock"
    if lock.exists() and not lock.is_file():
        raise InputError(f"{lock} is not a file; the study keeps its lock there. Move it away.")
    database = sqlite_path(config.storage_url)
    if database is not None:
        check_own_database(database)
    # a locked folder fails here, not in the first trial
    check_writable(config.folder, "study folder", "choose another --output-dir")
    claim_folder(config)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    from sqlalchemy.exc import SQLAlchemyError

    try:
        study = optuna.create_study(
            study_name=config.name, storage=config.storage_url, direction="maximize", load_if_exists=True
        )
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:  # not a database, or another's
        reason = str(getattr(error, "orig", None) or error).splitlines()[0]
        raise InputError(
            f"Could not open the study's storage {config.storage_url} ({reason}); move the file away or give "
            "another --storage or --output-dir."
        ) from None
    describe = {
        "algorithm": config.algorithm,
        "env_id": config.env_id,
        "env_kwargs": list(config.env_kwargs),
        "frames_per_trial": config.frames_per_trial,
        "seeds_per_trial": config.seeds_per_trial,
        # what a trial's score means: where its run may stop, over how many episodes, from which base preset
        "stop_at_return": config.stop_at_return,
        "eval_episodes": config.eval_episodes,
        "preset": config.preset,
    }
    with storage_errors(config):
        stored = dict(study.user_attrs)
        for key, value in describe.items():
            # a study stored before --seeds-per-trial existed ran one seed per trial; one stored before the later
            # keys is taken to have used this command's values for them
            missing = 1 if key == "seeds_per_trial" and "frames_per_trial" in stored else value
            saved = stored.get(key, missing)
            if saved != value:
                raise InputError(
                    f"Study {config.name!r} in {config.storage_url} tunes {key}={saved!r}, not {value!r}; continue "
                    "it with its own settings, or give another --study-name."
                )
            study.set_user_attr(key, value)
        check_space_continues(distributions, study)
        stopped_by, first_trial = None, len(study.get_trials(deepcopy=False))
    previous = signal.getsignal(signal.SIGTERM)
    if config.jobs == 1:
        try:
            stopped_by = run_worker(config, 0, first_trial)
        finally:
            signal.signal(signal.SIGTERM, previous)
    else:
        context = multiprocessing.get_context("spawn")
        workers = [
            context.Process(target=run_worker, args=(config, index, first_trial))
            for index in range(config.jobs)
        ]

        def pass_on(number: int, frame: Any) -> None:  # SIGTERM reaches this process alone: the workers too
            nonlocal stopped_by
            stopped_by = signal.Signals(number).name
            for worker in workers:
                if worker.pid is not None and worker.is_alive():
                    os.kill(worker.pid, number)  # they end their trials as failed

        signal.signal(signal.SIGTERM, pass_on)
        try:
            for worker in workers:
                worker.start()
            for worker in workers:
                while worker.is_alive():
                    try:
                        worker.join()
                    except KeyboardInterrupt:  # the workers got it too: they finish their trials as failed
                        stopped_by = stopped_by or "SIGINT"
        finally:
            signal.signal(signal.SIGTERM, previous)
    with storage_errors(config):
        study = optuna.load_study(study_name=config.name, storage=config.storage_url)
        summary = write_results(config, study)
    if stopped_by is None:
        check_failures(config, study, first_trial)
    return summary | {"interrupted_by": stopped_by}


@contextlib.contextmanager
def storage_errors(config: TuneConfig) -> Any:
    """Report what goes wrong reading or writing the study's storage in the block as one :class:`InputError`: a
    database that cannot be written (a read-only folder or file), or rows no Optuna study holds (a damaged or
    edited file, whose values fail Optuna's or the results' reading of them). Errors of a trial's run are not in
    such a block."""
    import optuna
    from sqlalchemy.exc import SQLAlchemyError

    try:
        yield
    except InputError:  # the study's own refusals (other settings, a search space it cannot continue)
        raise
    except (SQLAlchemyError, optuna.exceptions.StorageInternalError) as error:
        cause = getattr(error, "orig", None) or getattr(error, "__cause__", None) or error
        reason = (str(cause) or type(cause).__name__).splitlines()[0]
        raise InputError(
            f"Could not read or write the study's storage {config.storage_url} ({reason[:200]}); check that it and "
            "its folder are writable, or move a damaged file away, or give another --storage or --output-dir."
        ) from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError) as error:
        detail = str(error).splitlines()[0][:200] if str(error) else "no detail"
        raise InputError(
            f"The study's storage {config.storage_url} holds records no study writes ({type(error).__name__}: "
            f"{detail}); it is damaged or edited: move it away, or give another --storage or --output-dir."
        ) from None


def sqlite_path(url: str) -> Path | None:
    """The file of an SQLite storage URL (``sqlite:///relative.db``, ``sqlite:////absolute.db``); None for
    other databases and SQLite's in-memory one."""
    prefix = "sqlite:///"
    if not url.startswith(prefix) or url[len(prefix) :] in ("", ":memory:"):
        return None
    return Path(url[len(prefix) :].split("?", 1)[0])


def claim_folder(config: TuneConfig) -> None:
    """Raise :class:`InputError` when the study folder belongs to another study (its trials and results would
    be replaced by this one's); else mark it as this study's."""
    marker = config.folder / ".study"
    if marker.exists() or marker.is_symlink():
        try:
            require_regular_file(marker, "study marker")  # an InputError, a ValueError: "damaged" below
            if marker.stat().st_size > 2**16:  # a marker is a line of JSON
                raise ValueError
            owner = json.loads(marker.read_text())["study"]
        except (OSError, ValueError, TypeError, KeyError, RecursionError):
            raise InputError(
                f"{marker} is damaged; move it away if {config.folder} holds no other study."
            ) from None
        if owner != config.name:
            raise InputError(
                f"{config.folder} holds the study {owner!r}, whose trials and results this study would replace; "
                "give another --output-dir (or --study-name to continue that one)."
            )
        return
    write_text(marker, json.dumps({"study": config.name}) + "\n")


def check_own_database(path: Path) -> None:
    """Raise :class:`InputError` when ``path`` is an SQLite database of another program (Optuna would add its
    tables to it)."""
    import sqlite3

    if not path.is_file() or path.stat().st_size == 0:
        return
    try:
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = connection.execute("select name from sqlite_master where type='table'").fetchall()
        finally:
            connection.close()
        tables = {row[0] for row in rows}
    except sqlite3.DatabaseError:
        return  # not a database: Optuna's error names it
    if tables and "alembic_version" not in tables:
        raise InputError(
            f"{path} is a database of another program (tables {', '.join(sorted(tables)[:5])}); the study does "
            "not write into it. Move it away or give another --output-dir or --storage."
        )


def check_failures(config: TuneConfig, study: Any, first_trial: int) -> None:
    """After the workers stopped on ``config.trials`` failed trials: raise :class:`InputError` with the last
    failure's message when no trial of this invocation finished, else warn on stderr that the study holds fewer
    finished trials than asked."""
    import optuna

    states = optuna.trial.TrialState
    trials = [trial for trial in study.get_trials(deepcopy=False) if trial.number >= first_trial]
    failed = [trial for trial in trials if trial.state == states.FAIL]
    if len(failed) < config.trials:
        return
    error = failed[-1].user_attrs.get("error", "no message (see the trial's folder)")
    finished = sum(trial.state in (states.COMPLETE, states.PRUNED) for trial in trials)
    if finished == 0:
        raise InputError(
            f"All {len(failed)} trials failed; the last with: {error} Narrow the search space or change the "
            "options so that its samples can run."
        )
    print(
        f"warning: {len(failed)} trials failed, so the study stopped with {finished} finished trials of the "
        f"{config.trials} asked; the last failure: {error}",
        file=sys.stderr,
    )


def write_results(config: TuneConfig, study: Any) -> dict[str, Any]:
    """results.md, the plots and best_preset.json in the study's folder; returns the summary."""
    import optuna

    trials = study.get_trials(deepcopy=False)
    states = {state.name.lower(): sum(t.state == state for t in trials) for state in optuna.trial.TrialState}
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    summary: dict[str, Any] = {
        "study": config.name,
        "storage": config.storage_url,
        "trials": {state: count for state, count in states.items() if count},
        "output_dir": str(config.folder),
    }
    if not complete:
        return summary
    ranked = sorted(complete, key=lambda t: t.value, reverse=True)
    lines = ["| trial | mean return | per seed | frames | options |", "|---|---|---|---|---|"]
    for trial in ranked[:10]:
        options = ", ".join(f"{name}={value}" for name, value in trial.params.items())
        per_seed = ", ".join(f"{value:.2f}" for value in trial.user_attrs.get("returns", [trial.value]))
        lines.append(
            f"| {trial.number} | {trial.value:.2f} | {per_seed} | {trial.user_attrs.get('frames', '')} | {options} |"
        )
    write_text(config.folder / "results.md", "\n".join(lines) + "\n")
    preset = best_preset(study, config.env_id, parse_env_kwargs(config.env_kwargs), f"tuned-{config.name}")
    preset_path = config.folder / "best_preset.json"
    write_text(preset_path, json.dumps(preset, indent=2) + "\n")
    summary.update(
        best_trial=ranked[0].number,
        best_value=ranked[0].value,
        best_options=next(iter(preset.values())),
        best_preset=str(preset_path),
        plots=save_plots(study, config.folder),
    )
    return summary


def save_plots(study: Any, folder: Path) -> list[str]:
    """Optuna's optimisation history and parameter importances as PNG (importances need two complete trials
    that differ); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot
    from optuna.visualization import matplotlib as plots

    written = []
    for name, plot in (
        ("optimization_history", plots.plot_optimization_history),
        ("param_importances", plots.plot_param_importances),
    ):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # Optuna marks its matplotlib plots experimental
                axes = plot(study)
        except (ValueError, RuntimeError, ZeroDivisionError):  # too few trials for importances
            continue
        figure = axes.figure if hasattr(axes, "figure") else axes.flat[0].figure
        figure.tight_layout()
        write_atomically(folder / f"{name}.png", functools.partial(figure.savefig, dpi=100, format="png"))
        pyplot.close(figure)
        written.append(str(folder / f"{name}.png"))
    return written


if __name__ == "__main__":
    parsed, result = run_command(main, TuneConfig, __doc__)
    if "best_preset" in result:
        kwargs = f" --env-kwargs {' '.join(parsed.env_kwargs)}" if parsed.env_kwargs else ""
        print(
            f"\ntrain with the best options: python -m recipes.{parsed.algorithm} --env-id {parsed.env_id}{kwargs} "
            f"--preset-file {result['best_preset']} --preset tuned-{parsed.name}",
            file=sys.stderr,
        )
    if result["interrupted_by"] is not None:  # the results so far are written; the same command continues
        raise SystemExit(128 + signal.Signals[result["interrupted_by"]])
