"""Proximal Policy Optimization (Schulman et al., 2017, arXiv:1707.06347).

Clipped surrogate objective with GAE advantages, entropy bonus and a value loss, from TorchRL's
``ClipPPOLoss`` (run on plain tensors by ``agents.TensorClipPPOLoss``: the same losses and gradients, a fifth less
time per gradient step) and ``GAE``; linear learning-rate and clip-range annealing, gradient clipping, per-minibatch
advantage normalisation. Discrete (categorical policy) and Box (tanh-normal policy) action spaces; for Box
actions, --use-sde explores with gSDE instead (Raffin et al., 2021, arXiv:2005.05719; agents/gsde.py).
--recurrent lstm|gru gives the policy memory (agents/recurrent.py): minibatches are then whole sequences of
--sequence-length steps of one env, run from the state stored at their first step; rlkit/CartPoleNoVelocity-v1's
preset uses an LSTM.

Each env's preset (recipes/presets/ppo.toml, --list-presets) fills in the options not given; an env without
one gets the defaults below (Stable-Baselines3's and the paper's MuJoCo settings: 1 env x 2048 steps, 10 epochs of
64, Adam 3e-4, 64x64 tanh). CartPole-v1's preset solves it (deterministic evaluation mean >= 475 over 20
episodes) within 4k-40k frames (seed-dependent), a few seconds on a 2-core CPU; Pendulum-v1's reaches about -180
after 100k of its 200k frames (16 envs x 128 steps, 10 epochs, lr 1e-3, gamma 0.9, observation normalisation);
adding --use-sde --sde-sample-freq 4 gives -181 to -206 (seeds 0-2) at 102k frames.

    python -m recipes.ppo                      # CartPole-v1, with its preset
    python -m recipes.ppo --env-id Hopper-v5   # Hopper-v5's preset (recipes/presets/ppo.toml)
    python -m recipes.ppo --list-presets       # every preset
    python -m recipes.ppo --help               # every option
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torchrl.modules import set_recurrent_mode

from agents import (
    Agent,
    OneCallGAE,
    RewardNormalizer,
    TensorClipPPOLoss,
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
from agents.recurrent import (
    check_recurrent_options,
    check_sequence_options,
    make_recurrent_env,
    recurrent_kwargs,
    sequence_length,
    sequences,
)
from errors import InputError
from training import (
    Callback,
    EpochMinibatches,
    Learner,
    MetricMeans,
    Run,
    RunConfig,
    TrainingState,
    WorkerSession,
    apply_preset,
    check_gradient_workers,
    check_ranges,
    fused_adam,
    make_collector,
    make_training_env,
    prepare_process,
    preset_note,
    recipe_main,
    refuse_loss_addons,
    require_positive,
    run_cli,
    set_learning_rates,
    single_collector_only,
    train_on_gradient_workers,
)

PRESETS = Path(__file__).with_name("presets") / "ppo.toml"  # hyperparameters per env
RECURRENT_SIZE = 64  # units of a --recurrent layer unless --recurrent-size says otherwise


@dataclass
class CollectorConfig(Options):
    steps_per_env: int = 2048
    """Steps each env takes per collected batch (frames per batch = num_envs * steps_per_env)."""


@dataclass
class LossConfig(Options):
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda (1: Monte-Carlo advantages, 0: one-step TD)."""
    clip_epsilon: float = 0.2
    """Clipping range of the probability ratio: it is kept within [1 - eps, 1 + eps], so eps is in (0, 1]."""
    anneal_clip: bool = False
    """Anneal the clip range linearly to 0 over the budget."""
    clip_value: float | None = None
    """Clip the value prediction to within this distance of the value at collection (PPO2's clipped value
    loss, TorchRL's ClipPPOLoss(clip_value=...)); None: no clipping."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus."""
    critic_coef: float = 0.5
    """Weight of the value loss."""
    critic_loss: Literal["l2", "smooth_l1"] = "l2"
    """Value loss: squared error or Huber."""
    normalize_advantage: bool = True
    """Normalise advantages within each minibatch."""
    normalize_reward: bool = False
    """Divide rewards by the running standard deviation of the discounted return (Stable-Baselines3's
    VecNormalize(norm_reward=True)); evaluations and logged returns keep the env's rewards."""


@dataclass
class OptimConfig(Options):
    lr: float = 3e-4
    """Adam learning rate (of the actor, and of the critic unless --critic-lr is given)."""
    critic_lr: float | None = None
    """Adam learning rate of the critic; default: --lr."""
    adam_eps: float = 1e-5
    """Adam's epsilon (1e-5 as in the PPO implementations of OpenAI Baselines and Stable-Baselines3)."""
    anneal_lr: bool = False
    """Anneal the learning rates linearly to 0 over the budget."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm to this value."""
    num_epochs: int = 10
    """Passes over each collected batch."""
    minibatch_size: int = 64
    """Samples per gradient step."""
    sequence_length: int | None = None
    """--recurrent: minibatches are sequences of this many consecutive steps of one env, each starting from the
    state stored at its first step (gradients flow back through them); default: the longest length that
    --steps-per-env and --minibatch-size are both multiples of (--steps-per-env where the minibatch holds whole
    batches of one env's steps)."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the actor and of the critic."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "tanh"
    """Activation between hidden layers."""
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
    the MLP, shared with the critic, its state carried from step to step and reset at each episode's start."""
    recurrent_size: int = RECURRENT_SIZE
    """Units of the --recurrent layer."""


@dataclass
class PPOConfig(Options):
    """PPO: clipped policy gradient with GAE."""

    GRADIENT_SPLIT: ClassVar[tuple[str, ...]] = ("optim.minibatch_size",)  # shared out among gradient workers

    run: RunConfig = field(
        default_factory=defaults(RunConfig, num_envs=1, total_frames=1_000_000, eval_every=25_000)
    )
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    addons: LossAddonConfig = field(default_factory=LossAddonConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range or that do not combine."""
        check_ppo_options(self.run, self.collector, self.loss, self.optim, self.network)
        self.addons.validate()
        check_gradient_workers(self)


def check_ppo_options(
    run: RunConfig, collector: CollectorConfig, loss: LossConfig, optim: OptimConfig, network: NetworkConfig
) -> None:
    """Raise :class:`InputError` for PPO options outside their meaningful range or that do not combine."""
    run.validate()
    require_positive(
        steps_per_env=collector.steps_per_env,
        num_epochs=optim.num_epochs,
        minibatch_size=optim.minibatch_size,
    )
    check_ranges(
        lr=(optim.lr, "(0, inf)"),
        max_grad_norm=(optim.max_grad_norm, "> 0"),
        gamma=(loss.gamma, "(0, 1]"),
        gae_lambda=(loss.gae_lambda, "[0, 1]"),
        clip_epsilon=(loss.clip_epsilon, "(0, 1]"),
        entropy_coef=(loss.entropy_coef, "[0, inf)"),
        critic_coef=(loss.critic_coef, "[0, inf)"),
        critic_lr=(optim.critic_lr, "(0, inf)"),
        adam_eps=(optim.adam_eps, "(0, inf)"),
        clip_value=(loss.clip_value, "> 0"),
    )
    frames_per_batch = run.num_envs * collector.steps_per_env
    if optim.minibatch_size > frames_per_batch:
        raise InputError(
            f"--minibatch-size {optim.minibatch_size} exceeds the {frames_per_batch} frames per batch (--num-envs "
            f"{run.num_envs} x --steps-per-env {collector.steps_per_env}"
            f"{preset_note(run, 'minibatch_size', 'num_envs', 'steps_per_env')}): lower --minibatch-size or raise "
            "--num-envs or --steps-per-env."
        )
    check_sde_options(network.use_sde, network.sde_sample_freq)
    if network.use_sde:
        single_collector_only(run, "--use-sde")
    check_recurrent_ppo_options(run, collector, optim, network)


SHORTEST_DEFAULT_SEQUENCE = 8  # the shortest recurrent sequence taken without --sequence-length


def check_recurrent_ppo_options(
    run: RunConfig, collector: CollectorConfig, optim: OptimConfig, network: NetworkConfig
) -> None:
    """Raise :class:`InputError` for --recurrent options that do not combine (PPO, A2C and RND-PPO)."""
    if network.recurrent is None:
        if optim.sequence_length is not None:
            raise InputError("--sequence-length is for recurrent policies; add --recurrent lstm or gru.")
        check_recurrent_run(run, None, network.recurrent_size, network.use_sde)
        return
    if optim.sequence_length is not None:
        require_positive(sequence_length=optim.sequence_length)
    length = sequence_length(collector.steps_per_env, optim.minibatch_size, optim.sequence_length)
    if optim.sequence_length is None and length < min(SHORTEST_DEFAULT_SEQUENCE, collector.steps_per_env):
        raise InputError(
            f"--steps-per-env {collector.steps_per_env} and --minibatch-size {optim.minibatch_size} leave recurrent "
            f"sequences of length {length} (the longest length both are multiples of), too short for gradients to "
            "flow back through time: give --sequence-length (a divisor of both), or make --minibatch-size a "
            "multiple of --steps-per-env."
        )
    check_sequence_options(collector.steps_per_env, length, optim.minibatch_size)
    check_recurrent_run(run, network.recurrent, network.recurrent_size, network.use_sde)


def check_recurrent_run(run: RunConfig, recurrent: str | None, size: int, use_sde: bool) -> None:
    """Raise :class:`InputError` for a --recurrent policy with options it does not combine with, or for
    --recurrent-size given without --recurrent, which would be ignored (PPO, A2C; a preset's size goes unused when
    the user turns its --recurrent off)."""
    if recurrent is None:
        preset = (run.preset_applied or {}).get("set", {})
        if size != RECURRENT_SIZE and "recurrent_size" not in preset and run.resume is None:
            raise InputError(
                f"--recurrent-size {size} only applies with --recurrent lstm or gru: add --recurrent or drop it."
            )
        return
    check_recurrent_options(recurrent, size)
    for given, option in ((use_sde, "--use-sde"), (run.compile, "--compile")):
        if given:
            raise InputError(f"--recurrent does not combine with {option}; drop one of them.")
    if run.gradient_workers:
        raise InputError("--recurrent does not combine with --gradient-workers; train in one process.")
    single_collector_only(run, "--recurrent")


@recipe_main
def main(
    config: PPOConfig, loss_addons: Sequence[LossAddon] = (), *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Train PPO as configured and return the run summary (see ``training.run``).

    ``loss_addons`` are factories of extra policy-loss terms (:mod:`agents.loss_addons`), e.g. a KL penalty
    towards a reference policy: each gets the actor, and the ``loss_*`` terms of what it returns join the total.
    """
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    refuse_loss_addons(loss_addons, config.run)
    run_config, loss_config, optim_config = config.run, config.loss, config.optim
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    prepare_process(run_config)
    device = torch.device(run_config.device)
    num_batches = -(-run_config.total_frames // frames_per_batch)
    minibatches_per_epoch = max(1, frames_per_batch // optim_config.minibatch_size)

    # env
    env = make_training_env(run_config, device)
    observation_spec = env.observation_spec["observation"]

    # modules: the agent owns the actor (and the observation normaliser); the critic shares its input encoder
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
        "ppo",
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

    # loss + value estimator
    loss_module = TensorClipPPOLoss(
        actor,
        critic,
        clip_epsilon=loss_config.clip_epsilon,
        entropy_bonus=loss_config.entropy_coef > 0,
        entropy_coeff=loss_config.entropy_coef,
        critic_coeff=loss_config.critic_coef,
        loss_critic_type=loss_config.critic_loss,
        normalize_advantage=loss_config.normalize_advantage,
        clip_value=loss_config.clip_value,
        log_explained_variance=False,  # neither it nor the importance-weight diagnostics is logged
        diagnostics=False,
        functional=False,  # no target networks: skip swapping parameters in and out on every call
    )
    # a critic on the actor's CNN trunk costs a value head beside each policy step: the collector writes its
    # values, and the advantage step runs the trunk only on the next observations the batch lacks
    collected_values = critic_on_cnn_trunk(actor, critic)
    advantage_module = OneCallGAE(
        gamma=loss_config.gamma,
        lmbda=loss_config.gae_lambda,
        value_network=critic,
        average_gae=False,
        device=device,
        collected_values=collected_values,
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

    # minibatches: the current batch's items (of whole sequences when recurrent), without replacement each epoch
    length = (
        sequence_length(
            config.collector.steps_per_env, optim_config.minibatch_size, optim_config.sequence_length
        )
        if recurrent
        else 1
    )
    epoch_minibatches = EpochMinibatches(optim_config.minibatch_size // length)

    # optimizer: one Adam, the actor's and the critic's parameters in groups of their own learning rates
    actor_parameters, critic_parameters = split_parameters([actor, addons], [loss_module])
    optimizer = fused_adam(
        [{"params": actor_parameters}, {"params": critic_parameters}],
        lr=optim_config.lr,
        eps=optim_config.adam_eps,
    )
    budget = num_batches * frames_per_batch  # the schedules' frames

    loss_keys = ["loss_objective", "loss_critic"] + (["loss_entropy"] if loss_config.entropy_coef > 0 else [])
    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(minibatch):
        with set_recurrent_mode(recurrent):  # a recurrent layer runs over each sequence from its stored state
            loss = loss_fn(minibatch)
        addon_total, addon_metrics = addon_losses(addons, minibatch)
        total = sum(loss[key] for key in loss_keys) + addon_total
        metrics = loss.select(*loss_keys, "entropy", "clip_fraction", "kl_approx", strict=False).detach()
        return total, metrics.update(addon_metrics)

    def schedule(learner):  # learning rates and clip range, annealed linearly over the budget when asked
        progress = min(1.0, learner.frames / budget)  # of the frames before this batch, as CleanRL
        values = learner.hyperparameters
        lr_scale = 1.0 - progress if optim_config.anneal_lr else 1.0
        set_learning_rates(optimizer, [values["lr"], values["critic_lr"]], lr_scale)
        clip_scale = 1.0 - progress if loss_config.anneal_clip else 1.0
        loss_module.clip_epsilon.fill_(values["clip_epsilon"] * clip_scale)
        if "entropy_coef" in values:
            loss_module.entropy_coeff.fill_(values["entropy_coef"])

    learner = Learner(
        update,
        optimizer,
        {"loss": loss_module, "addons": addons},
        max_grad_norm=optim_config.max_grad_norm,
        hyperparameters={
            "lr": optim_config.lr,
            "critic_lr": optim_config.critic_lr or optim_config.lr,
            "clip_epsilon": loss_config.clip_epsilon,
        }
        | ({"entropy_coef": loss_config.entropy_coef} if loss_config.entropy_coef > 0 else {}),
        schedule=schedule,
    )

    def minibatches(batch):  # a collected batch -> the minibatches of its gradient steps
        if reward_normalizer is not None:  # the batch's rewards only: logged returns keep the env's
            reward_normalizer.normalize(batch)
        with torch.no_grad():
            advantage_module(batch)
        items = sequences(batch, length) if recurrent else batch.reshape(-1)
        # a tanh-normal policy's log-probabilities as the loss will compute them (a recurrent one's over sequences)
        loss_module.rescore_squashed_actions(items, sequences=recurrent)
        if not loss_addons:  # the loss reads no next-step entries once the advantages are in (an add-on may)
            items = items.exclude("next")
        yield from epoch_minibatches(items, optim_config.num_epochs * minibatches_per_epoch)

    def after_batch(batch):  # observation statistics, once the batch's updates are done
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
        optimizers={"adam": optimizer},
        extras={"learner": learner, "minibatches": epoch_minibatches},
    )
    run = Run("ppo", config, run_config, agent, training, callbacks=callbacks)
    if run_config.learns_on_workers:
        return train_on_gradient_workers(run, config, learner, after_batch)

    # loop
    for batch in collector:
        learner.set_frames(run.frames)  # collected before this batch: its updates anneal from there
        means = MetricMeans("train/")
        for minibatch in minibatches(batch):
            losses, grad_norm = learner.step(minibatch)
            means.add(losses.set("grad_norm", grad_norm))
        after_batch(batch)
        metrics = means.result()
        metrics["train/lr"] = optimizer.param_groups[0]["lr"]
        metrics["train/clip_epsilon"] = loss_module.clip_epsilon.item()
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, PPOConfig, __doc__, presets=PRESETS)
