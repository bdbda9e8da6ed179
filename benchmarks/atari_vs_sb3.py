"""Atari throughput: this toolkit against Stable-Baselines3 at the same settings, one after the other here.

Agent steps per second of training (no evaluation) on ``ALE/Pong-v5``, each side in a fresh process:

* ``sb3``: Stable-Baselines3 with RL Zoo's Atari settings: ``make_atari_env`` (``AtariWrapper``: 30 no-ops, 4
  frames per step max-pooled, episodic life, clipped rewards, 84x84 grayscale; ALE v5's sticky actions kept) and
  ``VecFrameStack(4)``, ``CnnPolicy``, torch's default threads.
* ``ours``: ``recipes.ppo`` / ``recipes.dqn`` with their Atari preset (the same settings), with torch's default
  threads as well (``--threads``: most recipes' own default is one thread, best for small networks; a CNN gains
  from both cores).
* ``ours-compiled`` (only when asked for in ``--sides``): ``ours`` with ``--compile``, its compilation in the
  wall-clock.
* ``ours-bf16`` (likewise): ``ours`` with ``--matmul-precision medium`` (the CNN's convolutions and matrix products
  in bfloat16 on CPUs that have it, TF32 on CUDA GPUs).
* ``ours-ieee`` (likewise): ``ours`` with ``--no-flush-denormal`` (denormal floats computed as such).
* ``ours-mkl`` (likewise): ``ours`` with ``--linear-kernels torch`` (the Nature CNN's linear layer through torch's
  default float32 product, MKL's on x86, where ``auto`` takes oneDNN's on AMD CPUs from Zen 5 on, and on Zen 4
  for the large products of the updates).
* ``ours-onednn`` (likewise): ``ours`` with ``--linear-kernels onednn`` (oneDNN's product on any CPU).
* ``ours-async`` and ``sb3-subproc`` (likewise): each env in a process of its own (``--vectorization async``;
  SB3's ``SubprocVecEnv``), the lever where cores are spare, as on a GPU machine.

``--device cuda`` puts both sides' networks on the GPU (SB3's ``device="cuda"``, our ``--device cuda``); the envs
step on the CPU either way.

PPO: 8 envs x 128 steps, 4 epochs of minibatches of 256, lr 2.5e-4 and clip range 0.1 annealed, entropy 0.01.
DQN: one gradient step of 32 per 4 agent steps, a 100k replay buffer, the target copied every 1000 agent steps;
learning starts after ``--learning-starts`` steps (default 2000, RL Zoo's is 100k) so that the measured budget is
mostly training. Peak resident memory of each process is printed too.

    pip install -e ".[bench]"
    python -m benchmarks.atari_vs_sb3 --algo ppo --frames 16384 --seeds 0
    python -m benchmarks.atari_vs_sb3 --algo dqn --frames 20000 --seeds 0
    python -m benchmarks.atari_vs_sb3 --algo ppo --sides sb3 ours ours-compiled
    python -m benchmarks.atari_vs_sb3 --algo ppo --device cuda --sides sb3 ours sb3-subproc ours-async
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

from benchmarks.common import side_kernels, whole_number

ENV_ID = "ALE/Pong-v5"
SIDES = [
    "sb3",
    "ours",
    "ours-compiled",
    "ours-bf16",
    "ours-ieee",
    "ours-mkl",
    "ours-onednn",
    "sb3-subproc",
    "ours-async",
]
OURS_SIDES = [side for side in SIDES if side.startswith("ours")]


def peak_memory_mb() -> float:
    """This process's peak resident memory in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def linear(start: float):
    return lambda progress_remaining: progress_remaining * start


def make_pong(**kwargs):
    """Pong with ale-py's envs registered, also in SB3's ``SubprocVecEnv`` workers (fresh interpreters)."""
    import ale_py
    import gymnasium as gym

    gym.register_envs(ale_py)
    return gym.make(ENV_ID, **kwargs)


def run_sb3(
    algo: str, frames: int, seed: int, learning_starts: int, device: str = "cpu", subprocesses: bool = False
) -> dict:
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv, VecFrameStack

    # frameskip=1: AtariWrapper repeats each action 4 times itself; ALE v5's sticky actions stay, as in ours
    n_envs = 8 if algo == "ppo" else 1
    vec_env_cls = SubprocVecEnv if subprocesses else DummyVecEnv
    env = VecFrameStack(
        make_atari_env(
            make_pong, n_envs=n_envs, seed=seed, env_kwargs={"frameskip": 1}, vec_env_cls=vec_env_cls
        ),
        4,
    )
    if algo == "ppo":
        model = PPO(
            "CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=linear(2.5e-4),
            clip_range=linear(0.1), vf_coef=0.5, ent_coef=0.01, seed=seed, verbose=0, device=device,
        )  # fmt: skip
    else:
        model = DQN(
            "CnnPolicy", env, buffer_size=100_000, learning_rate=1e-4, batch_size=32,
            learning_starts=learning_starts, target_update_interval=1000, train_freq=4, gradient_steps=1,
            exploration_fraction=0.1, exploration_final_eps=0.01, optimize_memory_usage=False, seed=seed,
            verbose=0, device=device,
        )  # fmt: skip
    start = time.perf_counter()
    model.learn(total_timesteps=frames)
    wall_time = time.perf_counter() - start
    return {
        "frames": frames,
        "wall_time_s": wall_time,
        "fps": frames / wall_time,
        "peak_mb": peak_memory_mb(),
    }


def run_ours(
    algo: str,
    frames: int,
    seed: int,
    learning_starts: int,
    threads: int = 0,
    compile: bool = False,
    matmul_precision: str = "highest",
    flush_denormal: bool = True,
    linear_kernels: str = "auto",
    device: str = "cpu",
    vectorization: str = "sync",
) -> dict:
    import importlib

    from training.cli import run_cli

    recipe = importlib.import_module(f"recipes.{algo}")
    output_dir = tempfile.mkdtemp(prefix=f"bench-atari-{algo}-")
    sys.argv = [
        algo, "--env-id", ENV_ID, "--seed", str(seed), "--total-frames", str(frames), "--eval-every", str(10**12),
        "--eval-episodes", "1", "--stop-at-return", "inf", "--logger", "csv", "--no-video", "--no-progress",
        "--output-dir", output_dir, "--overwrite", "--threads", str(threads), "--device", device,
        "--vectorization", vectorization,
    ]  # fmt: skip
    if algo == "dqn":
        sys.argv += ["--learning-starts", str(learning_starts)]
    if compile:
        sys.argv.append("--compile")
    sys.argv += ["--matmul-precision", matmul_precision, "--linear-kernels", linear_kernels]
    if not flush_denormal:
        sys.argv.append("--no-flush-denormal")
    config_class = recipe.PPOConfig if algo == "ppo" else recipe.DQNConfig
    run_cli(recipe.main, config_class, recipe.__doc__, presets=recipe.PRESETS)
    # training time: the run's clock at its last batch (the final evaluation game is not training)
    with open(os.path.join(output_dir, "csv", "scalars", "time", "elapsed_s.csv")) as file:
        last_frames, elapsed = (float(value) for value in list(csv.reader(file))[-1])
    return {
        "frames": int(last_frames),
        "wall_time_s": elapsed,
        "fps": last_frames / elapsed,
        "peak_mb": peak_memory_mb(),
    }


def run_side(
    side: str, algo: str, frames: int, seed: int, learning_starts: int, threads: int, device: str = "cpu"
) -> dict:
    """One side in a fresh interpreter, so that imports and thread pools do not leak between runs."""
    command = [
        sys.executable, "-m", "benchmarks.atari_vs_sb3", "--child", side, "--algo", algo, "--frames", str(frames),
        "--seeds", str(seed), "--learning-starts", str(learning_starts), "--threads", str(threads),
        "--device", device,
    ]  # fmt: skip
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
    parser.add_argument("--algo", choices=["ppo", "dqn"], default="ppo")
    parser.add_argument("--frames", type=whole_number, default=16_384, help="agent steps per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--sides", nargs="+", default=["sb3", "ours"], choices=SIDES)
    parser.add_argument(
        "--learning-starts", type=whole_number, default=2_000, help="DQN: random steps before learning"
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="our torch threads (0: torch's default, as SB3 runs)"
    )
    parser.add_argument(
        "--device", default="cpu", help="where both sides' networks run: cpu (default), cuda, cuda:1, ..."
    )
    parser.add_argument("--child", choices=SIDES, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        warnings.filterwarnings("ignore")
        if args.child.startswith("sb3"):
            result = run_sb3(
                args.algo, args.frames, args.seeds[0], args.learning_starts, args.device,
                subprocesses=args.child == "sb3-subproc",
            )  # fmt: skip
        else:
            result = run_ours(
                args.algo,
                args.frames,
                args.seeds[0],
                args.learning_starts,
                args.threads,
                compile=args.child == "ours-compiled",
                matmul_precision="medium" if args.child == "ours-bf16" else "highest",
                flush_denormal=args.child != "ours-ieee",
                linear_kernels=side_kernels(args.child),
                device=args.device,
                vectorization="async" if args.child == "ours-async" else "sync",
            )
        print(json.dumps(result))
        return
    results: dict[str, list[dict]] = {side: [] for side in args.sides}
    for seed in args.seeds:
        for side in args.sides:  # alternating sides: a slow spell of the machine hits both
            row = run_side(
                side, args.algo, args.frames, seed, args.learning_starts, args.threads, args.device
            )
            results[side].append(row)
            print(
                f"seed {seed} {side:13s} {row['frames']} agent steps in {row['wall_time_s']:7.1f} s: "
                f"{row['fps']:6.1f} steps/s, peak memory {row['peak_mb']:.0f} MiB",
                flush=True,
            )
    print(f"\n{args.algo} on {ENV_ID}, {args.frames} agent steps, seeds {args.seeds}, device {args.device}")
    print("| run | agent steps/s | peak memory (MiB) |\n|---|---|---|")
    for side, rows in results.items():
        print(
            f"| {side} | {statistics.mean(r['fps'] for r in rows):.1f} | "
            f"{max(r['peak_mb'] for r in rows):.0f} |"
        )
    for reference in ("sb3", "sb3-subproc"):
        for side in OURS_SIDES:
            if reference in results and side in results:
                ratio = statistics.mean(r["fps"] for r in results[side]) / statistics.mean(
                    r["fps"] for r in results[reference]
                )
                print(f"agent steps/s {side} / {reference}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
