"""Tabular Q-learning: the update against a hand-computed case, the observation grid, input errors, checkpoints,
the recipe's smoke run and CLI, and (marked ``learning``) the four reference tasks."""

import json
import sys

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 - registers Sign-v0
import torch
from tensordict import TensorDict
from torchrl.data import Binary, Bounded, Categorical, MultiCategorical
from torchrl.objectives import DQNLoss, ValueEstimators

from agents import Agent
from agents.agent import EVALUATION_STEP_LIMIT
from agents.tabular import (
    CELL_KEY,
    IntegerCells,
    ObservationGrid,
    egreedy_module,
    make_q_table,
    q_value_actor,
)
from errors import InputError
from recipes import qlearning
from training import RunConfig, quiet, run_cli


def test_dqn_loss_and_one_sgd_step_are_the_tabular_update():
    # The recipe's update: half DQNLoss (squared error, summed, TD(0) target from the current table) with pair
    # weights, then one SGD step of size lr, is Q(s, a) += lr * (target - Q(s, a)).
    gamma, lr = 0.9, 0.5
    policy = make_q_table(Categorical(4, shape=(1,)), Categorical(2, shape=(1,)))
    q_actor = q_value_actor(policy)
    table = q_actor.module[0].values
    with torch.no_grad():
        table.copy_(torch.tensor([[1.0, 2.0], [3.0, 0.0], [0.5, 4.0], [2.0, 2.0]]))
    # 0: s0 a1 -> s1, r 1           target 1 + .9 * max Q(s1) = 3.7     Q(s0, a1): 2 -> 2.85
    # 1: s1 a0 -> s2, r -1, terminated: target -1 (no bootstrap)        Q(s1, a0): 3 -> 1
    # 2: s2 a1 -> s3, r 0, truncated: target .9 * 2 = 1.8 (bootstraps)   Q(s2, a1): 4 -> 2.9
    # 3, 4: s3 a0 -> s0, r 1 and r 3: targets 2.8 and 4.8, mean 3.8      Q(s3, a0): 2 -> 2.9 (one step, not two)
    observation = torch.tensor([0, 1, 2, 3, 3])
    terminated = torch.tensor([False, True, False, False, False]).unsqueeze(-1)
    truncated = torch.tensor([False, False, True, False, False]).unsqueeze(-1)
    transitions = TensorDict(
        {
            "observation": observation,
            CELL_KEY: observation,
            "action": torch.tensor([1, 0, 1, 0, 0]),
            "next": {
                "observation": torch.tensor([1, 2, 3, 0, 0]),
                "reward": torch.tensor([1.0, -1.0, 0.0, 1.0, 3.0]).unsqueeze(-1),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
        },
        batch_size=[5],
    )
    loss_module = DQNLoss(q_actor, delay_value=False, loss_function="l2", reduction="sum")
    loss_module.set_keys(priority_weight=qlearning.PAIR_WEIGHT_KEY)
    loss_module.make_value_estimator(ValueEstimators.TD0, gamma=gamma)
    optimizer = torch.optim.SGD(loss_module.parameters(), lr=lr)

    pairs = transitions.get(CELL_KEY) * 2 + transitions.get("action")
    _, pair_index, pair_counts = torch.unique(pairs, return_inverse=True, return_counts=True)
    transitions.set(qlearning.PAIR_WEIGHT_KEY, 1.0 / pair_counts[pair_index])
    loss = 0.5 * loss_module(transitions)["loss"]
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

    expected = torch.tensor([[1.0, 2.85], [1.0, 0.0], [0.5, 2.9], [2.9, 2.0]])
    torch.testing.assert_close(table.detach(), expected)


def test_observation_grid_cells_at_edges_and_outside_the_box():
    grid = ObservationGrid(torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 10.0]), grid_size=4)
    observations = torch.tensor(
        [
            [-1.0, 0.0],  # the low corner: cell (0, 0)
            [1.0, 10.0],  # the high corner belongs to the last bins: (3, 3)
            [0.0, 5.0],  # a bin's lower edge belongs to it: (2, 2)
            [0.49, 2.49],  # (2, 0)
            [-5.0, 20.0],  # outside: clamped to (0, 3)
            [3.0, -1.0],  # outside: clamped to (3, 0)
        ]
    )
    assert grid(observations).tolist() == [0, 15, 10, 8, 3, 12]
    assert grid.num_cells == 16
    assert grid(observations.reshape(2, 3, 2)).tolist() == [[0, 15, 10], [8, 3, 12]]


def test_integer_cells_number_every_combination_of_values_and_clamp_outside_the_box():
    cells = IntegerCells(torch.tensor([0, -1]), torch.tensor([3, 1]))
    assert cells.num_cells == 12
    observations = torch.tensor([[0, -1], [0, 1], [1, -1], [3, 1], [9, -7]])
    assert cells(observations).tolist() == [0, 2, 3, 11, 9]
    assert cells(observations.float()).tolist() == [0, 2, 3, 11, 9]  # Agent.predict hands over floats
    with pytest.raises(InputError, match="pass --grid-size N"):
        IntegerCells(torch.zeros(3, dtype=torch.int64), torch.full((3,), 1000))
    widest = torch.iinfo(torch.int64)
    with pytest.raises(InputError, match="pass --grid-size N"):  # high - low + 1 would overflow int64
        IntegerCells(torch.tensor([widest.min]), torch.tensor([widest.max]))
    with pytest.raises(InputError, match="empty"):
        IntegerCells(torch.tensor([2]), torch.tensor([1]))


def test_qlearning_learns_on_integer_box_observations_value_by_value_and_on_a_grid(output_dir):
    # Sign-v0 kind=int: the side (-3 or 3) and the step count mod 5 in a Box(-5, 5, (2,), int64); random play scores 5
    for grid_size in (None, 3):
        config = qlearning.QLearningConfig(
            run=RunConfig(
                env_id="space_envs:Sign-v0",
                env_kwargs=("kind=int",),
                total_frames=4_096,
                seed=0,
                stop_at_return=float("inf"),
            )
        )
        config.table.grid_size = grid_size
        quiet(config, output_dir, overwrite=True)
        assert qlearning.main(config)["eval_return_mean"] == 10.0
        agent = Agent.load(output_dir / "agent.ckpt")
        assert agent.predict(np.array([3, 1])) == 1 and agent.predict(np.array([-3, 4])) == 0


def test_unbounded_box_is_refused_naming_the_dimensions():
    with pytest.raises(InputError, match=r"unbounded in dimension\(s\) \[0, 1\].*finite box"):
        ObservationGrid(torch.tensor([-float("inf"), 0.0]), torch.tensor([1.0, float("inf")]), grid_size=4)


def tiny_qlearning(output_dir, env_id="Taxi-v4", grid_size=None, **run_overrides):
    options = {
        "env_id": env_id,
        "num_envs": 4,
        "total_frames": 256,
        "eval_every": 128,
        "eval_episodes": 2,
        "output_dir": output_dir,
        "logger": "none",
        "video": False,
        "progress": False,
    }
    return qlearning.QLearningConfig(
        run=RunConfig(**{**options, **run_overrides}), table=qlearning.TableConfig(grid_size=grid_size)
    )


@pytest.mark.parametrize(
    "env_id, grid_size, message",
    [
        ("Pendulum-v1", 8, "use recipes.ppo for Box, MultiDiscrete or MultiBinary action spaces"),
        ("CartPole-v1", 8, r"unbounded in dimension\(s\) \[1, 3\]"),
        ("MountainCar-v0", None, "pass --grid-size N"),
        ("Taxi-v4", 8, "drop it for Discrete observations"),
    ],
)
def test_spaces_a_table_cannot_hold_raise_input_errors(env_id, grid_size, message, output_dir):
    with pytest.raises(InputError, match=message):
        qlearning.main(tiny_qlearning(output_dir, env_id, grid_size=grid_size))


def test_observation_spaces_without_a_table_are_refused_with_a_way_out():
    with pytest.raises(InputError, match=r"numbers the observations 0..n-1 with a Discrete\(n\)"):
        qlearning.check_spaces("Text-v0", gym.spaces.Text(4), gym.spaces.Discrete(2), None)
    qlearning.check_spaces("Grid-v0", gym.spaces.MultiDiscrete([3, 4]), gym.spaces.Discrete(2), None)
    image = gym.spaces.Box(0.0, 1.0, (64, 64, 3))  # 2 ** 12288 rows at two bins a value: a network's job
    with pytest.raises(
        InputError, match=r"12288 values: even two bins each make 2 \*\* 12288 table rows.*recipes.dqn"
    ):
        qlearning.check_spaces("Image-v0", image, gym.spaces.Discrete(2), 4)
    frames = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # Atari's: no grid of bins helps either
    with pytest.raises(InputError, match=r"28224 values: even two bins each make 2 \*\* 28224 table rows"):
        qlearning.check_spaces("ALE/Breakout-v5", frames, gym.spaces.Discrete(4), None)
    qlearning.check_spaces(
        "Wide-v0", gym.spaces.Box(0.0, 1.0, (24,)), gym.spaces.Discrete(2), 2
    )  # 2 ** 25 entries


def test_multi_discrete_and_multi_binary_observations_get_a_row_per_combination():
    actions = Categorical(2, shape=(3,))
    grid = MultiCategorical(
        torch.tensor([[2, 3], [4, 5]]).expand(3, 2, 2), shape=(3, 2, 2), dtype=torch.int64
    )
    table = make_q_table(grid, actions)
    cells = table(
        TensorDict(
            observation=torch.tensor([[[0, 0], [0, 0]], [[1, 2], [3, 4]], [[0, 0], [0, 1]]]), batch_size=[3]
        )
    )
    assert cells["cell"].tolist() == [0, 2 * 3 * 4 * 5 - 1, 1]
    assert cells["action_value"].shape == (3, 2)
    bits = make_q_table(Binary(n=3, shape=(3, 3), dtype=torch.int8), actions)
    cells = bits(
        TensorDict(
            observation=torch.tensor([[0, 0, 0], [1, 1, 1], [1, 0, 0]], dtype=torch.int8), batch_size=[3]
        )
    )
    assert cells["cell"].tolist() == [0, 7, 4]
    with pytest.raises(InputError, match="drop it for MultiDiscrete or MultiBinary"):
        make_q_table(grid, actions, grid_size=4)


@pytest.mark.learning
def test_qlearning_learns_blackjack_from_its_tuple_observations(output_dir):
    # Blackjack-v1 observes Tuple(Discrete(32), Discrete(11), Discrete(2)), read as MultiDiscrete: 704 rows
    config = quiet(
        qlearning.QLearningConfig(),
        output_dir,
        env_id="Blackjack-v1",
        total_frames=50_000,
        eval_every=50_000,
        stop_at_return=float("inf"),
    )
    qlearning.main(config)
    agent = Agent.load(output_dir)
    assert isinstance(agent.observation_space, gym.spaces.MultiDiscrete)
    result = agent.evaluate(episodes=2_000, seed=0)
    assert result.mean >= -0.15  # a random policy: about -0.4; the best: about -0.05
    assert agent.predict((21, 10, 0)) == 0  # stick on 21


def test_invalid_hyperparameters_raise_input_errors(output_dir):
    config = tiny_qlearning(output_dir)
    config.learning.lr = 1.5
    with pytest.raises(InputError, match=r"--lr must be in \(0, 1\]"):
        qlearning.main(config)
    config = tiny_qlearning(output_dir)
    config.exploration.final_epsilon = 0.9
    config.exploration.initial_epsilon = 0.5
    with pytest.raises(InputError, match="--final-epsilon must not exceed --initial-epsilon"):
        qlearning.main(config)
    with pytest.raises(InputError, match="--grid-size must be a positive integer"):
        qlearning.main(tiny_qlearning(output_dir, "MountainCar-v0", grid_size=0))


def test_q_table_builder_refuses_box_actions():
    with pytest.raises(InputError, match="use recipes.ppo"):
        make_q_table(Categorical(4, shape=(1,)), Bounded(-1.0, 1.0, shape=(1, 1)))


def test_q_table_agent_round_trip_and_greedy_predictions(tmp_path):
    env = gym.make("MountainCar-v0")
    agent = Agent.build(
        "MountainCar-v0",
        env.observation_space,
        env.action_space,
        "qlearning",
        policy_builder="q_table",
        policy_kwargs={"grid_size": 6, "epsilon": 1.0},
    )
    table = q_value_actor(agent.policy).module[0].values
    with torch.no_grad():
        table.copy_(torch.randn_like(table))
    egreedy_module(agent.policy).eps.fill_(0.25)
    agent.save(tmp_path / "agent.ckpt")
    loaded = Agent.load(tmp_path / "agent.ckpt")

    assert loaded.policy_builder == "q_table" and loaded.policy_kwargs == {"grid_size": 6, "epsilon": 1.0}
    assert egreedy_module(loaded.policy).eps.item() == 0.25
    torch.testing.assert_close(q_value_actor(loaded.policy).module[0].values, table)
    observations = np.stack([env.observation_space.sample() for _ in range(64)])
    actions = agent.predict(observations)
    np.testing.assert_array_equal(loaded.predict(observations), actions)
    cells = ObservationGrid(
        torch.tensor(env.observation_space.low), torch.tensor(env.observation_space.high), 6
    )
    greedy = table[cells(torch.as_tensor(observations))].argmax(-1)
    np.testing.assert_array_equal(actions, greedy.numpy())  # deterministic: no epsilon-greedy step
    egreedy_module(loaded.policy).eps.fill_(1.0)  # sampling: the epsilon-greedy step acts
    assert (loaded.predict(observations, deterministic=False) != actions).any()


def test_evaluation_caps_episodes_of_envs_without_a_time_limit():
    # A fresh table is greedy for "up", which never leaves CliffWalking's top-left corner.
    env = gym.make("CliffWalking-v1")
    agent = Agent.build("CliffWalking-v1", env.observation_space, env.action_space, "qlearning", "q_table")
    result = agent.evaluate(episodes=2, seed=0)
    assert result.lengths.tolist() == [EVALUATION_STEP_LIMIT] * 2
    assert result.mean == -EVALUATION_STEP_LIMIT


def test_qlearning_smoke_writes_outputs(output_dir):
    summary = qlearning.main(tiny_qlearning(output_dir, logger="csv"))
    assert summary["algorithm"] == "qlearning" and summary["frames"] == 256
    assert json.loads((output_dir / "summary.json").read_text()) == summary
    for name in ("evaluations.csv", "learning_curve.png", "agent.ckpt", "best_agent.ckpt", "config.json"):
        assert (output_dir / name).stat().st_size > 0, name
    agent = Agent.load(output_dir)
    assert agent.algorithm == "qlearning" and agent.policy_builder == "q_table"
    assert egreedy_module(agent.policy).eps.item() < 1.0  # annealed during training, saved with the agent
    assert q_value_actor(agent.policy).module[0].values.abs().sum() > 0  # the table learned something


def test_qlearning_smoke_box_observations_on_the_torch_backend(output_dir):
    config = tiny_qlearning(output_dir, "MountainCar-v0", grid_size=8, env_backend="torch", num_envs=16)
    summary = qlearning.main(config)
    assert summary["frames"] == 256
    assert Agent.load(output_dir).policy_kwargs["grid_size"] == 8


def test_cli_help_and_bad_input(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["qlearning", "--help"])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(qlearning.main, qlearning.QLearningConfig, qlearning.__doc__)
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    for flag in (
        "--grid-size",
        "--lr",
        "--gamma",
        "--steps-per-env",
        "--initial-epsilon",
        "--exploration-fraction",
    ):
        assert flag in help_text, flag
    monkeypatch.setattr(sys, "argv", ["qlearning", "--env-id", "Pendulum-v1", "--grid-size", "8"])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(qlearning.main, qlearning.QLearningConfig, qlearning.__doc__)
    lines = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 2 and len(lines) == 1
    assert (
        lines[0].startswith("error: Tabular Q-learning needs a Discrete action space")
        and "recipes.ppo" in lines[0]
    )


# Learning tests: the settings README.md gives for each task, fixed seed 0.


@pytest.mark.learning
def test_default_config_learns_taxi(output_dir):
    qlearning.main(quiet(qlearning.QLearningConfig(), output_dir))
    result = Agent.load(output_dir).evaluate(episodes=100, seed=0)
    assert result.mean >= 7  # the optimal policy scores 7.69 on these episodes; a looping episode costs 2


@pytest.mark.learning
def test_frozen_lake_success_rate(output_dir):
    config = quiet(
        qlearning.QLearningConfig(),
        output_dir,
        env_id="FrozenLake-v1",
        total_frames=100_000,
        eval_every=100_000,
        stop_at_return=float("inf"),
    )
    config.learning.lr = 0.1
    qlearning.main(config)
    result = Agent.load(output_dir).evaluate(episodes=1000, seed=0)
    assert (result.returns > 0).mean() >= 0.6  # slippery 4x4: the best policy succeeds about 74% of the time


@pytest.mark.learning
def test_cliff_walking_finds_the_optimal_path(output_dir):
    config = quiet(
        qlearning.QLearningConfig(), output_dir, env_id="CliffWalking-v1", num_envs=16, total_frames=10_000
    )
    summary = qlearning.main(config)
    assert summary["eval_return_mean"] == -13.0  # 13 steps along the cliff edge, every episode


@pytest.mark.learning
def test_mountain_car_on_a_grid(output_dir):
    config = quiet(
        qlearning.QLearningConfig(),
        output_dir,
        env_id="MountainCar-v0",
        env_backend="torch",
        num_envs=4096,
        total_frames=8_000_000,
        eval_every=8_000_000,
    )
    config.table.grid_size = 20
    config.learning.lr = 0.1
    config.exploration.initial_epsilon = config.exploration.final_epsilon = 0.1
    qlearning.main(config)
    result = Agent.load(output_dir).evaluate(episodes=100, seed=0)
    assert result.mean > -200  # -200: the car never reaches the flag; seed 0 scores about -150


def test_multiplicative_epsilon_decays_per_finished_episode(output_dir):
    from agents import ExplorationConfig
    from training import Callback

    class Episodes(Callback):
        count = 0

        def on_batch(self, run, batch, metrics):
            Episodes.count += int(batch.get(("next", "done")).sum())

    config = tiny_qlearning(output_dir, env_id="FrozenLake-v1", total_frames=1_024)
    config.exploration = ExplorationConfig(
        final_epsilon=0.01,
        epsilon_schedule="multiplicative",
        epsilon_decay=0.97,
        epsilon_decay_unit="episode",
    )
    qlearning.main(config, callbacks=[Episodes()])
    assert Episodes.count > 10
    expected = max(0.01, 0.97**Episodes.count)
    assert Agent.load(output_dir).policy[1].eps.item() == pytest.approx(expected, rel=1e-5)


def test_an_image_sized_box_is_refused_in_a_short_message_with_or_without_a_grid():
    # CarRacing's 96x96x3 pixels (one env): 256^27648 cells value by value, 2^27648 on a grid of 2
    shape = (1, 96, 96, 3)
    low, high = torch.zeros(shape, dtype=torch.uint8), torch.full(shape, 255, dtype=torch.uint8)
    image = Bounded(low, high, shape=shape, dtype=torch.uint8)
    messages = {
        None: r"Integer Box observations of shape \(96, 96, 3\) between 0 and 255 take more than",
        2: r"A Q-table of about 10\^8322 states x 5 actions is too large",
    }
    for grid_size, message in messages.items():
        with pytest.raises(InputError, match=message) as error:
            make_q_table(image, Categorical(5, shape=(1,)), grid_size=grid_size)
        assert len(str(error.value)) < 400
    with pytest.raises(InputError, match=r"\(3,072 in all\)") as error:
        ObservationGrid(torch.full((1024, 3), -float("inf")), torch.zeros(1024, 3), grid_size=2)
    assert len(str(error.value)) < 400


def test_an_observation_warm_up_is_refused_naming_the_table():
    """recipes.qlearning has no --normalize-obs: the warm-up's usual advice (add it) would not hold."""
    config = qlearning.QLearningConfig(run=RunConfig(env_id="CliffWalking-v1", normalize_obs_warmup=100))
    with pytest.raises(InputError, match="statistics that recipes.qlearning has none of .*leave it out"):
        config.validate()
