"""The torch classic-control envs reproduce Gymnasium's reference implementations."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.utils.env_checker import check_env
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from envs import EPISODE_LENGTH_KEY, TORCH_ENVS, make_env
from errors import InputError

# Per env: a short time limit (so that episodes end by truncation too) and start states that make the
# first episode end by termination; None means Gymnasium's own random start.
CASES = {
    "CartPole-v1": {"max_steps": 40, "starts": [None, None]},
    "Pendulum-v1": {"max_steps": 50, "starts": [None]},
    "MountainCar-v0": {"max_steps": 60, "starts": [[0.45, 0.03], None]},
    "MountainCarContinuous-v0": {"max_steps": 60, "starts": [[0.40, 0.03], None]},
    "Acrobot-v1": {"max_steps": 60, "starts": [[2.5, 0.5, 2.0, 1.0], None]},
}


def set_reference_state(reference: gym.Env, state) -> np.ndarray:
    unwrapped = reference.unwrapped
    if state is not None:
        dtype = np.float32 if unwrapped.spec.id.startswith("MountainCarContinuous") else np.float64
        unwrapped.state = np.array(state, dtype=dtype)
    return np.asarray(unwrapped.state, dtype=np.float64)


@pytest.mark.parametrize("env_id", list(CASES))
def test_matches_gymnasium_step_for_step(env_id):
    case = CASES[env_id]
    reference = gym.make(env_id, max_episode_steps=case["max_steps"])
    env = TORCH_ENVS[env_id](num_envs=1, dtype=torch.float64, max_episode_steps=case["max_steps"])
    env.reset()
    rng = np.random.default_rng(0)
    starts = list(case["starts"])
    episodes, ends = 0, {"terminated": 0, "truncated": 0}

    def start_episode():
        nonlocal episodes
        reference.reset(seed=episodes)
        state = set_reference_state(reference, starts.pop(0) if starts else None)
        env.state = torch.as_tensor(state, dtype=torch.float64).unsqueeze(0)
        episodes += 1

    start_episode()
    root = env._root()
    for _ in range(400):
        torch.testing.assert_close(
            root["observation"][0], reference_observation(reference), rtol=1e-5, atol=1e-5
        )
        if episodes == 1 and case["starts"][0] is not None:  # drive towards the goal in the scripted episode
            action = reference.action_space.high if isinstance(reference.action_space, gym.spaces.Box) else 2
        else:
            action = sample_action(reference.action_space, rng)
        observation, reward, terminated, truncated, _ = reference.step(action)
        data = TensorDict({"action": torch.as_tensor(np.asarray(action)).reshape(env.action_spec.shape)}, [1])
        data, root = env.step_and_maybe_reset(data)
        torch.testing.assert_close(
            data["next", "observation"][0], torch.as_tensor(observation), rtol=1e-5, atol=1e-5
        )
        assert data["next", "reward"].item() == pytest.approx(float(reward), rel=1e-6, abs=1e-6)
        assert data["next", "terminated"].item() == terminated
        assert data["next", "truncated"].item() == truncated
        if terminated or truncated:
            ends["terminated" if terminated else "truncated"] += 1
            start_episode()
            root = env._root()
    assert ends["truncated"] > 0
    if env_id != "Pendulum-v1":  # Pendulum never terminates
        assert ends["terminated"] > 0


def reference_observation(reference: gym.Env) -> torch.Tensor:
    """The observation Gymnasium's env would return for its current state."""
    unwrapped = reference.unwrapped
    observe = getattr(unwrapped, "_get_obs", None) or getattr(unwrapped, "_get_ob", None)
    return torch.as_tensor(observe() if observe else np.array(unwrapped.state, dtype=np.float32))


def sample_action(space: gym.Space, rng: np.random.Generator):
    if isinstance(space, gym.spaces.Discrete):
        return int(rng.integers(space.n))
    return rng.uniform(space.low, space.high).astype(np.float32)


@pytest.mark.parametrize("env_id", list(CASES))
def test_specs_single_env_and_vector_env(env_id):
    check_env_specs(make_env(env_id, num_envs=5, backend="torch", seed=0))
    single = gym.make(f"rlkit/{env_id}", render_mode="rgb_array")
    check_env(single.unwrapped)
    assert single.observation_space == gym.make(env_id).observation_space
    assert single.action_space == gym.make(env_id).action_space
    single.reset(seed=0)
    frame = single.render()
    assert frame.ndim == 3 and frame.shape[-1] == 3 and frame.std() > 0
    vector = gym.make_vec(f"rlkit/{env_id}", num_envs=3)
    assert vector.reset(seed=0)[0].shape == (3, *single.observation_space.shape)
    check_env_specs(make_env(vector, seed=0))


def test_seeding():
    def first_observations(seed):
        env = make_env("CartPole-v1", num_envs=8, backend="torch", seed=seed)
        torch.manual_seed(0)  # random actions come from torch's global generator
        return env.rollout(50, break_when_any_done=False)["observation"]

    torch.testing.assert_close(first_observations(1), first_observations(1), rtol=0, atol=0)
    assert not torch.equal(first_observations(1)[:, 0], first_observations(2)[:, 0])


def test_batched_autoreset_leaves_other_envs_alone_and_flags_truncation():
    env = make_env("Pendulum-v1", num_envs=4, backend="torch", seed=0, env_kwargs={"max_episode_steps": 5})
    env.reset()
    env.steps = torch.tensor([0, 2, 4, 1])  # sub-envs at different points of their episodes
    data = env.rollout(6, break_when_any_done=False, auto_reset=False, tensordict=env._root())
    truncated = data["next", "truncated"].squeeze(-1)
    assert not data["next", "terminated"].any()
    assert truncated[2, 0] and truncated[1, 2] and truncated[0, 4] and truncated[3, 3]
    for index in range(4):
        for t in range(5):
            if truncated[index, t]:
                assert data[EPISODE_LENGTH_KEY][index, t + 1].item() == 0
            else:  # an unfinished sub-env continues from where it was, whatever the others do
                torch.testing.assert_close(
                    data["observation"][index, t + 1], data["next", "observation"][index, t]
                )


def test_cartpole_terminates_per_env_and_resets_inside_the_initial_range():
    env = make_env("CartPole-v1", num_envs=3, backend="torch", seed=0)
    env.reset()
    env.state = torch.tensor([[0.0, 0.0, 0.2, 2.0], [0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    data, root = env.step_and_maybe_reset(TensorDict({"action": torch.ones(3, dtype=torch.int64)}, [3]))
    assert data["next", "terminated"].squeeze(-1).tolist() == [True, False, False]
    assert root["observation"][0].abs().max() <= 0.05
    torch.testing.assert_close(root["observation"][1:], data["next", "observation"][1:])


@pytest.mark.parametrize("env_id", ["CartPole-v1", "MountainCarContinuous-v0"])
def test_gymnasium_vector_env_reports_final_observations(env_id):
    vector = gym.make_vec(f"rlkit/{env_id}", num_envs=3, max_episode_steps=7)
    observations, _ = vector.reset(seed=0)
    for _ in range(7):
        observations, _, terminated, truncated, info = vector.step(vector.action_space.sample())
    assert (terminated | truncated).all()
    assert info["_final_obs"].all() and np.stack(info["final_obs"]).shape == observations.shape
    env = make_env(gym.make_vec(f"rlkit/{env_id}", num_envs=3, max_episode_steps=7), seed=0)
    data = env.rollout(20, break_when_any_done=False)
    assert data["next", "truncated"].sum() == 6


def test_torch_backend_bad_input():
    with pytest.raises(InputError, match="No torch implementation of 'LunarLander-v3'"):
        make_env("LunarLander-v3", backend="torch")
    with pytest.raises(InputError, match="max_episode_steps must be at least 1"):
        make_env("CartPole-v1", backend="torch", env_kwargs={"max_episode_steps": 0})
    with pytest.raises(InputError, match="only max_episode_steps"):
        make_env("CartPole-v1", backend="torch", env_kwargs={"sutton_barto_reward": True})


DISCRETE = [env_id for env_id in TORCH_ENVS if isinstance(gym.make(env_id).action_space, gym.spaces.Discrete)]


def gymnasium_error(make, action):
    env = make()
    env.reset(seed=0)
    with pytest.raises(Exception) as error:
        env.step(action)
    env.close()
    return error


@pytest.mark.parametrize("env_id", DISCRETE)
def test_an_invalid_action_raises_what_gymnasium_raises(env_id):
    expected = gymnasium_error(lambda: gym.make(env_id), 7)
    got = gymnasium_error(lambda: gym.make(f"rlkit/{env_id}"), 7)
    assert got.type is expected.type and str(got.value) == str(expected.value)
    expected = gymnasium_error(
        lambda: gym.make_vec(env_id, num_envs=2, vectorization_mode="sync"), np.array([0, 7])
    )
    got = gymnasium_error(lambda: gym.make_vec(f"rlkit/{env_id}", num_envs=2), np.array([0, 7]))
    assert got.type is expected.type and str(got.value) == str(expected.value)


@pytest.mark.parametrize("env_id", TORCH_ENVS)
def test_registration_and_vector_api_match_gymnasium(env_id):
    assert gym.spec(f"rlkit/{env_id}").max_episode_steps == gym.spec(env_id).max_episode_steps
    ours = gym.make_vec(f"rlkit/{env_id}", num_envs=2, render_mode="rgb_array")
    theirs = gym.make_vec(
        env_id,
        num_envs=2,
        vectorization_mode="sync",
        render_mode="rgb_array",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    # per-env seed lists are taken, and the same list gives the same batch
    first, _ = ours.reset(seed=[3, 4])
    again, _ = ours.reset(seed=[3, 4])
    theirs.reset(seed=[3, 4])
    np.testing.assert_array_equal(first, again)
    with pytest.raises(ValueError, match="Expected 2 seeds"):
        ours.reset(seed=[1, 2, 3])
    # one RGB frame per sub-env, as Gymnasium draws them
    frames, reference = ours.render(), theirs.render()
    assert len(frames) == len(reference) == 2 and frames[0].shape == reference[0].shape
    # a finished sub-env reports its final observation and a dict of final infos
    ours.reset(seed=0)
    theirs.reset(seed=0)
    infos = {}
    for name, env in (("ours", ours), ("theirs", theirs)):
        for _ in range(1_000):
            *_, terminated, truncated, info = env.step(env.action_space.sample())
            if (terminated | truncated).any():
                infos[name] = info
                break
    assert sorted(infos["ours"]) == sorted(infos["theirs"])
    assert (
        isinstance(infos["ours"]["final_info"], dict)
        and infos["ours"]["final_info"] == infos["theirs"]["final_info"]
    )
    ours.close()
    theirs.close()


def test_unsupported_dtype_and_render_mode_are_clear_errors():
    with pytest.raises(InputError, match="dtype must be one of"):
        gym.make("rlkit/CartPole-v1", dtype="float16")
    with pytest.raises(gym.error.Error, match="renders only with render_mode='rgb_array'"):
        gym.make_vec("rlkit/CartPole-v1", num_envs=2, render_mode="human")
