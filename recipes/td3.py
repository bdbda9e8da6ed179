"""Twin Delayed DDPG (TD3; Fujimoto, van Hoof and Meger, 2018, arXiv:1802.09477).

TorchRL's ``TD3Loss``: a deterministic tanh-squashed actor, twin Q networks whose smaller target value is
bootstrapped (clipped double Q), target policy smoothing (clipped Gaussian noise on the target action), and
delayed updates: the actor and all target networks move once every ``--policy-delay`` critic updates, the
targets by Polyak averaging. Exploration adds Gaussian (``--noise gaussian``, the paper's) or Ornstein-Uhlenbeck
(``--noise ou``, reset at every episode start) noise to the action in the env (never in evaluation).
The first ``--learning-starts`` frames are random actions; then every collected batch is followed by
``--updates-per-frame`` critic updates per frame from a replay buffer on ``--device``.

Noise scales are relative to the half-width of the Box (Stable-Baselines3's convention): on Pendulum-v1's
``[-2, 2]``, ``--noise-sigma 0.1`` is a standard deviation of 0.2.

Each env's preset (recipes/presets/td3.toml, --list-presets) fills in the options not given; an env without one
gets the defaults below (400x300 ReLU, Adam 1e-3, batch 256, 10k random frames, as in Stable-Baselines3).

    python -m recipes.td3                     # Pendulum-v1, with its preset (20k frames, 64x64)
    python -m recipes.td3 --list-presets      # every preset
    python -m recipes.td3 --help              # every option
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from agents import (
    TRANSITION_KEYS,
    Agent,
    ForeachSoftUpdate,
    TensorTD3Loss,
    compiled,
    find_normalizer,
    make_deterministic_actor,
    make_exploration_env,
    make_qvalue_critic,
)
from agents.continuous import check_box_actions, noise_scale
from agents.options import Options, defaults
from errors import InputError
from training import (
    Callback,
    LeanReplayBuffer,
    OffPolicyCollectorConfig,
    OffPolicyOptimConfig,
    Run,
    RunConfig,
    TrainingState,
    anneal_learning_rates,
    apply_preset,
    check_batch_fits_buffer,
    check_ranges,
    clip_and_step,
    make_off_policy_collector,
    make_training_env,
    off_policy_storage,
    prepare_process,
    recipe_main,
    require_positive,
    run_cli,
    single_collector_only,
    warn_if_never_updated,
)

PRESETS = Path(__file__).with_name("presets") / "td3.toml"  # hyperparameters per env


@dataclass
class BufferConfig(Options):
    buffer_size: int = 1_000_000
    """Replay buffer capacity in transitions."""
    batch_size: int = 256
    """Transitions per gradient step."""


@dataclass
class LossConfig(Options):
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target networks."""
    policy_delay: int = 2
    """Critic updates per actor and target update."""
    target_noise: float = 0.2
    """Standard deviation of the target policy smoothing noise, relative to the Box half-width."""
    target_noise_clip: float = 0.5
    """Clip of the target policy smoothing noise, relative to the Box half-width."""
    loss_function: Literal["l2", "smooth_l1"] = "l2"
    """Critic loss: squared error (as in the paper) or Huber."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (400, 300)
    """Hidden layer widths of the actor and of each Q network (the paper's; Pendulum-v1's preset: 64x64, as
    sample-efficient there at a third of the cost per update)."""
    activation: Literal["relu", "tanh", "elu", "silu"] = "relu"
    """Activation between hidden layers."""
    normalize_obs: bool = False
    """Normalise observations with running statistics saved in the agent (the actor's; the critics use them too)."""
    noise: Literal["gaussian", "ou"] = "gaussian"
    """Exploration noise: independent Gaussian, or temporally correlated Ornstein-Uhlenbeck."""
    noise_sigma: float = 0.1
    """Standard deviation of the exploration noise, relative to the Box half-width."""
    ou_theta: float = 0.15
    """Ornstein-Uhlenbeck mean-reversion rate."""


@dataclass
class TD3Config(Options):
    """TD3: clipped double-Q DDPG with target policy smoothing and delayed actor updates."""

    run: RunConfig = field(
        default_factory=defaults(
            RunConfig,
            env_id="Pendulum-v1",
            num_envs=1,
            total_frames=1_000_000,
            eval_every=25_000,
            threads=0,  # torch's default (all cores): 256- and 400x300-unit updates run 1.5-1.7x faster on two threads than on one
        )
    )
    collector: OffPolicyCollectorConfig = field(default_factory=OffPolicyCollectorConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OffPolicyOptimConfig = field(default_factory=OffPolicyOptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range."""
        self.run.validate()
        buffer, loss = self.buffer, self.loss
        require_positive(
            buffer_size=buffer.buffer_size, batch_size=buffer.batch_size, policy_delay=loss.policy_delay
        )
        check_ranges(gamma=(loss.gamma, "(0, 1]"), tau=(loss.tau, "(0, 1]"))
        self.optim.validate()
        self.collector.validate()
        check_batch_fits_buffer(buffer.batch_size, buffer.buffer_size)
        check_ranges(
            target_noise=(loss.target_noise, "[0, inf)"), target_noise_clip=(loss.target_noise_clip, ">= 0")
        )
        if self.network.noise == "ou":
            single_collector_only(self.run, "--noise ou")
        network = self.network
        check_ranges(noise_sigma=(network.noise_sigma, "[0, inf)"), ou_theta=(network.ou_theta, "(0, inf)"))
        if network.noise != "ou" and network.ou_theta != NetworkConfig.ou_theta:
            raise InputError(
                f"--ou-theta is for --noise ou: add --noise ou, or drop --ou-theta {network.ou_theta}."
            )


@recipe_main
def main(config: TD3Config, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train TD3 as configured and return the run summary (see ``training.run``)."""
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, buffer_config, loss_config = config.run, config.buffer, config.loss
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    updates_per_batch = config.collector.updates_per_batch(frames_per_batch)

    # env: Ornstein-Uhlenbeck noise resets on the env's episode-start flag
    env = make_training_env(run_config, device)
    try:
        action_spec = check_box_actions(env.action_spec, "TD3")
    except InputError:
        env.close()
        raise
    env = make_exploration_env(env, config.network.noise)
    observation_spec = env.observation_spec["observation"]

    # modules: the agent owns the noisy policy; the loss trains its deterministic actor and twin critics
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "noise": config.network.noise,
        "noise_sigma": config.network.noise_sigma,
        "ou_theta": config.network.ou_theta,
    }
    if config.network.normalize_obs:
        policy_kwargs["normalize_obs"] = True
    policy = make_deterministic_actor(observation_spec, env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "td3",
        policy_builder=make_deterministic_actor,
        policy_kwargs=policy_kwargs,
    )
    actor = policy[0]
    normalizer = find_normalizer(policy)
    critic = make_qvalue_critic(
        observation_spec,
        action_spec,
        config.network.hidden_sizes,
        config.network.activation,
        normalizer=normalizer,
    ).to(device)

    # loss + value estimator + target updater
    loss_module = TensorTD3Loss(
        actor,
        critic,
        action_spec=action_spec[0],  # one env's bounds: the target action is clamped to them
        num_qvalue_nets=2,
        policy_noise=noise_scale(loss_config.target_noise, action_spec),  # per action dim, on its device
        noise_clip=noise_scale(loss_config.target_noise_clip, action_spec),
        loss_function=loss_config.loss_function,
        delay_actor=True,
        delay_qvalue=True,
    )
    loss_module.make_value_estimator(gamma=loss_config.gamma)
    target_updater = ForeachSoftUpdate(loss_module, tau=loss_config.tau)

    # collector: uniformly random actions until learning starts
    collector = make_off_policy_collector(
        run_config, env, policy, frames_per_batch, config.collector.learning_starts, device
    )

    # buffer
    replay_buffer = LeanReplayBuffer(
        storage=off_policy_storage(
            buffer_config.buffer_size, run_config.total_frames, frames_per_batch, observation_spec, device
        ),
        batch_size=buffer_config.batch_size,
    )

    # optimizer
    optim_config = config.optim
    actor_parameters = list(loss_module.actor_network_params.values(True, True))
    critic_parameters = list(loss_module.qvalue_network_params.values(True, True))
    actor_optimizer = optim_config.adam(actor_parameters, actor=True)
    critic_optimizer = optim_config.adam(critic_parameters)

    # logger, evaluation, checkpoints
    counters = {"updates": 0}  # gradient steps taken: the actor learns on every policy_delay-th
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "policy": policy},
        optimizers={"actor": actor_optimizer, "critic": critic_optimizer},
        replay_buffer=replay_buffer,
        counters=counters,
    )
    run = Run("td3", config, run_config, agent, training, callbacks=callbacks)

    learning_starts, policy_delay = config.collector.learning_starts, loss_config.policy_delay
    max_grad_norm = optim_config.max_grad_norm
    clip = max_grad_norm != float("inf")

    # --compile: the critic's and the actor's loss, forward and backward
    value_loss = compiled(loss_module.value_loss, run_config.compile)
    actor_loss = compiled(loss_module.actor_loss, run_config.compile)

    def update(sample, update_actor: bool):
        loss_qvalue, _ = value_loss(sample)
        critic_optimizer.zero_grad(set_to_none=True)
        loss_qvalue.backward()
        if clip:
            clip_and_step(critic_optimizer, max_grad_norm)
        else:
            critic_optimizer.step()
        if not update_actor:
            return loss_qvalue.detach(), None
        loss_actor, _ = actor_loss(sample)
        actor_optimizer.zero_grad(set_to_none=True)
        loss_actor.backward()
        if clip:
            clip_and_step(actor_optimizer, max_grad_norm)
        else:
            actor_optimizer.step()
        target_updater.step()
        return loss_qvalue.detach(), loss_actor.detach()

    # loop
    frames = run.frames  # 0, or where a resumed run stopped
    for batch in collector:
        frames += batch.numel()
        replay_buffer.extend_selected(batch, TRANSITION_KEYS)
        if normalizer is not None:  # the buffer keeps raw observations, normalised with the latest statistics
            normalizer.update(batch.get("observation"))
        metrics = {}
        if optim_config.anneal_lr:
            anneal_learning_rates(
                [actor_optimizer, critic_optimizer],
                [optim_config.actor_learning_rate, optim_config.lr],
                frames / run_config.total_frames,
            )
        if frames >= learning_starts and len(replay_buffer) >= buffer_config.batch_size:
            critic_losses, actor_losses = [], []
            for _ in range(updates_per_batch):
                counters["updates"] += 1
                loss_qvalue, loss_actor = update(
                    replay_buffer.sample(), counters["updates"] % policy_delay == 0
                )
                critic_losses.append(loss_qvalue)
                if loss_actor is not None:
                    actor_losses.append(loss_actor)
            metrics["train/loss_qvalue"] = torch.stack(critic_losses).mean().item()
            if actor_losses:
                metrics["train/loss_actor"] = torch.stack(actor_losses).mean().item()
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    warn_if_never_updated(run.frames, learning_starts, len(replay_buffer), buffer_config.batch_size)
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, TD3Config, __doc__, presets=PRESETS)
