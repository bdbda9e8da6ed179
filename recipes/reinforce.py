"""REINFORCE: Monte-Carlo policy gradient (Williams, 1992, "Simple statistical gradient-following algorithms
for connectionist reinforcement learning", Machine Learning 8:229-256).

Each update takes ``--episodes-per-update`` complete episodes, computes every step's discounted return-to-go
G_t = r_t + gamma r_{t+1} + ... up to the end of its episode (TorchRL's ``reward2go``), and takes one gradient
step on -mean_t log pi(a_t|s_t) G_t (TorchRL's ``A2CLoss``, with no value term), optionally with the returns
standardised over the update's steps and an entropy bonus. Discrete (categorical policy) and Box (tanh-normal
policy) action spaces.

Complete episodes: the collector steps the envs ``--steps-per-env`` at a time and hands over finished episodes
only (TorchRL's ``trajs_per_batch``); an episode still running when a batch ends is kept and completed by the
following batches, so no return is ever cut at a batch boundary. An episode still running at an update is
finished by the updated policy: its first steps were taken by the policy of one update before (a small
off-policy lag, ignored here). A time-limit truncation is the end of that episode's return sum: REINFORCE has
no value function to bootstrap from, so G_t is the discounted reward until the cut. ``--total-frames`` bounds
the env steps; the run's frame count (summary, evaluations, ``solved_at_frames``) counts the steps of the
episodes handed to updates, which leaves out the up to ``--num-envs`` episodes still running (12.2k steps
taken for the 10.4k counted in the seed-0 run below).

The defaults (8 envs, 8 episodes per update, Adam 1e-2, standardised returns) solve CartPole-v1 (deterministic
evaluation mean >= 475 over 20 episodes) within the 100k-frame budget: at 10k, 6k, 31k, 11k and 26k frames for
seeds 0-4, 2-11 s on one core of a shared 2-core CPU. Pendulum-v1 (Box actions) runs, but plain REINFORCE does
not learn it in a small budget (still about -1400 after 20k frames); use A2C or PPO there.

    python -m recipes.reinforce                    # CartPole-v1
    python -m recipes.reinforce --help             # every option
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torchrl.objectives import A2CLoss

from agents import Agent, compiled, find_normalizer, make_actor
from agents.gsde import clip_env_actions
from agents.loss_addons import (
    LossAddon,
    LossAddonConfig,
    addon_losses,
    build_loss_addons,
    trainable_parameters,
)
from agents.networks import action_mask_kwargs, box_policy_kwargs
from agents.options import Options, defaults
from agents.policy_gradient import ReturnBaseline, returns_to_go
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
    train_on_gradient_workers,
    warn_if_no_whole_episodes,
)

PRESETS = Path(__file__).with_name("presets") / "reinforce.toml"  # hyperparameters per env
RETURN_TO_GO_KEY = "return_to_go"


@dataclass
class CollectorConfig(Options):
    episodes_per_update: int = 8
    """Complete episodes in each gradient step."""
    steps_per_env: int = 16
    """Steps each env takes per collector poll; finished episodes are handed over after each poll."""


@dataclass
class LossConfig(Options):
    gamma: float = 0.99
    """Discount factor of the returns."""
    normalize_returns: bool = True
    """Standardise the returns of each update (zero mean, unit std over its steps): a batch-mean baseline
    and a step size that does not grow with the returns."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: none)."""


@dataclass
class OptimConfig(Options):
    lr: float = 1e-2
    """Adam learning rate."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "tanh"
    """Activation between hidden layers."""
    normalize_obs: bool = False
    """Normalise observations with running statistics saved in the agent."""


@dataclass
class ReinforceConfig(Options):
    """REINFORCE: Monte-Carlo policy gradient over complete episodes."""

    GRADIENT_SPLIT: ClassVar[tuple[str, ...]] = ("collector.episodes_per_update",)  # shared out among workers

    run: RunConfig = field(
        default_factory=defaults(RunConfig, num_envs=8, total_frames=100_000, eval_every=5_000)
    )
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    network: NetworkConfig = field(default_factory=NetworkConfig)
    addons: LossAddonConfig = field(default_factory=LossAddonConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range."""
        self.run.validate()
        self.addons.validate()
        require_positive(
            episodes_per_update=self.collector.episodes_per_update, steps_per_env=self.collector.steps_per_env
        )
        check_ranges(
            lr=(self.optim.lr, "(0, inf)"),
            gamma=(self.loss.gamma, "(0, 1]"),
            entropy_coef=(self.loss.entropy_coef, "[0, inf)"),
        )
        check_gradient_workers(self)


@recipe_main
def main(
    config: ReinforceConfig, loss_addons: Sequence[LossAddon] = (), *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Train REINFORCE as configured and return the run summary (see ``training.run``); ``loss_addons`` are
    factories of extra policy-loss terms (:mod:`agents.loss_addons`), as in ``recipes.ppo``."""
    refuse_loss_addons(loss_addons, config.run)
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, loss_config = config.run, config.loss
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_poll = run_config.num_envs * config.collector.steps_per_env

    # env
    env = make_training_env(run_config, device)

    # modules: the agent owns the policy (and the observation normaliser)
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "normalize_obs": config.network.normalize_obs,
        **action_mask_kwargs(env),  # an env that gives the allowed actions gets a masked policy
        **box_policy_kwargs(env.action_spec),  # a Box with an infinite bound: an unsquashed Gaussian
    }
    if not policy_kwargs.get("squash", True):  # the env clips its actions to the Box's finite bounds
        env = clip_env_actions(env)
    policy = make_actor(env.observation_spec["observation"], env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "reinforce",
        policy_builder=make_actor,
        policy_kwargs=policy_kwargs,
    )
    actor = agent.policy
    normalizer = find_normalizer(actor)

    # loss: A2CLoss's policy term is REINFORCE's -log pi(a|s) * advantage, averaged over steps; with
    # critic_coeff=None it has no value term. It still takes a critic module: REINFORCE's baseline is zero.
    loss_module = A2CLoss(
        actor,
        ReturnBaseline(),  # never updated: b(s) = 0
        entropy_bonus=loss_config.entropy_coef > 0,
        entropy_coeff=loss_config.entropy_coef,
        critic_coeff=None,
        functional=False,
    )
    # extra loss terms, e.g. a KL penalty (given in Python, or by --kl-to)
    loss_addons = [
        *loss_addons,
        *config.addons.factories(env.single_observation_space, env.single_action_space),
    ]
    addons = build_loss_addons(loss_addons, actor).to(device)

    # collector: batches of complete episodes, concatenated along time (("next", "done") ends each one); with
    # --gradient-workers, each worker has its own
    collector = (
        None
        if run_config.learns_on_workers
        else make_collector(
            run_config,
            env,
            actor,
            device,
            frames_per_poll,
            -(-run_config.total_frames // frames_per_poll) * frames_per_poll,
            trajs_per_batch=config.collector.episodes_per_update,
            traj_format="cat",
        )
    )

    # optimizer
    optimizer = torch.optim.Adam(trainable_parameters(loss_module, addons), lr=config.optim.lr)

    loss_keys = ["loss_objective"] + (["loss_entropy"] if loss_config.entropy_coef > 0 else [])
    gamma, normalize_returns = loss_config.gamma, loss_config.normalize_returns
    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(episodes):
        loss = loss_fn(episodes)
        addon_total, addon_metrics = addon_losses(addons, episodes)
        total = sum(loss[key] for key in loss_keys) + addon_total
        metrics = loss.select(*loss_keys, "entropy", strict=False).detach().update(addon_metrics)
        return total, metrics.set("return_to_go", episodes.get(RETURN_TO_GO_KEY).mean())

    def schedule(learner):
        set_learning_rates(optimizer, [learner.hyperparameters["lr"]])
        if "entropy_coef" in learner.hyperparameters:
            loss_module.entropy_coeff.fill_(learner.hyperparameters["entropy_coef"])

    learner = Learner(
        update,
        optimizer,
        {"loss": loss_module, "addons": addons},
        hyperparameters={"lr": config.optim.lr}
        | ({"entropy_coef": loss_config.entropy_coef} if loss_config.entropy_coef > 0 else {}),
        schedule=schedule,
    )

    def minibatches(episodes):  # one gradient step on the batch's episodes, weighted by their returns
        returns = returns_to_go(episodes, gamma)  # to the end of each episode, truncated ones included
        advantage = returns
        if normalize_returns:
            advantage = (returns - returns.mean()) / (returns.std(correction=0) + 1e-8)
        yield episodes.set("advantage", advantage).set(RETURN_TO_GO_KEY, returns)

    def after_batch(episodes):  # observation statistics, once the batch's update is done
        if normalizer is not None:
            normalizer.update(episodes.get("observation"))

    if run_config.gradient_worker is not None:  # this process is a gradient worker: the learner drives it
        return WorkerSession(learner, collector, minibatches)

    # logger, evaluation, checkpoints, resume (the collector's episodes in the making included)
    training = TrainingState(
        env=env,
        collector=collector,
        modules={"loss": loss_module, "addons": addons},
        optimizers={"optimizer": optimizer},
        extras={"learner": learner},
    )
    run = Run("reinforce", config, run_config, agent, training, callbacks=callbacks)
    if run_config.learns_on_workers:
        return train_on_gradient_workers(run, config, learner, after_batch)

    # loop: one gradient step per batch of complete episodes
    for episodes in collector:
        for minibatch in minibatches(episodes):
            losses, _ = learner.step(minibatch)
        after_batch(episodes)
        metrics = {f"train/{key}": value.item() for key, value in losses.items()}
        if run.record_batch(episodes, metrics):
            break
    run.end_collection()  # also when the collector ran out, its last steps' episodes unfinished
    collector.shutdown()
    env.close()
    warn_if_no_whole_episodes(run.frames, run_config.total_frames, config.collector.episodes_per_update)
    return run.finish()


if __name__ == "__main__":
    run_cli(main, ReinforceConfig, __doc__, presets=PRESETS)
