"""Soft Actor-Critic (Haarnoja et al., 2018, arXiv:1812.05905), continuous and discrete (Christodoulou, 2019,
arXiv:1910.07207).

TorchRL's ``SACLoss`` (``DiscreteSACLoss`` for Discrete action spaces, chosen from the env): a tanh-normal
policy scaled to the Box bounds, twin Q networks evaluated as one vectorised ensemble, soft (Polyak) target
updates, and automatic entropy tuning towards a target entropy of ``-dim(A)`` (discrete: ``0.2 log(n)``). The first ``--learning-starts`` frames are random actions; after that every collected batch of
``num_envs * steps_per_env`` frames is followed by ``--updates-per-frame`` gradient steps per frame, drawn from a
replay buffer on ``--device``. Evaluation is deterministic (the policy's mean action, or its most likely action).

Each env's preset (recipes/presets/sac.toml, --list-presets) fills in the options not given; an env without
one gets the defaults below (the paper's: 256x256 ReLU, Adam 3e-4, batch 256, 10k random frames). Pendulum-v1's
preset (RL Zoo's budget, 20k frames, lr 1e-3, 64x64): see README for the return and the frames it takes. Discrete
SAC has settings of its own (DISCRETE_SETTINGS, applied by --discrete and by CartPole-v1's preset): CartPole-v1
reaches 475 within 8k-22k frames (seeds 0-5).

    python -m recipes.sac                                  # Pendulum-v1, with its preset
    python -m recipes.sac --env-id HalfCheetah-v5          # RL Zoo's MuJoCo settings
    python -m recipes.sac --list-presets                   # every preset
    python -m recipes.sac --use-sde                        # gSDE exploration
    python -m recipes.sac --env-id CartPole-v1 --discrete  # discrete SAC
    python -m recipes.sac --help                           # every option
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import gymnasium as gym
import torch
from torchrl.objectives import DiscreteSACLoss, SACLoss

from agents import (
    Agent,
    ForeachSoftUpdate,
    NStepReturns,
    TensorSACLoss,
    compiled,
    find_normalizer,
    make_actor,
    make_gsde_actor,
    make_qvalue_critic,
    without_log_prob,
)
from agents.continuous import check_box_actions, default_target_entropy
from agents.gsde import check_sde_options, make_gsde_env
from agents.loss_addons import LossAddon, LossAddonConfig, addon_losses, build_loss_addons, split_parameters
from agents.networks import check_log_std_bounds, refuse_action_masks, require_observation_values
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
    refuse_loss_addons,
    require_positive,
    run_cli,
    single_collector_only,
    warn_if_never_updated,
)
from training.presets import set_option

PRESETS = Path(__file__).with_name("presets") / "sac.toml"  # hyperparameters per env

DISCRETE_ENTROPY_WEIGHT = 0.2  # discrete SAC's target entropy, as a fraction of the uniform policy's log(n)


@dataclass
class BufferConfig(Options):
    buffer_size: int = 1_000_000
    """Replay buffer capacity in transitions."""
    batch_size: int = 256
    """Transitions per gradient step."""
    n_steps: int = 1
    """Look-ahead of the critics' targets: n-step returns cut at episode ends (1: one-step TD)."""


@dataclass
class LossConfig(Options):
    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak rate of the target Q networks (target <- (1 - tau) target + tau online, every update)."""
    alpha_init: float = 1.0
    """Initial entropy coefficient."""
    fixed_alpha: bool = False
    """Keep the entropy coefficient at --alpha-init instead of tuning it."""
    target_entropy: float | None = None
    """Entropy the coefficient is tuned towards, in the Box's units; default -dim(A) on actions rescaled to
    [-1, 1], as in the paper's code and Stable-Baselines3 (-dim(A) + sum log((high - low) / 2) in the Box's units),
    or 0.2 log(n) (Discrete, n actions)."""
    loss_function: Literal["l2", "smooth_l1"] = "l2"
    """Critic loss: squared error (as in the paper and Stable-Baselines3) or Huber."""
    log_prob_epsilon: float = 0.0
    """Box actions: the tanh correction of the actor's log-probability as log(1 - tanh(u)^2 + this);
    Stable-Baselines3's 1e-6 caps what a saturated action costs in entropy. 0: the exact correction (TorchRL's)."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (256, 256)
    """Hidden layer widths of the actor and of each Q network (the paper's; Pendulum-v1's preset: 64x64, as
    sample-efficient there at a third of the cost per update)."""
    activation: Literal["relu", "tanh", "elu", "silu"] = "relu"
    """Activation between hidden layers."""
    normalize_obs: bool = False
    """Normalise observations with running statistics saved in the agent (the actor's; the critics use them too)."""
    use_sde: bool = False
    """Box actions: explore with gSDE (state-dependent noise held for a while, Raffin et al. 2021)."""
    sde_sample_freq: int = -1
    """gSDE: resample the exploration noise every this many steps; -1: only at episode and batch starts."""
    sde_at_warmup: bool = False
    """gSDE: act with the gSDE policy during the --learning-starts warm-up too, instead of uniformly random
    actions (Stable-Baselines3's use_sde_at_warmup)."""
    log_std_bounds: tuple[float, ...] | None = None
    """Box actions: LOW HIGH: the policy's scale is exp(log std clamped to [LOW, HIGH]), Stable-Baselines3's and
    Spinning Up's head (-20 2); default: TorchRL's biased softplus with a floor of 1e-4."""


@dataclass
class SACConfig(Options):
    """SAC: off-policy maximum-entropy actor-critic."""

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
    discrete: bool = False
    """Require a Discrete action space (discrete SAC is chosen automatically for one; this makes it explicit). On
    the command line it also applies DISCRETE_SETTINGS to every option not given there."""
    collector: OffPolicyCollectorConfig = field(default_factory=OffPolicyCollectorConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OffPolicyOptimConfig = field(default_factory=defaults(OffPolicyOptimConfig, lr=3e-4))
    network: NetworkConfig = field(default_factory=NetworkConfig)
    addons: LossAddonConfig = field(default_factory=LossAddonConfig)

    def preset_skips(self) -> set[str]:
        """The options a preset leaves alone for this config: with --use-sde, those of the tanh-normal policy that
        a gSDE policy replaces (given explicitly, they are refused)."""
        return {"log_std_bounds", "log_prob_epsilon"} if self.network.use_sde else set()

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range or that do not combine."""
        self.run.validate()
        buffer, loss, optim = self.buffer, self.loss, self.optim
        require_positive(buffer_size=buffer.buffer_size, batch_size=buffer.batch_size, n_steps=buffer.n_steps)
        check_ranges(gamma=(loss.gamma, "(0, 1]"), tau=(loss.tau, "(0, 1]"))
        optim.validate()
        self.collector.validate()
        check_batch_fits_buffer(buffer.batch_size, buffer.buffer_size)
        check_ranges(
            alpha_init=(loss.alpha_init, "(0, inf)"), target_entropy=(loss.target_entropy, "(-inf, inf)")
        )
        check_sde_options(self.network.use_sde, self.network.sde_sample_freq)
        check_ranges(log_prob_epsilon=(loss.log_prob_epsilon, "[0, 1)"))
        check_log_std_bounds(self.network.log_std_bounds)
        if self.network.use_sde and (loss.log_prob_epsilon or self.network.log_std_bounds is not None):
            raise InputError(
                "--log-prob-epsilon and --log-std-bounds shape the tanh-normal policy; a --use-sde policy has "
                "its own noise: drop one of them."
            )
        if self.network.use_sde:
            single_collector_only(self.run, "--use-sde")
        elif self.network.sde_at_warmup:
            raise InputError("--sde-at-warmup acts with the gSDE policy during the warm-up: add --use-sde.")
        self.addons.validate()


# Discrete SAC's settings: they solve CartPole-v1 (475) within 8k-22k frames on seeds 0-5, where the Pendulum-v1
# defaults above plateau between 200 and 400. Wider layers than Pendulum's, a Huber critic loss with clipped
# gradients, 3-step targets, half an update per frame, a faster learning rate and target, one torch thread.
DISCRETE_SETTINGS = {
    "network.hidden_sizes": (128, 128),
    "optim.lr": 2e-3,
    "optim.max_grad_norm": 10.0,
    "loss.tau": 0.02,
    "loss.loss_function": "smooth_l1",
    "buffer.n_steps": 3,
    "buffer.batch_size": 128,
    "collector.updates_per_frame": 0.5,
    "collector.learning_starts": 1_000,
    "run.eval_every": 2_000,
    "run.threads": 1,  # 128-unit layers at batch 128: one thread is the fastest
}


def apply_discrete_settings(config: SACConfig, keep: Collection[str] = ()) -> SACConfig:
    """Set ``config``'s options to :data:`DISCRETE_SETTINGS` (and ``discrete``), except the option names in
    ``keep`` (e.g. those given on the command line); returns ``config``. They are set as a preset sets options,
    not counted as chosen by the user: on image observations the one thread meant for the 128-unit networks
    gives way to torch's default, as the recipe's own one-thread default does
    (:func:`training.seeding.threads_for_observations`)."""
    config.discrete = True
    for path, value in DISCRETE_SETTINGS.items():
        section, name = path.split(".")
        if name not in keep:
            set_option(config, (section, name), value)
    return config


@recipe_main
def main(
    config: SACConfig, loss_addons: Sequence[LossAddon] = (), *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Train SAC as configured and return the run summary (see ``training.run``); ``loss_addons`` are factories of
    extra actor-loss terms (:mod:`agents.loss_addons`), as in ``recipes.ppo``."""
    refuse_loss_addons(loss_addons, config.run)
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, buffer_config, loss_config, optim_config = (
        config.run,
        config.buffer,
        config.loss,
        config.optim,
    )
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    updates_per_batch = config.collector.updates_per_batch(frames_per_batch)

    # env
    env = make_training_env(run_config, device)
    discrete = isinstance(env.single_action_space, gym.spaces.Discrete)
    if config.discrete and not discrete:
        env.close()
        raise InputError(
            f"--discrete asks for a Discrete action space; {run_config.env_id} has {env.single_action_space}."
        )
    if discrete and config.network.use_sde:
        env.close()
        raise InputError("--use-sde is for Box actions; drop it for discrete SAC.")
    if discrete and not config.discrete:
        warnings.warn(
            f"{run_config.env_id} has Discrete actions: discrete SAC runs with the settings meant for Box actions "
            "(the paper's continuous-control defaults or this env's preset). Add --discrete for the settings tuned "
            "for Discrete actions (from Python: recipes.sac.apply_discrete_settings(config)).",
            stacklevel=2,
        )
    try:
        require_observation_values(env.observation_spec["observation"], "SAC")
        refuse_action_masks(env, "SAC")
        if not discrete:
            check_box_actions(env.action_spec, "SAC")
    except InputError:
        env.close()
        raise
    action_dim = env.action_spec.shape[-1] if not discrete else env.action_spec.space.n
    target = loss_config.target_entropy
    if (
        discrete
        and target is not None
        and not loss_config.fixed_alpha
        and not 0 <= target < math.log(action_dim)
    ):
        env.close()
        raise InputError(
            f"--target-entropy {target} is outside [0, log {action_dim} = {math.log(action_dim):.3f}), the entropies a "
            f"policy over {action_dim} actions can have short of uniform: the coefficient would "
            f"{'grow' if target > 0 else 'shrink'} without end. The default is {DISCRETE_ENTROPY_WEIGHT} log(n) = "
            f"{DISCRETE_ENTROPY_WEIGHT * math.log(action_dim):.3f}."
        )
    observation_spec = env.observation_spec["observation"]

    # modules: the agent owns the actor; the loss copies the critic into its twin Q networks and their targets
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
    }
    if config.network.normalize_obs:
        policy_kwargs["normalize_obs"] = True
    use_sde = config.network.use_sde
    if use_sde:  # gSDE, squashed into the Box like the tanh-normal policy
        policy_kwargs["squash"] = True
    elif not discrete:
        policy_kwargs["state_dependent_scale"] = True
        if config.network.log_std_bounds is not None:
            policy_kwargs["log_std_bounds"] = list(check_log_std_bounds(config.network.log_std_bounds))
    if discrete and (loss_config.log_prob_epsilon or config.network.log_std_bounds is not None):
        env.close()
        raise InputError(
            f"--log-prob-epsilon and --log-std-bounds shape a tanh-normal policy over Box actions; "
            f"{run_config.env_id} has Discrete actions: drop them."
        )
    make_policy = make_gsde_actor if use_sde else make_actor
    policy = make_policy(observation_spec, env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "sac",
        policy_builder=make_policy,
        policy_kwargs=policy_kwargs,
    )
    actor = agent.policy
    normalizer = find_normalizer(actor)
    if use_sde:
        # noise matrices kept as env state, resampled at episode starts and every --sde-sample-freq steps
        env = make_gsde_env(env, actor, config.network.sde_sample_freq, config.collector.steps_per_env)
    critic = make_qvalue_critic(
        observation_spec,
        env.action_spec,
        config.network.hidden_sizes,
        config.network.activation,
        normalizer=normalizer,
    ).to(device)

    # loss + value estimator + target updater
    common = {
        "num_qvalue_nets": 2,
        "loss_function": loss_config.loss_function,
        "alpha_init": loss_config.alpha_init,
        "fixed_alpha": loss_config.fixed_alpha,
        "delay_qvalue": True,
    }
    if discrete:
        loss_module = DiscreteSACLoss(
            actor,
            critic,
            action_space=env.action_spec,
            num_actions=action_dim,
            # 0.2 log(n): the weight of TorchRL's CartPole example; the paper's 0.98 keeps two actions near uniform
            target_entropy=DISCRETE_ENTROPY_WEIGHT * math.log(action_dim)
            if loss_config.target_entropy is None
            else loss_config.target_entropy,
            **common,
        )
    else:
        # TensorSACLoss runs the tanh-normal actor's network directly; a gSDE actor goes through SACLoss
        loss_class = SACLoss if use_sde else TensorSACLoss
        if not use_sde:
            common["log_prob_epsilon"] = loss_config.log_prob_epsilon
        loss_module = loss_class(
            actor,
            critic,
            action_spec=env.action_spec,
            target_entropy=default_target_entropy(env.action_spec)
            if loss_config.target_entropy is None
            else loss_config.target_entropy,
            delay_actor=False,
            **common,
        )
    loss_module.make_value_estimator(gamma=loss_config.gamma)
    target_updater = ForeachSoftUpdate(loss_module, tau=loss_config.tau)
    # extra actor-loss terms, e.g. a KL penalty (given in Python, or by --kl-to)
    loss_addons = [
        *loss_addons,
        *config.addons.factories(env.single_observation_space, env.single_action_space),
    ]
    addons = build_loss_addons(loss_addons, actor).to(device)

    # collector: uniformly random actions until learning starts (--sde-at-warmup: the gSDE policy's); the loss
    # draws its own actions, so the collected batches leave out the log-probability
    random_frames = 0 if config.network.sde_at_warmup else config.collector.learning_starts
    collector = make_off_policy_collector(
        run_config, env, without_log_prob(actor), frames_per_batch, random_frames, device
    )

    # buffer
    replay_buffer = LeanReplayBuffer(
        storage=off_policy_storage(
            buffer_config.buffer_size, run_config.total_frames, frames_per_batch, observation_spec, device
        ),
        batch_size=buffer_config.batch_size,
    )
    n_step_returns = NStepReturns(buffer_config.n_steps, loss_config.gamma)  # n_steps 1: one-step transitions

    # optimizer: one Adam each for the actor, the critics and the entropy coefficient (the paper's setup)
    actor_parameters = list(loss_module.actor_network_params.values(True, True))
    critic_parameters = list(loss_module.qvalue_network_params.values(True, True))
    optimizers = [optim_config.adam(actor_parameters, actor=True), optim_config.adam(critic_parameters)]
    learning_rates = [optim_config.actor_learning_rate, optim_config.lr]
    if not loss_config.fixed_alpha:
        optimizers.append(optim_config.adam([loss_module.log_alpha]))
        learning_rates.append(optim_config.lr)
    _, addon_parameters = split_parameters([actor], [addons])  # an add-on's own (a learned multiplier, say)
    if addon_parameters:
        optimizers.append(optim_config.adam(addon_parameters, actor=True))
        learning_rates.append(optim_config.actor_learning_rate)

    # logger, evaluation, checkpoints, resume
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "addons": addons},
        optimizers={f"adam{index}": optimizer for index, optimizer in enumerate(optimizers)},
        replay_buffer=replay_buffer,
        extras={"n_step_returns": n_step_returns} if buffer_config.n_steps > 1 else {},
    )
    run = Run("sac", config, run_config, agent, training, callbacks=callbacks)

    learning_starts, max_grad_norm = config.collector.learning_starts, optim_config.max_grad_norm
    clip = max_grad_norm != float("inf")

    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(sample):
        loss = loss_fn(sample)
        addon_total, addon_metrics = addon_losses(addons, sample)
        total = loss["loss_actor"] + loss["loss_qvalue"] + loss["loss_alpha"] + addon_total
        for optimizer in optimizers:
            optimizer.zero_grad(set_to_none=True)
        total.backward()
        for index, optimizer in enumerate(optimizers):
            if clip and index < 2:  # the actor's and the critics' (the entropy coefficient's is not clipped)
                clip_and_step(optimizer, max_grad_norm)
            else:
                optimizer.step()
        target_updater.step()
        logged = {
            key: loss.get(key).detach()
            for key in ("loss_actor", "loss_qvalue", "loss_alpha", "alpha", "entropy")
        }
        return {**logged, **dict(addon_metrics.items())}

    # loop
    frames = run.frames  # 0, or where a resumed run stopped
    for batch in collector:
        frames += batch.numel()
        n_step_returns.extend(replay_buffer, batch)
        if normalizer is not None:  # the buffer keeps raw observations, normalised with the latest statistics
            normalizer.update(batch.get("observation"))
        metrics = {}
        if optim_config.anneal_lr:
            anneal_learning_rates(optimizers, learning_rates, frames / run_config.total_frames)
        if frames >= learning_starts and len(replay_buffer) >= buffer_config.batch_size:
            metrics = mean_metrics(
                [update(replay_buffer.sample()) for _ in range(updates_per_batch)], "train/"
            )
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    warn_if_never_updated(
        run.frames, learning_starts, len(replay_buffer), buffer_config.batch_size, buffer_config.n_steps
    )
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(
        main,
        SACConfig,
        __doc__,
        presets=PRESETS,
        adjust=lambda config, given: (
            apply_discrete_settings(config, keep=given) if config.discrete else config
        ),
    )
