"""SAC on Pendulum-v1: this toolkit against Stable-Baselines3, one after the other on the same machine.

Three runs per seed, each in a fresh process:

* ``sb3``: Stable-Baselines3 SAC, 20k steps, lr 1e-3 (RL Zoo's Pendulum budget and rate), SB3's defaults
  otherwise (net [256, 256], batch 256, buffer 1M, learning_starts 100, tau 0.005, gamma 0.99, one gradient step
  per env step, automatic entropy tuning), then 20 deterministic evaluation episodes.
* ``ours-zoo``: ``recipes.sac`` with the same hyperparameters, budget and torch threads (one env, one step
  then one update), no early stop: raw throughput.
* ``ours``: ``recipes.sac`` with its defaults over the same 20k frames, evaluated every 1000 frames; the time to
  -200 is that of its first evaluation at or above -200.

The headline ratio is SB3's wall-clock time over the time our default run takes to reach -200; both sides also
report their return after the full budget.

    pip install -e ".[bench]"
    python -m benchmarks.sac_vs_sb3 --seeds 0 1 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import benchmark_cli, evaluate_sb3, output_suffix, sb3_row, summary_row, time_to_return

TOTAL_FRAMES = 20_000
TARGET = -200.0


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import SAC

    start = time.perf_counter()
    model = SAC("MlpPolicy", "Pendulum-v1", learning_rate=1e-3, seed=seed, verbose=0, device="cpu")
    model.learn(total_timesteps=TOTAL_FRAMES)
    train_time = time.perf_counter() - start
    return sb3_row(train_time, TOTAL_FRAMES, evaluate_sb3(model, "Pendulum-v1", seed))


def run_ours(seed: int, zoo: bool, **run_options: Any) -> dict:
    from agents.continuous import default_target_entropy
    from envs import make_env
    from recipes.sac import SACConfig, main
    from training import quiet

    config = SACConfig()
    config.run.seed = seed
    if zoo:
        config.run.eval_every = TOTAL_FRAMES
        config.run.threads = 0  # torch's default, as SB3's (two make 256-unit updates ~1.5x faster)
        config.collector.steps_per_env, config.collector.learning_starts = 1, 100
        config.network.hidden_sizes = (256, 256)
        # SB3's -dim(A) on [-1, 1] (the recipe's default; the Pendulum preset's tuned -1.0 otherwise)
        env = make_env("Pendulum-v1", 1)
        config.loss.target_entropy = default_target_entropy(env.action_spec)
        env.close()
    else:
        config.run.stop_at_return = float("inf")  # the whole budget: its final return, and the time to -200
    output_dir = f"runs/bench-sac-{'zoo' if zoo else 'default'}{output_suffix(**run_options)}-{seed}"
    # each benchmark run replaces the last one of its side and seed
    quiet(config, output_dir, overwrite=True, **run_options)
    row = summary_row(main(config))
    row["time_to_target_s"] = None if zoo else time_to_return(output_dir, TARGET)
    return row


def main() -> None:
    benchmark_cli("benchmarks.sac_vs_sb3", __doc__, run_sb3, run_ours, target=str(TARGET))


if __name__ == "__main__":
    main()
