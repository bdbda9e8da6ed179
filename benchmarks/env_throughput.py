"""CartPole-v1 steps per second with a random policy, by backend and batch size, and PPO time to solve.

Rows (N = number of envs stepped together):

* ``torch (TorchRL)``: the torch-native batched env through ``step_and_maybe_reset`` (what collectors call).
* ``torch rollout()``: the same env through TorchRL's ``EnvBase.rollout``.
* ``gymnasium (TorchRL)``: Gymnasium per-env envs in a ``SyncVectorEnv``, through this toolkit's TorchRL wrapper.
* ``gymnasium sync (raw)``: the same ``SyncVectorEnv`` stepped directly, no TorchRL.
* ``gymnasium numpy-vectorised (raw)``: Gymnasium's ``CartPoleVectorEnv`` stepped directly.

Then the default PPO recipe with each backend: wall-clock time until the deterministic evaluation reaches 475.

    python -m benchmarks.env_throughput                  # CPU
    python -m benchmarks.env_throughput --device cuda    # torch rows on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import gymnasium as gym
import numpy as np
import torch

from envs import make_env


def timed_steps(step, budget_s: float, windows: int = 5) -> tuple[float, float]:
    """Calls per second of ``step``: the best and the median of ``windows`` windows of ``budget_s / windows``.

    The best window is the least disturbed by other load on the machine; the median shows the spread.
    """
    for _ in range(3):
        step()
    rates = []
    for _ in range(windows):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < budget_s / windows:
            step()
            calls += 1
        rates.append(calls / elapsed)
    return max(rates), statistics.median(rates)


def scaled(rates: tuple[float, float], factor: int) -> tuple[float, float]:
    return rates[0] * factor, rates[1] * factor


def torch_rate(num_envs: int, device: str, budget_s: float):
    env = make_env("CartPole-v1", num_envs, backend="torch", device=device, seed=0)
    state = {"data": env.reset()}

    def step():
        data = state["data"]
        data.set("action", torch.randint(0, 2, (num_envs,), device=env.device))
        _, state["data"] = env.step_and_maybe_reset(data)

    def sync():
        if env.device.type == "cuda":
            torch.cuda.synchronize()

    rate = scaled(timed_steps(lambda: (step(), sync()), budget_s), num_envs)
    steps = 100

    def rollout():
        env.rollout(steps, break_when_any_done=False)
        sync()

    rollout_rate = scaled(timed_steps(rollout, budget_s), num_envs * steps)
    return rate, rollout_rate


def gymnasium_rates(num_envs: int, budget_s: float):
    env = make_env("CartPole-v1", num_envs, seed=0)
    state = {"data": env.reset()}

    def step():
        data = state["data"]
        data.set("action", torch.randint(0, 2, (num_envs,)))
        _, state["data"] = env.step_and_maybe_reset(data)

    wrapped = scaled(timed_steps(step, budget_s), num_envs)
    raw_env = env.vector_env
    actions = np.zeros(num_envs, dtype=np.int64)
    raw = scaled(timed_steps(lambda: raw_env.step(actions), budget_s), num_envs)
    env.close()
    return wrapped, raw


def numpy_vectorised_rate(num_envs: int, budget_s: float):
    env = gym.make_vec("CartPole-v1", num_envs, vectorization_mode="vector_entry_point")
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    return scaled(timed_steps(lambda: env.step(rng.integers(0, 2, num_envs)), budget_s), num_envs)


def ppo_time_to_solve(backend: str, seed: int, device: str) -> tuple[float | None, int | None]:
    from recipes.ppo import PPOConfig, main
    from training import quiet

    config = quiet(
        PPOConfig(), f"runs/bench-env-{backend}-{seed}", seed=seed, env_backend=backend, device=device
    )
    summary = main(config)
    return summary["solved_at_s"], summary["solved_at_frames"]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu", help="device of the torch backend")
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 16, 256, 4096])
    parser.add_argument("--budget-s", type=float, default=3.0, help="seconds per measurement (5 windows)")
    parser.add_argument("--ppo-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (the recipes' default is 1)"
    )
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(args.threads)

    rows: dict[str, list[str]] = {
        "torch (TorchRL step_and_maybe_reset)": [],
        "torch (TorchRL rollout())": [],
        "gymnasium SyncVectorEnv (TorchRL wrapper)": [],
        "gymnasium SyncVectorEnv (raw)": [],
        "gymnasium numpy-vectorised CartPole (raw)": [],
    }
    for num_envs in args.sizes:
        budget = args.budget_s
        step_rate, rollout_rate = torch_rate(num_envs, args.device, budget)
        wrapped, raw = gymnasium_rates(num_envs, budget)
        values = [step_rate, rollout_rate, wrapped, raw, numpy_vectorised_rate(num_envs, budget)]
        for name, (best, median) in zip(rows, values):
            rows[name].append(f"{best / 1e6:.3f} ({median / 1e6:.3f})")
        print(
            f"N={num_envs}: " + ", ".join(f"{n} {v[0] / 1e6:.3f}M" for n, v in zip(rows, values)), flush=True
        )

    if args.sizes:
        print(f"\nCartPole-v1 steps/s (millions; best window, median in brackets), torch on {args.device}:\n")
        print("| backend | " + " | ".join(f"N={n}" for n in args.sizes) + " |")
        print("|---|" + "---|" * len(args.sizes))
        for name, values in rows.items():
            print(f"| {name} | " + " | ".join(values) + " |")

    if args.ppo_seeds:
        print("\n| PPO CartPole-v1, default recipe | time to reach 475 (s), per seed | mean |")
        print("|---|---|---|")
        for backend in ("gymnasium", "torch"):
            results = [ppo_time_to_solve(backend, seed, args.device) for seed in args.ppo_seeds]
            times = [t for t, _ in results if t is not None]
            cells = ", ".join("not reached" if t is None else f"{t:.1f} ({f} frames)" for t, f in results)
            mean = f"{statistics.mean(times):.1f}" if times else "n/a"
            print(f"| {backend} backend | {cells} | {mean} |", flush=True)


if __name__ == "__main__":
    main()
