"""Soak test: train for a long time in one process with periodic checkpoints and resumes, and report resident memory.

Runs a recipe again and again (fresh seed each cycle, ``--checkpoint-every`` on, outputs overwritten, each cycle
reloading the agent it saved), sampling the process's resident set size (RSS) every ``--sample-every-s`` seconds,
until ``--minutes`` have passed. Each cycle is cut into legs: after ``--leg-s`` seconds a SIGTERM stops the run
(it saves ``resume.ckpt`` and returns) and the next leg continues it with ``--resume``, until the cycle's budget
is spent. Memory that grows cycle after cycle is a leak (envs, collectors, loggers, buffers or restored states
kept alive); flat memory after the first cycles is the expectation. Not part of ``make test``.

    python -m benchmarks.soak                              # PPO on CartPole-v1, 30 minutes
    python -m benchmarks.soak --recipe dqn --minutes 5 --out soak.csv

Prints one line per cycle and a summary: RSS at the end of the first cycle, at the end, the largest, and the
growth per cycle fitted over the second half of the cycles (least squares).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.common import whole_number

RECIPES = {
    "ppo": ("recipes.ppo", "PPOConfig", 100_000),
    "dqn": ("recipes.dqn", "DQNConfig", 50_000),
    "sac": ("recipes.sac", "SACConfig", 5_000),
}


def resident_mb() -> float:
    """Resident set size of this process in MiB (Linux ``/proc/self/statm``)."""
    pages = int(Path("/proc/self/statm").read_text().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


class MemorySampler(threading.Thread):
    """Samples :func:`resident_mb` every ``interval_s`` seconds into ``samples`` as ``(elapsed_s, cycle, mb)``."""

    def __init__(self, interval_s: float):
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.samples: list[tuple[float, int, float]] = []
        self.cycle = 0
        self.start_time = time.perf_counter()
        self._stop = threading.Event()

    def run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.samples.append((time.perf_counter() - self.start_time, self.cycle, resident_mb()))

    def stop(self) -> None:
        self._stop.set()


def slope(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``y`` against ``x``."""
    if len(points) < 2:
        return 0.0
    mean_x = sum(x for x, _ in points) / len(points)
    mean_y = sum(y for _, y in points) / len(points)
    denominator = sum((x - mean_x) ** 2 for x, _ in points)
    return sum((x - mean_x) * (y - mean_y) for x, y in points) / denominator if denominator else 0.0


def run_in_legs(module, config, leg_s: float) -> tuple[dict, int]:
    """Run ``config``, stopping it with SIGTERM every ``leg_s`` seconds and resuming it, until it ends; returns
    the last leg's summary and the number of legs."""
    legs = 0
    while True:
        timer = threading.Timer(leg_s, os.kill, (os.getpid(), signal.SIGTERM))
        timer.start()
        try:
            summary = module.main(config)
        finally:
            timer.cancel()
        legs += 1
        if summary["interrupted_by"] is None:
            return summary, legs
        config.run.resume = config.run.output_dir


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", choices=sorted(RECIPES), default="ppo")
    parser.add_argument("--env-id", default=None, help="default: the recipe's")
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument(
        "--frames-per-cycle", type=whole_number, default=None, help="default: a recipe-specific budget"
    )
    parser.add_argument("--checkpoint-every", type=whole_number, default=5_000)
    parser.add_argument(
        "--leg-s",
        type=float,
        default=15.0,
        help="seconds between the SIGTERM that stops a run and its resume",
    )
    parser.add_argument("--sample-every-s", type=float, default=5.0)
    parser.add_argument("--out", default=None, help="CSV of the samples (elapsed_s, cycle, rss_mb)")
    args = parser.parse_args()

    from agents import Agent
    from training import quiet

    module_name, config_name, default_frames = RECIPES[args.recipe]
    module = importlib.import_module(module_name)
    # a SIGTERM that lands outside a run (between legs) is ignored; inside one, the run's handler takes it
    signal.signal(signal.SIGTERM, lambda number, frame: None)
    sampler = MemorySampler(args.sample_every_s)
    sampler.start()
    cycle_end_mb: list[float] = []
    deadline = time.perf_counter() + 60 * args.minutes
    with tempfile.TemporaryDirectory(prefix="soak-") as directory:
        while time.perf_counter() < deadline:
            config = getattr(module, config_name)()
            run = config.run
            quiet(config, Path(directory), logger="csv", overwrite=True)  # each cycle replaces the last
            run.seed, run.total_frames = sampler.cycle, args.frames_per_cycle or default_frames
            run.checkpoint_every, run.stop_at_return = args.checkpoint_every, float("inf")
            if args.env_id:
                run.env_id = args.env_id
            summary, legs = run_in_legs(module, config, args.leg_s)
            Agent.load(Path(directory) / "agent.ckpt").evaluate(episodes=2, seed=0)
            cycle_end_mb.append(resident_mb())
            print(
                f"cycle {sampler.cycle}: {summary['frames']} frames in {summary['wall_time_s']:.0f} s "
                f"({legs} legs), "
                f"return {summary['eval_return_mean']:.1f}, RSS {cycle_end_mb[-1]:.0f} MiB",
                flush=True,
            )
            sampler.cycle += 1
    sampler.stop()
    if args.out:
        with open(args.out, "w", newline="") as file:
            writer = csv.writer(file)
            writer.writerow(["elapsed_s", "cycle", "rss_mb"])
            writer.writerows(sampler.samples)
    half = cycle_end_mb[len(cycle_end_mb) // 2 :]
    growth = slope(list(enumerate(half)))
    peak = max([mb for _, _, mb in sampler.samples] + cycle_end_mb)
    print(
        f"{len(cycle_end_mb)} cycles in {args.minutes:g} min: RSS after cycle 0 {cycle_end_mb[0]:.0f} MiB, "
        f"at the end {cycle_end_mb[-1]:.0f} MiB, peak {peak:.0f} MiB; growth over the second half "
        f"{growth:+.2f} MiB per cycle"
    )


if __name__ == "__main__":
    main()
