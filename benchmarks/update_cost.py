"""The cost of one gradient step: this toolkit's SAC and TD3 update against Stable-Baselines3's, in one process.

Both sides get the same networks (SAC: 256x256 ReLU, TD3: 400x300 ReLU, RL Zoo's MuJoCo settings), batch 256 and
one torch thread, and each times ``--steps`` updates per round, the two alternating over ``--rounds`` rounds so
that both see the same load; the table gives the median milliseconds per update and SB3's over ours (above 1:
ours is faster). Ours is what ``recipes.sac`` / ``recipes.td3`` run per update: the loss (``TensorSACLoss`` /
``TensorTD3Loss``), backward, the Adam steps of ``OffPolicyOptimConfig.adam``, the soft target update (TD3: the
actor, its Adam step and the target update every second step, as SB3's ``policy_delay`` 2). SB3's is
``model.train(gradient_steps=1, batch_size=256)`` on a buffer filled by ``learn``. Env stepping and the policy
call in the collector are not in it: see ``--collect`` for those (frames per second of the off-policy collector
against SB3's ``learn`` with no gradient steps).

    pip install -e ".[bench]"
    python -m benchmarks.update_cost --algos sac td3 --env-id Hopper-v5
    python -m benchmarks.update_cost --collect --steps-per-env 1 8
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

BATCH = 256
SIZES = {"sac": (256, 256), "td3": (400, 300)}


def ours_update(algo: str, env_id: str) -> Callable[[], None]:
    from tensordict import TensorDict

    from agents import (
        ForeachSoftUpdate,
        TensorSACLoss,
        TensorTD3Loss,
        make_actor,
        make_deterministic_actor,
        make_qvalue_critic,
    )
    from agents.continuous import default_target_entropy
    from envs import make_env
    from training.optim import OffPolicyOptimConfig

    env = make_env(env_id, 1)
    observation_spec, action_spec = env.observation_spec["observation"], env.action_spec
    sizes = SIZES[algo]
    critic = make_qvalue_critic(observation_spec, action_spec, sizes, "relu")
    optim = OffPolicyOptimConfig(lr=3e-4 if algo == "sac" else 1e-3)
    if algo == "sac":
        actor = make_actor(observation_spec, action_spec, sizes, "relu", state_dependent_scale=True)
        loss = TensorSACLoss(
            actor,
            critic,
            action_spec=action_spec,
            num_qvalue_nets=2,
            delay_qvalue=True,
            delay_actor=False,
            target_entropy=default_target_entropy(action_spec),
            loss_function="l2",  # the recipe's and SB3's mean squared error
        )
    else:
        actor = make_deterministic_actor(observation_spec, action_spec, sizes)[0]
        loss = TensorTD3Loss(
            actor,
            critic,
            action_spec=action_spec[0],
            num_qvalue_nets=2,
            policy_noise=0.2,
            noise_clip=0.5,
            loss_function="l2",  # the recipe's and SB3's mean squared error
            delay_actor=True,
            delay_qvalue=True,
        )
    loss.make_value_estimator(gamma=0.99)
    target_updater = ForeachSoftUpdate(loss, tau=0.005)
    actor_optimizer = optim.adam(loss.actor_network_params.values(True, True), actor=True)
    critic_optimizer = optim.adam(loss.qvalue_network_params.values(True, True))
    optimizers = [actor_optimizer, critic_optimizer]
    if algo == "sac":
        optimizers.append(optim.adam([loss.log_alpha]))
    observation_dim, action_dim = observation_spec.shape[-1], action_spec.shape[-1]
    low, high = action_spec.space.low[0], action_spec.space.high[0]
    sample = TensorDict(
        {
            "observation": torch.randn(BATCH, observation_dim),
            "action": low + (high - low) * torch.rand(BATCH, action_dim),
            "next": {
                "observation": torch.randn(BATCH, observation_dim),
                "reward": torch.randn(BATCH, 1),
                "terminated": torch.zeros(BATCH, 1, dtype=torch.bool),
                "done": torch.zeros(BATCH, 1, dtype=torch.bool),
            },
        },
        [BATCH],
    )
    env.close()
    steps = [0]

    def sac_step() -> None:
        losses = loss(sample)
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        (losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]).backward()
        for optimizer in optimizers:
            optimizer.step()
        target_updater.step()

    def td3_step() -> None:
        steps[0] += 1
        loss_qvalue, _ = loss.value_loss(sample)
        critic_optimizer.zero_grad(set_to_none=True)
        loss_qvalue.backward()
        critic_optimizer.step()
        if steps[0] % 2 == 0:
            loss_actor, _ = loss.actor_loss(sample)
            actor_optimizer.zero_grad(set_to_none=True)
            loss_actor.backward()
            actor_optimizer.step()
            target_updater.step()

    return sac_step if algo == "sac" else td3_step


def sb3_update(algo: str, env_id: str) -> Callable[[], None]:
    import stable_baselines3

    model = getattr(stable_baselines3, algo.upper())(
        "MlpPolicy",
        env_id,
        learning_starts=0,
        batch_size=BATCH,
        policy_kwargs={"net_arch": list(SIZES[algo])},
        device="cpu",
        seed=0,
        verbose=0,
    )
    model.learn(BATCH + 10)
    torch.set_num_threads(1)  # SB3 sets torch's threads when it builds the model
    return lambda: model.train(gradient_steps=1, batch_size=BATCH)


def median_ms(step: Callable[[], None], steps: int) -> float:
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def compare(sides: dict[str, Callable[[], None]], rounds: int, steps: int) -> dict[str, float]:
    times: dict[str, list[float]] = {side: [] for side in sides}
    for _ in range(rounds):
        for side, step in sides.items():
            times[side].append(median_ms(step, steps))
    return {side: statistics.median(values) for side, values in times.items()}


def collect_cost(env_id: str, steps_per_env: int, frames: int) -> Callable[[], float]:
    """ms per frame of the off-policy collector with the SAC actor (one env)."""
    from agents import make_actor
    from envs import make_env
    from training import RunConfig
    from training.collectors import make_off_policy_collector

    def run() -> float:
        config = RunConfig(env_id=env_id, total_frames=frames + 512)
        env = make_env(env_id, 1, seed=0)
        actor = make_actor(
            env.observation_spec["observation"],
            env.action_spec,
            SIZES["sac"],
            "relu",
            state_dependent_scale=True,
        )
        collector = make_off_policy_collector(config, env, actor, steps_per_env, 0, torch.device("cpu"))
        seen, start = 0, None
        for batch in collector:
            seen += batch.numel()
            if start is None and seen >= 512:
                start, counted = time.perf_counter(), seen
        collector.shutdown()
        env.close()
        return (time.perf_counter() - start) / (seen - counted) * 1e3

    return run


def sb3_collect_cost(env_id: str, steps_per_env: int, frames: int) -> Callable[[], float]:
    """ms per frame of SB3 SAC's ``learn`` with no gradient steps (its collection with the policy)."""

    def run() -> float:
        from stable_baselines3 import SAC

        model = SAC(
            "MlpPolicy",
            env_id,
            learning_starts=0,
            gradient_steps=0,
            train_freq=steps_per_env,
            seed=0,
            verbose=0,
        )
        torch.set_num_threads(1)
        model.learn(512)
        start = time.perf_counter()
        model.learn(frames, reset_num_timesteps=False)
        return (time.perf_counter() - start) / frames * 1e3

    return run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algos", nargs="+", default=["sac", "td3"], choices=sorted(SIZES))
    parser.add_argument("--env-id", default="Hopper-v5")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--steps", type=int, default=100, help="updates (or frames, with --collect) per round"
    )
    parser.add_argument("--collect", action="store_true", help="time collection instead of updates")
    parser.add_argument("--steps-per-env", type=int, nargs="+", default=[1, 8])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{args.env_id}, one torch thread, median of {args.rounds} alternating rounds")
    if args.collect:
        print(
            "| collection | steps per batch | ours ms/frame | SB3 ms/frame | SB3 / ours |\n|---|---|---|---|---|"
        )
        for steps_per_env in args.steps_per_env:
            frames = max(args.steps, 8 * steps_per_env)
            sides = {
                "ours": collect_cost(args.env_id, steps_per_env, frames),
                "sb3": sb3_collect_cost(args.env_id, steps_per_env, frames),
            }
            times = {
                side: statistics.median(run() for _ in range(args.rounds)) for side, run in sides.items()
            }
            ratio = times["sb3"] / times["ours"]
            print(
                f"| SAC actor | {steps_per_env} | {times['ours']:.3f} | {times['sb3']:.3f} | {ratio:.2f}x |"
            )
        return
    print("| update | networks | ours ms | SB3 ms | SB3 / ours |\n|---|---|---|---|---|")
    for algo in args.algos:
        times = compare(
            {"ours": ours_update(algo, args.env_id), "sb3": sb3_update(algo, args.env_id)},
            args.rounds,
            args.steps,
        )
        sizes = "x".join(map(str, SIZES[algo]))
        print(
            f"| {algo} | {sizes} | {times['ours']:.2f} | {times['sb3']:.2f} | {times['sb3'] / times['ours']:.2f}x |"
        )


if __name__ == "__main__":
    main()
