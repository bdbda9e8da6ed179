"""PPO on gradient workers against one process, on this machine: frames per second, time to the target, where a
step's time goes, and the scaling model's prediction checked against the measurement.

Sides, each a fresh ``python -m recipes.ppo`` process, one after the other:

* ``single``: one process collects and learns (``--collector-backend single``).
* ``sync-1``: one Ray gradient worker, this process the learner (``--gradient-workers 1 --collector-backend ray``).
* ``sync-2``: two synchronous gradient workers.
* ``async-2``: two asynchronous gradient workers (``--async``).

The setting is CPU-heavy on purpose (CartPole-v1, 512x512 networks, 64 envs x 64 steps, 4 epochs of two
2048-sample minibatches, the preset's learning rate and schedules): each gradient step is tens of milliseconds of
arithmetic, against the milliseconds a Ray round trip costs. Every side runs the whole budget (no early stop); the
time to the target is that of the first evaluation at or above it.

    pip install -e ".[ray]"
    python -m benchmarks.gradient_workers --seeds 0 1
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import time_to_return

SIDES = {
    "single": [],
    "sync-1": ["--gradient-workers", "1", "--collector-backend", "ray"],
    "sync-2": ["--gradient-workers", "2", "--collector-backend", "ray"],
    "async-2": ["--gradient-workers", "2", "--collector-backend", "ray", "--async"],
}
SETTING = [
    "--env-id", "CartPole-v1",
    "--hidden-sizes", "512", "512",
    "--num-envs", "64",
    "--steps-per-env", "64",
    "--num-epochs", "4",
    "--minibatch-size", "2048",
    "--total-frames", "98304",
    "--eval-every", "16384",
    "--stop-at-return", "inf",
]  # fmt: skip
TARGET = 475.0
TIMES = ("worker_collect_s", "worker_gradient_s", "learner_apply_s", "learner_weights_s", "learner_wait_s")


def run_side(side: str, seed: int, output_root: Path) -> dict:
    """Run one side in a fresh process; its summary, time to the target and mean step-time breakdown."""
    output_dir = output_root / f"{side}-{seed}"
    command = [sys.executable, "-m", "recipes.ppo", *SETTING, *SIDES[side], "--seed", str(seed)]
    command += [
        "--output-dir",
        str(output_dir),
        "--overwrite",
        "--logger",
        "csv",
        "--no-video",
        "--no-progress",
    ]
    result = subprocess.run(
        command, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    if result.returncode != 0:
        raise RuntimeError(f"{side} seed {seed} failed:\n{result.stderr[-3000:]}")
    summary = json.loads((output_dir / "summary.json").read_text())
    with open(output_dir / "evaluations.csv") as file:
        evaluations = list(csv.DictReader(file))
    first, last = (
        evaluations[0],
        evaluations[-1],
    )  # between them: no start-up (Ray, the workers' imports and envs)
    row = {
        "wall_time_s": summary["wall_time_s"],
        "fps": summary["fps"],
        "steady_fps": (int(last["frames"]) - int(first["frames"]))
        / (float(last["wall_time_s"]) - float(first["wall_time_s"])),
        "eval_return_mean": summary["eval_return_mean"],
        "time_to_target_s": time_to_return(str(output_dir), TARGET),
    }
    for name in TIMES:
        path = output_dir / "csv" / "scalars" / "time" / f"{name}.csv"
        if path.exists():
            with open(path) as file:
                # the median over batches: the first one also waits for the workers to start
                row[name] = statistics.median(float(line[-1]) for line in csv.reader(file))
    return row


def predict_sync(measured: dict, workers: int, cores: int) -> float:
    """The scaling model: the seconds of one synchronous step on ``workers`` workers, from a one-worker run.

    A step is the workers' collection and gradient (the work is split evenly over N workers that run on
    min(N, cores) cores, the learner mostly waiting: the one-worker time / min(N, cores)), plus the round trip (the
    one-worker wait minus its compute: requests, weights in, gradients out), plus the learner's update and weight
    publication, which do not shrink with N.
    """
    compute = measured["worker_collect_s"] + measured["worker_gradient_s"]
    round_trip = max(0.0, measured["learner_wait_s"] - compute)
    return (
        compute / min(workers, cores)
        + round_trip
        + measured["learner_apply_s"]
        + measured["learner_weights_s"]
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--sides", nargs="+", default=list(SIDES), choices=list(SIDES))
    parser.add_argument("--output-root", type=Path, default=Path("runs/bench-gradient-workers"))
    args = parser.parse_args()
    results: dict[str, list[dict]] = {side: [] for side in args.sides}
    for seed in args.seeds:
        for side in args.sides:
            row = run_side(side, seed, args.output_root)
            results[side].append(row)
            print(
                f"seed {seed} {side:8s} wall {row['wall_time_s']:6.1f} s  fps {row['fps']:7.0f} "
                f"(after the first evaluation {row['steady_fps']:7.0f})  "
                f"return {row['eval_return_mean']:6.1f}  time to {TARGET:.0f}: {row['time_to_target_s']}",
                flush=True,
            )

    print(f"\n| run | wall-clock s | frames/s | frames/s after the first evaluation | final return | time to "
          f"{TARGET:.0f} s | step time (ms): worker collect + gradient, learner wait, apply, weights |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for side, rows in results.items():
        solved = [r["time_to_target_s"] for r in rows if r["time_to_target_s"] is not None]
        times = ""
        if "learner_wait_s" in rows[0]:
            mean = {name: 1000 * statistics.mean(r[name] for r in rows) for name in TIMES}
            times = (
                f"{mean['worker_collect_s']:.1f} + {mean['worker_gradient_s']:.1f}, {mean['learner_wait_s']:.1f}, "
                f"{mean['learner_apply_s']:.1f}, {mean['learner_weights_s']:.1f}"
            )
        print(
            f"| {side} | {statistics.mean(r['wall_time_s'] for r in rows):.1f} | "
            f"{statistics.mean(r['fps'] for r in rows):.0f} | {statistics.mean(r['steady_fps'] for r in rows):.0f} | "
            f"{statistics.mean(r['eval_return_mean'] for r in rows):.1f} | "
            f"{f'{statistics.mean(solved):.1f} ({len(solved)}/{len(rows)} seeds)' if solved else 'n/a'} | {times} |"
        )
    if "sync-1" in results and "sync-2" in results:
        one = {name: statistics.mean(r[name] for r in results["sync-1"]) for name in TIMES}
        cores = os.cpu_count() or 1
        for workers in (1, 2):
            measured = statistics.mean(r["learner_wait_s"] + r["learner_apply_s"] + r["learner_weights_s"]
                                       for r in results[f"sync-{workers}"])  # fmt: skip
            print(
                f"model, {workers} sync worker(s) on {cores} cores: {1000 * predict_sync(one, workers, cores):.1f} "
                f"ms a step predicted, {1000 * measured:.1f} ms measured"
            )


if __name__ == "__main__":
    main()
