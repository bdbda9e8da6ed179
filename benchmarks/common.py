"""Shared plumbing of the benchmarks against Stable-Baselines3: fresh-process runs, SB3 evaluation, the table."""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import warnings
from collections.abc import Callable
from typing import Any

SIDES = [
    "sb3",
    "ours-zoo",
    "ours",
    "ours-zoo-compiled",
    "ours-zoo-bf16",
    "ours-zoo-ieee",
    "ours-zoo-mkl",
    "ours-zoo-onednn",
    "ours-zoo-1t",
    "sb3-1t",
]
# ours-zoo-compiled: ours-zoo with --compile; ours-zoo-bf16: with --matmul-precision medium; ours-zoo-ieee: with
# --no-flush-denormal; ours-zoo-mkl: with --linear-kernels torch (torch's default float32 products, MKL's on x86);
# ours-zoo-onednn: with --linear-kernels onednn; ours-zoo-1t and sb3-1t: ours-zoo and sb3 on one torch thread
# instead of torch's default (the last six only when asked for)
DEFAULT_SIDES = SIDES[:4]
EVAL_SEED_OFFSET = (
    1_000_000  # training.evaluation.EVAL_SEED_OFFSET (not imported: the SB3 side runs without torchrl)
)


def whole_number(text: str) -> int:
    """An argparse ``type`` for counts written as RL writes budgets: ``100000``, ``1e5``, ``2.5e5``."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (e.g. 100000 or 1e5)")
    return int(value)


def evaluate_sb3(
    model: Any,
    env_id: str,
    seed: int,
    episodes: int = 20,
    normalize_obs: Callable[[Any], Any] | None = None,
) -> float:
    """Mean return of ``episodes`` deterministic episodes, seeded like our recipes' evaluations; observations go
    through ``normalize_obs`` first when given (a frozen ``VecNormalize``'s ``normalize_obs``)."""
    import gymnasium as gym

    env = gym.make(env_id)
    returns = []
    for episode in range(episodes):
        observation, _ = env.reset(seed=EVAL_SEED_OFFSET + seed + episode)
        done, total = False, 0.0
        while not done:
            policy_input = observation if normalize_obs is None else normalize_obs(observation)
            action, _ = model.predict(policy_input, deterministic=True)
            observation, reward, terminated, truncated, _ = env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(statistics.mean(returns))


def sb3_row(train_time_s: float, frames: int, eval_return_mean: float) -> dict[str, Any]:
    """The benchmark's row of a Stable-Baselines3 run (it has no evaluation during training)."""
    return {
        "wall_time_s": train_time_s,
        "frames": frames,
        "fps": frames / train_time_s,
        "eval_return_mean": eval_return_mean,
        "time_to_target_s": None,
    }


def summary_row(summary: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's view of a recipe's run summary: its wall-clock without the time its evaluations took (as
    SB3's side, which evaluates after training), and the time to the target with them (an early stop needs them)."""
    train_time_s = summary["wall_time_s"] - summary.get("eval_time_s", 0.0)
    return {
        "wall_time_s": train_time_s,
        "frames": summary["frames"],
        "fps": summary["frames"] / max(train_time_s, 1e-9),
        "eval_return_mean": summary["eval_return_mean"],
        "time_to_target_s": summary["solved_at_s"],
    }


def side_kernels(side: str) -> str:
    """The ``--linear-kernels`` of one of our sides: its name's ``-mkl`` or ``-onednn`` ending, else ``auto``."""
    for ending, kernels in (("-mkl", "torch"), ("-onednn", "onednn")):
        if side.endswith(ending):
            return kernels
    return "auto"


def side_options(side: str) -> dict[str, Any]:
    """The run options that set one of our sides apart (``run_ours(seed, zoo, **side_options(side))``)."""
    options = {
        "compile": side == "ours-zoo-compiled",
        "matmul_precision": "medium" if side == "ours-zoo-bf16" else "highest",
        "flush_denormal": side != "ours-zoo-ieee",
        "linear_kernels": side_kernels(side),
    }
    return options | ({"threads": 1} if side.endswith("-1t") else {})


def output_suffix(
    compile: bool = False,
    matmul_precision: str = "highest",
    flush_denormal: bool = True,
    linear_kernels: str = "auto",
    threads: int | None = None,
) -> str:
    """What a side's run options add to its output folder's name, so that each side keeps its own run."""
    return (
        f"{'-compiled' if compile else ''}{'-bf16' if matmul_precision == 'medium' else ''}"
        f"{'' if flush_denormal else '-ieee'}{'' if linear_kernels == 'auto' else '-' + linear_kernels}"
        f"{'' if threads is None else f'-{threads}t'}"
    )


def run_ours_off_policy(
    algorithm: str,
    env_id: str,
    seed: int,
    zoo: bool,
    *,
    total_frames: int,
    learning_starts: int,
    hidden_sizes: tuple[int, ...],
    eval_episodes: int,
    **run_options: Any,
) -> dict[str, Any]:
    """One run of ``recipes.sac`` or ``recipes.td3`` on ``env_id`` for a same-settings benchmark, torch's default
    threads (as SB3's) and no early stop. ``zoo``: the recipe's defaults with no preset, one step then one
    gradient step, ``learning_starts`` random frames and ``hidden_sizes``; otherwise: the env's preset."""
    from recipes import sac, td3
    from training import RunConfig, quiet

    recipe, config_class = {"sac": (sac, sac.SACConfig), "td3": (td3, td3.TD3Config)}[algorithm]
    run = RunConfig(
        env_id=env_id,
        num_envs=1,
        total_frames=total_frames,
        eval_every=total_frames,
        eval_episodes=eval_episodes,
        seed=seed,
        stop_at_return=float("inf"),
        threads=0,
    )
    config = config_class(run=run)
    if zoo:
        run.preset = "none"
        config.collector.steps_per_env, config.collector.learning_starts = 1, learning_starts
        config.network.hidden_sizes = hidden_sizes
    name = env_id.split("-")[0].lower()
    output_dir = (
        f"runs/bench-{algorithm}-{name}-{'zoo' if zoo else 'default'}{output_suffix(**run_options)}-{seed}"
    )
    # each benchmark run replaces the last one of its side and seed
    quiet(config, output_dir, overwrite=True, **run_options)
    return summary_row(recipe.main(config))


def time_to_return(output_dir: str, target: float) -> float | None:
    """Wall-clock seconds at the first evaluation of a run whose mean return reached ``target`` (None if none did),
    read from the run's evaluations.csv: the time to a target of a run that went on to spend its whole budget."""
    with open(os.path.join(output_dir, "evaluations.csv")) as file:
        for row in csv.DictReader(file):
            if float(row["return_mean"]) >= target:
                return float(row["wall_time_s"])
    return None


def run_side(module: str, side: str, seed: int) -> dict[str, Any]:
    """Run one side in a fresh interpreter so imports and thread pools do not leak between runs."""
    command = [sys.executable, "-m", module, "--child", side, "--seeds", str(seed)]
    result = subprocess.run(
        command, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    if result.returncode != 0:
        raise RuntimeError(f"{side} seed {seed} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def compare(module: str, sides: list[str], seeds: list[int], target: str = "475") -> None:
    """Run every side for every seed and print a Markdown table and the headline ratios (``target``: the return
    the headline time is measured to, as printed)."""
    results: dict[str, list[dict]] = {side: [] for side in sides}
    for seed in seeds:
        for side in sides:
            results[side].append(run_side(module, side, seed))
            row = results[side][-1]
            print(
                f"seed {seed} {side:9s} wall {row['wall_time_s']:6.1f} s  fps {row['fps']:7.0f}  "
                f"return {row['eval_return_mean']:6.1f}  time to {target}: {row['time_to_target_s']}",
                flush=True,
            )

    print(
        f"\n| run | wall-clock s | frames/s | final return (deterministic evaluation, mean) | time to reach {target} s |"
    )
    print("|---|---|---|---|---|")
    for side, rows in results.items():
        solved = [r["time_to_target_s"] for r in rows if r["time_to_target_s"] is not None]
        print(
            f"| {side} | {statistics.mean(r['wall_time_s'] for r in rows):.1f} | "
            f"{statistics.mean(r['fps'] for r in rows):.0f} | "
            f"{statistics.mean(r['eval_return_mean'] for r in rows):.1f} | "
            f"{f'{statistics.mean(solved):.1f} ({len(solved)}/{len(rows)} seeds)' if solved else 'n/a'} |"
        )
    if "sb3" in results and "ours" in results:
        sb3_time = statistics.mean(r["wall_time_s"] for r in results["sb3"])
        ours = [r["time_to_target_s"] or r["wall_time_s"] for r in results["ours"]]
        print(f"\nSB3 wall-clock / our time to {target}: {sb3_time / statistics.mean(ours):.1f}x")
    for side, label in (
        ("ours-zoo", ""),
        ("ours-zoo-compiled", ", --compile"),
        ("ours-zoo-bf16", ", --matmul-precision medium"),
        ("ours-zoo-ieee", ", --no-flush-denormal"),
        ("ours-zoo-mkl", ", --linear-kernels torch"),
        ("ours-zoo-onednn", ", --linear-kernels onednn"),
        ("ours-zoo-1t", ", ours on one thread, SB3 on torch's default"),
    ):
        if "sb3" in results and side in results:
            ratio = statistics.mean(r["fps"] for r in results[side]) / statistics.mean(
                r["fps"] for r in results["sb3"]
            )
            print(f"same hyperparameters{label}, frames/s ours / SB3: {ratio:.2f}x")
    if "sb3-1t" in results and "ours-zoo-1t" in results:
        ratio = statistics.mean(r["fps"] for r in results["ours-zoo-1t"]) / statistics.mean(
            r["fps"] for r in results["sb3-1t"]
        )
        print(f"same hyperparameters, both on one thread, frames/s ours / SB3: {ratio:.2f}x")


def benchmark_cli(
    module: str,
    description: str,
    run_sb3: Callable[[int], dict[str, Any]],
    run_ours: Callable[[int, bool], dict[str, Any]],
    target: str = "475",
    extra_sides: dict[str, Callable[[int], dict[str, Any]]] | None = None,
) -> None:
    """Command line of a benchmark: compare the chosen sides, or (``--child``) run one side and print its row.
    ``extra_sides`` are further sides of this benchmark (run only when ``--sides`` names them)."""
    extra_sides = extra_sides or {}
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--sides", nargs="+", default=DEFAULT_SIDES, choices=SIDES + list(extra_sides))
    parser.add_argument("--child", choices=SIDES + list(extra_sides), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        warnings.filterwarnings("ignore")
        seed = args.seeds[0]
        if args.child in extra_sides:
            result = extra_sides[args.child](seed)
        elif args.child in ("sb3", "sb3-1t"):
            if args.child == "sb3-1t":
                import torch

                torch.set_num_threads(1)
            result = run_sb3(seed)
        else:
            result = run_ours(seed, args.child != "ours", **side_options(args.child))
        print(json.dumps(result))
        return
    compare(module, args.sides, args.seeds, target)
