"""Multi-seed benchmark suite: every (algorithm, env, seed) trained with its preset, then a report next to the
published reference scores.

    python -m benchmarks.suite --algos ppo sac --envs Hopper-v5 HalfCheetah-v5 --seeds 0 1 2 [--frames N]
    python -m benchmarks.suite --algos sac --envs "LunarLander-v3 continuous=true" --seeds 0
    python -m benchmarks.suite --report-only          # rebuild report.md and the plots from what is there

Each run is ``python -m recipes.ALGO --env-id ENV --seed S`` (plus ``--total-frames N`` when given; the whole budget,
no early stop), a separate process, ``--jobs`` at a time (default 2: one per core), or with ``--ray-address`` a task
of one CPU on a Ray cluster, as many at a time as it has free CPUs. Each run gets one torch thread when the runs fill
the cores and always beside Stable-Baselines3's (which get one too); a run with cores to spare keeps its preset's
threads, its share of the cores where it would take all of them (a preset's ``threads = 0``, or images).
Everything goes into one results folder (default ``benchmarks/results``):

    records/ALGO/ENV/seedS.json   a finished run's summary, evaluation curve and preset: what the report reads
                           (small files, kept in the repository)
    runs/ALGO/ENV/seedS/   the run's own outputs (agent.ckpt, resume.ckpt, ...; not kept in the repository)
    logs/                  each run's console output (not kept either)
    report.md              per (algorithm, env): seeds, frames, final and best evaluation (mean ± std over seeds),
                           wall-clock, frames/s, the reference score and its source
    summary.csv            the same, one row per run
    curves_ENV.png         evaluation return against frames: mean and 95% bootstrap band over seeds, per algorithm
    aggregate.png          interquartile mean of reference-normalised scores with bootstrap confidence intervals
                           (Agarwal et al. 2021), per algorithm

The suite is resumable: a finished run (its record) is not redone (a record whose preset has changed since is
named, with the changes, in a warning and in report.md; delete it and its run folder to rerun it); a run stopped by
the end of a session (SIGTERM, SIGINT or SIGHUP to the suite, which passes it on) saved resume.ckpt, and the same
suite command continues it from there; runs write resume.ckpt every ``--checkpoint-every`` frames too, so even a
killed run loses at most that much. Stable-Baselines3's runs, which have no resume checkpoint, start over. A
record or a stopped run at another budget than the one asked for (``--frames``, or the preset's) is refused
before anything runs: one folder holds one budget per (algorithm, env, seed); give the other budgets
their own ``--results`` folder. A suite killed outright (SIGKILL) leaves its running runs to finish on their own (their
folders locked meanwhile); a later suite command picks up their records. The suite exits with status 1 when a
run failed (each named with its log's last error), and 128 + N after signal N stopped it. Reference scores are ``benchmarks/references.csv`` (RL Zoo's benchmark.md, each row with its source); a score
is normalised as (score - random) / (reference - random), the random policy's return measured here once per env.
"""

from __future__ import annotations

import argparse
import csv
import functools
import io
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agents.files import write_atomically, write_text
from benchmarks.common import whole_number
from training.seeding import core_share

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = Path(__file__).with_name("references.csv")
BOOTSTRAP_SAMPLES = 2_000


@dataclass(frozen=True)
class Job:
    algorithm: str
    env: str  # "ENV_ID" or "ENV_ID key=value ..."
    seed: int

    @property
    def env_id(self) -> str:
        return self.env.split()[0]

    @property
    def env_kwargs(self) -> list[str]:
        return self.env.split()[1:]

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9_.=-]+", "_", self.env.replace(" ", "__"))

    def folder(self, results: Path) -> Path:
        return results / "runs" / self.algorithm / self.slug / f"seed{self.seed}"

    def record(self, results: Path) -> Path:
        return results / "records" / self.algorithm / self.slug / f"seed{self.seed}.json"


def recipe_config(algorithm: str, env: str) -> Any:
    """The config of ``algorithm``'s recipe on ``env`` with today's preset applied."""
    import importlib

    from training.presets import apply_preset

    module = importlib.import_module(f"recipes.{algorithm}")
    config_type = next(
        value
        for name, value in vars(module).items()
        if name.endswith("Config") and getattr(value, "__module__", "") == module.__name__
        and "run" in getattr(value, "__dataclass_fields__", {})
    )  # fmt: skip
    config = config_type()
    config.run.env_id, config.run.env_kwargs = env.split()[0], tuple(env.split()[1:])
    apply_preset(config, module.PRESETS)
    return config


@functools.cache
def takes_all_cores(algorithm: str, env: str) -> bool:
    """Whether ``algorithm``'s run on ``env`` takes torch's default threads (all cores): its preset says so
    (``threads = 0``), or the env's observations are images and the recipe's one thread is left to the image rule
    (``training.seeding.threads_for_observations``), which the env's observation spec decides."""
    from envs import make_env
    from training.collectors import env_construction
    from training.seeding import takes_default_threads

    run = recipe_config(algorithm, env).run
    if run.threads != 1:
        return run.threads == 0
    try:
        made = make_env(run.env_id, 1, **env_construction(run))
    except Exception:  # noqa: BLE001 - the run itself fails in its own process, and its log says why
        return False
    try:
        return takes_default_threads(run, made.observation_spec["observation"])
    finally:
        made.close()


@functools.cache
def recipe_budget(algorithm: str, env: str) -> tuple[int, int, int]:
    """(total frames, eval every, eval episodes) of ``algorithm`` on ``env`` with its preset."""
    config = recipe_config(algorithm, env)
    return config.run.total_frames, config.run.eval_every, config.run.eval_episodes


def requested_budget(job: Job, frames: int | None) -> int:
    """The frames ``job`` runs for: ``--frames``, else its recipe's preset's (Stable-Baselines3 runs: the same)."""
    return frames if frames is not None else recipe_budget(job.algorithm.removeprefix("sb3-"), job.env)[0]


def record_budget(record: dict[str, Any], results: Path | None = None) -> int | None:
    """The budget a record's run was given (its ``--total-frames``). Stable-Baselines3's records from before they
    kept it (in ``results``) have their recipe run's: the suite gives both the same; else None (unknown)."""
    total = record.get("config", {}).get("run", {}).get("total_frames")
    if isinstance(total, int) and not isinstance(total, bool):
        return total
    if results is not None and record["algorithm"].startswith("sb3-"):
        paired = Job(record["algorithm"].removeprefix("sb3-"), record["env"], record["seed"])
        recipe_record = read_record(paired.record(results), quiet=True)
        return None if recipe_record is None else record_budget(recipe_record)
    return None


def budget_conflicts(jobs: list[Job], results: Path, frames: int | None) -> list[str]:
    """One line for each job whose record, or stopped run, has another budget than the one asked for: its record
    would stand for runs it is not (or its continuation would run to the old budget)."""
    conflicts = []
    for job in jobs:
        asked = requested_budget(job, frames)
        record = read_record(job.record(results), quiet=True)
        saved = job.folder(results) / "config.json"
        if record is not None:
            had, where = record_budget(record, results), job.record(results)
        elif (job.folder(results) / "resume.ckpt").exists() and saved.exists():
            try:
                had = json.loads(read_regular(saved))["run"]["total_frames"]
            except (OSError, ValueError, TypeError, KeyError):
                continue  # the recipe's --resume names what is wrong with the run folder
            where = job.folder(results)
        else:
            continue
        if isinstance(had, int) and not isinstance(had, bool) and had != asked:
            conflicts.append(
                f"{job.algorithm} {job.env} seed {job.seed} has a budget of {had:,} frames in {where}, this suite "
                f"asks for {asked:,}"
            )
    return conflicts


# the options the suite gives each recipe run on its command line (``command``): no preset sets them there
SUITE_OPTIONS = {"total_frames", "stop_at_return", "seed", "output_dir", "logger", "video", "progress",
                 "checkpoint_every", "overwrite", "threads"}  # fmt: skip


def preset_changes(record: dict[str, Any]) -> list[str]:
    """How today's preset for a record's (algorithm, env) differs from the one its run had, as ``"name: then ->
    now"`` lines; empty when it is the same (or for a Stable-Baselines3 run). What the suite gives the run on its
    command line (a budget given with ``--frames``) is not a change."""
    if record["algorithm"].startswith("sb3-"):
        return []
    try:
        return _preset_changes(record)
    # a recipe gone, a module that is no recipe, an env it refuses, a record of another shape
    except (ImportError, KeyError, AttributeError, TypeError, ValueError, StopIteration) as error:
        return [f"not comparable with today's preset ({type(error).__name__}: {str(error)[:200]})"]


def _preset_changes(record: dict[str, Any]) -> list[str]:
    from training.presets import get_option, json_ready, option_paths

    config = recipe_config(record["algorithm"], record["env"])
    then = record["config"]["run"].get("preset_applied") or {}
    now = config.run.preset_applied
    changes = [f"preset: {then.get('name')} -> {now['name']}"] if then.get("name") != now["name"] else []
    defaults, paths = type(config)(), option_paths(config)  # the recipe's defaults: options no preset sets
    for name in sorted(set(then.get("set", {})) | set(now["set"])):
        if name in SUITE_OPTIONS and name not in then.get("set", {}):
            continue  # given on the run's command line (the suite's --frames, --stop-at-return inf, ...)
        default = json_ready(get_option(defaults, paths[name])) if name in paths else None
        before = then.get("set", {}).get(name, default)
        after = now["set"].get(name, default)
        if before != after:
            changes.append(f"{name}: {before} -> {after}")
    return changes


def make_jobs(algorithms: list[str], envs: list[str], seeds: list[int], with_sb3: bool) -> list[Job]:
    """Every (algorithm, env, seed); with ``with_sb3`` each recipe run is followed by SB3's on the same env and
    seed, so that with two jobs at a time the two run side by side and share the machine alike."""
    return [Job(name, env, seed) for algorithm in algorithms for env in envs for seed in seeds
            for name in ([algorithm, f"sb3-{algorithm}"] if with_sb3 else [algorithm])]  # fmt: skip


def command(
    job: Job, results: Path, frames: int | None, checkpoint_every: int, threads: int | None = 1
) -> list[str]:
    """The recipe's command line for ``job``: a fresh run, the continuation of a stopped one, or a fresh run over a
    failed one; ``threads`` torch threads, or None for the recipe's (a preset's ``threads = 0``, all cores, would
    have runs side by side fight over every core). An ``sb3-ALGO`` job runs Stable-Baselines3 with RL Zoo's
    settings at the recipe's budget and evaluation cadence (``benchmarks/sb3_runner.py``; it starts over when stopped)."""
    folder = job.folder(results)
    if job.algorithm.startswith("sb3-"):
        algorithm = job.algorithm.removeprefix("sb3-")
        total, eval_every, eval_episodes = recipe_budget(algorithm, job.env)
        total = frames if frames is not None else total
        return [sys.executable, "-m", "benchmarks.sb3_runner", "--algo", algorithm, "--env", job.env_id,
                "--seed", str(job.seed), "--frames", str(total), "--eval-every", str(min(eval_every, total)),
                "--eval-episodes", str(eval_episodes), "--output-dir", str(folder),
                *(["--env-kwargs", *job.env_kwargs] if job.env_kwargs else [])]  # fmt: skip
    reporting = [
        "--logger",
        "csv",
        "--no-video",
        "--no-progress",
        "--checkpoint-every",
        str(checkpoint_every),
    ]
    base = [sys.executable, "-m", f"recipes.{job.algorithm}"]
    if (folder / "resume.ckpt").exists():
        # an env of the user's own module (module:EnvId): restated, so that the resumed run may import it
        restated = ["--env-id", job.env_id] if ":" in job.env_id else []
        return [*base, "--resume", str(folder), *restated, *reporting]
    options = [
        "--env-id",
        job.env_id,
        "--seed",
        str(job.seed),
        "--output-dir",
        str(folder),
        "--stop-at-return",
        "inf",
        *(["--threads", str(threads)] if threads is not None else []),
    ]
    if job.env_kwargs:
        options += ["--env-kwargs", *job.env_kwargs]
    if frames is not None:
        options += ["--total-frames", str(frames)]
    if folder.exists():
        options.append("--overwrite")  # a run that failed before writing resume.ckpt
    return [*base, *options, *reporting]


MAX_RUN_FILE_BYTES = (
    16 * 2**20
)  # a record, summary or curve file: a run's are well below (100k evaluations: ~4 MB)


def read_regular(path: Path) -> str:
    """The text of the regular file at ``path``; OSError for a device, pipe or folder in its place (a pipe would
    wait for a writer for ever, ``/dev/zero`` never end), ValueError for a file larger than any run writes."""
    if not path.is_file():
        raise OSError(f"{path} is not a regular file")
    if (size := path.stat().st_size) > MAX_RUN_FILE_BYTES:
        raise ValueError(f"{path.name} holds {size:,} bytes, more than a run writes ({MAX_RUN_FILE_BYTES:,})")
    return path.read_text()


def linked_folders(job: Job, results: Path) -> list[Path]:
    """The folders inside ``results`` that the suite writes for ``job`` (its run folder and those above it, its
    record's, the logs) that are links: a run there would write wherever they point."""
    linked = set()
    for target in (job.folder(results), job.record(results).parent, results / "logs"):
        parts = target.relative_to(results).parts
        linked.update(
            path
            for depth in range(1, len(parts) + 1)
            if (path := results.joinpath(*parts[:depth])).is_symlink()
        )
    return sorted(linked)


def foreign_run(job: Job, results: Path) -> str | None:
    """What ``job``'s run folder holds when it is another run's (another algorithm, env, env kwargs or seed, from
    its config.json and summary.json), or None. Missing or damaged files name nothing here: the run's own checks
    and :func:`write_record` deal with them."""
    folder = job.folder(results)
    held: dict[str, Any] = {}
    for name in ("config.json", "summary.json"):
        try:
            data = json.loads(read_regular(folder / name))
        except (OSError, ValueError, RecursionError):
            continue
        held[name] = data if isinstance(data, dict) else {}
    run = held.get("config.json", {}).get("run")
    run = run if isinstance(run, dict) else {}
    summary = held.get("summary.json", {})
    found = {
        "algorithm": summary.get("algorithm", job.algorithm),
        "env": run.get("env_id", summary.get("env_id", job.env_id)),
        "env kwargs": run.get("env_kwargs", job.env_kwargs),
        "seed": run.get("seed", summary.get("seed", job.seed)),
    }
    if (
        summary.get("env_id", found["env"]) != found["env"]
        or summary.get("seed", found["seed"]) != found["seed"]
    ):
        return "a summary.json and a config.json of two runs"
    expected = {"algorithm": job.algorithm, "env": job.env_id, "env kwargs": job.env_kwargs, "seed": job.seed}
    differ = [f"{key} {found[key]!r:.80}" for key in expected if found[key] != expected[key]]
    return "a run of " + ", ".join(differ) if differ else None


def link_problems(jobs: list[Job], results: Path) -> list[str]:
    """The linked folders (:func:`linked_folders`) of ``jobs``, one line each."""
    linked = sorted({path for job in jobs for path in linked_folders(job, results)})
    return [
        f"{path} is a link (to {os.path.realpath(path)}): the suite writes only into folders of its own"
        for path in linked
    ]


def foreign_problems(jobs: list[Job], results: Path) -> list[str]:
    """The run folders of ``jobs`` that hold another run (which the job's ``--overwrite`` would replace, or its
    ``--resume`` continue), one line each."""
    return [
        f"{job.folder(results)} holds {what}, not {job.algorithm} {job.env} seed {job.seed}"
        for job in jobs
        if (what := foreign_run(job, results)) is not None
    ]


def refuse(problems: list[str]) -> None:
    """Exit with status 2 naming ``problems`` (what the results folder holds that no run may write over)."""
    print("error: the results folder holds what the suite must not run over:", file=sys.stderr)
    for line in problems:
        print(f"  {line}", file=sys.stderr)
    print("Move those away (or delete them) and run the suite again.", file=sys.stderr)
    raise SystemExit(2)


def completed(job: Job, results: Path) -> bool:
    """Whether the run in ``job``'s folder spent its budget (a run stopped by a signal also writes summary.json);
    an unreadable summary.json is not a finished run (the run is continued or redone), with a warning."""
    path = job.folder(results) / "summary.json"
    if not path.exists():
        return False
    try:
        summary = json.loads(read_regular(path))
        return isinstance(summary, dict) and summary.get("interrupted_by") is None
    except (OSError, ValueError, RecursionError) as error:
        print(f"warning: {path} cannot be read ({type(error).__name__}); the run is not counted as finished")
        return False


def finished(job: Job, results: Path) -> bool:
    """Whether ``job`` has its record (written from its run folder here if the run completed without one)."""
    if not job.record(results).exists() and completed(job, results):
        write_record(job, results)
    return job.record(results).exists()


def write_record(job: Job, results: Path) -> None:
    """The report's view of a finished run: summary, evaluation curve, preset and options. Run files that are not
    a finished run's (not regular files, damaged, edited) give no record, with a warning saying to delete the run's
    folder to run it again."""
    folder = job.folder(results)
    try:
        if (what := foreign_run(job, results)) is not None:
            raise ValueError(f"it holds {what}")
        summary = json.loads(read_regular(folder / "summary.json"))
        config = json.loads(read_regular(folder / "config.json"))
        rows = csv.DictReader(io.StringIO(read_regular(folder / "evaluations.csv")))
        curve = [[int(row["frames"]), float(row["return_mean"])] for row in rows]
        # the run folder relative to the results folder: a record is kept in the repository, read on other machines
        summary["output_dir"] = config["run"]["output_dir"] = folder.relative_to(results).as_posix()
        record = {"algorithm": job.algorithm, "env": job.env, "seed": job.seed, "summary": summary, "curve": curve,
                  "preset": (config["run"].get("preset_applied") or {}).get("name"), "config": config}  # fmt: skip
        _check_record(record)
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as error:
        print(
            f"warning: {folder} does not hold a finished run's files ({reason(error)}); no record written: delete "
            "the folder to run it again",
            flush=True,
        )
        return
    write_text(job.record(results), json.dumps(record, indent=1) + "\n")


def open_log(path: Path) -> io.TextIOWrapper:
    """``path`` opened for appending, never through a link: a link in its place is removed (what it points at is
    left alone) and the log starts afresh."""
    if path.is_symlink():
        path.unlink()
    return open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o644), "a")


def reason(error: BaseException) -> str:
    """``error``'s type and the first line of its message, for a one-line warning."""
    return f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else 'no detail'}"


def last_error(log: Path) -> str:
    """The last ``error:`` line (or else the last line) of the latest attempt in a run's log (the lines after its
    last ``$ command`` line): why it failed, for the suite's summary."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    starts = [index for index, line in enumerate(lines) if line.startswith("$ ")]
    lines = lines[starts[-1] + 1 :] if starts else lines
    errors = [line for line in lines if line.lower().startswith("error")]
    return (errors or lines or ["empty log"])[-1][:300]


class Runner:
    """Runs the jobs' processes, ``jobs`` at a time; SIGINT, SIGTERM and SIGHUP are passed on to them (they save and
    stop), and no job starts after one of them arrived."""

    def __init__(self, jobs: int, with_sb3: bool = False):
        self.jobs = jobs
        self.with_sb3 = with_sb3
        self.processes: set[subprocess.Popen] = set()
        self.stopping: int | None = None  # the signal that stops the suite
        self.failures: list[tuple[Job, str]] = []  # (job, why), for the summary at the end
        self.restarting: list[Job] = []  # stopped without a resume checkpoint: they start over
        self.lock = (
            threading.RLock()
        )  # re-entrant: the Ray runner's signal handler runs in the thread that holds it

    def threads(self, job: Job) -> int | None:
        """Torch threads for ``job``'s run: one when the runs fill the cores or run beside SB3's (one thread
        each), else the recipe's own, but no more than its share of the cores where it would take all of them
        (its preset's ``threads = 0``, or image observations: :func:`takes_all_cores`)."""
        share = core_share(self.jobs)
        if share == 1 or self.with_sb3:
            return 1
        if job.algorithm.startswith("sb3-"):
            return None  # SB3's runner sets its one thread itself
        return share if takes_all_cores(job.algorithm, job.env) else None

    def run(self, job: Job, results: Path, frames: int | None, checkpoint_every: int) -> int:
        if self.stopping is not None:
            return -1
        logs = results / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{job.algorithm}-{job.slug}-seed{job.seed}.log"
        arguments = command(job, results, frames, checkpoint_every, self.threads(job))
        resuming = "--resume" in arguments
        with open_log(log_path) as log:
            with self.lock:  # a stop that arrived while the command was built: nothing starts
                if self.stopping is not None:
                    return -1
                log.write("$ " + " ".join(arguments) + "\n")
                log.flush()
                process = subprocess.Popen(
                    arguments, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                    env={**os.environ, "PYTHONWARNINGS": "ignore", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
                )  # fmt: skip
                self.processes.add(process)
            status = process.wait()
            with self.lock:
                self.processes.discard(process)
        self.finish(job, results, status, log_path, resuming)
        return status

    def finish(self, job: Job, results: Path, status: int, log_path: Path, resuming: bool) -> None:
        """Keep the record of a run that spent its budget; note a failure, or a stopped run that starts over."""
        if status == 0 and completed(job, results):
            write_record(job, results)
        elif self.stopping is not None:
            if not job.algorithm.startswith("sb3-") and not (job.folder(results) / "resume.ckpt").exists():
                self.restarting.append(job)
        elif status != 0:
            error = last_error(log_path)
            why = f"exit {status}: {error} (log: {log_path})"
            if "Another run is writing into" in error:  # a run left going by a suite killed earlier
                why += "; that run is still going: run the suite again once it has ended"
            elif resuming:
                why += (
                    f"; it was continuing from {job.folder(results) / 'resume.ckpt'}: if that file is damaged, "
                    "delete the run folder to start the run over"
                )
            self.failures.append((job, why))
        print(
            f"{job.algorithm} {job.env} seed {job.seed}: " + ("done" if status == 0 else f"exit {status}"),
            flush=True,
        )

    def stop(self, number: int, frame: Any) -> None:
        passed = (
            signal.SIGTERM if number == signal.SIGHUP else number
        )  # the recipes save on SIGINT and SIGTERM
        with self.lock:
            self.stopping = number
            for process in self.processes:
                process.send_signal(passed)  # each run saves resume.ckpt and exits
            count = len(self.processes)
        print(
            f"stopping: {signal.Signals(number).name} passed on to {count} runs"
            + (" (as SIGTERM)" if passed != number else ""),
            flush=True,
        )

    def handle_signals(self) -> None:
        """Stop on SIGINT, SIGTERM and SIGHUP, except those the suite was started ignoring (``nohup`` ignores
        SIGHUP, a shell's background job SIGINT): a logout does not stop a suite started with nohup."""
        for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(number) is not signal.SIG_IGN:
                signal.signal(number, self.stop)

    def run_all(self, jobs: list[Job], results: Path, frames: int | None, checkpoint_every: int) -> None:
        self.handle_signals()
        with ThreadPoolExecutor(self.jobs) as pool:
            list(pool.map(lambda job: self.run(job, results, frames, checkpoint_every), jobs))


RUN_FILES = ("summary.json", "config.json", "evaluations.csv")  # what a record is written from
SHIPPED_EXCLUDES = [".git", ".venv", "runs", "benchmarks/results", "wandb", "**/__pycache__"]


def run_on_worker(arguments: list[str], folder: str, shipped: bool) -> dict[str, Any]:
    """One run on a Ray worker: the command of :func:`command` with this node's Python, in the project shipped with
    the task (``shipped``) or at the head's path. The run writes into ``folder`` when this node sees the head's
    results folder (one machine, or a shared filesystem: a stopped run then continues from its resume.ckpt), else
    into a temporary folder; the files a record is written from come back with the exit status and the output."""
    import tempfile

    shared = Path(folder).parent.is_dir()
    target = folder if shared else tempfile.mkdtemp(prefix="suite-run-")
    arguments = [sys.executable, *(target if argument == folder else argument for argument in arguments[1:])]
    process = subprocess.Popen(
        arguments, cwd=os.getcwd() if shipped else ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, "PYTHONWARNINGS": "ignore", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
    )  # fmt: skip
    try:
        output, _ = process.communicate()
    except KeyboardInterrupt:  # ray.cancel: the run saves resume.ckpt and stops
        process.send_signal(signal.SIGINT)
        process.wait()
        raise
    files = {}
    for name in RUN_FILES:
        try:
            files[name] = read_regular(Path(target) / name)
        except (OSError, ValueError):  # missing, not a regular file, not text: the head writes no record
            continue
    return {"status": process.returncode, "output": output, "files": files, "shared": shared}


class RayRunner(Runner):
    """Runs each job as a Ray task of one CPU on the cluster at ``address`` (``"local"``: a cluster of this
    machine's cores), as many at a time as the cluster has free CPUs. Away from this machine the project is shipped
    with the tasks (Ray's ``working_dir``; the nodes need the same Python packages), and the finished runs' files
    come back here. SIGINT, SIGTERM and SIGHUP cancel the tasks, which stop their runs."""

    def __init__(self, address: str, with_sb3: bool = False):
        super().__init__(jobs=1, with_sb3=with_sb3)
        self.address = address
        self.pending: dict[Any, tuple[Job, bool]] = {}  # task -> (job, whether it continues a stopped run)

    def run_all(self, jobs: list[Job], results: Path, frames: int | None, checkpoint_every: int) -> None:
        from ray.exceptions import RayError

        from training.distributed import init_ray

        ray = init_ray(None if self.address == "local" else self.address, 1)
        shipped = self.address != "local"
        options = {"runtime_env": {"working_dir": str(ROOT), "excludes": SHIPPED_EXCLUDES}} if shipped else {}
        task = ray.remote(num_cpus=1, max_retries=0)(run_on_worker).options(**options)
        self.handle_signals()
        for job in jobs:
            job.folder(results).parent.mkdir(parents=True, exist_ok=True)
            arguments = command(job, results, frames, checkpoint_every)
            with self.lock:  # a stop cancels what was submitted; nothing is submitted after it
                if self.stopping is not None:
                    break
                reference = task.remote(arguments, str(job.folder(results)), shipped)
                self.pending[reference] = (job, "--resume" in arguments)
                if self.stopping is not None:  # the stop arrived during the submission
                    ray.cancel(reference)
        while self.pending:
            [ready], _ = ray.wait(list(self.pending), num_returns=1)
            job, resuming = self.pending.pop(ready)
            try:
                result = ray.get(ready)
            except RayError as error:  # cancelled, or the worker died: the next suite run starts it again
                print(f"{job.algorithm} {job.env} seed {job.seed}: {type(error).__name__}", flush=True)
                if self.stopping is None:
                    self.failures.append((job, f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"))
                continue
            self.collect(job, results, result, resuming)

    def collect(self, job: Job, results: Path, result: dict[str, Any], resuming: bool = False) -> None:
        """Keep a finished task's output and files, and its record when the run spent its budget."""
        logs = results / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{job.algorithm}-{job.slug}-seed{job.seed}.log"
        with open_log(log_path) as log:
            log.write(result["output"])
        folder = job.folder(results)
        if not result["shared"]:
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in result["files"].items():
                if name in RUN_FILES and isinstance(text, str):
                    write_text(folder / name, text)  # replaces, never writes through, what is there
        self.finish(job, results, result["status"], log_path, resuming)

    def stop(self, number: int, frame: Any) -> None:
        import ray

        with self.lock:
            self.stopping = number
            for reference in list(self.pending):
                ray.cancel(reference)
        print(f"stopping: {len(self.pending)} Ray tasks cancelled", flush=True)


# ---------------------------------------------------------------------------------------------------- the report
RECORD_NAME = re.compile(r"seed(\d+)\.json")


def read_runs(results: Path) -> list[dict[str, Any]]:
    """The records of the finished runs: ``records/ALGO/ENV/seedS.json`` files only (a copy such as
    ``seed1.old.json`` is not another seed); a damaged one is left out with a warning, see :func:`read_record`."""
    paths = sorted((results / "records").glob("*/*/seed*.json"))
    records = (read_record(path) for path in paths if RECORD_NAME.fullmatch(path.name))
    return [record for record in records if record is not None]


def read_record(path: Path, quiet: bool = False) -> dict[str, Any] | None:
    """The record at ``path``, or None with a warning naming it (none when ``quiet``) when there is none or it is
    not one the suite wrote (damaged, edited by hand, from another program, or moved from another run's place): the
    report goes on without it."""
    if quiet and not path.exists():
        return None
    try:
        record = json.loads(read_regular(path))
        _check_record(record)
        job = Job(record["algorithm"], record["env"], record["seed"])
        if (
            path.parent.parent.name != job.algorithm
            or path.parent.name != job.slug
            or path.name != f"seed{job.seed}.json"
        ):
            raise ValueError(
                f"it is the record of {job.algorithm} {job.env} seed {job.seed}, whose place is "
                f"records/{job.algorithm}/{job.slug}/seed{job.seed}.json"
            )
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as error:
        if quiet:
            return None
        print(
            f"warning: {path} is not a run record the suite can read ({reason(error)}); left out of the report. Delete "
            "it and its run folder to run it again.",
            flush=True,
        )
        return None
    return record


MAX_CURVE_POINTS = (
    100_000  # evaluations in a record's curve: a 10M-frame run evaluated every 1,000 frames has 10,000
)


def _check_record(record: Any) -> None:
    """Raise ValueError unless ``record`` has the fields, of the types, that the report reads."""

    def number(value: Any) -> bool:  # finite, and far enough from float's end for sums and plots
        return isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 1e300

    def count(value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1e300

    summary, curve, config = record["summary"], record["curve"], record.get("config", {})
    run = config.get("run", {}) if isinstance(config, dict) else None
    preset = run.get("preset_applied") if isinstance(run, dict) else None
    if not (
        isinstance(record["algorithm"], str)
        and isinstance(record["env"], str)
        and record["env"].split()
        and count(record["seed"])
        and isinstance(summary, dict)
        and count(summary["frames"])
        and all(number(summary[key]) for key in ("seed", "eval_return_mean", "wall_time_s", "fps"))
        and isinstance(curve, list)
        and 0 < len(curve) <= MAX_CURVE_POINTS
        and all(isinstance(point, list) and len(point) == 2 and all(map(number, point)) for point in curve)
        and (record.get("preset") is None or isinstance(record["preset"], str))
        and isinstance(run, dict)
        and (preset is None or isinstance(preset, dict) and isinstance(preset.get("set", {}), dict))
        and (run.get("total_frames") is None or count(run["total_frames"]))
    ):
        raise ValueError("fields missing, of the wrong type, or not finite")


def read_references() -> dict[tuple[str, str], dict[str, str]]:
    with open(REFERENCES) as file:
        return {(row["algorithm"], row["env"]): row for row in csv.DictReader(file)}


def random_score(env: str, cache: Path, episodes: int = 10) -> float:
    """Mean return of uniformly random actions over ``episodes`` seeded episodes (cached in ``cache``; a cache that
    cannot be read, or an entry that is no finite number, is measured again)."""
    scores = read_random_scores(cache)
    if env not in scores:
        import gymnasium as gym

        from envs.atari import is_atari, make_atari_env
        from training.config import parse_env_kwargs

        env_id, *kwargs = env.split()
        if is_atari(env_id):  # as the evaluations score it: whole games, the game's own score
            instance = make_atari_env(env_id, training=False, **parse_env_kwargs(kwargs))
        else:
            instance = gym.make(env_id, **parse_env_kwargs(kwargs))
        instance.action_space.seed(0)
        returns = []
        for episode in range(episodes):
            instance.reset(seed=episode)
            total, done = 0.0, False
            while not done:
                _, reward, terminated, truncated, _ = instance.step(instance.action_space.sample())
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
        instance.close()
        scores[env] = statistics.mean(returns)
        write_text(cache, json.dumps(scores, indent=2) + "\n")  # whole or not at all, never through a link
    return scores[env]


def read_random_scores(cache: Path) -> dict[str, float]:
    """The cached random scores that are finite numbers (the rest, or a damaged file, with a warning)."""
    if not cache.exists():
        return {}
    try:
        scores = json.loads(read_regular(cache))
    except (OSError, ValueError, RecursionError) as error:
        print(
            f"warning: {cache} cannot be read ({type(error).__name__}); the random scores are measured again"
        )
        return {}
    if not isinstance(scores, dict):
        print(f"warning: {cache} holds no table of scores; the random scores are measured again")
        return {}
    kept = {
        env: score
        for env, score in scores.items()
        if isinstance(score, (int, float)) and not isinstance(score, bool) and abs(score) < 1e300
    }
    if len(kept) < len(scores):
        print(f"warning: {cache}: {', '.join(sorted(set(scores) - set(kept)))} not a number; measured again")
    return kept


def interquartile_mean(groups: list[list[float]]) -> float:
    """The interquartile mean (IQM, Agarwal et al. 2021) of runs grouped by task (an env's seeds), every task
    weighing the same.

    With as many runs in every task it is rliable's: the mean of the runs left when a quarter of them, rounded
    down, is dropped from each end (``scipy.stats.trim_mean(runs, 0.25)``). With unequal seed counts a task of
    ``n`` runs counts each as ``L / n`` runs (``L``, the least common multiple of the counts): pooled as they are,
    a task run on ten seeds would outweigh ten tasks run on one."""
    groups = [group for group in groups if group]
    if not groups:
        raise ValueError("the IQM of no runs")
    copies = math.lcm(*(len(group) for group in groups))
    weighted = sorted((value, copies // len(group)) for group in groups for value in group)
    total = copies * len(groups)
    low, high = total // 4, total - total // 4  # the kept positions of the expanded, sorted runs
    kept, start = 0.0, 0
    for value, weight in weighted:  # each run fills positions [start, start + weight)
        overlap = min(start + weight, high) - max(start, low)
        if overlap > 0:
            kept += value * overlap
        start += weight
    return kept / (high - low)


def pooled_mean(groups: list[list[float]]) -> float:
    """The mean of all values of ``groups``."""
    return statistics.fmean(value for group in groups for value in group)


def bootstrap_interval(
    groups: list[list[float]], statistic: Any, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of ``statistic`` (of a list of groups) over stratified bootstrap resamples: each
    group (an env's seeds) is resampled with replacement on its own, as rliable does."""
    generator = random.Random(seed)
    estimates = sorted(
        statistic([[generator.choice(group) for _ in group] for group in groups]) for _ in range(samples)
    )
    return estimates[int(0.025 * samples)], estimates[int(0.975 * samples) - 1]


def mean_std(values: list[float]) -> str:
    """``mean ± standard deviation``; one value alone, without a spread it does not have."""
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


def write_report(results: Path) -> Path:
    """report.md, summary.csv and the plots from the finished runs in ``results``."""
    runs = read_runs(results)
    references = read_references()
    rows: dict[
        tuple[str, str, int], list[dict]
    ] = {}  # a row per budget: runs of other budgets do not average
    for run in runs:
        budget = record_budget(run, results)  # unknown: the frames it ran
        rows.setdefault((run["algorithm"], run["env"], budget or run["summary"]["frames"]), []).append(run)
    table = io.StringIO(newline="")
    writer = csv.writer(table)
    writer.writerow(["algorithm", "env", "seed", "preset", "frames", "final_return", "best_return", "wall_time_s",
                     "fps"])  # fmt: skip
    for run in runs:
        summary = run["summary"]
        writer.writerow([run["algorithm"], run["env"], summary["seed"], run["preset"], summary["frames"],
                         summary["eval_return_mean"], max(value for _, value in run["curve"]),
                         summary["wall_time_s"], summary["fps"]])  # fmt: skip
    write_text(
        results / "summary.csv", table.getvalue()
    )  # files here are replaced, never written through links
    lines = [
        "# Benchmark results",
        "",
        "Made by `python -m benchmarks.suite` on this machine (2 CPU cores); each run with its preset and the whole",
        "budget (no early stop). Final: the last evaluation (deterministic, the run's --eval-episodes); best: the",
        "best evaluation of the run. Mean ± standard deviation over seeds. Reference: the published score, its",
        "budget and source (benchmarks/references.csv: RL Zoo's benchmark.md, Stable-Baselines3 with RL Zoo's",
        "settings, scored over about 150k evaluation steps of the trained agent); a budget below the reference's is",
        "marked with *.",
        "",
        "| algorithm | env | seeds | frames | final | best | wall-clock (s) | frames/s | reference | source |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    normalised: dict[str, list[list[float]]] = {}
    left_out = []  # pairs with a reference that the aggregate cannot normalise
    scores: dict[tuple[str, str], list[float]] = {}  # (algorithm, env) -> normalised final returns
    for (algorithm, env, _), group in sorted(rows.items()):
        frames = [run["summary"]["frames"] for run in group]
        final = [run["summary"]["eval_return_mean"] for run in group]
        best = [max(value for _, value in run["curve"]) for run in group]
        reference = references.get((algorithm.removeprefix("sb3-"), env))
        budget = min(frames)
        if reference is not None:
            below = budget < int(reference["frames"]) * 0.99
            reference_text = f"{float(reference['score']):.1f} at {int(reference['frames']):,}" + (
                "*" if below else ""
            )
            source = reference["source"]
            floor = random_score(env, results / "random_scores.json")
            scale = float(reference["score"]) - floor
            if scale > 0:  # rows come in ascending budgets: a pair's largest budget stands for it
                scores[(algorithm, env)] = [(value - floor) / scale for value in final]
            else:
                left_out.append(
                    f"{algorithm} on {env} (its random score {floor:.1f} is not below the reference)"
                )
        else:
            reference_text, source = "-", "-"
        lines.append(
            f"| {algorithm} | {env} | {len(group)} | {budget:,} | {mean_std(final)} | {mean_std(best)} | "
            f"{statistics.fmean(run['summary']['wall_time_s'] for run in group):.0f} | "
            f"{statistics.fmean(run['summary']['fps'] for run in group):.0f} | {reference_text} | {source} |"
        )
    stale = [(run, changes) for run in runs if (changes := preset_changes(run))]
    if stale:
        lines += ["", "Made with a preset that has changed since (these rows are not today's preset; delete the record",
                  "and its run folder to run it again):", ""]  # fmt: skip
        for run, changes in stale:
            lines.append(f"- {run['algorithm']} {run['env']} seed {run['seed']}: {'; '.join(changes)}")
    for (algorithm, _), values in sorted(scores.items()):
        normalised.setdefault(algorithm, []).append(values)
    if normalised:
        lines += ["", "## Aggregate", "", "Interquartile mean of the final returns normalised as (score - random) /",
                  "(reference - random), 95% stratified bootstrap interval over seeds (Agarwal et al. 2021), every pair",
                  "weighing the same whatever its number of seeds; pairs without a reference score are not in it, a",
                  "pair run at several budgets is in it at its largest (budgets below the reference's included):", "",
                  "| algorithm | pairs | IQM | 95% interval |", "|---|---|---|---|"]  # fmt: skip
        for algorithm, groups in sorted(normalised.items()):
            low, high = bootstrap_interval(groups, interquartile_mean)
            lines.append(
                f"| {algorithm} | {len(groups)} | {interquartile_mean(groups):.2f} | [{low:.2f}, {high:.2f}] |"
            )
    if left_out:
        lines += ["", "Left out of the aggregate: " + "; ".join(left_out) + "."]
    against = [key for key in sorted(rows) if (f"sb3-{key[0]}", *key[1:]) in rows]
    if against:
        lines += ["", "## Against Stable-Baselines3 at the same frames", "",
                  "Stable-Baselines3 with RL Zoo's settings (`--with-sb3`), the same seeds, frames and evaluations, in",
                  "the same suite run. Speed: SB3's wall-clock over ours (above 1: ours is faster).", "",
                  "| algorithm | env | seeds | frames | final (ours) | final (SB3) | wall-clock ours / SB3 (s) | speed |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for algorithm, env, budget in against:
            ours, theirs = rows[(algorithm, env, budget)], rows[(f"sb3-{algorithm}", env, budget)]
            ours_time = statistics.fmean(run["summary"]["wall_time_s"] for run in ours)
            sb3_time = statistics.fmean(run["summary"]["wall_time_s"] for run in theirs)
            lines.append(
                f"| {algorithm} | {env} | {len(ours)} / {len(theirs)} | {min(r['summary']['frames'] for r in ours):,} | "
                f"{mean_std([r['summary']['eval_return_mean'] for r in ours])} | "
                f"{mean_std([r['summary']['eval_return_mean'] for r in theirs])} | "
                f"{ours_time:.0f} / {sb3_time:.0f} | {sb3_time / ours_time:.2f}x |"
            )
    written = plot(results, rows, normalised)
    lines += ["", "Plots: " + ", ".join(f"[{name}]({name})" for name in sorted(written))]
    return write_text(results / "report.md", "\n".join(lines) + "\n")


def plot(
    results: Path, rows: dict[tuple[str, str, int], list[dict]], normalised: dict[str, list[list[float]]]
) -> list[str]:
    """curves_ENV.png per env (a curve per algorithm and budget) and aggregate.png; returns their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for env in sorted({env for _, env, _ in rows}):
        figure, axes = plt.subplots(figsize=(6, 4))
        for (algorithm, row_env, budget), group in sorted(rows.items()):
            if row_env != env:
                continue
            budgets = sum(1 for other, other_env, _ in rows if (other, other_env) == (algorithm, env))
            at_frame: dict[float, list[float]] = {}  # the seeds' evaluations at each frame count
            for run in group:
                for frame, value in run["curve"]:
                    at_frame.setdefault(frame, []).append(value)
            frames = sorted(at_frame)
            means, lows, highs = [], [], []
            for frame in frames:
                values = at_frame[frame]
                means.append(statistics.fmean(values))
                # one evaluation has no spread to resample
                low, high = (
                    bootstrap_interval([values], pooled_mean, samples=500)
                    if len(values) > 1
                    else (values[0],) * 2
                )
                lows.append(low)
                highs.append(high)
            label = f"{algorithm} ({len(group)} seed{'s' if len(group) > 1 else ''}"
            axes.plot(frames, means, label=label + (f", {budget:,} frames)" if budgets > 1 else ")"))
            axes.fill_between(frames, lows, highs, alpha=0.25)
        axes.set_xlabel("frames")
        axes.set_ylabel("evaluation return")
        axes.set_title(env)
        axes.legend()
        figure.tight_layout()
        written.append(f"curves_{re.sub(r'[^A-Za-z0-9_.=-]+', '_', env)}.png")
        write_atomically(results / written[-1], functools.partial(figure.savefig, dpi=100))
        plt.close(figure)
    if normalised:
        figure, axes = plt.subplots(figsize=(6, 1 + 0.5 * len(normalised)))
        for row, (algorithm, groups) in enumerate(sorted(normalised.items())):
            low, high = bootstrap_interval(groups, interquartile_mean)
            axes.plot([low, high], [row, row], linewidth=6, alpha=0.5)
            axes.plot([interquartile_mean(groups)], [row], "k|", markersize=14)
        axes.set_yticks(range(len(normalised)), sorted(normalised))
        axes.set_xlabel("IQM of reference-normalised score (1 = the reference)")
        figure.tight_layout()
        write_atomically(results / "aggregate.png", functools.partial(figure.savefig, dpi=100))
        plt.close(figure)
        written.append("aggregate.png")
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=[], help="recipes, e.g. ppo sac")
    parser.add_argument("--envs", nargs="+", default=[], help='env ids, with kwargs as "ID key=value"')
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument(
        "--frames", type=whole_number, default=None, help="budget per run (default: the preset's)"
    )
    parser.add_argument("--results", type=Path, default=Path(__file__).with_name("results"))
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (without --ray-address)")
    parser.add_argument(
        "--ray-address",
        default=None,
        help="run on a Ray cluster: its address (e.g. auto, ray://head:10001), or local for this machine's cores",
    )
    parser.add_argument(
        "--checkpoint-every", type=whole_number, default=50_000, help="frames between resume checkpoints"
    )
    parser.add_argument(
        "--report-only", action="store_true", help="only rebuild the report from finished runs"
    )
    parser.add_argument(
        "--with-sb3",
        action="store_true",
        help="also run Stable-Baselines3 with RL Zoo's settings (bench extra)",
    )
    args = parser.parse_args(argv)
    if args.frames is not None and args.frames <= 0 or args.jobs <= 0 or args.checkpoint_every <= 0:
        parser.error("--frames, --jobs and --checkpoint-every must be positive")
    # the runs work in the project's root: a relative folder is the caller's, not the project's
    args.results = args.results.resolve()
    for name in ("algos", "envs", "seeds"):  # each run once, in the order given
        setattr(args, name, list(dict.fromkeys(getattr(args, name))))
    if args.report_only:
        if not args.results.is_dir():
            parser.error(f"--results {args.results} is no folder")
    elif problem := check_request(args.algos, args.envs, args.seeds, args.with_sb3):
        parser.error(problem)
    if args.results.exists() and not args.results.is_dir():
        parser.error(f"--results {args.results} is a file; name a folder")
    try:
        args.results.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        parser.error(f"--results {args.results}: cannot make the folder ({error.strerror}); name a folder")
    status = 0
    if not args.report_only:
        jobs = make_jobs(args.algos, args.envs, args.seeds, args.with_sb3)
        if problems := link_problems(jobs, args.results):  # before any record is written
            refuse(problems)
        pending = [job for job in jobs if not finished(job, args.results)]
        if conflicts := budget_conflicts(jobs, args.results, args.frames):
            print("error: one results folder holds one budget per (algorithm, env, seed):", file=sys.stderr)
            for line in conflicts:
                print(f"  {line}", file=sys.stderr)
            print(
                "Give another --results folder for the new budget, --frames for the old one, or delete those "
                "records and run folders to run them again.",
                file=sys.stderr,
            )
            raise SystemExit(2)
        if problems := foreign_problems(pending, args.results):
            refuse(problems)
        for job in jobs:
            record = None if job in pending else read_record(job.record(args.results))
            if record is not None and (changes := preset_changes(record)):
                print(
                    f"warning: {job.algorithm} {job.env} seed {job.seed} was run with another preset "
                    f"({'; '.join(changes)}); delete {job.record(args.results)} and its run folder to run it again",
                    flush=True,
                )
        print(
            f"{len(jobs) - len(pending)} of {len(jobs)} runs already finished; {len(pending)} to run",
            flush=True,
        )
        runner = (
            RayRunner(args.ray_address, args.with_sb3)
            if args.ray_address
            else Runner(args.jobs, args.with_sb3)
        )
        runner.run_all(pending, args.results, args.frames, args.checkpoint_every)
        for job in runner.restarting:
            print(
                f"{job.algorithm} {job.env} seed {job.seed} has no resume checkpoint (Stable-Baselines3's runs write "
                "none): it starts over next time",
                flush=True,
            )
        if runner.failures:
            print(f"{len(runner.failures)} of {len(pending)} runs failed:", flush=True)
            for job, why in runner.failures:
                print(f"  {job.algorithm} {job.env} seed {job.seed}: {why}", flush=True)
            status = 1
        if runner.stopping is not None:
            print("stopped; run the same command again to continue", flush=True)
            status = 128 + runner.stopping
    if not any((args.results / "records").glob("*/*/seed*.json")):
        print("no finished runs yet")
    elif args.report_only:
        print(f"report: {write_report(args.results)}")
    else:
        # in a fresh process: the recipes and presets as they are now, not as they were when a long suite started
        report = [sys.executable, "-m", "benchmarks.suite", "--report-only", "--results", str(args.results)]
        status = status or subprocess.run(report, cwd=ROOT, check=False).returncode
    if status:
        raise SystemExit(status)


def check_request(algorithms: list[str], envs: list[str], seeds: list[int], with_sb3: bool) -> str | None:
    """What is wrong with the runs asked for, before any of them starts (None: nothing)."""
    from training.config import parse_env_kwargs

    if not algorithms or not envs:
        return "give --algos and --envs (or --report-only to rebuild the report from the runs there)"
    recipes = sorted(  # the training recipes: those with presets
        path.stem
        for path in (ROOT / "recipes" / "presets").glob("*.toml")
        if (ROOT / "recipes" / f"{path.stem}.py").exists()
    )
    for algorithm in algorithms:
        if algorithm not in recipes:
            return f"no training recipe {algorithm!r}; the suite runs {', '.join(recipes)}"
    for seed in seeds:
        if not 0 <= seed < 2**32:
            return f"--seeds must be in [0, 2**32), got {seed}"
    places: dict[Path, str] = {}
    for env in envs:
        if not env.split():
            return 'an empty --envs item: give env ids, with kwargs as "ID key=value"'
        try:
            parse_env_kwargs(env.split()[1:])
        except ValueError as error:  # InputError
            return f"--envs {env!r}: {error}"
        place = Job(algorithms[0], env, 0).record(Path())
        if places.setdefault(place, env) != env:
            return f"--envs {places[place]!r} and {env!r} would share the records folder {place.parent}; spell one otherwise"
    if with_sb3:
        from benchmarks.sb3_runner import ZOO_SETTINGS

        missing = [f"{algorithm} on {env}" for algorithm in algorithms for env in envs
                   if (algorithm, " ".join(env.split())) not in ZOO_SETTINGS]  # fmt: skip
        if missing:
            return f"--with-sb3: no RL Zoo settings for {', '.join(missing)} in benchmarks/sb3_runner.py"
    return None


if __name__ == "__main__":
    main()
