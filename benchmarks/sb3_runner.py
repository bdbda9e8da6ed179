"""One Stable-Baselines3 run with RL Zoo's settings, written as a recipe's run folder, for the suite's ``--with-sb3``.

    python -m benchmarks.sb3_runner --algo sac --env Hopper-v5 --seed 0 --frames 100000 \
        --eval-every 25000 --eval-episodes 10 --output-dir DIR
    python -m benchmarks.sb3_runner --algo ppo --env LunarLander-v3 --env-kwargs continuous=true ...

The model trains with RL Zoo's hyperparameters for the pair (``ZOO_SETTINGS``: RL Zoo's ``hyperparams/ALGO.yml``,
Stable-Baselines3's defaults with the changes listed), in one ``learn`` call over the whole budget (so that linear
schedules span it), and is evaluated every ``--eval-every`` frames and at the end on ``--eval-episodes``
deterministic episodes seeded as the recipes' evaluations are (``EVAL_SEED_OFFSET + seed + episode``; with RL Zoo's
``normalize``, through the training VecNormalize's statistics). The folder gets what the suite reads from a recipe's run: summary.json,
evaluations.csv and config.json. Requires the bench extra (``pip install -e ".[bench]"``).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import EVAL_SEED_OFFSET, whole_number

MUJOCO = ["HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5"]
LUNAR_CONTINUOUS = "LunarLander-v3 continuous=true"
# RL Zoo's MuJoCo PPO settings (hyperparams/ppo.yml, the v4 entries), besides normalize: true
ZOO_MUJOCO_NETWORK = {"log_std_init": -2, "ortho_init": False, "activation_fn": "relu",
                      "net_arch": {"pi": [256, 256], "vf": [256, 256]}}  # fmt: skip
PPO_LUNAR = {"n_envs": 16, "n_steps": 1024, "batch_size": 64, "gae_lambda": 0.98, "gamma": 0.999, "n_epochs": 4,
             "ent_coef": 0.01}  # fmt: skip
DQN_LUNAR = {"learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000, "learning_starts": 0,
             "gamma": 0.99, "target_update_interval": 250, "train_freq": 4, "gradient_steps": -1,
             "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
             "policy_kwargs": {"net_arch": [256, 256]}}  # fmt: skip
# RL Zoo's settings per (algorithm, env as the suite names it), from its hyperparams/ALGO.yml (MuJoCo: the v4
# entries; LunarLander with continuous=true: LunarLanderContinuous). Keys are Stable-Baselines3's constructor
# arguments, plus "n_envs", "normalize" (VecNormalize of observations and rewards, discounted with the algorithm's
# gamma, as RL Zoo does) and "noise_std" (Gaussian action noise); ("lin", x) is a rate decayed linearly from x to 0.
ZOO_SETTINGS: dict[tuple[str, str], dict[str, Any]] = {
    **{("sac", env): {"learning_starts": 10_000} for env in MUJOCO},
    **{("td3", env): {"learning_starts": 10_000, "noise_std": 0.1} for env in MUJOCO},
    **{("ddpg", env): {"learning_starts": 10_000, "noise_std": 0.1} for env in MUJOCO},
    ("ppo", "CartPole-v1"): {
        "n_envs": 8,
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": ("lin", 1e-3),
        "clip_range": ("lin", 0.2),
    },
    ("ppo", "Acrobot-v1"): {
        "normalize": True,
        "n_envs": 16,
        "n_steps": 256,
        "gae_lambda": 0.94,
        "gamma": 0.99,
        "n_epochs": 4,
        "ent_coef": 0.0,
    },
    ("ppo", "MountainCar-v0"): {
        "normalize": True,
        "n_envs": 16,
        "n_steps": 16,
        "gae_lambda": 0.98,
        "gamma": 0.99,
        "n_epochs": 4,
        "ent_coef": 0.0,
    },
    ("ppo", "Pendulum-v1"): {
        "n_envs": 4,
        "n_steps": 1024,
        "gae_lambda": 0.95,
        "gamma": 0.9,
        "n_epochs": 10,
        "ent_coef": 0.0,
        "learning_rate": 1e-3,
        "clip_range": 0.2,
        "use_sde": True,
        "sde_sample_freq": 4,
    },
    ("ppo", "LunarLander-v3"): PPO_LUNAR,
    ("ppo", LUNAR_CONTINUOUS): PPO_LUNAR,
    ("ppo", "BipedalWalker-v3"): {
        "normalize": True,
        "n_envs": 32,
        "n_steps": 2048,
        "batch_size": 64,
        "gae_lambda": 0.95,
        "gamma": 0.999,
        "n_epochs": 10,
        "ent_coef": 0.0,
        "learning_rate": 3e-4,
        "clip_range": 0.18,
    },
    ("ppo", "HalfCheetah-v5"): {
        "normalize": True,
        "batch_size": 64,
        "n_steps": 512,
        "gamma": 0.98,
        "learning_rate": 2.0633e-05,
        "ent_coef": 0.000401762,
        "clip_range": 0.1,
        "n_epochs": 20,
        "gae_lambda": 0.92,
        "max_grad_norm": 0.8,
        "vf_coef": 0.58096,
        "policy_kwargs": ZOO_MUJOCO_NETWORK,
    },
    ("ppo", "Hopper-v5"): {
        "normalize": True,
        "batch_size": 32,
        "n_steps": 512,
        "gamma": 0.999,
        "learning_rate": 9.80828e-05,
        "ent_coef": 0.00229519,
        "clip_range": 0.2,
        "n_epochs": 5,
        "gae_lambda": 0.99,
        "max_grad_norm": 0.7,
        "vf_coef": 0.835671,
        "policy_kwargs": ZOO_MUJOCO_NETWORK,
    },
    ("ppo", "Walker2d-v5"): {
        "normalize": True,
        "batch_size": 32,
        "n_steps": 512,
        "gamma": 0.99,
        "learning_rate": 5.05041e-05,
        "ent_coef": 0.000585045,
        "clip_range": 0.1,
        "n_epochs": 20,
        "gae_lambda": 0.95,
        "max_grad_norm": 1.0,
        "vf_coef": 0.871923,
    },
    ("ppo", "Ant-v5"): {"normalize": True},
    ("a2c", "CartPole-v1"): {"n_envs": 8, "ent_coef": 0.0},
    ("a2c", "Acrobot-v1"): {"normalize": True, "n_envs": 16, "ent_coef": 0.0},
    ("a2c", "MountainCar-v0"): {"normalize": True, "n_envs": 16, "ent_coef": 0.0},
    ("a2c", "LunarLander-v3"): {
        "n_envs": 8,
        "gamma": 0.995,
        "n_steps": 5,
        "learning_rate": ("lin", 0.00083),
        "ent_coef": 0.00001,
    },
    ("a2c", "Pendulum-v1"): {
        "normalize": True,
        "n_envs": 8,
        "ent_coef": 0.0,
        "max_grad_norm": 0.5,
        "n_steps": 8,
        "gae_lambda": 0.9,
        "vf_coef": 0.4,
        "gamma": 0.9,
        "use_rms_prop": True,
        "normalize_advantage": False,
        "learning_rate": ("lin", 7e-4),
        "use_sde": True,
        "policy_kwargs": {"log_std_init": -2, "ortho_init": False},
    },
    **{("a2c", env): {"normalize": True} for env in MUJOCO},
    ("dqn", "CartPole-v1"): {
        "learning_rate": 2.3e-3,
        "batch_size": 64,
        "buffer_size": 100_000,
        "learning_starts": 1000,
        "gamma": 0.99,
        "target_update_interval": 10,
        "train_freq": 256,
        "gradient_steps": 128,
        "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
    ("dqn", "MountainCar-v0"): {
        "learning_rate": 4e-3,
        "batch_size": 128,
        "buffer_size": 10_000,
        "learning_starts": 1000,
        "gamma": 0.98,
        "target_update_interval": 600,
        "train_freq": 16,
        "gradient_steps": 8,
        "exploration_fraction": 0.2,
        "exploration_final_eps": 0.07,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
    ("dqn", "LunarLander-v3"): DQN_LUNAR,
    ("dqn", "Acrobot-v1"): DQN_LUNAR,
}


def model_arguments(settings: dict[str, Any]) -> dict[str, Any]:
    """Stable-Baselines3's constructor arguments from a :data:`ZOO_SETTINGS` entry (the env-side keys left out)."""
    from torch import nn

    def schedule(value: Any) -> Any:
        if isinstance(value, tuple) and value[0] == "lin":
            start = value[1]
            return lambda progress_remaining: progress_remaining * start
        return value

    arguments = {key: schedule(value) for key, value in settings.items() if key not in ("n_envs", "normalize",
                 "noise_std")}  # fmt: skip
    if "policy_kwargs" in arguments:
        policy_kwargs = dict(arguments["policy_kwargs"])
        if "activation_fn" in policy_kwargs:
            policy_kwargs["activation_fn"] = {"relu": nn.ReLU, "tanh": nn.Tanh}[
                policy_kwargs["activation_fn"]
            ]
        arguments["policy_kwargs"] = policy_kwargs
    return arguments


def evaluate(
    model: Any, env_id: str, env_kwargs: dict[str, Any], seed: int, episodes: int, normalizer: Any = None
) -> tuple[list[float], list[int]]:
    """Deterministic episodes on a fresh env, seeded as the recipes' evaluations; observations go through the
    training VecNormalize's current statistics (``normalizer``) when there is one."""
    import gymnasium as gym

    env = gym.make(env_id, **env_kwargs)
    returns, lengths = [], []
    for episode in range(episodes):
        observation, _ = env.reset(seed=EVAL_SEED_OFFSET + seed + episode)
        done, total, length = False, 0.0, 0
        while not done:
            seen = normalizer.normalize_obs(observation) if normalizer is not None else observation
            action, _ = model.predict(seen, deterministic=True)
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
    parser.add_argument("--env-kwargs", nargs="*", default=[], help="KEY=VALUE arguments of gymnasium.make")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--frames", type=whole_number, required=True)
    parser.add_argument("--eval-every", type=whole_number, required=True)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--output-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    if min(args.frames, args.eval_every, args.eval_episodes) < 1:
        parser.error("--frames, --eval-every and --eval-episodes must be positive")
    name = " ".join([args.env, *args.env_kwargs])
    settings = ZOO_SETTINGS.get((args.algo, name))
    if settings is None:
        print(
            f"error: no RL Zoo settings for {args.algo} on {name} in benchmarks/sb3_runner.py",
            file=sys.stderr,
        )
        raise SystemExit(2)
    import numpy as np
    import stable_baselines3
    import torch
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise
    from stable_baselines3.common.vec_env import VecNormalize

    from agents.files import write_text
    from training.config import parse_env_kwargs

    torch.set_num_threads(1)  # as each recipe run: the suite runs one job per core
    env_kwargs = parse_env_kwargs(args.env_kwargs)
    env = make_vec_env(args.env, n_envs=settings.get("n_envs", 1), seed=args.seed, env_kwargs=env_kwargs)
    if settings.get("normalize"):
        env = VecNormalize(env, gamma=settings.get("gamma", 0.99))
    model_class = getattr(stable_baselines3, args.algo.upper())
    model = model_class(
        "MlpPolicy", env, seed=args.seed, verbose=0, device="cpu", **model_arguments(settings)
    )
    if "noise_std" in settings:
        dimensions = model.action_space.shape[0]
        model.action_noise = NormalActionNoise(
            np.zeros(dimensions), settings["noise_std"] * np.ones(dimensions)
        )
    args.output_dir.mkdir(parents=True, exist_ok=True)
    rows, start = [], time.perf_counter()

    def record() -> None:
        normalizer = env if isinstance(env, VecNormalize) else None
        returns, lengths = evaluate(model, args.env, env_kwargs, args.seed, args.eval_episodes, normalizer)
        rows.append({"frames": model.num_timesteps, "wall_time_s": time.perf_counter() - start,
                     "return_mean": statistics.fmean(returns), "return_std": statistics.pstdev(returns),
                     "length_mean": statistics.fmean(lengths)})  # fmt: skip
        row = rows[-1]
        print(
            f"frames {row['frames']}: evaluation return {row['return_mean']:.1f} ({row['wall_time_s']:.0f} s)",
            flush=True,
        )

    class Evaluations(BaseCallback):
        """Evaluate every ``--eval-every`` frames within one ``learn`` call (its schedules span the budget)."""

        def __init__(self):
            super().__init__()
            self.next = args.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps >= self.next and self.num_timesteps < args.frames:
                record()
                self.next += args.eval_every
            return True

    model.learn(total_timesteps=args.frames, callback=Evaluations())
    record()
    wall_time = time.perf_counter() - start
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    # each file replaced, never written through a link
    write_text(args.output_dir / "evaluations.csv", table.getvalue())
    frames = model.num_timesteps
    summary = {"algorithm": f"sb3-{args.algo}", "env_id": args.env, "seed": args.seed, "frames": frames,
               "wall_time_s": wall_time, "fps": frames / wall_time, "eval_return_mean": rows[-1]["return_mean"],
               "eval_return_std": rows[-1]["return_std"],
               "best_eval_return_mean": max(row["return_mean"] for row in rows),
               "stable_baselines3": stable_baselines3.__version__}  # fmt: skip
    write_text(args.output_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
    config = {"run": {"env_id": args.env, "env_kwargs": args.env_kwargs, "total_frames": args.frames,
                      "preset_applied": {"name": "RL Zoo (SB3)"}},
              "settings": {key: list(value) if isinstance(value, tuple) else value for key, value in settings.items()}}  # fmt: skip
    write_text(args.output_dir / "config.json", json.dumps(config, indent=2) + "\n")


if __name__ == "__main__":
    main()
