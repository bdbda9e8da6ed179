"""TD3 on MuJoCo's HalfCheetah-v5 at identical settings: this toolkit's frames per second against Stable-Baselines3's.

Both sides train with RL Zoo's HalfCheetah settings (Adam 1e-3, batch 256, buffer 1M, Gaussian action noise 0.1,
policy delay 2, target noise 0.2 clipped at 0.5, tau 0.005, gamma 0.99; 10k uniformly random frames before
learning) on 256x256 ReLU networks (RL Zoo's are 400x300), one env taking one step then one gradient step, for
20k frames (10k gradient steps), torch's default threads on both sides; then 10 deterministic evaluation
episodes, outside the wall-clock on both sides. Each run is a fresh process.

* ``sb3``: Stable-Baselines3's ``TD3("MlpPolicy", "HalfCheetah-v5", ...)`` with those settings.
* ``ours-zoo``: ``recipes.td3`` with exactly these options set explicitly (``--preset none``).
* ``ours``: ``recipes.td3`` with the HalfCheetah-v5 preset over the same 20k frames (400x300 networks, 8 steps
  then 8 gradient steps).

The headline is our frames per second over SB3's (``same hyperparameters`` line).

    pip install -e ".[bench]"
    python -m benchmarks.td3_halfcheetah_vs_sb3 --sides sb3 ours-zoo --seeds 0 1 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import benchmark_cli, evaluate_sb3, run_ours_off_policy, sb3_row

ENV_ID = "HalfCheetah-v5"
TOTAL_FRAMES = 20_000
LEARNING_STARTS = 10_000
EVAL_EPISODES = 10
HIDDEN_SIZES = (256, 256)


def run_sb3(seed: int) -> dict:
    import gymnasium as gym
    import numpy as np
    from stable_baselines3 import TD3
    from stable_baselines3.common.noise import NormalActionNoise

    action_dim = gym.spec(ENV_ID).make().action_space.shape[0]
    start = time.perf_counter()
    model = TD3(
        "MlpPolicy",
        ENV_ID,
        learning_rate=1e-3,
        learning_starts=LEARNING_STARTS,
        action_noise=NormalActionNoise(mean=np.zeros(action_dim), sigma=0.1 * np.ones(action_dim)),
        policy_kwargs={"net_arch": list(HIDDEN_SIZES)},
        seed=seed,
        verbose=0,
        device="cpu",
    )
    model.learn(total_timesteps=TOTAL_FRAMES)
    train_time = time.perf_counter() - start
    return sb3_row(train_time, TOTAL_FRAMES, evaluate_sb3(model, ENV_ID, seed, EVAL_EPISODES))


def run_ours(seed: int, zoo: bool, **run_options: Any) -> dict:
    return run_ours_off_policy(
        "td3",
        ENV_ID,
        seed,
        zoo,
        total_frames=TOTAL_FRAMES,
        learning_starts=LEARNING_STARTS,
        hidden_sizes=HIDDEN_SIZES,
        eval_episodes=EVAL_EPISODES,
        **run_options,
    )


def main() -> None:
    benchmark_cli("benchmarks.td3_halfcheetah_vs_sb3", __doc__, run_sb3, run_ours, target="inf")


if __name__ == "__main__":
    main()
