"""PPO on CartPole-v1: this toolkit against Stable-Baselines3, one after the other on the same machine.

Three runs per seed, each in a fresh process:

* ``sb3``: Stable-Baselines3 PPO with RL Zoo's CartPole-v1 hyperparameters (8 envs, n_steps 32, batch 256,
  20 epochs, gae_lambda 0.8, gamma 0.98, learning rate and clip range linearly annealed from 1e-3 and 0.2,
  ent_coef 0, 100k steps), then 20 deterministic evaluation episodes.
* ``ours-zoo``: ``recipes.ppo`` with the same hyperparameters, budget and torch threads (no early stop): raw
  throughput.
* ``ours``: ``recipes.ppo`` with its defaults, stopping once the deterministic evaluation reaches 475.

The headline ratio is SB3's wall-clock time over the time our default run takes to reach 475.

    pip install -e ".[bench]"      # or: make bench
    python -m benchmarks.ppo_vs_sb3 --seeds 0 1 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import benchmark_cli, evaluate_sb3, output_suffix, sb3_row, summary_row

TOTAL_FRAMES = 100_000


def run_sb3(seed: int) -> dict:
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
    return sb3_row(train_time, TOTAL_FRAMES, evaluate_sb3(model, "CartPole-v1", seed))


def run_ours(seed: int, zoo: bool, **run_options: Any) -> dict:
    from recipes.ppo import CollectorConfig, LossConfig, OptimConfig, PPOConfig, main
    from training import RunConfig, quiet

    output_dir = f"runs/bench-ppo-{'zoo' if zoo else 'default'}{output_suffix(**run_options)}-{seed}"
    if zoo:
        config = PPOConfig(
            run=RunConfig(
                num_envs=8,
                total_frames=TOTAL_FRAMES,
                eval_every=TOTAL_FRAMES,
                seed=seed,
                stop_at_return=float("inf"),
                preset="none",  # every setting below, nothing from CartPole-v1's preset
                threads=0,  # torch's default, as SB3's
            ),
            collector=CollectorConfig(steps_per_env=32),
            loss=LossConfig(gamma=0.98, gae_lambda=0.8, clip_epsilon=0.2, anneal_clip=True, entropy_coef=0.0),
            optim=OptimConfig(lr=1e-3, anneal_lr=True, num_epochs=20, minibatch_size=256),
        )
    else:
        config = PPOConfig()
        config.run.seed = seed
    # each benchmark run replaces the last one of its side and seed
    quiet(config, output_dir, overwrite=True, **run_options)
    return summary_row(main(config))


def main() -> None:
    benchmark_cli("benchmarks.ppo_vs_sb3", __doc__, run_sb3, run_ours)


if __name__ == "__main__":
    main()
