"""Dict observations (``tests/dict_env.py``: a vector, a Discrete and an image entry): the env layer's nested
``"observation"``, the per-entry encoder and its normalisation, the agent's predict, evaluate and checkpoint, and
recipes learning on them."""

import types

import dict_env  # noqa: F401 - registers GoalReach-v0 and GoalReachContinuous-v0
import gymnasium as gym
import numpy as np
import pytest
import torch

from agents import Agent
from agents.networks import DictEncoder, NatureCNN, find_normalizer, make_actor
from envs import make_env
from envs.specs import space_to_spec
from errors import InputError
from recipes import a2c, dqn, ppo, sac
from training import quiet

ENV_ID = "dict_env:GoalReach-v0"


def test_the_env_gives_a_nested_observation_with_each_episodes_final_one():
    env = make_env(ENV_ID, 3, seed=0)

    # moving right, every episode ends away from its start (random moves may end where they began)
    def move_right(tensordict):
        return tensordict.set("action", torch.full((3,), 2))

    rollout = env.rollout(25, move_right, break_when_any_done=False)
    observation = rollout["observation"]
    assert observation["position"].shape == (3, 25, 2) and observation["side"].dtype == torch.int64
    assert observation["view"].shape == (3, 25, 1, 36, 36) and observation["view"].dtype == torch.uint8
    done = rollout["next", "done"].squeeze(-1)
    assert done[:, 9].all() and not done[:, 10].any()  # ten-step episodes
    # the last step of an episode keeps the final observation, the next step starts from the reset one
    assert (rollout["next", "observation", "position"][:, 9, 0] != 0).all()
    assert (rollout["observation", "position"][:, 10, 0] == 0).all()
    env.close()


def test_dict_observations_refuse_nested_dicts():
    space = gym.spaces.Dict({"inner": gym.spaces.Dict({"x": gym.spaces.Discrete(2)})})
    with pytest.raises(InputError, match="none of them a Dict"):
        space_to_spec(space, 1)


def test_each_entry_gets_its_encoder_and_vectors_their_own_statistics():
    env = make_env(ENV_ID, 2, seed=0)
    spec = env.observation_spec["observation"]
    encoder = DictEncoder(spec, normalize=True)
    assert isinstance(encoder.encoders["view"], NatureCNN)
    assert encoder.out_features == 2 + 2 + NatureCNN.out_features and encoder.normalized_keys == ["position"]
    actor = make_actor(spec, env.action_spec, normalize_obs=True)
    normalizer = find_normalizer(actor)
    assert isinstance(normalizer, DictEncoder)
    rollout = env.rollout(20, break_when_any_done=False)
    normalizer.update(rollout["observation"].reshape(-1))
    statistics = find_normalizer(normalizer.encoders["position"])
    torch.testing.assert_close(
        statistics.mean.float(),
        rollout["observation", "position"].reshape(-1, 2).mean(0),
        rtol=1e-5,
        atol=1e-5,
    )
    assert actor(env.reset())["action"].shape == (2,)
    env.close()


def test_a_dict_agent_predicts_evaluates_and_round_trips(output_dir):
    config = dqn.DQNConfig()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=512, num_envs=4, preset="none")
    config.collector.learning_starts = 128
    config.network.normalize_obs = True
    dqn.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")
    assert isinstance(agent.observation_space, gym.spaces.Dict)
    env = gym.make(ENV_ID)
    observation, _ = env.reset(seed=0)
    action = agent.predict(observation)
    assert env.action_space.contains(int(action))
    batch = {key: np.stack([value, value]) for key, value in observation.items()}
    assert agent.predict(batch).shape == (2,)
    assert agent.evaluate(episodes=2, seed=0).lengths.tolist() == [10, 10]
    with pytest.raises(InputError, match="takes Dict observations with the entries"):
        agent.predict(observation["position"])
    assert (
        agent.predict(types.MappingProxyType(batch)).tolist() == agent.predict(batch).tolist()
    )  # any Mapping
    uneven = dict(batch, **{key: np.stack([value] * 3) for key, value in list(observation.items())[:1]})
    with pytest.raises(InputError, match="entries hold batches of different sizes"):
        agent.predict(uneven)


def test_off_policy_recipes_take_dict_observations_but_not_their_normalisation(output_dir):
    config = sac.SACConfig()
    quiet(config, output_dir, env_id="dict_env:GoalReachContinuous-v0", total_frames=64, num_envs=2)
    config.collector.learning_starts, config.buffer.batch_size, config.network.hidden_sizes = 32, 16, (16,)
    summary = sac.main(config)
    assert summary["frames"] >= 64
    config.network.normalize_obs, config.run.overwrite = True, True
    with pytest.raises(InputError, match="--normalize-obs with Dict observations"):
        sac.main(config)


@pytest.mark.learning
def test_a2c_learns_from_dict_observations(output_dir):
    config = a2c.A2CConfig()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=30_000, eval_every=10_000, eval_episodes=10)
    summary = a2c.main(config)
    assert summary["eval_return_mean"] >= 8.5  # 9 is perfect: reach the goal in two steps, stay


@pytest.mark.learning
def test_ppo_learns_from_dict_observations_normalised(output_dir):
    config = ppo.PPOConfig()
    quiet(
        config,
        output_dir,
        env_id=ENV_ID,
        total_frames=30_000,
        eval_every=10_000,
        eval_episodes=10,
        num_envs=8,
        stop_at_return=8.5,
    )
    config.collector.steps_per_env, config.optim.minibatch_size, config.optim.num_epochs = 32, 64, 4
    # lr 1e-3: seeds 0-2 all reach 9.0 by the first evaluation (seed 0 then drifts to 6.2 by 30k frames, so the run
    # stops at the target, as users run it); at 3e-3 some seeds settle on going one way (1.8 to 9.0)
    config.optim.lr, config.network.normalize_obs = 1e-3, True
    summary = ppo.main(config)
    assert summary["solved_at_frames"] is not None and summary["eval_return_mean"] >= 8.5


def test_recipes_whose_networks_read_one_array_refuse_dict_observations(output_dir):
    from recipes import qlearning, rnd_ppo

    config = rnd_ppo.RNDPPOConfig()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=256)
    with pytest.raises(InputError, match="RND's networks read one observation array"):
        rnd_ppo.main(config)
    config = qlearning.QLearningConfig()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=256)
    with pytest.raises(
        InputError, match="Tabular Q-learning reads Discrete, MultiDiscrete or MultiBinary observations"
    ):
        qlearning.main(config)


def test_multidiscrete_and_multibinary_observations_are_encoded_per_component():
    from agents.networks import encoder_width, observation_encoder

    multi = space_to_spec(gym.spaces.MultiDiscrete([2, 3]), 2)
    encoder, width = observation_encoder(multi, normalize=False)
    assert width == encoder_width(multi) == 5
    assert encoder(torch.tensor([[1, 2], [0, 0]])).tolist() == [[0, 1, 0, 0, 1], [1, 0, 1, 0, 0]]
    binary = space_to_spec(gym.spaces.MultiBinary(3), 2)
    encoder, width = observation_encoder(binary, normalize=False)
    assert width == encoder_width(binary) == 3
    assert encoder(torch.tensor([[1, 0, 1], [0, 0, 0]], dtype=torch.int8)).tolist() == [[1, 0, 1], [0, 0, 0]]


@pytest.mark.parametrize("recipe", [ppo, dqn], ids=["ppo", "dqn"])
def test_a_dict_of_float_entries_only_trains_and_its_nan_is_caught(output_dir, recipe):
    config = recipe.PPOConfig() if recipe is ppo else recipe.DQNConfig()
    quiet(config, output_dir, env_id=ENV_ID, total_frames=256, num_envs=2, preset="none")
    config.run.env_wrappers = ('gymnasium.wrappers.FilterObservation={"filter_keys": ["position"]}',)
    if recipe is ppo:
        config.collector.steps_per_env, config.optim.minibatch_size = 64, 64
    else:
        config.collector.learning_starts = 64
    assert recipe.main(config)["frames"] >= 256
    from tensordict import TensorDict

    from training.metrics import find_non_finite

    batch = TensorDict({"observation": {"position": torch.tensor([[0.0, float("nan")]])}}, batch_size=[1])
    assert find_non_finite(batch, {}) is not None


@pytest.mark.parametrize("recipe", [ppo, dqn], ids=["ppo", "dqn"])
def test_normalisation_leaves_the_integer_entries_of_a_dict_as_they_are(output_dir, recipe):
    # TimeAwareObservation(flatten=False): {"obs": float Box, "time": integer Box}
    config = recipe.PPOConfig() if recipe is ppo else recipe.DQNConfig()
    quiet(config, output_dir, env_id="CartPole-v1", total_frames=256, num_envs=2, preset="none")
    config.run.env_wrappers = ('gymnasium.wrappers.TimeAwareObservation={"flatten": false}',)
    config.network.normalize_obs = True
    if recipe is ppo:
        config.collector.steps_per_env, config.optim.minibatch_size = 64, 64
    else:
        config.collector.learning_starts = 64
    assert recipe.main(config)["frames"] >= 256
    agent = Agent.load(output_dir / "agent.ckpt")
    encoder = find_normalizer(agent.policy)
    assert isinstance(encoder, DictEncoder) and encoder.normalized_keys == ["obs"]
    assert find_normalizer(encoder.encoders["time"]) is None
