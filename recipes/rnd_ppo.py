"""PPO with Random Network Distillation (Burda et al., 2018, "Exploration by Random Network Distillation",
arXiv:1810.12894).

PPO (``recipes.ppo``) plus an exploration bonus: the intrinsic reward is the error of a predictor network trained
to reproduce a fixed random network's embedding of each next observation (:class:`agents.RandomNetworkDistillation`).
As in the paper, the extrinsic and intrinsic rewards have their own critics, discounts and GAE advantages (TorchRL's
``GAE`` with the intrinsic keys), the policy follows ``ext_coef * A_ext + int_coef * A_int``, and the predictor
trains on a quarter of each minibatch. Two defaults differ from the paper's Atari settings, because they find
DeepSea's treasure more reliably (README.md has the numbers): the extrinsic weight is 0.5 instead of 2 (DeepSea
charges every right move, and that cost outweighs the fading intrinsic reward), and intrinsic returns are episodic.
With ``--no-intrinsic-episodic`` they run on across episode ends as in the paper; TorchRL's GAE, which works within
a collected trajectory, then bootstraps them from the intrinsic value of the episode's final observation.

On DeepSea (``rlkit/DeepSea-v0``, a 10 x 10 grid whose only reward needs ten correct moves in a row) the defaults
reach the treasure (deterministic evaluation return 0.99) within 6k-19k frames (seeds 0-3), under 10 s on a 2-core
CPU; on ``rlkit/DeepSea14-v0`` within 10k-14k frames (seeds 0-5), where plain PPO with the same settings learns to
avoid the move cost and does not find it in 40k frames.

    python -m recipes.rnd_ppo                                # rlkit/DeepSea-v0
    python -m recipes.rnd_ppo --env-id rlkit/DeepSea16-v0
    python -m recipes.rnd_ppo --env-id ALE/MontezumaRevenge-v5   # images; the paper's Atari settings (its preset)
    python -m recipes.rnd_ppo --help                         # every option
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import gymnasium as gym
import torch
from torchrl.modules import ValueOperator
from torchrl.objectives import distance_loss

from agents import (
    Agent,
    OneCallGAE,
    RandomNetworkDistillation,
    TensorClipPPOLoss,
    compiled,
    find_normalizer,
    input_encoder,
    make_actor,
    make_critic,
    make_gsde_actor,
    make_gsde_env,
    make_rnd_networks,
    orthogonal_init,
)
from agents.gsde import clip_env_actions
from agents.loss_addons import (
    LossAddon,
    LossAddonConfig,
    addon_losses,
    build_loss_addons,
    trainable_parameters,
)
from agents.networks import action_mask_kwargs, box_policy_kwargs, check_mlp_options
from agents.options import Options, defaults
from agents.rnd import INTRINSIC_REWARD_KEY, normalizes_observations
from errors import InputError
from recipes.ppo import (
    RECURRENT_SIZE,
    CollectorConfig,
    LossConfig,
    NetworkConfig,
    OptimConfig,
    check_ppo_options,
)
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
    recipe_main,
    refuse_loss_addons,
    require_positive,
    run_cli,
    set_learning_rates,
    train_on_gradient_workers,
)
from training.collectors import warm_up_normalizer

PRESETS = Path(__file__).with_name("presets") / "rnd_ppo.toml"  # hyperparameters per env

INTRINSIC_VALUE_KEY = "state_value_int"
INTRINSIC_VALUE_TARGET_KEY = "value_target_int"
INTRINSIC_TERMINATED_KEY = "terminated_int"  # ("next", ...): the termination flag of the intrinsic returns
EXTRINSIC_ADVANTAGE_KEY = "advantage_ext"
INTRINSIC_ADVANTAGE_KEY = "advantage_int"


@dataclass
class IntrinsicConfig(Options):
    gamma_int: float = 0.99
    """Discount of the intrinsic returns (Burda et al.: 0.99; --gamma is the extrinsic one)."""
    intrinsic_episodic: bool = True
    """End intrinsic returns at termination like extrinsic ones (Burda et al.'s are non-episodic)."""
    ext_coef: float = 0.5
    """Weight of the extrinsic advantage in the policy's advantage (Burda et al.: 2, on Atari)."""
    int_coef: float = 1.0
    """Weight of the intrinsic advantage (Burda et al.: 1; 0 turns the exploration bonus off)."""
    rnd_hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the RND target network (the predictor has one more layer)."""
    rnd_embedding_dim: int = 64
    """Width of the random embedding the predictor learns to reproduce."""
    rnd_update_fraction: float = 0.25
    """Fraction of each minibatch that trains the predictor, slowing it down (Burda et al.: 0.25)."""
    rnd_obs_warmup: int = 0
    """Frames of uniformly random actions, in separate envs and outside the budget, whose observations start RND's
    observation statistics before the first batch (Burda et al.: 50 x 128 steps of each env); 0: the first batch does."""


@dataclass
class RNDPPOConfig(Options):
    """PPO with a Random Network Distillation exploration bonus."""

    GRADIENT_SPLIT: ClassVar[tuple[str, ...]] = ("optim.minibatch_size",)  # shared out among gradient workers

    run: RunConfig = field(
        default_factory=defaults(
            RunConfig, env_id="rlkit/DeepSea-v0", num_envs=16, total_frames=100_000, eval_every=2_048
        )
    )
    collector: CollectorConfig = field(default_factory=defaults(CollectorConfig, steps_per_env=32))
    loss: LossConfig = field(default_factory=defaults(LossConfig, entropy_coef=0.01, anneal_clip=True))
    intrinsic: IntrinsicConfig = field(default_factory=IntrinsicConfig)
    optim: OptimConfig = field(
        default_factory=defaults(OptimConfig, lr=1e-3, num_epochs=4, minibatch_size=256, anneal_lr=True)
    )
    network: NetworkConfig = field(default_factory=NetworkConfig)
    addons: LossAddonConfig = field(default_factory=LossAddonConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range or that do not combine."""
        unsupported = {  # before PPO's own checks, whose advice (e.g. add --recurrent) does not hold here
            "--normalize-reward": self.loss.normalize_reward,
            "--clip-value": self.loss.clip_value is not None,
            "--critic-lr": self.optim.critic_lr is not None,
            "--recurrent": self.network.recurrent is not None,
            "--sequence-length": self.optim.sequence_length is not None,
            "--recurrent-size": self.network.recurrent_size != RECURRENT_SIZE,
        }
        for option, given in unsupported.items():
            if given:
                raise InputError(
                    f"{option} is a PPO option that recipes.rnd_ppo does not support (its two critics share one "
                    "learning rate and an unclipped value loss, on the env's rewards, and have no memory); drop it."
                )
        check_ppo_options(self.run, self.collector, self.loss, self.optim, self.network)
        self.addons.validate()
        check_gradient_workers(self)
        intrinsic = self.intrinsic
        require_positive(rnd_embedding_dim=intrinsic.rnd_embedding_dim)
        check_mlp_options(intrinsic.rnd_hidden_sizes, self.network.activation, "--rnd-hidden-sizes")
        check_ranges(
            gamma_int=(intrinsic.gamma_int, "(0, 1]"),
            ext_coef=(intrinsic.ext_coef, "[0, inf)"),
            int_coef=(intrinsic.int_coef, "[0, inf)"),
            rnd_update_fraction=(intrinsic.rnd_update_fraction, "(0, 1]"),
        )
        if intrinsic.rnd_obs_warmup < 0:
            raise InputError(f"--rnd-obs-warmup must be 0 or positive, got {intrinsic.rnd_obs_warmup}.")


@recipe_main
def main(
    config: RNDPPOConfig, loss_addons: Sequence[LossAddon] = (), *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Train PPO with RND as configured and return the run summary (see ``training.run``).

    ``loss_addons`` are factories of extra policy-loss terms (:mod:`agents.loss_addons`), as in ``recipes.ppo``.
    """
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    refuse_loss_addons(loss_addons, config.run)
    run_config, loss_config, optim_config = config.run, config.loss, config.optim
    intrinsic_config = config.intrinsic
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    prepare_process(run_config)
    device = torch.device(run_config.device)
    num_batches = -(-run_config.total_frames // frames_per_batch)
    minibatches_per_epoch = max(1, frames_per_batch // optim_config.minibatch_size)

    # env
    env = make_training_env(run_config, device)
    observation_spec = env.observation_spec["observation"]
    if isinstance(env.single_observation_space, gym.spaces.Dict):
        env.close()
        raise InputError(
            "RND's networks read one observation array; Dict observations are for recipes.ppo and the other "
            "recipes (or flatten them with gymnasium.wrappers.FlattenObservation)."
        )

    # modules: the agent owns the actor; both critics share its input encoder; RND has its own networks
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "normalize_obs": config.network.normalize_obs,
        **action_mask_kwargs(env),  # an env that gives the allowed actions gets a masked policy
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
        "rnd_ppo",
        policy_builder=make_policy,
        policy_kwargs=policy_kwargs,
    )
    actor = agent.policy
    if config.network.use_sde:  # gSDE noise kept as env state; actions clipped to the Box on their way in
        env = make_gsde_env(env, actor, config.network.sde_sample_freq, config.collector.steps_per_env)
    elif not policy_kwargs.get("squash", True):  # an unbounded Gaussian: the env clips its actions to the Box
        env = clip_env_actions(env)
    critic = make_critic(
        observation_spec, config.network.hidden_sizes, config.network.activation, encoder=input_encoder(actor)
    ).to(device)
    intrinsic_critic = ValueOperator(
        make_critic(
            observation_spec,
            config.network.hidden_sizes,
            config.network.activation,
            encoder=input_encoder(actor),
        ).module,
        in_keys=["observation"],
        out_keys=[INTRINSIC_VALUE_KEY],
    ).to(device)
    normalizer = find_normalizer(actor)
    if config.network.ortho_init:
        orthogonal_init(actor, critic, intrinsic_critic)
    target_network, predictor_network = make_rnd_networks(
        observation_spec, intrinsic_config.rnd_hidden_sizes, intrinsic_config.rnd_embedding_dim
    )
    rnd = RandomNetworkDistillation(
        target_network,
        predictor_network,
        observation_shape=observation_spec.shape[1:],
        gamma=intrinsic_config.gamma_int,
        update_fraction=intrinsic_config.rnd_update_fraction,
        normalize_observations=normalizes_observations(observation_spec),
    ).to(device)
    # the statistics from random steps first; a resumed run has its own, the learner of gradient workers none
    if intrinsic_config.rnd_obs_warmup and run_config.resume is None and not run_config.learns_on_workers:
        if rnd.obs_rms is None:
            env.close()
            raise InputError(
                f"--rnd-obs-warmup starts RND's observation statistics, and {run_config.env_id}'s "
                f"{type(env.single_observation_space).__name__} observations have none (RND one-hot encodes "
                "them); drop it."
            )
        warm_up_normalizer(run_config, rnd.obs_rms, device, intrinsic_config.rnd_obs_warmup)

    # loss + value estimators: the clipped objective reads the combined advantage; one GAE per reward stream
    loss_module = TensorClipPPOLoss(
        actor,
        critic,
        clip_epsilon=loss_config.clip_epsilon,
        entropy_bonus=loss_config.entropy_coef > 0,
        entropy_coeff=loss_config.entropy_coef,
        critic_coeff=loss_config.critic_coef,
        loss_critic_type=loss_config.critic_loss,
        normalize_advantage=loss_config.normalize_advantage,
        log_explained_variance=False,  # neither it nor the importance-weight diagnostics is logged
        diagnostics=False,
        functional=False,
    )
    extrinsic_gae = OneCallGAE(
        gamma=loss_config.gamma,
        lmbda=loss_config.gae_lambda,
        value_network=critic,
        average_gae=False,
        device=device,
    )
    extrinsic_gae.set_keys(advantage=EXTRINSIC_ADVANTAGE_KEY)  # value target: "value_target", for loss_module
    intrinsic_gae = OneCallGAE(
        gamma=intrinsic_config.gamma_int,
        lmbda=loss_config.gae_lambda,
        value_network=intrinsic_critic,
        average_gae=False,
        device=device,
    )
    intrinsic_gae.set_keys(
        reward=INTRINSIC_REWARD_KEY,
        value=INTRINSIC_VALUE_KEY,
        advantage=INTRINSIC_ADVANTAGE_KEY,
        value_target=INTRINSIC_VALUE_TARGET_KEY,
        terminated=INTRINSIC_TERMINATED_KEY,
    )
    # extra loss terms, e.g. a KL penalty (given in Python, or by --kl-to)
    loss_addons = [
        *loss_addons,
        *config.addons.factories(env.single_observation_space, env.single_action_space),
    ]
    addons = build_loss_addons(loss_addons, actor).to(device)

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
        )
    )

    # minibatches: the current batch's items, without replacement each epoch
    epoch_minibatches = EpochMinibatches(optim_config.minibatch_size)

    # optimizer: actor, both critics, the RND predictor (the RND target is frozen) and any add-on parameters
    parameters = trainable_parameters(loss_module, intrinsic_critic, rnd, addons)
    optimizer = fused_adam(parameters, lr=optim_config.lr, eps=optim_config.adam_eps)
    budget = num_batches * frames_per_batch  # the schedules' frames

    loss_keys = ["loss_objective", "loss_critic"] + (["loss_entropy"] if loss_config.entropy_coef > 0 else [])
    loss_keys += ["loss_critic_int", "loss_predictor"]
    logged_keys = [*loss_keys, "entropy", "clip_fraction", "kl_approx"]
    critic_coef, critic_loss_type = loss_config.critic_coef, loss_config.critic_loss
    ext_coef, int_coef = intrinsic_config.ext_coef, intrinsic_config.int_coef
    intrinsic_episodic = intrinsic_config.intrinsic_episodic
    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(minibatch):
        loss = loss_fn(minibatch)  # clipped objective on the combined advantage, extrinsic value, entropy
        value_int = intrinsic_critic(minibatch.select("observation")).get(INTRINSIC_VALUE_KEY)
        target_int = minibatch.get(INTRINSIC_VALUE_TARGET_KEY)
        loss["loss_critic_int"] = critic_coef * distance_loss(target_int, value_int, critic_loss_type).mean()
        loss["loss_predictor"] = rnd(minibatch)["loss_predictor"]
        addon_total, addon_metrics = addon_losses(addons, minibatch)
        total = sum(loss[key] for key in loss_keys) + addon_total
        metrics = loss.select(*logged_keys, strict=False).detach().update(addon_metrics)
        return total, metrics.set("intrinsic_reward", minibatch.get(("next", INTRINSIC_REWARD_KEY)).mean())

    def schedule(learner):  # learning rate and clip range, annealed linearly over the budget when asked
        progress = min(1.0, learner.frames / budget)  # of the frames before this batch, as CleanRL
        values = learner.hyperparameters
        set_learning_rates(optimizer, [values["lr"]], 1.0 - progress if optim_config.anneal_lr else 1.0)
        clip_scale = 1.0 - progress if loss_config.anneal_clip else 1.0
        loss_module.clip_epsilon.fill_(values["clip_epsilon"] * clip_scale)
        if "entropy_coef" in values:
            loss_module.entropy_coeff.fill_(values["entropy_coef"])

    learner = Learner(
        update,
        optimizer,
        {"loss": loss_module, "intrinsic_critic": intrinsic_critic, "rnd": rnd, "addons": addons},
        max_grad_norm=optim_config.max_grad_norm,
        hyperparameters={"lr": optim_config.lr, "clip_epsilon": loss_config.clip_epsilon}
        | ({"entropy_coef": loss_config.entropy_coef} if loss_config.entropy_coef > 0 else {}),
        schedule=schedule,
        # each gradient worker normalises its intrinsic rewards with statistics of its own observations
        local_state=("rnd.obs_rms", "rnd.return_rms", "rnd.running_return"),
    )

    def minibatches(batch):  # a collected batch -> the minibatches of its gradient steps
        with torch.no_grad():
            # intrinsic rewards, after folding the batch into RND's observation and return statistics
            rnd.add_intrinsic_reward(batch)
            terminated = batch.get(("next", "terminated"))
            terminated_int = terminated if intrinsic_episodic else torch.zeros_like(terminated)
            batch.set(("next", INTRINSIC_TERMINATED_KEY), terminated_int)
            extrinsic_gae(batch)
            intrinsic_gae(batch)
            batch.set(
                "advantage",
                ext_coef * batch.get(EXTRINSIC_ADVANTAGE_KEY) + int_coef * batch.get(INTRINSIC_ADVANTAGE_KEY),
            )
        loss_module.rescore_squashed_actions(batch)  # a tanh-normal policy's, as the loss will compute them
        # the predictor reads the next observations
        yield from epoch_minibatches(batch.reshape(-1), optim_config.num_epochs * minibatches_per_epoch)

    def after_batch(batch):  # observation statistics, once the batch's updates are done
        if normalizer is not None:
            normalizer.update(batch.get("observation"))

    if run_config.gradient_worker is not None:  # this process is a gradient worker: the learner drives it
        return WorkerSession(learner, collector, minibatches)

    # logger, evaluation, checkpoints, resume
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "intrinsic_critic": intrinsic_critic, "rnd": rnd, "addons": addons},
        optimizers={"adam": optimizer},
        extras={"learner": learner, "minibatches": epoch_minibatches},
    )
    run = Run("rnd_ppo", config, run_config, agent, training, callbacks=callbacks)
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
    run_cli(main, RNDPPOConfig, __doc__, presets=PRESETS)
