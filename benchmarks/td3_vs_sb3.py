"""TD3 on Pendulum-v1: this toolkit against Stable-Baselines3, one after the other on the same machine.

Three runs per seed, each in a fresh process:

* ``sb3``: Stable-Baselines3 TD3 with RL Zoo's Pendulum-v1 hyperparameters (20k steps, gamma 0.98, buffer 200k,
  learning_starts 10000, Gaussian action noise 0.1, lr 1e-3, net [400, 300]; SB3's defaults otherwise: batch
  256, one gradient step per env step, policy delay 2, target noise 0.2 clipped at 0.5, tau 0.005), then 20
  deterministic evaluation episodes.
* ``ours-zoo``: ``recipes.td3`` with the same hyperparameters, budget and torch threads (one env, one step
  then one update), no early stop: raw throughput.
* ``ours``: ``recipes.td3`` with its defaults over the same 20k frames, evaluated every 1000 frames; the time to
  -200 is that of its first evaluation at or above -200.

The headline ratio is SB3's wall-clock time over the time our default run takes to reach -200; both sides also
report their return after the full budget.

    pip install -e ".[bench]"
    python -m benchmarks.td3_vs_sb3 --seeds 0 1 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import benchmark_cli, evaluate_sb3, output_suffix, sb3_row, summary_row, time_to_return

TOTAL_FRAMES = 20_000
TARGET = -200.0


def run_sb3(seed: int) -> dict:
    import numpy as np
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    start = time.perf_counter()
    model = TD3(
        "MlpPolicy",
        "Pendulum-v1",
        learning_rate=1e-3,
        gamma=0.98,
        buffer_size=200_000,
        learning_starts=10_000,
        action_noise=NormalActionNoise(mean=np.zeros(1), sigma=0.1 * np.ones(1)),
        policy_kwargs={"net_arch": [400, 300]},
        seed=seed,
        verbose=0,
        device="cpu",
    )
    model.learn(total_timesteps=TOTAL_FRAMES)
    train_time = time.perf_counter() - start
    return sb3_row(train_time, TOTAL_FRAMES, evaluate_sb3(model, "Pendulum-v1", seed))


def run_ours(seed: int, zoo: bool, **run_options: Any) -> dict:
    from recipes.td3 import TD3Config, main
    from training import quiet

    config = TD3Config()
    config.run.seed = seed
    if zoo:
        config.run.eval_every = TOTAL_FRAMES
        config.run.threads = 0  # torch's default, as SB3's (two make 400x300 updates ~1.7x faster)
        config.collector.steps_per_env, config.collector.learning_starts = 1, 10_000
        config.network.hidden_sizes = (400, 300)
    else:
        config.run.stop_at_return = float("inf")  # the whole budget: its final return, and the time to -200
    output_dir = f"runs/bench-td3-{'zoo' if zoo else 'default'}{output_suffix(**run_options)}-{seed}"
    # each benchmark run replaces the last one of its side and seed
    quiet(config, output_dir, overwrite=True, **run_options)
    row = summary_row(main(config))
    row["time_to_target_s"] = None if zoo else time_to_return(output_dir, TARGET)
    return row


def main() -> None:
    benchmark_cli("benchmarks.td3_vs_sb3", __doc__, run_sb3, run_ours, target=str(TARGET))


if __name__ == "__main__":
    main()
