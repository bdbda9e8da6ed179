"""Deep Deterministic Policy Gradient (DDPG; Lillicrap et al., 2016, arXiv:1509.02971).

TorchRL's ``DDPGLoss``: a deterministic tanh-squashed actor trained to maximise ``Q(s, mu(s))``, one Q network
trained on TD(0) targets from target copies of both networks, which follow by Polyak averaging after every
update. Exploration adds Gaussian (``--noise gaussian``, as in TD3 and RL Zoo) or Ornstein-Uhlenbeck
(``--noise ou``, the paper's choice, reset at every episode start) noise to the action in the env, never in
evaluation. The first ``--learning-starts`` frames are random actions; then every collected batch is followed by
``--updates-per-frame`` updates per frame from a replay buffer on ``--device``.

Noise scales are relative to the half-width of the Box (Stable-Baselines3's convention): on Pendulum-v1's
``[-2, 2]``, ``--noise-sigma 0.1`` is a standard deviation of 0.2.

Each env's preset (recipes/presets/ddpg.toml, --list-presets) fills in the options not given; an env without one
gets the defaults below (400x300 ReLU, Adam 1e-3, batch 256, 10k random frames, as in Stable-Baselines3).

    python -m recipes.ddpg                    # Pendulum-v1, with its preset (20k frames, 64x64), Gaussian noise
    python -m recipes.ddpg --list-presets     # every preset
    python -m recipes.ddpg --noise ou         # Ornstein-Uhlenbeck noise
    python -m recipes.ddpg --help             # every option
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
    TensorDDPGLoss,
    compiled,
    find_normalizer,
    make_deterministic_actor,
    make_exploration_env,
    make_qvalue_critic,
)
from agents.continuous import check_box_actions
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
    mean_metrics,
    off_policy_storage,
    prepare_process,
    recipe_main,
    require_positive,
    run_cli,
    single_collector_only,
    warn_if_never_updated,
)

PRESETS = Path(__file__).with_name("presets") / "ddpg.toml"  # hyperparameters per env


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
class DDPGConfig(Options):
    """DDPG: deterministic policy gradient with a learned Q function."""

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
        """Raise :class:`InputError` for options outside their meaningful range or that do not combine."""
        self.run.validate()
        buffer, loss = self.buffer, self.loss
        require_positive(buffer_size=buffer.buffer_size, batch_size=buffer.batch_size)
        check_ranges(gamma=(loss.gamma, "(0, 1]"), tau=(loss.tau, "(0, 1]"))
        self.optim.validate()
        self.collector.validate()
        check_batch_fits_buffer(buffer.batch_size, buffer.buffer_size)
        if self.network.noise == "ou":
            single_collector_only(self.run, "--noise ou")
        network = self.network
        check_ranges(noise_sigma=(network.noise_sigma, "[0, inf)"), ou_theta=(network.ou_theta, "(0, inf)"))
        if network.noise != "ou" and network.ou_theta != NetworkConfig.ou_theta:
            raise InputError(
                f"--ou-theta is for --noise ou: add --noise ou, or drop --ou-theta {network.ou_theta}."
            )


@recipe_main
def main(config: DDPGConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train DDPG as configured and return the run summary (see ``training.run``)."""
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, buffer_config, loss_config, network_config = (
        config.run,
        config.buffer,
        config.loss,
        config.network,
    )
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    updates_per_batch = config.collector.updates_per_batch(frames_per_batch)

    # env: Ornstein-Uhlenbeck noise resets on the env's episode-start flag
    env = make_training_env(run_config, device)
    try:
        action_spec = check_box_actions(env.action_spec, "DDPG")
    except InputError:
        env.close()
        raise
    env = make_exploration_env(env, network_config.noise)
    observation_spec = env.observation_spec["observation"]

    # modules: the agent owns the noisy policy; the loss trains its deterministic actor and the critic
    policy_kwargs = {
        "hidden_sizes": list(network_config.hidden_sizes),
        "activation": network_config.activation,
        "noise": network_config.noise,
        "noise_sigma": network_config.noise_sigma,
        "ou_theta": network_config.ou_theta,
    }
    if network_config.normalize_obs:
        policy_kwargs["normalize_obs"] = True
    policy = make_deterministic_actor(observation_spec, env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "ddpg",
        policy_builder=make_deterministic_actor,
        policy_kwargs=policy_kwargs,
    )
    actor = policy[0]
    normalizer = find_normalizer(policy)
    critic = make_qvalue_critic(
        observation_spec,
        action_spec,
        network_config.hidden_sizes,
        network_config.activation,
        normalizer=normalizer,
    ).to(device)

    # loss + value estimator + target updater
    loss_module = TensorDDPGLoss(
        actor, critic, loss_function=loss_config.loss_function, delay_actor=True, delay_value=True
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
    critic_parameters = list(loss_module.value_network_params.values(True, True))
    actor_optimizer = optim_config.adam(actor_parameters, actor=True)
    critic_optimizer = optim_config.adam(critic_parameters)

    # logger, evaluation, checkpoints, resume
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "policy": policy},
        optimizers={"actor": actor_optimizer, "critic": critic_optimizer},
        replay_buffer=replay_buffer,
    )
    run = Run("ddpg", config, run_config, agent, training, callbacks=callbacks)

    learning_starts = config.collector.learning_starts
    max_grad_norm = optim_config.max_grad_norm
    clip = max_grad_norm != float("inf")

    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(sample):
        loss = loss_fn(sample)
        actor_optimizer.zero_grad(set_to_none=True)
        critic_optimizer.zero_grad(set_to_none=True)
        (loss["loss_actor"] + loss["loss_value"]).backward()  # each term reaches only its own network
        for optimizer in (actor_optimizer, critic_optimizer):
            if clip:
                clip_and_step(optimizer, max_grad_norm)
            else:
                optimizer.step()
        target_updater.step()
        return {key: loss.get(key).detach() for key in ("loss_actor", "loss_value")}

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
            metrics = mean_metrics(
                [update(replay_buffer.sample()) for _ in range(updates_per_batch)], "train/"
            )
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    warn_if_never_updated(run.frames, learning_starts, len(replay_buffer), buffer_config.batch_size)
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, DDPGConfig, __doc__, presets=PRESETS)
