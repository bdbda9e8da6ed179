"""DQN on CartPole-v1: this toolkit against Stable-Baselines3, one after the other on the same machine.

Three runs per seed, each in a fresh process:

* ``sb3``: Stable-Baselines3 DQN with RL Zoo's CartPole-v1 hyperparameters (50k steps, lr 2.3e-3, batch 64,
  buffer 100k, learning_starts 1000, gamma 0.99, target_update_interval 10, train_freq 256, gradient_steps
  128, exploration_fraction 0.16, exploration_final_eps 0.04, net [256, 256]), then 20 deterministic
  evaluation episodes.
* ``ours-zoo``: ``recipes.dqn`` with the same hyperparameters, budget and torch threads (one env, 256 steps then 128
  updates; SB3 syncs the target during collection, i.e. once per 128 updates), no early stop: raw throughput.
* ``ours``: ``recipes.dqn`` with its defaults, stopping once the deterministic evaluation reaches 475.
* ``ours-rainbow`` (on request: ``--sides sb3 ours ours-rainbow``): ``recipes.dqn --variant rainbow`` (double,
  dueling, noisy, prioritized, C51 and 3-step returns) with CartPole-v1's preset, stopping at 475.

The headline ratio is SB3's wall-clock time over the time our default run takes to reach 475.

    pip install -e ".[bench]"
    python -m benchmarks.dqn_vs_sb3 --seeds 0 1 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import benchmark_cli, evaluate_sb3, output_suffix, sb3_row, summary_row

TOTAL_FRAMES = 50_000


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import DQN

    start = time.perf_counter()
    model = DQN(
        "MlpPolicy",
        "CartPole-v1",
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1_000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
        policy_kwargs={"net_arch": [256, 256]},
        seed=seed,
        verbose=0,
        device="cpu",
    )
    model.learn(total_timesteps=TOTAL_FRAMES)
    train_time = time.perf_counter() - start
    return sb3_row(train_time, TOTAL_FRAMES, evaluate_sb3(model, "CartPole-v1", seed))


def run_ours(seed: int, zoo: bool, **run_options: Any) -> dict:
    from agents import ExplorationConfig
    from recipes.dqn import (
        BufferConfig,
        CollectorConfig,
        DQNConfig,
        LossConfig,
        NetworkConfig,
        OptimConfig,
        main,
    )
    from training import RunConfig, quiet

    output_dir = f"runs/bench-dqn-{'zoo' if zoo else 'default'}{output_suffix(**run_options)}-{seed}"
    if zoo:
        config = DQNConfig(
            run=RunConfig(
                num_envs=1,
                total_frames=TOTAL_FRAMES,
                eval_every=TOTAL_FRAMES,
                seed=seed,
                stop_at_return=float("inf"),
                preset="none",  # every setting below, nothing from CartPole-v1's preset
                threads=0,  # torch's default, as SB3's
            ),
            collector=CollectorConfig(steps_per_env=256, updates_per_batch=128, learning_starts=1_000),
            buffer=BufferConfig(buffer_size=100_000, batch_size=64, n_steps=1),
            exploration=ExplorationConfig(final_epsilon=0.04, exploration_fraction=0.16),
            loss=LossConfig(gamma=0.99, target_update_interval=128),
            optim=OptimConfig(lr=2.3e-3),
            network=NetworkConfig(hidden_sizes=(256, 256)),
        )
    else:
        config = DQNConfig()
        config.run.seed = seed
    # each benchmark run replaces the last one of its side and seed
    quiet(config, output_dir, overwrite=True, **run_options)
    return summary_row(main(config))


def run_rainbow(seed: int) -> dict:
    from recipes.dqn import DQNConfig, main
    from training import quiet

    config = DQNConfig(variant="rainbow")
    config.run.seed = seed
    quiet(config, f"runs/bench-dqn-rainbow-{seed}", overwrite=True)
    return summary_row(main(config))


def main() -> None:
    benchmark_cli(
        "benchmarks.dqn_vs_sb3", __doc__, run_sb3, run_ours, extra_sides={"ours-rainbow": run_rainbow}
    )


if __name__ == "__main__":
    main()
