"""Vanilla policy gradient: REINFORCE with a baseline and an optional entropy bonus (Williams, 1992, "Simple
statistical gradient-following algorithms for connectionist reinforcement learning", whose REINFORCE allows
any reinforcement baseline; the "VPG" of OpenAI Spinning Up, Achiam 2018).

Each update takes ``--episodes-per-update`` complete episodes (collected as in ``recipes.reinforce``: episodes
that span a batch boundary are completed by the following batches), computes every step's discounted
return-to-go G_t (TorchRL's ``reward2go``; at a time-limit truncation the learned value's V(s') of the cut-off
observation carries the sum on, the other baselines end it there) and the advantage A_t = G_t - b(s_t) for the
chosen baseline, and takes one gradient step on TorchRL's ``A2CLoss``: -mean_t log pi(a_t|s_t) A_t minus
entropy_coef * entropy, plus mean_t (V(s_t) - G_t)^2 for a learned value. A baseline that does not depend on
the action leaves the gradient unbiased and lowers its variance.

    --baseline value          a critic V(s), regressed on the returns (its own learning rate, --critic-lr)
    --baseline running-mean   a running mean of earlier updates' returns (state-independent)
    --baseline none           plain REINFORCE

The baseline is computed before the update that uses it (the critic's values and the running mean are those of
the earlier batches), so it never depends on the actions it scores. Discrete (categorical policy) and Box
(tanh-normal policy) action spaces.

Advantages are divided by their root mean square (``--normalize-advantage``) but not centred: centring would
subtract the batch mean, itself a baseline, and make the state-independent baselines all the same.

The defaults (value baseline, 8 envs, 8 episodes per update, Adam 1e-2 for both networks) solve CartPole-v1
(deterministic evaluation mean >= 475 over 20 episodes) within the 100k-frame budget: at 11k, 41k, 15k, 52k
and 11k frames for seeds 0-4 (4-12 s on one core of a shared 2-core CPU); ``--baseline running-mean`` at 27k,
12k, 17k, 16k and 33k (4-13 s); ``--baseline none`` at 33k, 32k and 32k for seeds 0-2 (10-13 s). Frames are
counted as in ``recipes.reinforce`` (the steps of the episodes used).

    python -m recipes.vpg                                  # CartPole-v1, value baseline
    python -m recipes.vpg --baseline running-mean
    python -m recipes.vpg --help                           # every option
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

import torch
from torchrl.objectives import A2CLoss

from agents import Agent, compiled, find_normalizer, input_encoder, make_actor, make_critic
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
from agents.policy_gradient import ReturnBaseline, returns_to_go, truncation_values
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

PRESETS = Path(__file__).with_name("presets") / "vpg.toml"  # hyperparameters per env


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
    baseline: Literal["value", "running-mean", "none"] = "value"
    """What is subtracted from the returns: a learned state value, a running mean of returns, or nothing."""
    baseline_rate: float = 0.1
    """Running-mean baseline: weight of the newest update's mean return (a plain average for the first 1/rate
    updates)."""
    normalize_advantage: bool = True
    """Divide the advantages of each update by their root mean square (not centred: centring would subtract
    the batch mean, itself a baseline, and cancel a state-independent one)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: none)."""


@dataclass
class OptimConfig(Options):
    lr: float = 1e-2
    """Adam learning rate of the policy."""
    critic_lr: float = 1e-2
    """Adam learning rate of the value baseline."""


@dataclass
class NetworkConfig(Options):
    hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden layer widths of the policy and of the value baseline."""
    activation: Literal["tanh", "relu", "elu", "silu"] = "tanh"
    """Activation between hidden layers."""
    normalize_obs: bool = False
    """Normalise observations with running statistics saved in the agent."""


@dataclass
class VPGConfig(Options):
    """VPG: REINFORCE with a baseline and an optional entropy bonus."""

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
        loss, optim = self.loss, self.optim
        require_positive(
            episodes_per_update=self.collector.episodes_per_update, steps_per_env=self.collector.steps_per_env
        )
        check_ranges(
            lr=(optim.lr, "(0, inf)"),
            critic_lr=(optim.critic_lr, "(0, inf)"),
            gamma=(loss.gamma, "(0, 1]"),
            baseline_rate=(loss.baseline_rate, "(0, 1]"),
            entropy_coef=(loss.entropy_coef, "[0, inf)"),
        )
        check_gradient_workers(self)


@recipe_main
def main(
    config: VPGConfig, loss_addons: Sequence[LossAddon] = (), *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Train VPG as configured and return the run summary (see ``training.run``); ``loss_addons`` are factories of
    extra policy-loss terms (:mod:`agents.loss_addons`), as in ``recipes.ppo``."""
    refuse_loss_addons(loss_addons, config.run)
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, loss_config, optim_config = config.run, config.loss, config.optim
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_poll = run_config.num_envs * config.collector.steps_per_env
    learned_value = loss_config.baseline == "value"

    # env
    env = make_training_env(run_config, device)
    observation_spec = env.observation_spec["observation"]

    # modules: the agent owns the policy (and the observation normaliser); the baseline writes "state_value"
    policy_kwargs = {
        "hidden_sizes": list(config.network.hidden_sizes),
        "activation": config.network.activation,
        "normalize_obs": config.network.normalize_obs,
        **action_mask_kwargs(env),  # an env that gives the allowed actions gets a masked policy
        **box_policy_kwargs(env.action_spec),  # a Box with an infinite bound: an unsquashed Gaussian
    }
    if not policy_kwargs.get("squash", True):  # the env clips its actions to the Box's finite bounds
        env = clip_env_actions(env)
    policy = make_actor(observation_spec, env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "vpg",
        policy_builder=make_actor,
        policy_kwargs=policy_kwargs,
    )
    actor = agent.policy
    normalizer = find_normalizer(actor)
    if learned_value:
        baseline = make_critic(
            observation_spec,
            config.network.hidden_sizes,
            config.network.activation,
            encoder=input_encoder(actor),
        ).to(device)
    else:
        baseline = ReturnBaseline(rate=loss_config.baseline_rate).to(device)  # "none": never updated, b = 0

    # loss: -log pi(a|s) * advantage (+ entropy bonus) (+ squared error of a learned value against returns)
    loss_module = A2CLoss(
        actor,
        baseline,
        entropy_bonus=loss_config.entropy_coef > 0,
        entropy_coeff=loss_config.entropy_coef,
        critic_coeff=1.0 if learned_value else None,  # separate networks and learning rates: no weighting
        loss_critic_type="l2",
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

    # optimizer: one Adam, a learning rate for the policy and one for the value baseline
    actor_parameters = trainable_parameters(actor, addons)  # with an add-on's own (a learned multiplier, say)
    shared = {id(parameter) for parameter in actor_parameters}  # an image encoder is shared with the critic
    critic_parameters = [parameter for parameter in baseline.parameters() if id(parameter) not in shared]
    optimizer = torch.optim.Adam([{"params": actor_parameters}, {"params": critic_parameters}])

    loss_keys = (
        ["loss_objective"]
        + (["loss_critic"] if learned_value else [])
        + (["loss_entropy"] if loss_config.entropy_coef > 0 else [])
    )
    gamma, normalize_advantage = loss_config.gamma, loss_config.normalize_advantage
    loss_fn = compiled(loss_module, run_config.compile)  # --compile: forward and backward

    def update(episodes):
        loss = loss_fn(episodes)
        addon_total, addon_metrics = addon_losses(addons, episodes)
        total = sum(loss[key] for key in loss_keys) + addon_total
        metrics = loss.select(*loss_keys, "entropy", strict=False).detach().update(addon_metrics)
        metrics.set("return_to_go", episodes.get("value_target").mean())
        return total, metrics.set("baseline", episodes.get("state_value").mean())

    def schedule(learner):
        values = learner.hyperparameters
        set_learning_rates(optimizer, [values["lr"], values["critic_lr"]])
        if "entropy_coef" in values:
            loss_module.entropy_coeff.fill_(values["entropy_coef"])

    learner = Learner(
        update,
        optimizer,
        {"loss": loss_module, "addons": addons},
        hyperparameters={"lr": optim_config.lr, "critic_lr": optim_config.critic_lr}
        | ({"entropy_coef": loss_config.entropy_coef} if loss_config.entropy_coef > 0 else {}),
        schedule=schedule,
    )

    def minibatches(episodes):  # one gradient step on the batch's episodes, with their advantages
        # to the end of each episode; a learned value carries a truncated one on past its time limit
        cut_off = truncation_values(baseline, episodes) if learned_value else None
        returns = returns_to_go(episodes, gamma, cut_off)
        with torch.no_grad():
            baseline(episodes)  # b(s_t) from the critic or the running mean, before this batch moves it
        advantage = returns - episodes.get("state_value")
        if normalize_advantage:
            advantage = advantage / advantage.square().mean().sqrt().clamp_min(1e-8)
        yield episodes.set("advantage", advantage).set("value_target", returns)

    def after_batch(episodes):  # the running-mean baseline and observation statistics, after the update
        if loss_config.baseline == "running-mean":
            baseline.update(returns_to_go(episodes, gamma))
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
    run = Run("vpg", config, run_config, agent, training, callbacks=callbacks)
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
    run_cli(main, VPGConfig, __doc__, presets=PRESETS)
