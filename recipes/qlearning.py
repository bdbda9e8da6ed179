"""Tabular Q-learning (Watkins & Dayan, 1992, "Q-learning", Machine Learning 8:279-292).

A table of action values, updated from every collected transition towards the one-step target
r + gamma * max_a' Q(s', a') (no bootstrap past a termination; truncation bootstraps), with epsilon-greedy
exploration annealed linearly. Discrete observations index the table directly; Box observations are cut into
``--grid-size`` bins per dimension. Discrete action spaces only.

The update is TorchRL's ``DQNLoss`` (squared error, TD(0) target from the current table, no target copy) and
one plain SGD step of size ``--lr`` on half the summed loss: that is exactly
Q(s, a) += lr * (target - Q(s, a)) for each transition. When several transitions of a batch share a state and
action, each is weighted by 1 / (their count), so the entry moves by lr towards their mean target instead of
overshooting (see ``update``).

The zero-initialised table is optimistic for rewards below zero, which drives exploration on its own. Many envs
stepped once per update (the default 128) keep the per-update cost of the loss module small per frame.

Results on a 2-core CPU, seed 0, with the settings in README.md (each a learning test):
Taxi-v4, the defaults: 80k frames, 12-17 s, mean return 7.6 over 100 episodes (the optimal policy: 7.7 on the same
episodes); FrozenLake-v1 (4x4, slippery), --lr 0.1: 100k frames, about 10 s, 74% success over 1000 episodes;
CliffWalking-v1, 16 envs: 10k frames, about 5 s, the optimal -13; MountainCar-v0 with --grid-size 20 on the torch
backend, 4096 envs: 8M frames, about 23 s, about -147 (-200 means the car never reaches the flag).

    python -m recipes.qlearning                    # Taxi-v4
    python -m recipes.qlearning --help             # every option
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from torchrl.objectives import DQNLoss, ValueEstimators

from agents import Agent, ExplorationConfig, make_q_table
from agents.options import Options, defaults
from agents.tabular import CELL_KEY, MAX_TABLE_ENTRIES, check_finite_bounds, egreedy_module, q_value_actor
from errors import InputError
from training import (
    Callback,
    Run,
    RunConfig,
    TrainingState,
    apply_preset,
    check_ranges,
    make_collector,
    make_training_env,
    prepare_process,
    recipe_main,
    require_positive,
    run_cli,
)

PRESETS = Path(__file__).with_name("presets") / "qlearning.toml"  # hyperparameters per env

PAIR_WEIGHT_KEY = "pair_weight"  # per-transition loss weight: 1 / visits of its (state, action) in the batch


@dataclass
class CollectorConfig(Options):
    steps_per_env: int = 1
    """Steps each env takes per collected batch (frames per batch = num_envs * steps_per_env); one update per
    batch."""


@dataclass
class LearningConfig(Options):
    lr: float = 0.5
    """Step size alpha of Q(s, a) += alpha * (target - Q(s, a))."""
    gamma: float = 0.99
    """Discount factor."""


@dataclass
class TableConfig(Options):
    grid_size: int | None = None
    """Bins per observation dimension for Box observations (the table has grid_size ** dims rows); leave unset
    for Discrete observations."""


@dataclass
class QLearningConfig(Options):
    """Tabular Q-learning with epsilon-greedy exploration."""

    run: RunConfig = field(
        default_factory=defaults(
            RunConfig, env_id="Taxi-v4", num_envs=128, total_frames=80_000, eval_every=10_240
        )
    )
    collector: CollectorConfig = field(default_factory=CollectorConfig)
    exploration: ExplorationConfig = field(default_factory=ExplorationConfig)
    learning: LearningConfig = field(default_factory=LearningConfig)
    table: TableConfig = field(default_factory=TableConfig)

    def validate(self) -> None:
        """Raise :class:`InputError` for options outside their meaningful range."""
        self.run.validate()
        if self.run.compile:
            raise InputError(
                "--compile has nothing to compile in recipes.qlearning (a Q-table); leave it out."
            )
        if self.run.normalize_obs_warmup:
            raise InputError(
                "--normalize-obs-warmup fills observation statistics that recipes.qlearning has none of (it "
                "indexes a table by the observation); leave it out."
            )
        require_positive(steps_per_env=self.collector.steps_per_env)
        check_ranges(lr=(self.learning.lr, "(0, 1]"), gamma=(self.learning.gamma, "(0, 1]"))
        self.exploration.validate()
        if self.table.grid_size is not None:
            require_positive(grid_size=self.table.grid_size)


def check_spaces(
    env_id: str, observation_space: gym.Space, action_space: gym.Space, grid_size: int | None
) -> None:
    """Raise :class:`InputError` for spaces a Q-table cannot hold (naming the recipe that can) or a missing grid."""
    if not isinstance(action_space, gym.spaces.Discrete):
        raise InputError(
            f"Tabular Q-learning needs a Discrete action space, but {env_id} has {action_space}: "
            "use recipes.ppo for Box, MultiDiscrete or MultiBinary action spaces."
        )
    if isinstance(observation_space, gym.spaces.Box):
        check_finite_bounds(observation_space.low, observation_space.high)
        floating = np.issubdtype(observation_space.dtype, np.floating)
        # a grid of two bins has 2 ** dims rows; integers at least as many, counting the dims that take 2+ values
        dims = int(
            np.prod(observation_space.shape)
            if floating
            else np.count_nonzero(observation_space.high > observation_space.low)
        )
        most_dims = math.log2(MAX_TABLE_ENTRIES / action_space.n)
        if dims > most_dims:
            raise InputError(
                f"{env_id} has Box observations of {dims} values: even two bins each make 2 ** {dims} table rows, "
                "more than a Q-table holds; use recipes.dqn or recipes.ppo, whose networks read them."
            )
        if grid_size is None and floating:
            raise InputError(
                f"{env_id} has Box observations {observation_space}: pass --grid-size N to cut each dimension "
                "into N bins (the table gets N ** dims rows)."
            )
    elif not isinstance(
        observation_space, (gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)
    ):
        raise InputError(
            f"Tabular Q-learning reads Discrete, MultiDiscrete or MultiBinary observations (a Tuple of Discrete "
            f"ones too), or bounded Box ones; {env_id} has {observation_space}. Wrap the env in a "
            "gymnasium.ObservationWrapper that numbers the observations 0..n-1 with a Discrete(n) observation "
            "space, which this recipe reads."
        )


@recipe_main
def main(config: QLearningConfig, *, callbacks: Sequence[Callback] = ()) -> dict:
    """Train tabular Q-learning as configured and return the run summary (see ``training.run``)."""
    # config: the env's preset fills in the options left at their defaults
    apply_preset(config, PRESETS)
    config.validate()
    run_config, exploration_config, learning_config = config.run, config.exploration, config.learning
    prepare_process(run_config)
    device = torch.device(run_config.device)
    frames_per_batch = run_config.num_envs * config.collector.steps_per_env
    num_batches = -(-run_config.total_frames // frames_per_batch)

    # env
    env = make_training_env(run_config, device)
    try:
        check_spaces(
            run_config.env_id, env.single_observation_space, env.single_action_space, config.table.grid_size
        )
    except InputError:
        env.close()
        raise

    # modules: the agent owns the epsilon-greedy policy over the table; the loss trains its Q-value actor
    policy_kwargs = {"grid_size": config.table.grid_size, "epsilon": exploration_config.initial_epsilon}
    policy = make_q_table(env.observation_spec["observation"], env.action_spec, **policy_kwargs).to(device)
    agent = Agent(
        policy,
        run_config.env_id,
        env.single_observation_space,
        env.single_action_space,
        "qlearning",
        policy_builder=make_q_table,
        policy_kwargs=policy_kwargs,
    )
    q_actor, epsilon_greedy = q_value_actor(agent.policy), egreedy_module(agent.policy)

    # loss + value estimator: (Q(s, a) - r - gamma * (1 - terminated) * max_a' Q(s', a'))^2, summed over the
    # batch with each transition's pair weight; the target reads the current table, detached
    loss_module = DQNLoss(q_actor, delay_value=False, loss_function="l2", reduction="sum")
    loss_module.set_keys(priority_weight=PAIR_WEIGHT_KEY)
    loss_module.make_value_estimator(ValueEstimators.TD0, gamma=learning_config.gamma)

    # collector
    collector = make_collector(
        run_config,
        env,
        agent.policy,
        device,
        frames_per_batch,
        num_batches * frames_per_batch,
    )

    # optimizer: plain SGD on half the squared error is the tabular update, Q += lr * (target - Q)
    optimizer = torch.optim.SGD(loss_module.parameters(), lr=learning_config.lr)

    # logger, evaluation, checkpoints, resume
    training = TrainingState(
        env=env, collector=collector, modules={"policy": agent.policy}, optimizers={"sgd": optimizer}
    )
    run = Run("qlearning", config, run_config, agent, training, callbacks=callbacks)

    num_actions = env.single_action_space.n

    def update(batch):
        transitions = batch.reshape(-1)
        # Transitions sharing a (state, action) pair would add their steps up: weight each by 1 / (their count)
        # so the pair moves by lr towards the mean of their targets.
        pairs = transitions.get(CELL_KEY) * num_actions + transitions.get("action")
        _, pair_index, pair_counts = torch.unique(pairs, return_inverse=True, return_counts=True)
        transitions.set(PAIR_WEIGHT_KEY, 1.0 / pair_counts[pair_index])
        loss = 0.5 * loss_module(transitions)["loss"]
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss.detach()

    # loop
    frames = run.frames  # 0, or where a resumed run stopped
    for batch in collector:
        frames += batch.numel()
        loss = update(batch)
        epsilon = exploration_config.next_epsilon(
            epsilon_greedy.eps.item(), frames, run_config.total_frames, batch
        )
        epsilon_greedy.eps.fill_(epsilon)
        metrics = {
            "train/loss": loss.item() / batch.numel(),
            "train/epsilon": epsilon_greedy.eps.item(),
        }
        if run.record_batch(batch, metrics):
            break
    collector.shutdown()
    env.close()
    return run.finish()


if __name__ == "__main__":
    run_cli(main, QLearningConfig, __doc__, presets=PRESETS)
