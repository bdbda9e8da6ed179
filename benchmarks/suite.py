"""Multi-seed benchmark suite: every (algorithm, env, seed) trained with its preset, then a report next to the
published reference scores.

    python -m benchmarks.suite --algos ppo sac --envs Hopper-v5 HalfCheetah-v5 --seeds 0 1 2 [--frames N]
    python -m benchmarks.suite --algos sac --envs "LunarLander-v3 continuous=true" --seeds 0
    python -m benchmarks.suite --report-only          # rebuild report.md and the plots from what is there

Each run is ``python -m recipes.ALGO --env-id ENV --seed S`` (plus ``--total-frames N`` when given; the whole budget,
no early stop), a separate process, ``--jobs`` at a time (default 2: one per core; each recipe uses one torch
thread), or with ``--ray-address`` a task of one CPU on a Ray cluster, as many at a time as it has free CPUs.
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
the end of a session (SIGTERM or SIGINT to the suite, which passes it on) saved resume.ckpt and continues with
``--resume``; runs write resume.ckpt every ``--checkpoint-every`` frames too, so even a killed run loses at most that
much. Reference scores are ``benchmarks/references.csv`` (RL Zoo's benchmark.md, each row with its source); a score
is normalised as (score - random) / (reference - random), the random policy's return measured here once per env.
"""

from __future__ import annotations

import argparse
import csv
import json
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

from benchmarks.common import whole_number

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


def recipe_budget(algorithm: str, env: str) -> tuple[int, int, int]:
    """(total frames, eval every, eval episodes) of ``algorithm`` on ``env`` with its preset."""
    config = recipe_config(algorithm, env)
    return config.run.total_frames, config.run.eval_every, config.run.eval_episodes


# the options the suite gives each recipe run on its command line (``command``): no preset sets them there
SUITE_OPTIONS = {"total_frames", "stop_at_return", "seed", "output_dir", "logger", "video", "progress",
                 "checkpoint_every", "overwrite", "threads"}  # fmt: skip


def preset_changes(record: dict[str, Any]) -> list[str]:
    """How today's preset for a record's (algorithm, env) differs from the one its run had, as ``"name: then ->
    now"`` lines; empty when it is the same (or for a Stable-Baselines3 run). What the suite gives the run on its
    command line (a budget given with ``--frames``) is not a change."""
    if record["algorithm"].startswith("sb3-"):
        return []
    from training.presets import get_option, json_ready, option_paths

    try:
        config = recipe_config(record["algorithm"], record["env"])
        then = record["config"]["run"].get("preset_applied") or {}
    # a recipe gone, a record of another shape
    except (ImportError, KeyError, AttributeError, TypeError) as error:
        return [f"not comparable with today's preset ({type(error).__name__}: {error})"]
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
        return [*base, "--resume", str(folder), *reporting]
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


def completed(job: Job, results: Path) -> bool:
    """Whether the run in ``job``'s folder spent its budget (a run stopped by a signal also writes summary.json)."""
    path = job.folder(results) / "summary.json"
    return path.exists() and json.loads(path.read_text()).get("interrupted_by") is None


def finished(job: Job, results: Path) -> bool:
    """Whether ``job`` has its record (written from its run folder here if the run completed without one)."""
    if not job.record(results).exists() and completed(job, results):
        write_record(job, results)
    return job.record(results).exists()


def write_record(job: Job, results: Path) -> None:
    """The report's view of a finished run: summary, evaluation curve, preset and options."""
    folder = job.folder(results)
    summary = json.loads((folder / "summary.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    with open(folder / "evaluations.csv") as file:
        curve = [[int(row["frames"]), float(row["return_mean"])] for row in csv.DictReader(file)]
    # the run folder relative to the results folder: a record is kept in the repository, read on other machines
    summary["output_dir"] = config["run"]["output_dir"] = folder.relative_to(results).as_posix()
    record = {"algorithm": job.algorithm, "env": job.env, "seed": job.seed, "summary": summary, "curve": curve,
              "preset": (config["run"].get("preset_applied") or {}).get("name"), "config": config}  # fmt: skip
    path = job.record(results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n")


class Runner:
    """Runs the jobs' processes, ``jobs`` at a time; SIGINT/SIGTERM are passed on to them (they save and stop)."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.processes: set[subprocess.Popen] = set()
        self.stopping = False
        self.lock = threading.Lock()

    def run(self, job: Job, results: Path, frames: int | None, checkpoint_every: int) -> int:
        if self.stopping:
            return -1
        logs = results / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        log_path = logs / f"{job.algorithm}-{job.slug}-seed{job.seed}.log"
        fills_machine = self.jobs >= (os.cpu_count() or 1)
        threads = 1 if fills_machine else None  # a core each when the runs fill the machine
        arguments = command(job, results, frames, checkpoint_every, threads)
        with open(log_path, "a") as log:
            log.write("$ " + " ".join(arguments) + "\n")
            log.flush()
            process = subprocess.Popen(
                arguments, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "PYTHONWARNINGS": "ignore", "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")},
            )  # fmt: skip
            with self.lock:
                self.processes.add(process)
            status = process.wait()
            with self.lock:
                self.processes.discard(process)
        if status == 0 and completed(job, results):
            write_record(job, results)
        print(
            f"{job.algorithm} {job.env} seed {job.seed}: " + ("done" if status == 0 else f"exit {status}"),
            flush=True,
        )
        return status

    def stop(self, number: int, frame: Any) -> None:
        self.stopping = True
        with self.lock:
            for process in self.processes:
                process.send_signal(number)  # each run saves resume.ckpt and exits
        print(f"stopping: {signal.Signals(number).name} passed on to {len(self.processes)} runs", flush=True)

    def run_all(self, jobs: list[Job], results: Path, frames: int | None, checkpoint_every: int) -> None:
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGTERM, self.stop)
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
    files = {name: (Path(target) / name).read_text() for name in RUN_FILES if (Path(target) / name).exists()}
    return {"status": process.returncode, "output": output, "files": files, "shared": shared}


class RayRunner(Runner):
    """Runs each job as a Ray task of one CPU on the cluster at ``address`` (``"local"``: a cluster of this
    machine's cores), as many at a time as the cluster has free CPUs. Away from this machine the project is shipped
    with the tasks (Ray's ``working_dir``; the nodes need the same Python packages), and the finished runs' files
    come back here. SIGINT/SIGTERM cancel the tasks, which stop their runs."""

    def __init__(self, address: str):
        super().__init__(jobs=1)
        self.address = address
        self.pending: dict[Any, Job] = {}

    def run_all(self, jobs: list[Job], results: Path, frames: int | None, checkpoint_every: int) -> None:
        from ray.exceptions import RayError

        from training.distributed import init_ray

        ray = init_ray(None if self.address == "local" else self.address, 1)
        shipped = self.address != "local"
        options = {"runtime_env": {"working_dir": str(ROOT), "excludes": SHIPPED_EXCLUDES}} if shipped else {}
        task = ray.remote(num_cpus=1, max_retries=0)(run_on_worker).options(**options)
        signal.signal(signal.SIGINT, self.stop)
        signal.signal(signal.SIGTERM, self.stop)
        for job in jobs:
            job.folder(results).parent.mkdir(parents=True, exist_ok=True)
            arguments = command(job, results, frames, checkpoint_every)
            self.pending[task.remote(arguments, str(job.folder(results)), shipped)] = job
        while self.pending:
            [ready], _ = ray.wait(list(self.pending), num_returns=1)
            job = self.pending.pop(ready)
            try:
                result = ray.get(ready)
            except RayError as error:  # cancelled, or the worker died: the next suite run starts it again
                print(f"{job.algorithm} {job.env} seed {job.seed}: {type(error).__name__}", flush=True)
                continue
            self.collect(job, results, result)

    def collect(self, job: Job, results: Path, result: dict[str, Any]) -> None:
        """Keep a finished task's output and files, and its record when the run spent its budget."""
        logs = results / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / f"{job.algorithm}-{job.slug}-seed{job.seed}.log", "a") as log:
            log.write(result["output"])
        folder = job.folder(results)
        if not result["shared"]:
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in result["files"].items():
                if name in RUN_FILES:
                    (folder / name).write_text(text)
        status = result["status"]
        if status == 0 and completed(job, results):
            write_record(job, results)
        print(
            f"{job.algorithm} {job.env} seed {job.seed}: " + ("done" if status == 0 else f"exit {status}"),
            flush=True,
        )

    def stop(self, number: int, frame: Any) -> None:
        import ray

        self.stopping = True
        for reference in list(self.pending):
            ray.cancel(reference)
        print(f"stopping: {len(self.pending)} Ray tasks cancelled", flush=True)


# ---------------------------------------------------------------------------------------------------- the report
def read_runs(results: Path) -> list[dict[str, Any]]:
    """The records of the finished runs (a damaged one is left out with a warning, see :func:`read_record`)."""
    records = (read_record(path) for path in sorted((results / "records").glob("*/*/seed*.json")))
    return [record for record in records if record is not None]


def read_record(path: Path) -> dict[str, Any] | None:
    """The record at ``path``, or None with a warning naming it when it is not one the suite wrote (damaged, edited
    by hand, or from another program): the report goes on without it."""
    try:
        record = json.loads(path.read_text())
        _check_record(record)
    except (OSError, ValueError, TypeError, KeyError, RecursionError) as error:
        reason = f"{type(error).__name__}: {str(error).splitlines()[0][:200] if str(error) else 'no detail'}"
        print(
            f"warning: {path} is not a run record the suite can read ({reason}); left out of the report. Delete "
            "it and its run folder to run it again.",
            flush=True,
        )
        return None
    return record


def _check_record(record: Any) -> None:
    """Raise ValueError unless ``record`` has the fields, of the types, that the report reads."""

    def number(value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    summary, curve = record["summary"], record["curve"]
    if not (
        isinstance(record["algorithm"], str)
        and isinstance(record["env"], str)
        and isinstance(record["seed"], int)
        and isinstance(summary, dict)
        and isinstance(summary["frames"], int)
        and all(number(summary[key]) for key in ("seed", "eval_return_mean", "wall_time_s", "fps"))
        and isinstance(curve, list)
        and curve
        and all(isinstance(point, list) and len(point) == 2 and all(map(number, point)) for point in curve)
        and (record.get("preset") is None or isinstance(record["preset"], str))
        and isinstance(record.get("config", {}), dict)
    ):
        raise ValueError("fields missing or of the wrong type")


def read_references() -> dict[tuple[str, str], dict[str, str]]:
    with open(REFERENCES) as file:
        return {(row["algorithm"], row["env"]): row for row in csv.DictReader(file)}


def random_score(env: str, cache: Path, episodes: int = 10) -> float:
    """Mean return of uniformly random actions over ``episodes`` seeded episodes (cached in ``cache``)."""
    scores = json.loads(cache.read_text()) if cache.exists() else {}
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
        cache.write_text(json.dumps(scores, indent=2) + "\n")
    return scores[env]


def interquartile_mean(values: list[float]) -> float:
    """Mean of the middle half of ``values`` (Agarwal et al. 2021: the IQM)."""
    ordered = sorted(values)
    cut = len(ordered) // 4
    middle = ordered[cut : len(ordered) - cut] or ordered
    return statistics.fmean(middle)


def bootstrap_interval(
    groups: list[list[float]], statistic: Any, samples: int = BOOTSTRAP_SAMPLES, seed: int = 0
) -> tuple[float, float]:
    """95% percentile interval of ``statistic`` over stratified bootstrap resamples: each group (an env's seeds) is
    resampled with replacement on its own, as rliable does."""
    generator = random.Random(seed)
    estimates = sorted(
        statistic([generator.choice(group) for group in groups for _ in group]) for _ in range(samples)
    )
    return estimates[int(0.025 * samples)], estimates[int(0.975 * samples) - 1]


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.fmean(values):.1f} ± {spread:.1f}"


def write_report(results: Path) -> Path:
    """report.md, summary.csv and the plots from the finished runs in ``results``."""
    runs = read_runs(results)
    references = read_references()
    pairs: dict[tuple[str, str], list[dict]] = {}
    for run in runs:
        pairs.setdefault((run["algorithm"], run["env"]), []).append(run)
    with open(results / "summary.csv", "w", newline="") as file:
        writer = csv.writer(file)
        writer.writerow(["algorithm", "env", "seed", "preset", "frames", "final_return", "best_return", "wall_time_s",
                         "fps"])  # fmt: skip
        for run in runs:
            summary = run["summary"]
            writer.writerow([run["algorithm"], run["env"], summary["seed"], run["preset"], summary["frames"],
                             summary["eval_return_mean"], max(value for _, value in run["curve"]),
                             summary["wall_time_s"], summary["fps"]])  # fmt: skip
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
    for (algorithm, env), group in sorted(pairs.items()):
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
            if scale > 0:
                normalised.setdefault(algorithm, []).append([(value - floor) / scale for value in final])
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
    if normalised:
        lines += ["", "## Aggregate", "", "Interquartile mean of the final returns normalised as (score - random) /",
                  "(reference - random), 95% stratified bootstrap interval over seeds (Agarwal et al. 2021):", "",
                  "| algorithm | pairs | IQM | 95% interval |", "|---|---|---|---|"]  # fmt: skip
        for algorithm, groups in sorted(normalised.items()):
            flat = [value for group in groups for value in group]
            low, high = bootstrap_interval(groups, interquartile_mean)
            lines.append(
                f"| {algorithm} | {len(groups)} | {interquartile_mean(flat):.2f} | [{low:.2f}, {high:.2f}] |"
            )
    against = [(algorithm, env) for algorithm, env in sorted(pairs) if (f"sb3-{algorithm}", env) in pairs]
    if against:
        lines += ["", "## Against Stable-Baselines3 at the same frames", "",
                  "Stable-Baselines3 with RL Zoo's settings (`--with-sb3`), the same seeds, frames and evaluations, in",
                  "the same suite run. Speed: SB3's wall-clock over ours (above 1: ours is faster).", "",
                  "| algorithm | env | seeds | frames | final (ours) | final (SB3) | wall-clock ours / SB3 (s) | speed |",
                  "|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for algorithm, env in against:
            ours, theirs = pairs[(algorithm, env)], pairs[(f"sb3-{algorithm}", env)]
            ours_time = statistics.fmean(run["summary"]["wall_time_s"] for run in ours)
            sb3_time = statistics.fmean(run["summary"]["wall_time_s"] for run in theirs)
            lines.append(
                f"| {algorithm} | {env} | {len(ours)} / {len(theirs)} | {min(r['summary']['frames'] for r in ours):,} | "
                f"{mean_std([r['summary']['eval_return_mean'] for r in ours])} | "
                f"{mean_std([r['summary']['eval_return_mean'] for r in theirs])} | "
                f"{ours_time:.0f} / {sb3_time:.0f} | {sb3_time / ours_time:.2f}x |"
            )
    plot(results, pairs, normalised)
    lines += [
        "",
        "Plots: " + ", ".join(f"[{path.name}]({path.name})" for path in sorted(results.glob("*.png"))),
    ]
    report = results / "report.md"
    report.write_text("\n".join(lines) + "\n")
    return report


def plot(
    results: Path, pairs: dict[tuple[str, str], list[dict]], normalised: dict[str, list[list[float]]]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for env in sorted({env for _, env in pairs}):
        figure, axes = plt.subplots(figsize=(6, 4))
        for (algorithm, pair_env), group in sorted(pairs.items()):
            if pair_env != env:
                continue
            frames = sorted({frame for run in group for frame, _ in run["curve"]})
            means, lows, highs = [], [], []
            for frame in frames:
                values = [value for run in group for at, value in run["curve"] if at == frame]
                means.append(statistics.fmean(values))
                low, high = bootstrap_interval([values], statistics.fmean, samples=500)
                lows.append(low)
                highs.append(high)
            axes.plot(frames, means, label=f"{algorithm} ({len(group)} seed{'s' if len(group) > 1 else ''})")
            axes.fill_between(frames, lows, highs, alpha=0.25)
        axes.set_xlabel("frames")
        axes.set_ylabel("evaluation return")
        axes.set_title(env)
        axes.legend()
        figure.tight_layout()
        figure.savefig(results / f"curves_{re.sub(r'[^A-Za-z0-9_.=-]+', '_', env)}.png", dpi=100)
        plt.close(figure)
    if normalised:
        figure, axes = plt.subplots(figsize=(6, 1 + 0.5 * len(normalised)))
        for row, (algorithm, groups) in enumerate(sorted(normalised.items())):
            flat = [value for group in groups for value in group]
            low, high = bootstrap_interval(groups, interquartile_mean)
            axes.plot([low, high], [row, row], linewidth=6, alpha=0.5)
            axes.plot([interquartile_mean(flat)], [row], "k|", markersize=14)
        axes.set_yticks(range(len(normalised)), sorted(normalised))
        axes.set_xlabel("IQM of reference-normalised score (1 = the reference)")
        figure.tight_layout()
        figure.savefig(results / "aggregate.png", dpi=100)
        plt.close(figure)


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
    args.results.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        for algorithm in args.algos:
            if not (ROOT / "recipes" / f"{algorithm}.py").exists():
                parser.error(f"no recipe {algorithm!r} (recipes/{algorithm}.py)")
        jobs = make_jobs(args.algos, args.envs, args.seeds, args.with_sb3)
        pending = [job for job in jobs if not finished(job, args.results)]
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
        runner = RayRunner(args.ray_address) if args.ray_address else Runner(args.jobs)
        runner.run_all(pending, args.results, args.frames, args.checkpoint_every)
        if runner.stopping:
            print("stopped; run the same command again to continue", flush=True)
    if not any((args.results / "records").glob("*/*/seed*.json")):
        print("no finished runs yet")
    elif args.report_only:
        print(f"report: {write_report(args.results)}")
    else:
        # in a fresh process: the recipes and presets as they are now, not as they were when a long suite started
        report = [sys.executable, "-m", "benchmarks.suite", "--report-only", "--results", str(args.results)]
        subprocess.run(report, cwd=ROOT, check=True)


if __name__ == "__main__":
    main()
