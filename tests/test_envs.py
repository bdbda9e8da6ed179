import gymnasium as gym
import numpy as np
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from envs import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY, make_env
from errors import InputError


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1", "MountainCarContinuous-v0", "Acrobot-v1"])
def test_specs_match_data(env_id):
    env = make_env(env_id, num_envs=3, seed=0)
    check_env_specs(env)
    assert env.batch_size == torch.Size([3])


def test_discrete_observation_space():
    env = make_env("FrozenLake-v1", num_envs=2, seed=0)
    check_env_specs(env)
    assert env.reset()["observation"].dtype == torch.int64


def test_same_seed_same_rollout_different_seed_different_rollout():
    def rollout(seed):
        env = make_env("CartPole-v1", num_envs=4, seed=seed)
        torch.manual_seed(0)
        return env.rollout(300, break_when_any_done=False)

    first, second, other = rollout(3), rollout(3), rollout(4)
    assert torch.equal(first["observation"], second["observation"])
    assert torch.equal(first["next", "reward"], second["next", "reward"])
    assert torch.equal(first["next", "done"], second["next", "done"])
    assert not torch.equal(first["observation"][:, 0], other["observation"][:, 0])


def test_time_limit_is_truncation_not_termination():
    env = make_env("Pendulum-v1", num_envs=2, seed=0, env_kwargs={"max_episode_steps": 10})
    data = env.rollout(25, break_when_any_done=False)
    truncated = data["next", "truncated"].squeeze(-1)
    terminated = data["next", "terminated"].squeeze(-1)
    assert truncated[:, 9].all() and truncated[:, 19].all()
    assert truncated.sum() == 4 and not terminated.any()
    assert torch.equal(data["next", "done"].squeeze(-1), truncated)
    # the step that ends an episode carries the true final observation; the next step starts from the reset one
    assert not torch.equal(data["next", "observation"][:, 9], data["observation"][:, 10])
    assert torch.equal(data["next", "observation"][:, 8], data["observation"][:, 9])


def test_termination_with_final_observation_and_episode_statistics():
    env = make_env("CartPole-v1", num_envs=2, seed=0)
    data = env.rollout(200, break_when_any_done=False)
    terminated = data["next", "terminated"].squeeze(-1)
    assert terminated.any() and not data["next", "truncated"].any()
    env_index, step = terminated.nonzero()[0].tolist()
    final_observation = data["next", "observation"][env_index, step]
    # CartPole terminates when the pole angle or the cart position leaves its range
    assert final_observation[2].abs() > 0.2094 or final_observation[0].abs() > 2.4
    assert data["next", EPISODE_LENGTH_KEY][env_index, step].item() == step + 1
    assert data["next", EPISODE_RETURN_KEY][env_index, step].item() == step + 1
    assert data[EPISODE_LENGTH_KEY][env_index, step + 1].item() == 0


def test_async_vectorization():
    env = make_env("CartPole-v1", num_envs=2, seed=0, vectorization="async")
    try:
        data = env.rollout(20, break_when_any_done=False)
        assert data.batch_size == torch.Size([2, 20])
    finally:
        env.close()


def test_accepts_gymnasium_objects_of_every_autoreset_mode():
    # Gymnasium's numpy-vectorised CartPole only knows NEXT_STEP autoreset: rebuilt per sub-env, with a warning
    with pytest.warns(UserWarning, match="NEXT_STEP"):
        env = make_env(gym.make_vec("CartPole-v1", 3, vectorization_mode="vector_entry_point"), seed=0)
    check_env_specs(env)
    env = make_env(gym.make_vec("CartPole-v1", 3, vectorization_mode="sync"), seed=0)  # NEXT_STEP sync
    check_env_specs(env)
    same_step = gym.make_vec(
        "Pendulum-v1",
        2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP},
    )
    assert make_env(same_step).vector_env is same_step
    check_env_specs(make_env(gym.make("Acrobot-v1"), seed=0))


def test_a_wrapped_next_step_vector_env_is_refused_rather_than_rebuilt_without_its_wrappers():
    clipped = gym.wrappers.vector.ClipReward(
        gym.make_vec("CartPole-v1", 2, vectorization_mode="sync"), 0, 0.5
    )
    with pytest.raises(InputError, match="rebuilding it in SAME_STEP mode would drop its wrappers"):
        make_env(clipped)
    timed = gym.make_vec(
        "CartPole-v1", 2, vectorization_mode="async", wrappers=[gym.wrappers.TimeAwareObservation]
    )
    try:
        with pytest.raises(InputError, match="would drop its wrappers"):
            make_env(timed)
    finally:
        timed.close()


def test_bad_input_is_reported_clearly():
    with pytest.raises(InputError, match="Unknown Gymnasium env id 'NoSuchEnv-v0'"):
        make_env("NoSuchEnv-v0")
    with pytest.raises(InputError, match="num_envs must be at least 1"):
        make_env("CartPole-v1", num_envs=0)
    with pytest.raises(InputError, match="cannot be copied"):
        make_env(gym.make("CartPole-v1"), num_envs=2)
    with pytest.raises(InputError, match="not supported.*wrap other Tuple observations"):
        make_env(TupleOfBoxEnv())


class TupleOfBoxEnv(gym.Env):
    """Tuple observations that are not all Discrete."""

    observation_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(-1.0, 1.0, (2,))))
    action_space = gym.spaces.Discrete(2)


class ShiftedDiscreteEnv(gym.Env):
    """Discrete observations and actions that start at 10 and 5, to check the offsets."""

    observation_space = gym.spaces.Discrete(4, start=10)
    action_space = gym.spaces.Discrete(2, start=5)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = 10
        return self.position, {}

    def step(self, action):
        assert action in (5, 6)
        self.position = min(13, self.position + int(action == 6))
        return self.position, 1.0, self.position == 13, False, {}


def test_discrete_spaces_with_a_start_are_shifted_to_zero():
    env = make_env(ShiftedDiscreteEnv())
    data = env.rollout(
        5, lambda td: td.set("action", torch.ones(1, dtype=torch.int64)), break_when_any_done=False
    )
    assert data["observation"][0, :4].tolist() == [0, 1, 2, 0]
    assert data["next", "observation"][0, 2].item() == 3 and data["next", "terminated"][0, 2].item()


def test_observations_are_not_aliased_when_the_vector_env_reuses_its_buffers():
    vector = gym.make_vec(
        "CartPole-v1",
        2,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP, "copy": False},
    )
    data = make_env(vector, seed=0).rollout(5, break_when_any_done=False)
    assert not torch.equal(data["observation"][:, 0], data["observation"][:, 4])


def test_multidiscrete_actions_get_a_spec():
    vector = gym.vector.SyncVectorEnv(
        [
            lambda: gym.wrappers.TransformAction(
                gym.make("CartPole-v1"), lambda a: int(a[0]), gym.spaces.MultiDiscrete([2, 3])
            )
        ],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    check_env_specs(make_env(vector, seed=0))


class NaNAfterThreeStepsEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.steps = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.steps += 1
        value = np.nan if self.steps == 3 else 0.0
        return np.full(2, value, np.float32), 0.0, False, False, {}


def test_nan_observations_stop_with_a_clear_error():
    env = make_env(NaNAfterThreeStepsEnv(), seed=0)
    with pytest.raises(InputError, match=r"NaN or Inf in an observation or reward \(sub-envs \[0\]\)"):
        env.rollout(5, break_when_any_done=False)


class ReturnsOf(gym.Env):
    """One step an episode, returning ``returned`` (reward, terminated, truncated) or raising inside the env."""

    observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, reward=1.0, terminated=True, raises=False):
        self.reward, self.terminated, self.raises = reward, terminated, raises

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        if self.raises:
            raise ValueError("the env's own complaint")
        return np.zeros(2, np.float32), self.reward, self.terminated, False, {}


@pytest.mark.parametrize(
    "returned",
    [{"reward": np.array([1.0])}, {"reward": [1.0, 2.0]}, {"terminated": np.array([True, False])}],
    ids=["reward-of-shape-1", "reward-list", "flags-array"],
)
def test_a_step_returning_arrays_where_numbers_belong_is_one_clear_error(returned):
    env = make_env(ReturnsOf(**returned), num_envs=1)
    env.reset()
    with pytest.raises(
        InputError, match="step returned something Gymnasium's vector env cannot store .*a plain number"
    ):
        env.rand_step()


class OldAPI(ReturnsOf):
    """Gymnasium's old API (``step`` returning four values, ``reset`` the observation alone), or an observation of
    another shape than its space's."""

    def __init__(self, mistake):
        super().__init__(terminated=mistake != "shape-mid-episode")
        self.mistake = mistake

    def reset(self, *, seed=None, options=None):
        observation, info = super().reset(seed=seed)
        return observation if self.mistake == "reset" else (observation, info)

    def step(self, action):
        observation, reward, terminated, truncated, info = super().step(action)
        if self.mistake.startswith("shape"):
            observation = np.zeros(3, np.float32)
        return (
            (observation, reward, terminated, info)
            if self.mistake == "step"
            else (observation, reward, terminated, truncated, info)
        )


@pytest.mark.parametrize(
    "mistake, message",
    [
        ("step", r"step returned something .* cannot store \(not enough values to unpack"),
        (
            "shape",
            r"step returned something .* cannot store .*an observation of the observation space's shape",
        ),
        ("shape-mid-episode", r"step returned something .* cannot store .*the observation space's shape"),
        ("reset", r"reset returned something .* cannot store .*: reset must return \(observation, info\)"),
    ],
)
def test_an_env_of_the_old_api_or_another_shape_is_one_clear_error(mistake, message):
    """Gymnasium's own wrappers and arrays fail on such results, below the env: one line naming the env's method
    and what it must return, not a ValueError from inside Gymnasium."""
    with pytest.raises(InputError, match=message):
        env = make_env(OldAPI(mistake), num_envs=1)
        env.reset()
        env.rand_step()


def test_a_finite_reward_beyond_float32s_range_is_named_as_such():
    env = make_env(ReturnsOf(reward=-1e39), num_envs=1)
    env.reset()
    with pytest.raises(
        InputError, match=r"returned a reward beyond float32's range .*sub-envs \[0\]\); scale"
    ):
        env.rand_step()
    env = make_env(ReturnsOf(reward=3e38), num_envs=1)  # large, but a float32
    env.reset()
    assert env.rand_step()["next", "reward"].item() == pytest.approx(3e38, rel=1e-6)


def test_an_error_raised_inside_the_env_s_step_stays_the_env_s_own():
    env = make_env(ReturnsOf(raises=True), num_envs=1)
    env.reset()
    with pytest.raises(ValueError, match="the env's own complaint"):
        env.rand_step()


@pytest.mark.parametrize(
    "options, message",
    [
        ({"seed": -1}, "seed must be a whole number of at least 0"),
        ({"seed": 1.5}, "seed must be a whole number of at least 0"),
        ({"num_envs": 2.0}, "num_envs must be a whole number of at least 1"),
        ({"device": "gpu"}, "'gpu' is not a torch device"),
        ({"device": "mps"}, "'mps' was asked for but this torch build or machine has none"),
        ({"env_kwargs": "x"}, "env_kwargs takes a dict"),
        ({"env_kwargs": {"foo": 1}}, "env_kwargs foo=1: CartPole-v1 takes no argument 'foo'"),
    ],
)
def test_make_env_refuses_bad_arguments_in_one_line(options, message):
    with pytest.raises(InputError, match=message):
        make_env("CartPole-v1", **options)


@pytest.mark.parametrize("backend", ["gymnasium", "torch"])
def test_make_env_takes_numpy_integers_as_the_recipes_do(backend):
    kwargs = {"max_episode_steps": np.int64(5)}
    env = make_env("CartPole-v1", num_envs=np.int64(2), seed=np.int64(3), backend=backend, env_kwargs=kwargs)
    other = make_env("CartPole-v1", num_envs=2, seed=3, backend=backend, env_kwargs={"max_episode_steps": 5})
    try:
        assert torch.equal(env.reset()["observation"], other.reset()["observation"])
        steps = env.rollout(10, break_when_any_done=False)
        assert torch.equal(
            steps["next", "truncated"], other.rollout(10, break_when_any_done=False)["next", "truncated"]
        )
        assert steps["next", "truncated"][:, 4].all()  # the time limit of 5 steps, as an int's
    finally:
        env.close()
        other.close()


def test_messages_name_the_gymnasium_space_a_spec_stands_for():
    from envs.specs import space_name, space_to_spec

    spaces = [
        (gym.spaces.Discrete(3), "Discrete"),
        (gym.spaces.MultiDiscrete([2, 3]), "MultiDiscrete"),
        (gym.spaces.MultiBinary(3), "MultiBinary"),
        (gym.spaces.Box(-1, 1, (2,)), "Box"),
        (gym.spaces.Box(-np.inf, np.inf, (2,)), "unbounded Box"),
    ]
    for space, name in spaces:
        assert space_name(space_to_spec(space, 2)) == name
    assert space_name(object()) == "object"
