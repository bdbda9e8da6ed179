"""Deep Q-Network (Mnih et al., 2015) with composable Rainbow options (Hessel et al., 2018, arXiv:1710.02298).

TorchRL's ``DQNLoss`` (TD(0) targets that bootstrap on truncation, Huber loss; run on plain tensors by
``agents.TensorDQNLoss``, which gives the same loss at half the per-call overhead) with a hard-copied target
network, epsilon-greedy exploration annealed linearly and a ``TensorDictReplayBuffer``. Options, in any
combination:

    --double        Double DQN: the online network picks the next action, the target network values it
    --dueling       separate state-value and advantage streams
    --noisy         NoisyNet layers instead of epsilon-greedy (epsilon 0, new noise for every action and update)
    --n-steps N     N-step returns that stop at episode ends and bootstrap on truncation (default 3; 1: one-step)
    --prioritized   prioritized replay (alpha, beta annealed to 1, importance weights in the loss)
    --distributional    C51 (Bellemare et al., 2017): a distribution over --num-atoms returns in [--v-min, --v-max]
                    per action, trained by TorchRL's DistributionalDQNLoss (cross-entropy to the projected target)
    --variant rainbow   all of the above (with the --n-steps N of the run): Hessel et al.'s full Rainbow

Discrete action spaces only. Each env's preset (recipes/presets/dqn.toml, --list-presets) fills in the options
not given; an env without one gets the defaults below (Mnih et al.'s and Stable-Baselines3's: Adam 1e-4, batch
32, one gradient step per 4 frames, target copied every 2500 steps, 10% of the budget exploring). CartPole-v1's
preset solves it (deterministic evaluation mean >= 475 over 20 episodes) within 50k frames (8k, 25k, 8k, 18k,
27k and 29k for seeds 0-5, 3.5-12 s on two CPU cores); image observations (Atari) get the Nature CNN.

    python -m recipes.dqn                          # CartPole-v1, with its preset
    python -m recipes.dqn --list-presets           # every preset
    python -m recipes.dqn --variant rainbow
    python -m recipes.dqn --help                   # every option
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import gymnasium as gym
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, RandomSampler
from torchrl.envs.utils import ExplorationType
from torchrl.modules import reset_noise

from agents import (
    Agent,
    ExplorationConfig,
    NStepReturns,
    TensorDQNLoss,
    compiled,
    find_normalizer,
    image_layout,
    make_q_actor,
    make_target_updater,
    prioritized_sampler,
    reset_target_noise,
)
from agents.networks import action_mask_kwargs
from agents.options import Options, defaults
from agents.qvalue import OTHER_RECIPES, NStepDistributionalDQNLoss, check_support
from errors import InputError
from training import (
    Callback,
    FrameStackStorage,
    LeanReplayBuffer,
    Learner,
    Run,
    RunConfig,
    TrainingState,
    WorkerSession,
    anneal_learning_rates,
    apply_preset,
    check_batch_fits_buffer,
    check_gradient_workers,
    check_ranges,
    check_replay_memory,
    fused_adam,
    make_collector,
    make_training_env,
    prepare_process,
    recipe_main,
    require_positive,
    run_cli,
    train_on_gradient_workers,
    warn_if_never_updated,
)

PRESETS = Path(__file__).with_name("presets") / "dqn.toml"  # hyperparameters per env


@dataclass
class CollectorConfig(Options):
    steps_per_env: int = 32
    """Steps each env takes per collected batch (frames per batch = num_envs * steps_per_env)."""
    updates_per_batch: int = 64
    """Gradient steps after each collected batch."""
    learning_starts: int = 10_000
    """Frames collected before the first update."""


@dataclass
class BufferConfig(Options):
    buffer_size: int = 100_000
    """Replay buffer capacity in transitions."""
    batch_size: int = 32
    """Transitions per gradient step."""
    n_steps: int = 3
    """Multi-step return length (1: one-step TD targets)."""
    prioritized: bool = False
    """Prioritized experience replay (Schaul et al., 2016)."""
    alpha: float = 0.6
    """Prioritization exponent (0: uniform sampling)."""
    beta: float = 0.4
    """Initial importance-sampling exponent, annealed linearly to 1 over the budget."""


@dataclass
class LossConfig(Options):
    gamma: float = 0.99
    """Discount factor."""
    double: bool = False
    """Double DQN (van Hasselt et al., 2016)."""
    loss_function: Literal["smooth_l1", "l2"] = "smooth_l1"
    """TD-error loss: Huber or squared error."""
    target_update_interval: int = 2_500
    """Gradient steps between hard copies of the online network into the target network."""
    tau: float = 1.0
    """1: hard target updates every target_update_interval steps; below 1: Polyak averaging every step."""


@dataclass
class OptimConfig(Options):
    lr: float = 1e-4
    """Adam learning rate."""
    anneal_lr: bool = False
    """Anneal the learning rate linearly to 0 over the budget."""
    adam_eps: float = 1e-8
    """Adam's epsilon."""
    max_grad_norm: float = 10.0
    """Clip the global gradient norm to this value."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the Q-network (after the CNN for image observations)."""
    activation: Literal["relu", "tanh", "elu", "silu"] = "relu"
    """Activation between hidden layers."""
    dueling: bool = False
    """Dueling value/advantage streams (Wang et al., 2016)."""
    noisy: bool = False
    """NoisyNet layers (Fortunato et al., 2018) replace epsilon-greedy exploration."""
    noisy_type: Literal["factorised", "independent"] = "factorised"
    """Noise of the noisy layers: factorised Gaussian (the paper's choice for DQN) or independent Gaussian."""
    distributional: bool = False
    """C51 (Bellemare et al., 2017): learn a distribution over --num-atoms returns per action instead of its mean;
    the next action is picked by the online network (as in Rainbow) and --loss-function does not apply."""
    num_atoms: int = 51
    """Atoms of the return distribution (--distributional)."""
    v_min: float = -10.0
    """Lowest return of the distribution's support (--distributional; returns beyond are clipped to it)."""
    v_max: float = 10.0
    """Highest return of the distribution's support (--distributional)."""
    normalize_obs: bool = False
    """Normalise observations with running statistics saved in the agent."""


@dataclass
class DQNConfig(Options):
    """DQN with Double, Dueling, Noisy, N-step and Prioritized-replay options."""

    # shared out among gradient workers: each keeps a replay buffer of its own frames
    GRADIENT_SPLIT: ClassVar[tuple[str, ...]] = ("buffer.batch_size", "buffer.buffer_size")

    run: RunConfig = field(
        default_factory=defaults(RunConfig, num_envs=8, total_frames=1_000_000, eval_every=25_000)
    )
    variant: Literal["dqn", "rainbow"] = "dqn"
    """'rainbow' switches on double, dueling, noisy, prioritized and distributional (n-step returns are on by
    default)."""
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    exploration: ExplorationConfig = field(
        default_factory=defaults(ExplorationConfig, final_epsilon=0.05, exploration_fraction=0.1)
    )
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)

    @property
    def rainbow(self) -> bool:
        return self.variant == "rainbow"

    @property
    def double(self) -> bool:
        return self.loss.double or self.rainbow

    @property
    def dueling(self) -> bool:
        return self.network.dueling or self.rainbow

    @property
    def noisy(self) -> bool:
        return self.network.noisy or self.rainbow

    @property
    def prioritized(self) -> bool:
        return self.buffer.prioritized or self.rainbow

    @property
    def distributional(self) -> bool:
        return self.network.distributional or self.rainbow

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range."""
        self.run.validate()
        collector, buffer, loss, optim = self.collector, self.buffer, self.loss, self.optim
        require_positive(
            steps_per_env=collector.steps_per_env,
            updates_per_batch=collector.updates_per_batch,
            buffer_size=buffer.buffer_size,
            batch_size=buffer.batch_size,
            n_steps=buffer.n_steps,
            target_update_interval=loss.target_update_interval,
        )
        check_ranges(
            lr=(optim.lr, "(0, inf)"),
            adam_eps=(optim.adam_eps, "(0, inf)"),
            max_grad_norm=(optim.max_grad_norm, "> 0"),
            gamma=(loss.gamma, "(0, 1]"),
            tau=(loss.tau, "(0, 1]"),
            alpha=(buffer.alpha, "[0, inf)"),
            beta=(buffer.beta, "[0, 1]"),
            learning_starts=(collector.learning_starts, ">= 0"),
        )
        self.exploration.validate()
        if self.distributional:
            check_support(self.network.num_atoms, self.network.v_min, self.network.v_max)
        check_batch_fits_buffer(buffer.batch_size, buffer.buffer_size)
        check_gradient_workers(self)


@recipe_main
def main(config: DQNConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train DQN as configured and return the run summary (see ``training.run``)."""
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, buffer_config, loss_config = config.run, config.buffer, config.loss
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    num_batches = -(-run_config.total_frames // frames_per_batch)
    noisy, n_steps, prioritized = config.noisy, buffer_config.n_steps, config.prioritized
    distributional, network_config = config.distributional, config.network
    # noisy layers explore on their own: epsilon stays 0
    exploration = ExplorationConfig(0.0, 0.0) if noisy else config.exploration
    if noisy and (
        unused := config.exploration.options_given((run_config.preset_applied or {}).get("set", {}))
    ):
        warnings.warn(f"{', '.join(unused)} unused: --noisy layers explore on their own (epsilon stays 0).")

    # env
    env = make_training_env(run_config, device)
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        env.close()
        raise InputError(
            f"DQN needs a Discrete action space; {run_config.env_id} has {env.single_action_space}. {OTHER_RECIPES}"
        )

    # modules: the agent owns the epsilon-greedy Q policy; the loss trains its Q-value actor
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "dueling": config.dueling,
        "noisy": noisy,
        "noisy_type": config.network.noisy_type,
        "normalize_obs": config.network.normalize_obs,
        **(
            {
                "distributional": True,
                "num_atoms": network_config.num_atoms,
                "v_min": network_config.v_min,
                "v_max": network_config.v_max,
            }
            if distributional
            else {}
        ),
        "epsilon": exploration.initial_epsilon,
        **action_mask_kwargs(
            env
        ),  # an env that gives the allowed actions: greedy and random actions among them
    }
    policy = make_q_actor(env.observation_spec["observation"], env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "dqn",
        policy_builder=make_q_actor,
        policy_kwargs=policy_kwargs,
    )
    q_actor, epsilon_greedy = policy[0], policy[1]
    normalizer = find_normalizer(policy)

    # loss + value estimator + target updater (C51: the projected distributional target, in TorchRL's loss)
    if distributional:
        loss_module = NStepDistributionalDQNLoss(q_actor, gamma=loss_config.gamma, delay_value=True)
    else:
        loss_module = TensorDQNLoss(
            q_actor,
            loss_function=loss_config.loss_function,
            double_dqn=config.double,
            action_space=env.action_spec,
        )
        loss_module.make_value_estimator(gamma=loss_config.gamma)
    if noisy:
        # loss modules run their networks in deterministic mode unless told otherwise: keep the noise on
        loss_module.deterministic_sampling_mode = ExplorationType.RANDOM
    target_updater = make_target_updater(loss_module, loss_config.target_update_interval, loss_config.tau)

    # room for the replay buffer, checked before the collector starts (worker processes, Ray actors)
    observation_spec = env.observation_spec["observation"]
    frame_stacks = image_layout(observation_spec) in ("chw", "schw", "shwc")  # stacks along the first dim
    try:
        check_replay_memory(
            buffer_config.buffer_size,
            observation_spec,
            prioritized=prioritized,
            frame_stacks=frame_stacks,
            device=device,
        )
    except InputError:
        env.close()
        raise

    # collector (with --gradient-workers, each worker has its own)
    collector = (
        None
        if run_config.learns_on_workers
        else make_collector(
            run_config,
            env,
            policy,
            device,
            frames_per_batch,
            num_batches * frames_per_batch,
        )
    )

    # buffer: uniform or prioritized sampling; n-step returns are computed as batches come in; stacked frames
    # (Atari's channels-first stacks, FrameStackObservation's stacks of frames) are stored one frame each, not
    # eight times over
    if prioritized:
        sampler = prioritized_sampler(buffer_config.buffer_size, buffer_config.alpha, buffer_config.beta)
    else:
        sampler = RandomSampler()
    if frame_stacks:
        storage = FrameStackStorage(buffer_config.buffer_size, device=device)
    else:
        storage = LazyTensorStorage(buffer_config.buffer_size, device=device)
    replay_buffer = LeanReplayBuffer(
        storage=storage,
        sampler=sampler,
        priority_key="td_error",
    )
    n_step_returns = NStepReturns(n_steps, loss_config.gamma)  # n_steps 1: one-step transitions

    # optimizer
    parameters = [p for p in loss_module.value_network_params.values(True, True) if p.requires_grad]
    optimizer = fused_adam(parameters, lr=config.optim.lr, eps=config.optim.adam_eps)

    max_grad_norm = config.optim.max_grad_norm
    learning_starts, updates_per_batch = config.collector.learning_starts, config.collector.updates_per_batch
    batch_size, total_frames = buffer_config.batch_size, run_config.total_frames
    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(sample):
        loss = loss_fn(sample)["loss"]
        return loss, TensorDict(loss=loss.detach())

    def schedule(learner):  # the learning rate, annealed over the frames with --anneal-lr
        progress = learner.frames / total_frames if config.optim.anneal_lr else 0.0
        anneal_learning_rates([optimizer], [learner.hyperparameters["lr"]], progress)

    def after_step():
        target_updater.step()
        if noisy:
            q_actor.apply(reset_noise)  # a fresh noise sample after every optimisation step
            reset_target_noise(loss_module)  # and one of its own for the target network

    learner = Learner(
        update,
        optimizer,
        {"loss": loss_module, "policy": policy},
        max_grad_norm=max_grad_norm,
        hyperparameters={"lr": config.optim.lr},
        schedule=schedule,
        after_step=after_step,
    )

    def minibatches(batch):  # store the batch; once learning has started, the samples of its gradient steps
        n_step_returns.extend(replay_buffer, batch)
        frames = (
            learner.frames
        )  # this batch's included (on a gradient worker: every worker's, as last counted)
        if frames < learning_starts or len(replay_buffer) < batch_size:
            return
        if prioritized:
            sampler.beta = buffer_config.beta + (1.0 - buffer_config.beta) * min(1.0, frames / total_frames)
            for _ in range(updates_per_batch):  # each draw sees the priorities the previous update wrote
                sample = replay_buffer.sample(batch_size)
                yield sample  # the gradient step runs here and writes the squared TD errors into the sample
                if (
                    not distributional
                ):  # the paper's priority is |TD error|; C51's, its cross-entropy (as written)
                    sample.set("td_error", sample.get("td_error").sqrt())
                replay_buffer.update_tensordict_priority(sample)
        else:  # uniform draws from an unchanging buffer: one sampler call gives them all
            yield from replay_buffer.sample(batch_size * updates_per_batch).split(batch_size)

    def after_batch(batch):  # the next batch's exploration rate; observation statistics
        epsilon_greedy.eps.fill_(
            exploration.next_epsilon(epsilon_greedy.eps.item(), learner.frames, total_frames, batch)
        )
        if normalizer is not None:
            normalizer.update(batch.get("observation"))

    if run_config.gradient_worker is not None:  # this process is a gradient worker: the learner drives it
        return WorkerSession(learner, collector, minibatches)

    # logger, evaluation, checkpoints, resume
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "policy": policy},
        optimizers={"adam": optimizer},
        replay_buffer=replay_buffer,
        target_updater=target_updater,
        extras={"learner": learner} | ({"n_step_returns": n_step_returns} if n_steps > 1 else {}),
    )
    run = Run("dqn", config, run_config, agent, training, callbacks=callbacks)
    if run_config.learns_on_workers:
        return train_on_gradient_workers(run, config, learner, after_batch)

    # loop
    for batch in collector:
        learner.set_frames(run.frames + batch.numel())
        losses, grad_norms = [], []
        for sample in minibatches(batch):
            loss, grad_norm = learner.step(sample)
            losses.append(loss["loss"])
            grad_norms.append(grad_norm)
        after_batch(batch)
        metrics = {"train/epsilon": epsilon_greedy.eps.item()}
        if config.optim.anneal_lr:
            metrics["train/lr"] = optimizer.param_groups[0]["lr"]
        if losses:
            metrics["train/loss"] = torch.stack(losses).mean().item()
            metrics["train/grad_norm"] = torch.stack(grad_norms).mean().item()
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    warn_if_never_updated(run.frames, learning_starts, len(replay_buffer), batch_size, n_steps)
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, DQNConfig, __doc__, presets=PRESETS)
