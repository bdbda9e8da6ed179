"""PPO on CartPole-v1: this toolkit against Stable-Baselines3, one after the other on the same machine.

Three runs per seed, each in a fresh process:

* ``sb3``: Stable-Baselines3 PPO with RL Zoo's CartPole-v1 hyperparameters (8 envs, n_steps 32, batch 256,
  20 epochs, gae_lambda 0.8, gamma 0.98, learning rate and clip range linearly annealed from 1e-3 and 0.2,
  ent_coef 0, 100k steps), then 20 deterministic evaluation episodes.
* ``ours-zoo``: ``recipes.ppo`` with the same hyperparameters and budget (no early stop): raw throughput.
* ``ours``: ``recipes.ppo`` with its defaults, stopping once the deterministic evaluation reaches 475.

The headline ratio is SB3's wall-clock time over the time our default run takes to reach 475.

    pip install -e ".[bench]"      # or: make bench
    python -m benchmarks.ppo_vs_sb3 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

TOTAL_FRAMES = 100_000


def run_sb3(seed: int) -> dict:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    def linear(start: float):
        return lambda progress_remaining: progress_remaining * start

    start = time.perf_counter()
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gae_lambda=0.8,
        gamma=0.98,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        ent_coef=0.0,
        seed=seed,
        verbose=0,
        device="cpu",
    )
    model.learn(total_timesteps=TOTAL_FRAMES)
    train_time = time.perf_counter() - start
    returns = []
    eval_env = gym.make("CartPole-v1")
    for episode in range(20):
        observation, _ = eval_env.reset(seed=1_000_000 + seed + episode)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(observation, deterministic=True)
            observation, reward, terminated, truncated, _ = eval_env.step(action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    return {
        "wall_time_s": train_time,
        "frames": TOTAL_FRAMES,
        "fps": TOTAL_FRAMES / train_time,
        "eval_return_mean": float(np.mean(returns)),
        "time_to_475_s": None,
    }


def run_ours(seed: int, zoo: bool) -> dict:
    from recipes.common import RunConfig
    from recipes.ppo import CollectorConfig, LossConfig, OptimConfig, PPOConfig, main

    output_dir = f"runs/bench-ppo-{'zoo' if zoo else 'default'}-{seed}"
    if zoo:
        config = PPOConfig(
            run=RunConfig(
                num_envs=8,
                total_frames=TOTAL_FRAMES,
                eval_every=TOTAL_FRAMES,
                seed=seed,
                stop_at_return=float("inf"),
            ),
            collector=CollectorConfig(steps_per_env=32),
            loss=LossConfig(gamma=0.98, gae_lambda=0.8, clip_epsilon=0.2, entropy_coef=0.0),
            optim=OptimConfig(lr=1e-3, num_epochs=20, minibatch_size=256),
        )
    else:
        config = PPOConfig()
        config.run.seed = seed
    config.run.output_dir, config.run.logger, config.run.video, config.run.progress = (
        output_dir,
        "none",
        False,
        False,
    )
    summary = main(config)
    return {
        "wall_time_s": summary["wall_time_s"],
        "frames": summary["frames"],
        "fps": summary["fps"],
        "eval_return_mean": summary["eval_return_mean"],
        "time_to_475_s": summary["solved_at_s"],
    }


def run_side(side: str, seed: int) -> dict:
    """Run one side in a fresh interpreter so imports and thread pools do not leak between runs."""
    command = [sys.executable, "-m", "benchmarks.ppo_vs_sb3", "--child", side, "--seeds", str(seed)]
    result = subprocess.run(
        command, check=False, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    if result.returncode != 0:
        raise RuntimeError(f"{side} seed {seed} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument(
        "--sides", nargs="+", default=["sb3", "ours-zoo", "ours"], choices=["sb3", "ours-zoo", "ours"]
    )
    parser.add_argument("--child", choices=["sb3", "ours-zoo", "ours"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        warnings.filterwarnings("ignore")
        seed = args.seeds[0]
        result = run_sb3(seed) if args.child == "sb3" else run_ours(seed, zoo=args.child == "ours-zoo")
        print(json.dumps(result))
        return

    results: dict[str, list[dict]] = {side: [] for side in args.sides}
    for seed in args.seeds:
        for side in args.sides:
            results[side].append(run_side(side, seed))
            row = results[side][-1]
            print(
                f"seed {seed} {side:9s} wall {row['wall_time_s']:6.1f} s  fps {row['fps']:7.0f}  "
                f"return {row['eval_return_mean']:6.1f}  time to 475: {row['time_to_475_s']}",
                flush=True,
            )

    print("\n| run | wall-clock s | frames/s | final return (20 det. episodes) | time to reach 475 s |")
    print("|---|---|---|---|---|")
    for side, rows in results.items():
        solved = [r["time_to_475_s"] for r in rows if r["time_to_475_s"] is not None]
        print(
            f"| {side} | {statistics.mean(r['wall_time_s'] for r in rows):.1f} | "
            f"{statistics.mean(r['fps'] for r in rows):.0f} | "
            f"{statistics.mean(r['eval_return_mean'] for r in rows):.1f} | "
            f"{f'{statistics.mean(solved):.1f} ({len(solved)}/{len(rows)} seeds)' if solved else 'n/a'} |"
        )
    if "sb3" in results and "ours" in results:
        sb3_time = statistics.mean(r["wall_time_s"] for r in results["sb3"])
        ours = [r["time_to_475_s"] or r["wall_time_s"] for r in results["ours"]]
        print(f"\nSB3 wall-clock / our time to 475: {sb3_time / statistics.mean(ours):.1f}x")
    if "sb3" in results and "ours-zoo" in results:
        ratio = statistics.mean(r["fps"] for r in results["ours-zoo"]) / statistics.mean(
            r["fps"] for r in results["sb3"]
        )
        print(f"same hyperparameters, frames/s ours / SB3: {ratio:.2f}x")


if __name__ == "__main__":
    main()
