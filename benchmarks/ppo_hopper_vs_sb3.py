"""PPO on MuJoCo's Hopper-v5 at identical settings: this toolkit's frames per second against Stable-Baselines3's.

Both sides train with the PPO paper's MuJoCo settings (Schulman et al. 2017, as Stable-Baselines3's and CleanRL's
defaults): one env, 2048 steps per batch, 10 epochs of 64-sample minibatches, Adam 3e-4 annealed linearly to 0,
gamma 0.99, GAE 0.95, clip 0.2, no entropy bonus, value coefficient 0.5, gradient norm 0.5, 64x64 tanh networks
with orthogonal initialisation, an unsquashed Gaussian policy (log std 0) whose actions the env clips, running
observation and return normalisation; then 20 deterministic evaluation episodes. Each run is a fresh process.

* ``sb3``: Stable-Baselines3's PPO (``MlpPolicy``) on ``VecNormalize(make_vec_env("Hopper-v5"))``, torch's
  default threads; its evaluation, with the normaliser's frozen statistics, is outside its wall-clock.
* ``ours-zoo`` and ``ours``: ``recipes.ppo`` with exactly these options set explicitly (``--preset none``; they are
  also the Hopper-v5 preset), one torch thread; its wall-clock leaves out the time its evaluation takes, as SB3's.

The headline is our frames per second over SB3's (``same hyperparameters`` line).

    pip install -e ".[bench]"
    python -m benchmarks.ppo_hopper_vs_sb3 --sides sb3 ours-zoo --seeds 0 1 2
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks.common import benchmark_cli, evaluate_sb3, output_suffix, sb3_row, summary_row

ENV_ID = "Hopper-v5"
TOTAL_FRAMES = 100_000
EVAL_EPISODES = 20


def run_sb3(seed: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    start = time.perf_counter()
    env = VecNormalize(make_vec_env(ENV_ID, n_envs=1, seed=seed), gamma=0.99)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=2048,
        batch_size=64,
        n_epochs=10,
        learning_rate=lambda progress_remaining: 3e-4 * progress_remaining,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        seed=seed,
        verbose=0,
        device="cpu",
    )
    model.learn(total_timesteps=TOTAL_FRAMES)
    train_time = time.perf_counter() - start
    env.training = False  # evaluation reads the normaliser's statistics, frozen
    return sb3_row(
        train_time, TOTAL_FRAMES, evaluate_sb3(model, ENV_ID, seed, EVAL_EPISODES, env.normalize_obs)
    )


def run_ours(seed: int, zoo: bool, **run_options: Any) -> dict:
    from recipes.ppo import CollectorConfig, LossConfig, NetworkConfig, OptimConfig, PPOConfig, main
    from training import RunConfig, quiet

    config = PPOConfig(
        run=RunConfig(
            env_id=ENV_ID,
            num_envs=1,
            total_frames=TOTAL_FRAMES,
            eval_every=TOTAL_FRAMES,
            eval_episodes=EVAL_EPISODES,
            seed=seed,
            stop_at_return=float("inf"),
            preset="none",
        ),
        collector=CollectorConfig(steps_per_env=2048),
        loss=LossConfig(
            gamma=0.99,
            gae_lambda=0.95,
            clip_epsilon=0.2,
            entropy_coef=0.0,
            critic_coef=0.5,
            normalize_reward=True,
        ),
        optim=OptimConfig(
            lr=3e-4, anneal_lr=True, adam_eps=1e-5, max_grad_norm=0.5, num_epochs=10, minibatch_size=64
        ),
        network=NetworkConfig(
            hidden_sizes=(64, 64),
            activation="tanh",
            normalize_obs=True,
            ortho_init=True,
            log_std_init=0.0,
            squash=False,
        ),
    )
    quiet(
        config,
        f"runs/bench-ppo-hopper-{'zoo' if zoo else 'default'}{output_suffix(**run_options)}-{seed}",
        overwrite=True,
        **run_options,
    )
    return summary_row(main(config))


def main() -> None:
    benchmark_cli("benchmarks.ppo_hopper_vs_sb3", __doc__, run_sb3, run_ours, target="inf")


if __name__ == "__main__":
    main()
