import itertools
import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from torchrl.envs.utils import check_env_specs

from envs import DeepSeaEnv, make_env
from errors import InputError
from training import RunConfig


@pytest.mark.parametrize(
    "env_id, kwargs",
    [
        ("rlkit/DeepSea-v0", {}),
        ("rlkit/DeepSea5-v0", {"randomize_actions": False}),
        ("rlkit/DeepSea-v0", {"size": 4, "render_mode": "rgb_array"}),
    ],
)
def test_gymnasium_env_checker_passes_without_warnings(env_id, kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gym.make(env_id, **kwargs).unwrapped)
    assert [str(warning.message) for warning in caught] == []


def play(env, actions):
    observation, _ = env.reset(seed=0)
    observations, rewards, flags = [observation], [], []
    for action in actions:
        observation, reward, terminated, truncated, _ = env.step(action)
        observations.append(observation)
        rewards.append(reward)
        flags.append((terminated, truncated))
    return observations, rewards, flags


def cell(observation, size):
    index = int(np.flatnonzero(observation)[0])
    return divmod(index, size)


def test_dynamics_and_rewards_by_hand():
    env = DeepSeaEnv(size=3, randomize_actions=False)  # action 1 is "right" in every cell
    observations, rewards, flags = play(env, [1, 1, 1])
    assert [cell(o, 3) for o in observations[:3]] == [(0, 0), (1, 1), (2, 2)]
    assert observations[0].dtype == np.float32 and observations[0].sum() == 1
    assert not observations[3].any()  # the agent left the grid: all-zero final observation
    cost = 0.01 / 3
    assert rewards == pytest.approx([-cost, -cost, 1.0 - cost])
    assert flags == [(False, False), (False, False), (True, False)]
    # left from the first column stays there and costs nothing; right then left comes back
    observations, rewards, flags = play(env, [0, 1, 0])
    assert [cell(o, 3) for o in observations[:3]] == [(0, 0), (1, 0), (2, 1)]
    assert rewards == pytest.approx([0.0, -cost, 0.0]) and flags[-1] == (True, False)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


def test_only_the_mapped_right_moves_reach_the_treasure():
    env = DeepSeaEnv(size=6, mapping_seed=3)
    assert 0 < env.action_mapping.sum() < 36  # "right" is action 0 in some cells and action 1 in others
    returns = {actions: sum(play(env, actions)[1]) for actions in itertools.product((0, 1), repeat=6)}
    best = max(returns, key=returns.get)
    assert returns[best] == pytest.approx(0.99)  # the optimal return: 1 minus six right moves of 0.01 / 6
    assert list(best) == [env.action_mapping[step, step] for step in range(6)]
    assert all(value <= 0 for actions, value in returns.items() if actions != best)


def test_action_mapping_belongs_to_the_task_not_to_the_episode():
    first, second = DeepSeaEnv(size=8, mapping_seed=1), DeepSeaEnv(size=8, mapping_seed=1)
    first.reset(seed=0)
    second.reset(seed=123)
    assert np.array_equal(first.action_mapping, second.action_mapping)
    assert not np.array_equal(first.action_mapping, DeepSeaEnv(size=8, mapping_seed=2).action_mapping)
    assert DeepSeaEnv(size=8, randomize_actions=False).action_mapping.min() == 1


def test_registered_ids_work_with_make_env_and_run_config():
    assert gym.spec("rlkit/DeepSea-v0").kwargs == {"size": 10}
    assert gym.make("rlkit/DeepSea16-v0").observation_space.shape == (256,)
    assert gym.make("rlkit/DeepSea-v0", size=7).unwrapped.size == 7
    RunConfig(env_id="rlkit/DeepSea16-v0").validate()
    assert RunConfig(env_id="rlkit/DeepSea-v0").target_return == 0.9
    env = make_env("rlkit/DeepSea-v0", num_envs=3, seed=0)
    check_env_specs(env)
    data = env.rollout(25, break_when_any_done=False)
    terminated = data["next", "terminated"].squeeze(-1)
    assert terminated[:, [9, 19]].all() and terminated.sum() == 6 and not data["next", "truncated"].any()
    assert torch.equal(data["next", "done"], data["next", "terminated"])


def test_render_and_bad_arguments():
    env = DeepSeaEnv(size=5, render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame.dtype == np.uint8 and frame.shape == (5 * 51, 5 * 51, 3)
    with pytest.raises(InputError, match="from 2 to 1024"):
        DeepSeaEnv(size=1)
    with pytest.raises(InputError, match="rgb_array"):
        DeepSeaEnv(render_mode="human")
    env.reset(seed=0)
    for action in (7, -3, 0.9):
        with pytest.raises(InputError, match="0 or 1"):
            env.step(action)


@pytest.mark.parametrize("size", [1, 1_025, 2.5, True, 200_000])
def test_a_size_outside_its_range_is_refused_before_anything_is_allocated(size):
    with pytest.raises(InputError, match=r"DeepSea size must be a whole number from 2 to 1024"):
        DeepSeaEnv(size=size)
    assert DeepSeaEnv(size=1_024).observation_space.shape == (1_024 * 1_024,)
