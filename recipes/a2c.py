"""Advantage actor-critic, A2C: the synchronous variant of A3C (Mnih et al., 2016, "Asynchronous methods for
deep reinforcement learning", arXiv:1602.01783).

Every ``--num-envs`` env takes ``--steps-per-env`` (n) steps; each step's advantage is its n-step return (the
discounted rewards to the end of the segment plus the discounted critic value there) minus V(s_t), from
TorchRL's ``TD1Estimator`` (or GAE with ``--gae-lambda``); both stop at terminations and bootstrap from V(s')
at time-limit truncations. One gradient step on TorchRL's ``A2CLoss`` per batch: -mean log pi(a|s) A -
entropy_coef * entropy + critic_coef * mean (V(s) - target)^2, with RMSprop (or Adam), gradient clipping and
optional linear learning-rate annealing. Actor and critic are separate networks, or share their hidden layers
with ``--shared-network``. Discrete (categorical policy) and Box (tanh-normal policy) action spaces; for Box
actions, --use-sde explores with gSDE instead (Raffin et al., 2021, arXiv:2005.05719; agents/gsde.py).
--recurrent lstm|gru gives the policy memory (agents/recurrent.py): each update runs the recurrent layer over
every env's steps of the batch from the state stored at their first step.

Each env's preset (recipes/presets/a2c.toml, --list-presets) fills in the options not given; an env without
one gets the defaults below (Stable-Baselines3's: 8 envs x 5 steps, RMSprop 7e-4, 64x64 tanh). CartPole-v1's preset
(16 envs x 8 steps, RMSprop 2e-3, no entropy bonus) solves it (deterministic evaluation mean >= 475 over 20
episodes) within its 200k-frame budget: at 40k, 50k, 50k, 10k and 30k frames for seeds 0-4, 3-17 s on one core
of a shared 2-core CPU (``--shared-network``: 190k for seed 0). Pendulum-v1's preset reaches -180 to -197 at
100k-150k frames for seeds 0-4 (9-20 s; a random policy scores about -1200): 128 envs x 4 steps, gamma 0.9, GAE
lambda 0.95, rewards scaled by 0.1 (the critic cannot fit returns of -100 in a few hundred updates otherwise),
entropy bonus 0.01 (without it 3 seeds of 6 collapsed to a saturated policy near -1600), RMSprop 3e-3,
observation normalisation.

    python -m recipes.a2c                      # CartPole-v1, with its preset
    python -m recipes.a2c --list-presets       # every preset
    python -m recipes.a2c --help               # every option
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torchrl.modules import ValueOperator, set_recurrent_mode
from torchrl.objectives import A2CLoss

from agents import (
    Agent,
    OneCallGAE,
    OneCallTD1,
    RewardNormalizer,
    compiled,
    find_normalizer,
    input_encoder,
    make_actor,
    make_critic,
    make_gsde_actor,
    make_gsde_env,
    make_recurrent_critic,
    orthogonal_init,
)
from agents.gsde import check_sde_options, clip_env_actions
from agents.loss_addons import LossAddon, LossAddonConfig, addon_losses, build_loss_addons, split_parameters
from agents.networks import action_mask_kwargs, box_policy_kwargs, critic_on_cnn_trunk
from agents.options import Options, defaults
from agents.policy_gradient import make_shared_critic
from agents.recurrent import make_recurrent_env, recurrent_kwargs
from errors import InputError
from recipes.ppo import RECURRENT_SIZE, check_recurrent_run
from training import (
    Callback,
    Learner,
    Run,
    RunConfig,
    TrainingState,
    WorkerSession,
    apply_preset,
    check_gradient_workers,
    check_ranges,
    make_collector,
    make_training_env,
    prepare_process,
    recipe_main,
    refuse_loss_addons,
    require_positive,
    run_cli,
    set_learning_rates,
    single_collector_only,
    train_on_gradient_workers,
)

PRESETS = Path(__file__).with_name("presets") / "a2c.toml"  # hyperparameters per env

# RMSprop as in Stable-Baselines3's A2C (smoothing constant of the squared-gradient average)
RMSPROP_ALPHA = 0.99


@dataclass
class CollectorConfig(Options):
    steps_per_env: int = 5
    """Steps each env takes per update: the n of the n-step returns (frames per batch = num_envs * n)."""


@dataclass
class LossConfig(Options):
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float | None = None
    """GAE lambda; None or 1: plain n-step returns (TD(1) over each env's segment)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    critic_coef: float = 0.5
    """Weight of the value loss."""
    reward_scale: float = 1.0
    """Multiply rewards by this before computing returns: sets the scale of the values the critic fits (logged
    episode returns stay unscaled)."""
    normalize_reward: bool = False
    """Divide rewards by the running standard deviation of the discounted return (Stable-Baselines3's
    VecNormalize(norm_reward=True)), after --reward-scale; evaluations and logged returns keep the env's rewards."""


@dataclass
class OptimConfig(Options):
    optimizer: Literal["rmsprop", "adam"] = "rmsprop"
    """RMSprop (alpha 0.99, as in Stable-Baselines3) or Adam."""
    lr: float = 7e-4
    """Learning rate (of the actor and, with --shared-network, the shared layers; of the critic unless
    --critic-lr is given)."""
    critic_lr: float | None = None
    """Learning rate of the critic; default: --lr."""
    optimizer_eps: float = 1e-5
    """Epsilon of RMSprop or Adam (1e-5 as in Stable-Baselines3)."""
    anneal_lr: bool = False
    """Anneal the learning rates linearly to 0 over the budget."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this value."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "tanh"
    """Activation between hidden layers."""
    shared_network: bool = False
    """Actor and critic share their hidden layers (each keeps its own output layer)."""
    normalize_obs: bool = False
    """Normalise observations with running statistics saved in the agent."""
    ortho_init: bool = False
    """Orthogonal initialisation as Stable-Baselines3's (gain sqrt(2), policy output 0.01, value output 1)."""
    log_std_init: float = 0.0
    """Box actions: the logarithm of the policy's first standard deviation (its Gaussian's scale, or gSDE's sigma)."""
    squash: bool = True
    """Box actions: a tanh-normal policy squashed into the bounds; --no-squash: an unbounded Gaussian whose actions
    the env clips to the Box (Stable-Baselines3's PPO and A2C; gSDE policies are unsquashed either way)."""
    use_sde: bool = False
    """Box actions: explore with gSDE (state-dependent noise, Raffin et al. 2021), not a tanh-normal policy."""
    sde_sample_freq: int = -1
    """gSDE: resample the exploration noise every this many steps; -1: only at episode and batch starts."""
    recurrent: Literal["lstm", "gru"] | None = None
    """Give the policy memory (partially observed envs): an LSTM or GRU layer between the observation encoder and
    the MLP, shared with the critic, its state carried from step to step and reset at each episode's start; each
    update runs it over every env's steps of the batch from the state stored at their first."""
    recurrent_size: int = RECURRENT_SIZE
    """Units of the --recurrent layer."""


@dataclass
class A2CConfig(Options):
    """A2C: synchronous advantage actor-critic with n-step returns."""

    GRADIENT_SPLIT: ClassVar[tuple[str, ...]] = ()  # gradient workers share out the envs; one step per batch

    run: RunConfig = field(
        default_factory=defaults(RunConfig, num_envs=8, total_frames=1_000_000, eval_every=25_000)
    )
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    addons: LossAddonConfig = field(default_factory=LossAddonConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range or that do not combine."""
        self.run.validate()
        self.addons.validate()
        loss, optim = self.loss, self.optim
        require_positive(steps_per_env=self.collector.steps_per_env)
        check_ranges(
            lr=(optim.lr, "(0, inf)"),
            max_grad_norm=(optim.max_grad_norm, "> 0"),
            gamma=(loss.gamma, "(0, 1]"),
            gae_lambda=(loss.gae_lambda, "[0, 1]"),  # None: n-step returns
            entropy_coef=(loss.entropy_coef, "[0, inf)"),
            critic_coef=(loss.critic_coef, "(0, inf)"),
            reward_scale=(loss.reward_scale, "(0, inf)"),
            critic_lr=(optim.critic_lr, "(0, inf)"),
            optimizer_eps=(optim.optimizer_eps, "(0, inf)"),
        )
        check_sde_options(self.network.use_sde, self.network.sde_sample_freq)
        if self.network.use_sde:
            single_collector_only(self.run, "--use-sde")
        network = self.network
        check_recurrent_run(self.run, network.recurrent, network.recurrent_size, network.use_sde)
        if network.recurrent is not None and network.shared_network:
            raise InputError(
                "--recurrent already shares the encoder and recurrent layer; drop --shared-network."
            )
        check_gradient_workers(self)


def make_advantage_module(
    critic: ValueOperator,
    gamma: float,
    gae_lambda: float | None,
    device: torch.device,
    collected_values: bool = False,
) -> OneCallTD1 | OneCallGAE:
    """n-step returns (TD(1) to the end of each env's segment) for ``gae_lambda`` None or 1, else GAE.

    Both write ``"advantage"`` and ``"value_target"``, stop at terminations and bootstrap from the critic at
    time-limit truncations and at the end of the segment; with ``collected_values`` they read the values of the
    batch's observations that the collector wrote (see :mod:`agents.advantages`).
    """
    if gae_lambda is None or gae_lambda == 1.0:
        return OneCallTD1(gamma=gamma, value_network=critic, device=device, collected_values=collected_values)
    return OneCallGAE(
        gamma=gamma,
        lmbda=gae_lambda,
        value_network=critic,
        average_gae=False,
        device=device,
        collected_values=collected_values,
    )


@recipe_main
def main(
    config: A2CConfig, loss_addons: Sequence[LossAddon] = (), *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Train A2C as configured and return the run summary (see ``training.run``).

    ``loss_addons`` are factories of extra policy-loss terms (:mod:`agents.loss_addons`), as in ``recipes.ppo``.
    """
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    refuse_loss_addons(loss_addons, config.run)
    run_config, loss_config, optim_config = config.run, config.loss, config.optim
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    num_batches = -(-run_config.total_frames // frames_per_batch)

    # env
    env = make_training_env(run_config, device)
    observation_spec = env.observation_spec["observation"]

    # modules: the agent owns the actor (and the observation normaliser); the critic shares its input encoder,
    # or its whole torso with --shared-network
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "normalize_obs": config.network.normalize_obs,
        **action_mask_kwargs(env),  # an env that gives the allowed actions gets a masked policy
        **recurrent_kwargs(config.network.recurrent, config.network.recurrent_size),
    }
    try:
        policy_kwargs |= box_policy_kwargs(
            env.action_spec, config.network.log_std_init, config.network.squash, config.network.use_sde
        )
    except InputError:
        env.close()
        raise
    make_policy = make_gsde_actor if config.network.use_sde else make_actor
    policy = make_policy(observation_spec, env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "a2c",
        policy_builder=make_policy,
        policy_kwargs=policy_kwargs,
    )
    actor = agent.policy
    if config.network.use_sde:  # gSDE noise kept as env state; actions clipped to the Box on their way in
        env = make_gsde_env(env, actor, config.network.sde_sample_freq, config.collector.steps_per_env)
    elif not policy_kwargs.get("squash", True):  # an unbounded Gaussian: the env clips its actions to the Box
        env = clip_env_actions(env)
    recurrent = config.network.recurrent is not None
    if recurrent:  # the recurrent state (and the episode starts that reset it) travel as env state
        env = make_recurrent_env(env, actor)
        critic = make_recurrent_critic(actor, config.network.hidden_sizes, config.network.activation).to(
            device
        )
    elif config.network.shared_network:
        critic = make_shared_critic(actor).to(device)
    else:
        critic = make_critic(
            observation_spec,
            config.network.hidden_sizes,
            config.network.activation,
            encoder=input_encoder(actor),
        ).to(device)
    normalizer = find_normalizer(actor)
    if config.network.ortho_init:
        orthogonal_init(actor, critic)

    # loss + value estimator: n-step returns (TD(1) over the segment) or GAE, both bootstrapping on truncation
    loss_module = A2CLoss(
        actor,
        critic,
        entropy_bonus=loss_config.entropy_coef > 0,
        entropy_coeff=loss_config.entropy_coef,
        critic_coeff=loss_config.critic_coef,
        loss_critic_type="l2",
        functional=False,
    )
    # a critic on the actor's CNN trunk: the collector writes its values (see recipes.ppo)
    collected_values = critic_on_cnn_trunk(actor, critic)
    advantage_module = make_advantage_module(
        critic, loss_config.gamma, loss_config.gae_lambda, device, collected_values
    )
    # extra loss terms, e.g. a KL penalty (given in Python, or by --kl-to)
    loss_addons = [
        *loss_addons,
        *config.addons.factories(env.single_observation_space, env.single_action_space),
    ]
    addons = build_loss_addons(loss_addons, actor).to(device)
    reward_normalizer = (
        RewardNormalizer(run_config.num_envs, loss_config.gamma).to(device)
        if loss_config.normalize_reward
        else None
    )

    # collector (with --gradient-workers, each worker has its own)
    collector = (
        None
        if run_config.learns_on_workers
        else make_collector(
            run_config,
            env,
            actor,
            device,
            frames_per_batch,
            num_batches * frames_per_batch,
            critic=critic if collected_values else None,
        )
    )

    # optimizer: the actor's (and shared) parameters and the critic's in groups of their own learning rates
    actor_parameters, critic_parameters = split_parameters([actor, addons], [loss_module])
    groups = [{"params": actor_parameters}, {"params": critic_parameters}]
    if optim_config.optimizer == "rmsprop":
        optimizer = torch.optim.RMSprop(
            groups, lr=optim_config.lr, alpha=RMSPROP_ALPHA, eps=optim_config.optimizer_eps
        )
    else:
        optimizer = torch.optim.Adam(groups, lr=optim_config.lr, eps=optim_config.optimizer_eps)

    loss_keys = ["loss_objective", "loss_critic"] + (["loss_entropy"] if loss_config.entropy_coef > 0 else [])
    reward_scale = loss_config.reward_scale
    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(batch):
        with set_recurrent_mode(
            recurrent
        ):  # a recurrent layer runs over each env's steps from its stored state
            loss = loss_fn(batch)
        addon_total, addon_metrics = addon_losses(addons, batch)
        total = sum(loss[key] for key in loss_keys) + addon_total
        return total, loss.select(*loss_keys, "entropy", strict=False).detach().update(addon_metrics)

    def schedule(learner):  # learning rates, annealed linearly over the budget with --anneal-lr
        values = learner.hyperparameters
        progress = min(1.0, learner.frames / (num_batches * frames_per_batch))  # before this batch
        scale = 1.0 - progress if optim_config.anneal_lr else 1.0
        set_learning_rates(optimizer, [values["lr"], values["critic_lr"]], scale)
        if "entropy_coef" in values:
            loss_module.entropy_coeff.fill_(values["entropy_coef"])

    learner = Learner(
        update,
        optimizer,
        {"loss": loss_module, "addons": addons},
        max_grad_norm=optim_config.max_grad_norm,
        hyperparameters={"lr": optim_config.lr, "critic_lr": optim_config.critic_lr or optim_config.lr}
        | ({"entropy_coef": loss_config.entropy_coef} if loss_config.entropy_coef > 0 else {}),
        schedule=schedule,
    )

    def minibatches(batch):  # one gradient step on the whole batch, with its advantages
        if reward_scale != 1.0:
            batch.set(("next", "reward"), batch.get(("next", "reward")) * reward_scale)
        if reward_normalizer is not None:  # the batch's rewards only: logged returns keep the env's
            reward_normalizer.normalize(batch)
        with torch.no_grad():
            advantage_module(batch)
        yield batch if recurrent else batch.reshape(-1)

    def after_batch(batch):  # observation statistics, once the batch's update is done
        if normalizer is not None:
            normalizer.update(batch.get("observation"))

    if run_config.gradient_worker is not None:  # this process is a gradient worker: the learner drives it
        return WorkerSession(learner, collector, minibatches)

    # logger, evaluation, checkpoints, resume
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "addons": addons}
        | ({"reward_normalizer": reward_normalizer} if reward_normalizer is not None else {}),
        optimizers={"optimizer": optimizer},
        extras={"learner": learner},
    )
    run = Run("a2c", config, run_config, agent, training, callbacks=callbacks)
    if run_config.learns_on_workers:
        return train_on_gradient_workers(run, config, learner, after_batch)

    # loop: one gradient step per collected batch
    for batch in collector:
        learner.set_frames(run.frames)  # collected before this batch: its updates anneal from there
        for minibatch in minibatches(batch):
            losses, grad_norm = learner.step(minibatch)
        after_batch(batch)
        metrics = {f"train/{key}": value.item() for key, value in losses.items()}
        metrics["train/grad_norm"] = grad_norm.item()
        metrics["train/lr"] = optimizer.param_groups[0]["lr"]
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, A2CConfig, __doc__, presets=PRESETS)
