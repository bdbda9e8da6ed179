"""Box observations in their less common forms (envs in ``tests/space_envs.py``): images channels last or grayscale,
read by the Nature CNN as the env returns them; scalar and integer Boxes, read as float vectors; and the recipes
learning on each, with the saved agent predicting from the env's own observations."""

import json

import gymnasium as gym
import numpy as np
import pytest
import space_envs  # noqa: F401 - registers Look-v0, Sign-v0, Bandit-v0, Nudge-v0 and FlatNudge-v0
import torch
from run_helpers import tiny_dqn, tiny_es, tiny_off_policy, tiny_ppo, tiny_rnd_ppo
from tensordict import TensorDict
from torchrl.data import Bounded, MultiCategorical, Unbounded
from torchrl.envs.utils import ExplorationType, set_exploration_type

from agents import Agent, image_layout
from agents.networks import (
    NatureCNN,
    ToFloat,
    encoder_width,
    find_normalizer,
    make_actor,
    observation_encoder,
)
from agents.recurrent import sequence_length
from envs import make_env
from envs.specs import space_to_spec
from envs.wrappers import DiscreteTuple, is_discrete_tuple
from errors import InputError
from recipes import dqn, es, ppo, rnd_ppo, sac
from training import quiet


def box_spec(shape, dtype, low=0, high=255):
    return Bounded(low, high, (1, *shape), dtype=dtype)


@pytest.mark.parametrize(
    ("spec", "layout"),
    [
        (box_spec((4, 84, 84), torch.uint8), "chw"),
        (box_spec((1, 36, 36), torch.uint8), "chw"),
        (box_spec((96, 96, 3), torch.uint8), "hwc"),
        (box_spec((84, 84, 4), torch.uint8), "hwc"),
        (box_spec((40, 48), torch.uint8), "hw"),
        (box_spec((4, 96, 96, 3), torch.uint8), "shwc"),  # FrameStackObservation of RGB frames
        (box_spec((2, 3, 40, 40), torch.uint8), "schw"),
        (box_spec((40, 48), torch.uint8, high=10), None),  # a grid of small numbers, not an image
        (box_spec((128,), torch.uint8), None),  # Atari RAM
        (box_spec((3, 84, 84), torch.int64), None),
        (Unbounded((1, 5)), None),
    ],
)
def test_image_layout_reads_the_spec(spec, layout):
    assert image_layout(spec) == layout


def test_the_cnn_reads_channels_last_and_grayscale_images_as_their_channels_first_forms():
    torch.manual_seed(0)
    first = NatureCNN((3, 36, 40))
    last = NatureCNN((36, 40, 3), "hwc")
    last.load_state_dict(first.state_dict())
    images = torch.randint(0, 256, (2, 5, 36, 40, 3), dtype=torch.uint8)  # two leading batch dims
    torch.testing.assert_close(last(images), first(images.permute(0, 1, 4, 2, 3)), rtol=0, atol=0)
    gray = NatureCNN((36, 40), "hw")
    single = NatureCNN((1, 36, 40))
    gray.load_state_dict(single.state_dict())
    frames = torch.randint(0, 256, (3, 36, 40), dtype=torch.uint8)
    torch.testing.assert_close(gray(frames), single(frames.unsqueeze(1)), rtol=0, atol=0)
    six = NatureCNN((6, 36, 40))  # two stacked RGB frames: their six channels, frame by frame
    stacked_last, stacked_first = NatureCNN((2, 36, 40, 3), "shwc"), NatureCNN((2, 3, 36, 40), "schw")
    stacked_last.load_state_dict(six.state_dict())
    stacked_first.load_state_dict(six.state_dict())
    stacks = torch.randint(0, 256, (4, 2, 36, 40, 3), dtype=torch.uint8)
    channels_first = stacks.permute(0, 1, 4, 2, 3)
    expected = six(channels_first.reshape(4, 6, 36, 40))
    torch.testing.assert_close(stacked_last(stacks), expected, rtol=0, atol=0)
    torch.testing.assert_close(stacked_first(channels_first.contiguous()), expected, rtol=0, atol=0)


def test_the_cnn_refuses_small_images_and_unknown_layouts_in_one_line():
    with pytest.raises(Exception, match=r"\(24, 24, 3\) \(read as HWC\) are too small .*ResizeObservation"):
        NatureCNN((24, 24, 3), "hwc")
    with pytest.raises(Exception, match="cannot have the layout 'whc'"):
        NatureCNN((36, 36, 3), "whc")


def test_integer_and_scalar_boxes_are_float_vectors_with_optional_normalisation():
    encoder, width = observation_encoder(box_spec((3,), torch.int64, low=-5, high=5), normalize=True)
    assert width == 3 and isinstance(encoder[0], ToFloat)
    counts = torch.tensor([[1, -2, 4], [3, 0, -4]])
    find_normalizer(encoder).update(counts)
    features = encoder(counts)
    assert features.dtype == torch.float32 and features.shape == (2, 3)
    torch.testing.assert_close(features.mean(0), torch.zeros(3), atol=1e-4, rtol=0)
    scalar, width = observation_encoder(Bounded(-1.0, 1.0, (4,)), normalize=False)  # four envs, shape ()
    assert width == 1 and scalar(torch.arange(4.0)).shape == (4, 1)
    assert scalar(torch.zeros(2, 4)).shape == (2, 4, 1)


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("space_envs:Look-v0", "layout=hwc"),
        ("space_envs:Look-v0", "layout=hw"),
        ("space_envs:Look-v0", "layout=shwc"),
        ("space_envs:Sign-v0", "kind=scalar"),
        ("space_envs:Sign-v0", "kind=int"),
    ],
)
def test_ppo_learns_each_form_and_its_agent_acts_on_the_envs_observations(output_dir, env_id, kwargs):
    # a random policy scores 5 of 10
    config = tiny_ppo(output_dir, env_id=env_id, env_kwargs=[kwargs], seed=0)
    quiet(config, output_dir)
    assert ppo.main(config)["eval_return_mean"] >= 9.0
    # the recipe's one thread, left alone, becomes torch's default for the CNN of image observations
    threads = json.loads((output_dir / "config.json").read_text())["run"]["threads"]
    assert threads == (0 if "Look" in env_id else 1)
    agent = Agent.load(f"{output_dir}/agent.ckpt")
    key, value = kwargs.split("=")
    env = gym.make(env_id.split(":")[1], **{key: value})
    observation, _ = env.reset(seed=1)
    total = 0.0
    for _ in range(10):
        action = agent.predict(observation)
        assert np.shape(action) == ()
        observation, reward, *_ = env.step(action)
        total += reward
    assert total >= 9.0
    batch = np.stack([env.observation_space.sample() for _ in range(3)])
    assert agent.predict(batch).shape == (3,)


def test_dqn_and_sac_train_on_channels_last_images_and_scalar_boxes(output_dir):
    for layout in ("hwc", "shwc"):  # whole frames; a stack's frames each stored once
        config = tiny_dqn(
            output_dir, env_id="space_envs:Look-v0", env_kwargs=[f"layout={layout}"], total_frames=512
        )
        quiet(config, output_dir, overwrite=True)
        assert dqn.main(config)["frames"] == 512
    config = tiny_off_policy(sac.SACConfig)(
        output_dir, env_id="space_envs:Sign-v0", env_kwargs=["kind=scalar"]
    )
    config.discrete = True
    quiet(config, output_dir, overwrite=True)
    assert sac.main(config)["frames"] >= 1_024
    # discrete SAC's settings pick one thread for its 128-unit networks; the CNN of images takes torch's default
    for env_id, kwargs, threads in (("Sign-v0", "kind=scalar", 1), ("Look-v0", "layout=hwc", 0)):
        config = tiny_off_policy(sac.SACConfig)(
            output_dir, env_id=f"space_envs:{env_id}", env_kwargs=[kwargs], total_frames=512
        )
        sac.apply_discrete_settings(config, keep={"learning_starts", "batch_size"})
        quiet(config, output_dir, overwrite=True)
        assert sac.main(config)["frames"] == 512
        assert json.loads((output_dir / "config.json").read_text())["run"]["threads"] == threads, env_id


def test_recurrent_sequences_default_to_the_longest_length_both_batch_sizes_divide():
    assert sequence_length(2_048, 64, None) == 64  # the generic PPO defaults
    assert sequence_length(16, 256, None) == 16  # all of an env's steps: the minibatch holds whole batches
    assert sequence_length(100, 64, None) == 4
    assert sequence_length(32, 64, 8) == 8
    config = ppo.PPOConfig()
    config.network.recurrent = "lstm"
    config.validate()  # 1 env x 2048 steps, minibatches of 64: sequences of 64


class Counters(gym.Env):
    """Observations of a ``MultiDiscrete`` space with a start (``Tuple`` of ``Discrete``s with ``kind="tuple"``)."""

    action_space = gym.spaces.Discrete(5)

    def __init__(self, kind="multi_discrete"):
        self.observation_space = (
            gym.spaces.MultiDiscrete([3, 4], start=[-1, 5])
            if kind == "multi_discrete"
            else gym.spaces.Tuple((gym.spaces.Discrete(3, start=-1), gym.spaces.Discrete(4, start=5)))
        )

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize("kind", ["multi_discrete", "tuple"])
def test_discrete_observations_with_a_start_reach_the_network_as_in_training(kind):
    env = make_env(Counters(kind), seed=0)
    assert isinstance(env.single_observation_space, gym.spaces.MultiDiscrete)
    torch.manual_seed(0)
    policy = make_actor(env.observation_spec["observation"], env.action_spec, hidden_sizes=[16])
    agent = Agent(policy, "Counters-v0", env.single_observation_space, env.single_action_space, "ppo")
    raw = [Counters(kind).observation_space.sample() for _ in range(30)]  # as the env gives them
    trained_on = torch.as_tensor(np.asarray(raw) - [-1, 5])  # what the training env hands the network
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        expected = policy(TensorDict(observation=trained_on, batch_size=[30]))["action"].numpy()
    assert (agent.predict(raw) == expected).all()
    assert agent.predict(raw[0]) == expected[0]
    with pytest.raises(InputError, match="outside the agent's observation space"):
        agent.predict(trained_on.numpy()[:, ::-1] + 10)


def test_a_tuple_of_discrete_observations_is_read_as_multi_discrete():
    env = DiscreteTuple(gym.make("Blackjack-v1"))
    assert env.observation_space == gym.spaces.MultiDiscrete([32, 11, 2])
    observation, _ = env.reset(seed=0)
    assert observation.dtype == np.int64 and observation in env.observation_space
    assert not is_discrete_tuple(gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Box(0, 1))))
    with pytest.raises(InputError, match="Tuple observations of Discrete spaces"):
        DiscreteTuple(gym.make("CartPole-v1"))
    spec = make_env("Blackjack-v1", num_envs=2).observation_spec["observation"]
    assert isinstance(spec, MultiCategorical) and spec.shape == (2, 3)


def test_an_agent_on_tuple_observations_evaluates_in_an_env_instance_as_in_its_id():
    """The agent's observation space is the MultiDiscrete its training env gave; a plain ``gym.make`` instance
    observes the Tuple, which evaluate reads as training did (it was refused as another env)."""
    space = DiscreteTuple(gym.make("Blackjack-v1")).observation_space
    agent = Agent.build("Blackjack-v1", space, gym.spaces.Discrete(2), "ppo", "mlp_actor", {}).eval()
    by_id = agent.evaluate("Blackjack-v1", episodes=5, seed=3)
    by_instance = agent.evaluate(gym.make("Blackjack-v1"), episodes=5, seed=3)
    assert by_instance.returns.tolist() == by_id.returns.tolist()
    assert by_instance.lengths.tolist() == by_id.lengths.tolist()


@pytest.mark.parametrize(
    "space",
    [gym.spaces.MultiDiscrete([[2, 3], [4, 5]]), gym.spaces.MultiBinary([2, 3])],
    ids=["multi_discrete_2d", "multi_binary_2d"],
)
def test_discrete_observations_of_several_dims_are_flattened(space):
    spec = space_to_spec(space, 4)
    encoder, width = observation_encoder(spec, normalize=False)
    assert width == encoder_width(spec) == (14 if isinstance(space, gym.spaces.MultiDiscrete) else 6)
    features = encoder(spec.rand())
    assert features.shape == (4, width) and features.dtype == torch.float32
    if isinstance(space, gym.spaces.MultiDiscrete):
        assert (features.sum(-1) == 4).all()  # one hot value per component


def test_tuple_and_dict_action_spaces_are_refused_naming_the_spaces_that_work():
    class TupleActions(Counters):
        action_space = gym.spaces.Tuple((gym.spaces.Discrete(2), gym.spaces.Discrete(3)))

    with pytest.raises(
        InputError,
        match=r"Action space Tuple\(Discrete\(2\), Discrete\(3\)\) is not supported.*MultiDiscrete",
    ):
        make_env(TupleActions())


@pytest.mark.parametrize(
    ("make_config", "main"), [(tiny_ppo, ppo.main), (tiny_dqn, dqn.main), (tiny_es, es.main)]
)
def test_recipes_learn_a_bandit_that_observes_nothing(output_dir, make_config, main):
    config = make_config(output_dir, env_id="space_envs:Bandit-v0", seed=0)
    if main is dqn.main:
        config.optim.lr, config.run.total_frames = 1e-3, 8_192  # Q is the arm's pay; greedy after 10%
    if main is es.main:
        config.run.total_frames = config.run.eval_every = 512  # a generation is 8 one-pull episodes
    summary = main(config)
    assert summary["eval_return_mean"] == 1.0, summary  # the best arm
    assert Agent.load(output_dir).predict(np.zeros(0, np.float32)) == 2


@pytest.mark.parametrize(("make_config", "main", "name"), [
    (tiny_off_policy(sac.SACConfig), sac.main, "SAC"), (tiny_rnd_ppo, rnd_ppo.main, "RND")])  # fmt: skip
def test_sac_and_rnd_refuse_empty_observations_in_one_line(output_dir, make_config, main, name):
    config = make_config(output_dir, env_id="space_envs:Bandit-v0")
    if main is sac.main:
        config.discrete = True
    with pytest.raises(InputError, match=f"{name} needs at least one observation value") as error:
        main(config)
    assert "\n" not in str(error.value)


def test_box_actions_of_other_shapes_are_refused_naming_a_wrapper_that_works(output_dir):
    with pytest.raises(
        InputError, match=r"Box action spaces must be one-dimensional .* got shape \(\): wrap"
    ) as error:
        ppo.main(tiny_ppo(output_dir, env_id="space_envs:Nudge-v0"))
    assert "gymnasium.wrappers.TransformAction" in str(error.value) and "\n" not in str(error.value)
    summary = ppo.main(
        tiny_ppo(output_dir, env_id="space_envs:FlatNudge-v0", total_frames=256, overwrite=True)
    )
    assert summary["frames"] == 256
