"""One Stable-Baselines3 run with RL Zoo's settings, written as a recipe's run folder, for the suite's ``--with-sb3``.

    python -m benchmarks.sb3_runner --algo sac --env Hopper-v5 --seed 0 --frames 100000 \
        --eval-every 25000 --eval-episodes 10 --output-dir DIR

The model trains with RL Zoo's hyperparameters for the pair (``ZOO_SETTINGS``: RL Zoo's ``hyperparams/ALGO.yml``,
which for these pairs are Stable-Baselines3's defaults with the changes listed) and is evaluated every
``--eval-every`` frames on ``--eval-episodes`` deterministic episodes seeded as the recipes' evaluations are
(``EVAL_SEED_OFFSET + seed + episode``). The folder gets what the suite reads from a recipe's run: summary.json,
evaluations.csv and config.json. Requires the bench extra (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import EVAL_SEED_OFFSET

MUJOCO = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]
# RL Zoo's settings for MuJoCo (hyperparams/{sac,td3,ddpg}.yml, the v4 entries): SB3's defaults, 10k random steps;
# TD3 and DDPG with Gaussian action noise 0.1 (of the [-1, 1] action range).
ZOO_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    **{("sac", env): {"learning_starts": 10_000} for env in MUJOCO},
    **{("td3", env): {"learning_starts": 10_000, "noise_std": 0.1} for env in MUJOCO},
    **{("ddpg", env): {"learning_starts": 10_000, "noise_std": 0.1} for env in MUJOCO},
}


def evaluate(model: Any, env_id: str, seed: int, episodes: int) -> tuple[list[float], list[int]]:
    import gymnasium as gym

    env = gym.make(env_id)
    returns, lengths = [], []
    for episode in range(episodes):
        observation, _ = env.reset(seed=EVAL_SEED_OFFSET + seed + episode)
        done, total, length = False, 0.0, 0
        while not done:
            action, _ = model.predict(observation, deterministic=True)
            observation, reward, terminated, truncated, _ = env.step(action)
            total, length = total + float(reward), length + 1
            done = terminated or truncated
        returns.append(total)
        lengths.append(length)
    env.close()
    return returns, lengths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algo", required=True)
    parser.add_argument("--env", required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=int, required=True)
    parser.add_argument("--eval-every", type=int, required=True)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--output-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    settings = ZOO_SETTINGS.get((args.algo, args.env))
    if settings is None:
        print(
            f"error: no RL Zoo settings for {args.algo} on {args.env} in benchmarks/sb3_runner.py",
            file=sys.stderr,
        )
        raise SystemExit(2)
    import numpy as np
    import stable_baselines3
    from stable_baselines3.common.noise import NormalActionNoise

    options = dict(settings)
    noise_std = options.pop("noise_std", None)
    model_class = getattr(stable_baselines3, args.algo.upper())
    model = model_class("MlpPolicy", args.env, seed=args.seed, verbose=0, device="cpu", **options)
    if noise_std is not None:
        dimensions = model.action_space.shape[0]
        model.action_noise = NormalActionNoise(np.zeros(dimensions), noise_std * np.ones(dimensions))
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows, start, frames = [], time.perf_counter(), 0
    while frames < args.frames:
        chunk = min(args.eval_every, args.frames - frames)
        model.learn(total_timesteps=chunk, reset_num_timesteps=False)
        frames += chunk
        returns, lengths = evaluate(model, args.env, args.seed, args.eval_episodes)
        rows.append({"frames": frames, "wall_time_s": time.perf_counter() - start,
                     "return_mean": statistics.fmean(returns), "return_std": statistics.pstdev(returns),
                     "length_mean": statistics.fmean(lengths)})  # fmt: skip
    wall_time = time.perf_counter() - start
    with open(args.output_dir / "evaluations.csv", "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    summary = {"algorithm": f"sb3-{args.algo}", "env_id": args.env, "seed": args.seed, "frames": frames,
               "wall_time_s": wall_time, "fps": frames / wall_time, "eval_return_mean": rows[-1]["return_mean"],
               "eval_return_std": rows[-1]["return_std"], "stable_baselines3": stable_baselines3.__version__}  # fmt: skip
    (args.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    config = {"run": {"env_id": args.env, "env_kwargs": [], "preset_applied": {"name": "RL Zoo (SB3)"}},
              "settings": settings}  # fmt: skip
    (args.output_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
