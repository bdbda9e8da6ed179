import json
import pickle
import warnings
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents import Agent, ObservationNormalizer
from errors import InputError
from recipes import ppo
from training import quiet


def make_agent(env_id="CartPole-v1", **policy_kwargs):
    env = gym.make(env_id)
    torch.manual_seed(0)
    return Agent.build(env_id, env.observation_space, env.action_space, "test", policy_kwargs=policy_kwargs)


def test_predict_single_and_batched_observations():
    agent = make_agent()
    space = gym.make("CartPole-v1").action_space
    observation = np.zeros(4, dtype=np.float32)
    action = agent.predict(observation)
    assert np.ndim(action) == 0 and space.contains(int(action))
    batch = agent.predict(torch.zeros(5, 4))
    assert batch.shape == (5,) and all(space.contains(int(a)) for a in batch)
    assert agent.predict([0.0, 0.0, 0.0, 0.0]) == action
    assert agent.predict(np.zeros(4, dtype=np.longdouble)) == action
    with pytest.raises(InputError, match="masked array: the policy would read its masked values"):
        agent.predict(np.ma.masked_array(observation, mask=[1, 0, 0, 0]))
    with pytest.raises(InputError, match="a meta tensor, which holds no values"):
        agent.predict(torch.zeros(4, device="meta"))


def test_continuous_actions_stay_in_bounds_and_deterministic_is_repeatable():
    agent = make_agent("Pendulum-v1")
    space = gym.make("Pendulum-v1").action_space
    observations = np.random.default_rng(0).uniform(-1, 1, size=(64, 3)).astype(np.float32)
    sampled = agent.predict(observations, deterministic=False)
    assert sampled.shape == (64, 1) and sampled.dtype == np.float32
    assert all(space.contains(a) for a in sampled)
    np.testing.assert_array_equal(agent.predict(observations), agent.predict(observations))


def test_save_load_keeps_actions_and_normalizer_statistics(tmp_path):
    agent = make_agent("Pendulum-v1", hidden_sizes=[32], normalize_obs=True)
    agent.normalizer.update(torch.randn(500, 3) * 4 + 1)
    path = agent.save(tmp_path / "agent.ckpt")
    loaded = Agent.load(path)
    for name in ("mean", "var", "count"):
        torch.testing.assert_close(
            getattr(loaded.normalizer, name), getattr(agent.normalizer, name), rtol=0, atol=0
        )
    observations = np.random.default_rng(1).normal(size=(32, 3)).astype(np.float32)
    np.testing.assert_array_equal(loaded.predict(observations), agent.predict(observations))
    assert loaded.env_id == "Pendulum-v1" and loaded.action_space == agent.action_space
    assert loaded.policy_kwargs == {"hidden_sizes": [32], "normalize_obs": True}
    folder = tmp_path / "run"
    folder.mkdir()
    assert agent.save(folder) == folder / "agent.ckpt"  # a folder gets agent.ckpt, as load reads one
    np.testing.assert_array_equal(Agent.load(folder).predict(observations), agent.predict(observations))


def test_evaluate_returns_per_episode_results_reproducibly(tmp_path):
    agent = make_agent()
    first = agent.evaluate(episodes=7, seed=3, max_parallel_envs=3)
    second = agent.evaluate(episodes=7, seed=3)
    assert first.returns.shape == (7,) and first.lengths.shape == (7,)
    np.testing.assert_array_equal(first.returns, second.returns)
    np.testing.assert_array_equal(first.lengths, second.lengths)
    np.testing.assert_array_equal(first.returns, first.lengths)  # CartPole pays 1 per step
    video = tmp_path / "episode.mp4"
    assert agent.evaluate(episodes=1, seed=3, video_path=video).video_path == video
    assert video.stat().st_size > 1000
    assert agent.evaluate(episodes=1, video_path=tmp_path).video_path == tmp_path / "video.mp4"  # a folder
    assert (tmp_path / "video.mp4").stat().st_size > 1000
    for unwritable in ("episode.gif", "episode", "episode.webm"):
        with pytest.raises(
            InputError, match=f"Cannot write a video to .*{unwritable}: name a file ending in .mp4"
        ):
            agent.evaluate(episodes=1, video_path=tmp_path / unwritable)
    assert agent.evaluate(episodes=1).video_path is None


class _TrackedFrame(np.ndarray):
    """A frame that counts how many of its kind are alive."""

    alive = peak = 0

    def __array_finalize__(self, obj):
        if type(self) is _TrackedFrame:
            _TrackedFrame.alive += 1
            _TrackedFrame.peak = max(_TrackedFrame.peak, _TrackedFrame.alive)

    def __del__(self):
        _TrackedFrame.alive -= 1


class _CountedRender(gym.Wrapper):
    """CartPole whose frames are small :class:`_TrackedFrame`s; ``fail_at``: the render call that raises."""

    def __init__(self, fail_at=None):
        super().__init__(gym.make("CartPole-v1", render_mode="rgb_array"))
        self.calls, self.fail_at = 0, fail_at

    def render(self):
        self.calls += 1
        if self.calls == self.fail_at:
            raise KeyError("the renderer broke")
        return np.full((16, 16, 3), self.calls % 255, np.uint8).view(_TrackedFrame)


def test_evaluation_videos_encode_frames_as_they_come_and_a_failure_keeps_the_previous_file(tmp_path):
    agent = make_agent()
    video = tmp_path / "episode.mp4"
    _TrackedFrame.alive = _TrackedFrame.peak = 0
    env = _CountedRender()
    result = agent.evaluate(env=env, episodes=1, seed=3, video_path=video)
    assert env.calls == result.lengths[0] + 1 > 8  # the reset's frame and one a step
    assert _TrackedFrame.peak <= 2  # each frame encoded, then let go: none kept for the end of the episode
    import imageio.v2 as imageio

    with imageio.get_reader(video, format="FFMPEG") as reader:
        assert reader.count_frames() == env.calls
    before = video.read_bytes()
    with pytest.raises(KeyError, match="the renderer broke"):  # the renderer's own error, not a write error
        agent.evaluate(env=_CountedRender(fail_at=5), episodes=1, seed=3, video_path=video)
    assert video.read_bytes() == before
    assert [path.name for path in tmp_path.iterdir()] == ["episode.mp4"]  # no temporary file left


def test_write_video_takes_any_iterable_of_frames_and_refuses_none(tmp_path):
    from agents import write_video

    frames = (np.full((8, 8, 3), index, np.uint8) for index in range(5))
    assert write_video(frames, tmp_path / "five.mp4", fps=10) == tmp_path / "five.mp4"
    with pytest.raises(InputError, match="No frames to write to .*none.mp4: a video needs at least one"):
        write_video([], tmp_path / "none.mp4")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["five.mp4"]


@pytest.mark.parametrize("shape", [(33, 47, 3), (33, 47), (34, 46, 1)], ids=["odd rgb", "odd gray", "gray"])
def test_videos_take_frames_of_odd_sizes_and_grayscale_frames(tmp_path, shape):
    """H.264 needs an even height and width and three channels: odd frames get their last row or column again,
    grayscale ones three equal channels (the encoder failed with a broken pipe, or wrote an empty file)."""
    import imageio.v2 as imageio

    from agents import write_video

    frames = [np.full(shape, 40 * index, np.uint8) for index in range(4)]
    write_video(frames, tmp_path / "odd.mp4", fps=10)
    with imageio.get_reader(tmp_path / "odd.mp4", format="FFMPEG") as reader:
        assert reader.count_frames() == 4
        third = reader.get_data(2)
    assert third.shape == (shape[0] + shape[0] % 2, shape[1] + shape[1] % 2, 3)
    assert abs(int(third.mean()) - 80) <= 3  # the frame's own gray, give or take the codec's rounding


def test_an_encoder_that_writes_nothing_is_a_write_error_and_leaves_no_file(tmp_path, monkeypatch):
    """ffmpeg given frames it cannot encode (odd-sized grayscale ones, sent as they are) may end without an error
    and without a frame: a render error (a run warns and keeps its other outputs), not an empty video."""
    from agents import write_video
    from errors import RenderError

    monkeypatch.setattr("agents.agent._encodable", lambda frame: frame)
    with pytest.raises(
        RenderError, match=r"encoder wrote nothing to .*empty.mp4 from 4 frames of shape \(33, 47\)"
    ):
        write_video([np.full((33, 47), 40 * index, np.uint8) for index in range(4)], tmp_path / "empty.mp4")
    assert list(tmp_path.iterdir()) == []


def test_evaluate_refuses_seeds_outside_gymnasiums_range_and_wraps_episode_seeds_past_its_end():
    agent = make_agent()
    bad_arguments = (
        {"seed": -1},
        {"seed": 2**32},
        {"seed": 1.5},
        {"episodes": 0},
        {"episodes": 10**30},
        {"episodes": 2.5},
        {"episodes": True},
        {"max_parallel_envs": 0},
    )
    for bad in bad_arguments:
        with pytest.raises(
            InputError, match="seed must be a whole|episodes must be|max_parallel_envs must be"
        ):
            agent.evaluate(**{"episodes": 2, **bad})
    np.testing.assert_array_equal(  # NumPy's integers are whole numbers too
        agent.evaluate(episodes=np.int64(2), seed=np.int64(3)).returns,
        agent.evaluate(episodes=2, seed=3).returns,
    )
    with pytest.raises(InputError, match="env_kwargs foo=1: CartPole-v1 takes no argument 'foo'"):
        agent.evaluate(episodes=1, env_kwargs={"foo": 1})
    last = agent.evaluate(episodes=2, seed=2**32 - 1)  # its second episode is seeded 0
    np.testing.assert_array_equal(last.returns[1:], agent.evaluate(episodes=1, seed=0).returns)


def test_evaluate_in_a_user_env():
    agent = make_agent()
    result = agent.evaluate(gym.make("CartPole-v1"), episodes=2, seed=0)
    assert len(result.returns) == 2
    with pytest.raises(
        InputError, match="env_kwargs are the keyword arguments .*make it with them, or pass its id"
    ):
        agent.evaluate(gym.make("CartPole-v1"), episodes=1, env_kwargs={"sutton_barto_reward": True})


def test_evaluate_in_a_user_env_warns_of_the_agent_s_wrappers_it_lacks():
    agent = make_agent()
    agent.env_wrappers = [
        {"path": "gymnasium.wrappers.ClipReward", "kwargs": {"max_reward": 0.5}},
        {"path": "gymnasium.wrappers.TransformReward", "kwargs": {}},
    ]
    clipped = gym.wrappers.ClipReward(gym.make("CartPole-v1"), max_reward=0.5)
    with pytest.warns(
        UserWarning, match=r"wrapped in gymnasium.wrappers.TransformReward, which the env given lacks"
    ):
        agent.evaluate(clipped, episodes=1, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        agent.evaluate(gym.wrappers.TransformReward(clipped, lambda reward: reward), episodes=1, seed=0)


def test_wrong_env_and_wrong_observations_are_refused():
    agent = make_agent()
    with pytest.raises(InputError, match="trained on 'CartPole-v1'"):
        agent.evaluate("Pendulum-v1", episodes=1)
    with pytest.raises(InputError, match="does not match"):
        agent.predict(np.zeros(3))
    with pytest.raises(InputError, match="NaN"):
        agent.predict(np.array([0.0, np.nan, 0.0, 0.0]))
    with pytest.raises(InputError, match="is not an array"):
        agent.predict([[0.0, 0.0, 0.0, 0.0], [0.0, 0.0]])  # rows of different lengths
    with pytest.raises(InputError, match=r"shape \(0, 4\) does not match"):
        agent.predict(np.zeros((0, 4), np.float32))  # an empty batch


def test_max_episode_steps_holds_when_evaluating_in_another_env(tmp_path):
    config = quiet(ppo.PPOConfig(), tmp_path)
    config.run.total_frames, config.run.eval_every, config.run.eval_episodes = 512, 512, 2
    config.run.max_episode_steps, config.run.eval_env_id = 5, "CartPole-v0"
    ppo.main(config)
    rows = (tmp_path / "evaluations.csv").read_text().splitlines()
    assert float(rows[-1].split(",")[rows[0].split(",").index("length_mean")]) <= 5  # the run's evaluations
    agent = Agent.load(tmp_path / "agent.ckpt")
    assert agent.evaluate("CartPole-v0", episodes=3, seed=0).lengths.max() <= 5
    assert agent.evaluate(episodes=3, seed=0, env_kwargs={"sutton_barto_reward": True}).lengths.max() <= 5
    longer = agent.evaluate(episodes=3, seed=0, env_kwargs={"max_episode_steps": 500}).lengths
    assert longer.max() > 5  # an env's own limit, given, wins


def test_loading_bad_files_gives_clear_errors_and_never_unpickles(tmp_path):
    with pytest.raises(InputError, match="No agent checkpoint"):
        Agent.load(tmp_path / "missing.ckpt")
    garbage = tmp_path / "garbage.ckpt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="garbage.ckpt"):
        Agent.load(garbage)

    sentinel = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(sentinel), "w"))

    malicious = tmp_path / "malicious.ckpt"
    malicious.write_bytes(pickle.dumps(Payload()))
    with pytest.raises(InputError):
        Agent.load(malicious)
    assert not sentinel.exists()

    # a genuine archive with a pickled sidecar that TensorDict's loader would unpickle
    saved = make_agent().save(tmp_path / "genuine.ckpt")
    sidecar = tmp_path / "sidecar.ckpt"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(sidecar, "w") as target:
        for name in source.namelist():
            target.writestr(name, source.read(name))
        target.writestr("components/0000-policy/state/other.pickle", pickle.dumps(Payload()))
    with pytest.raises(InputError, match="unexpected file"):
        Agent.load(sidecar)
    assert not sentinel.exists()

    # meta.json naming a class for TensorDict's loader to import
    retyped = tmp_path / "retyped.ckpt"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(retyped, "w") as target:
        for name in source.namelist():
            data = source.read(name)
            if name.endswith("state/meta.json"):
                meta = json.loads(data)
                meta["_type"] = "<class 'os.system'>"
                data = json.dumps(meta).encode()
            target.writestr(name, data)
    with pytest.raises(InputError, match="other than plain tensors"):
        Agent.load(retyped)

    truncated = tmp_path / "truncated.ckpt"
    data = make_agent().save(tmp_path / "agent.ckpt").read_bytes()
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match="truncated.ckpt"):
        Agent.load(truncated)


def test_normalizer_matches_numpy_statistics():
    rng = np.random.default_rng(0)
    chunks = [rng.normal(3.0, 2.0, size=(n, 4)) for n in (7, 100, 33)]
    normalizer = ObservationNormalizer((4,))
    for chunk in chunks:
        normalizer.update(torch.as_tensor(chunk, dtype=torch.float32))
    data = np.concatenate(chunks)
    np.testing.assert_allclose(normalizer.mean.numpy(), data.mean(0), rtol=1e-5)
    np.testing.assert_allclose(normalizer.var.numpy(), data.var(0), rtol=1e-4)
    normalized = normalizer(torch.as_tensor(data, dtype=torch.float32))
    np.testing.assert_allclose(normalized.mean(0).numpy(), 0.0, atol=1e-4)
    np.testing.assert_allclose(normalized.std(0).numpy(), 1.0, atol=1e-2)


def test_normalizer_output_follows_every_change_of_its_statistics():
    """Each way the statistics can change shows in the output (a cache of them would have to follow every one)."""
    import copy

    def expected(normalizer, observation):
        mean = normalizer.mean.to(observation.dtype)
        std = torch.sqrt(normalizer.var + normalizer.epsilon).to(observation.dtype)
        return ((observation - mean) / std).clamp(-normalizer.clip, normalizer.clip)

    def check(normalizer, observation):
        torch.testing.assert_close(normalizer(observation), expected(normalizer, observation), rtol=0, atol=0)

    torch.manual_seed(0)
    normalizer, observation = ObservationNormalizer((3,)), torch.randn(5, 3) * 4 + 1
    check(normalizer, observation)  # the identity statistics
    normalizer.update(torch.randn(50, 3) * 3 + 2)
    check(normalizer, observation)
    with torch.inference_mode():
        check(normalizer, observation)
    other = ObservationNormalizer((3,))
    other.update(torch.randn(20, 3) * 10 - 5)
    normalizer.load_state_dict(other.state_dict())
    check(normalizer, observation)
    check(normalizer, observation.double())
    with torch.no_grad():
        normalizer.var.mul_(4)
    check(normalizer, observation)
    normalizer.epsilon = 1.0
    check(normalizer, observation)
    normalizer.register_buffer("mean", torch.full((3,), 7.0, dtype=torch.float64))
    check(normalizer, observation)
    # a write through another tensor on the same storage (TorchRL's loss parameters, a resumed run's load) leaves
    # the buffer's version counter alone: the output follows it all the same
    normalizer.var.data.copy_(torch.full((3,), 0.25, dtype=torch.float64))
    check(normalizer, observation)
    duplicate = copy.deepcopy(normalizer)
    duplicate.update(torch.randn(30, 3))
    check(duplicate, observation)
    check(normalizer, observation)
    # made in inference mode, used by autograd after it: a gradient through the normaliser still flows
    with torch.inference_mode():
        normalizer(observation)
    leaf = observation.clone().requires_grad_()
    normalizer(leaf).sum().backward()
    assert leaf.grad is not None and torch.isfinite(leaf.grad).all()
    # under vmap (TorchRL's ensembles of critics) and torch.func transforms the values are the same
    torch.testing.assert_close(
        torch.vmap(normalizer)(observation.unsqueeze(1)).squeeze(1), expected(normalizer, observation)
    )


def test_agent_records_the_builder_a_recipe_called(tmp_path):
    from agents import make_q_actor
    from envs import make_env

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    kwargs = {"hidden_sizes": [16], "dueling": True}
    policy = make_q_actor(env.observation_spec["observation"], env.action_spec, **kwargs)
    agent = Agent(
        policy,
        "CartPole-v1",
        env.single_observation_space,
        env.single_action_space,
        "dqn",
        policy_builder=make_q_actor,
        policy_kwargs=kwargs,
    )
    assert agent.policy_builder == "q_actor"
    agent.save(tmp_path / "agent.ckpt")
    loaded = Agent.load(tmp_path / "agent.ckpt")
    observations = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    assert (loaded.predict(observations) == agent.predict(observations)).all()
    with pytest.raises(InputError, match="not a policy builder"):
        Agent(
            policy,
            "CartPole-v1",
            env.single_observation_space,
            env.single_action_space,
            "dqn",
            policy_builder=len,
        )
    env.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_loading_onto_a_missing_gpu_is_one_line(tmp_path):
    agent = Agent.build("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), "test")
    agent.save(tmp_path / "agent.ckpt")
    with pytest.raises(InputError, match="no CUDA device is available"):
        Agent.load(tmp_path / "agent.ckpt", device="cuda")


def test_loading_a_resume_checkpoint_as_an_agent_names_the_file_to_pass(tmp_path):
    from training.resume import save_resume_checkpoint

    save_resume_checkpoint(tmp_path / "resume.ckpt", {"run": {"frames": 0}}, {"algorithm": "ppo"})
    with pytest.raises(
        InputError, match=r"is a resume checkpoint .*pass the agent.ckpt or best_agent.ckpt beside it"
    ):
        Agent.load(tmp_path / "resume.ckpt")


def test_policy_calls_do_not_search_for_pandas(monkeypatch):
    """TensorDict.from_any looks for pandas on disk for every module output; importing agents short-cuts it for
    tensors, and a policy call then makes no lookup at all (this fails if the per-call cost comes back)."""
    import importlib.util

    from tensordict import TensorDict

    from agents.networks import make_actor
    from envs import make_env

    env = make_env("Pendulum-v1", 2)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    step = env.reset()
    lookups = []
    original = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: lookups.append(name) or original(name, *args)
    )
    for _ in range(3):
        actor(step.clone())
    assert lookups == []
    # everything else still takes TensorDict's own path
    tensor = torch.ones(2)
    assert TensorDict.from_any(tensor) is tensor
    converted = TensorDict.from_any({"a": torch.zeros(3, 2)}, auto_batch_size=True)
    assert isinstance(converted, TensorDict) and converted.batch_size == (3, 2)
    env.close()


@pytest.mark.parametrize(
    "space, fine, refused, message",
    [
        (
            gym.spaces.Discrete(4, start=5),
            [5, 8.0, np.int64(6)],
            ["5", None, 5.5, 9],
            r"not numeric|whole numbers|outside",
        ),
        (
            gym.spaces.MultiBinary(4),
            [[0, 1, 1, 0], [True, False, True, True]],
            [[0, 2, 0, 1], [-1, 1, 0, 1], [0.5, 1, 0, 1]],
            "outside the agent's observation space",
        ),
        (
            gym.spaces.Box(0, 255, (3,), np.uint8),
            [[0, 128, 255]],
            [[0.5, 0.2, 0.1], [0, 300, 2]],
            "outside the agent's observation space",
        ),
        (
            gym.spaces.Box(0, 1, (3,), bool),
            [[True, False, True], [1, 0, 1]],
            [[2, 1, 1]],
            "outside the agent's observation space",
        ),
    ],
    ids=["discrete", "multi-binary", "uint8-box", "bool-box"],
)
def test_predict_refuses_observations_outside_integral_spaces(space, fine, refused, message):
    agent = Agent.build(
        "Custom-v0", space, gym.spaces.Discrete(2), "test", policy_kwargs={"hidden_sizes": [8]}
    )
    for observation in fine:
        assert agent.predict(observation) in (0, 1)
    for observation in refused:
        with pytest.raises(InputError, match=message):
            agent.predict(observation)


def test_an_image_of_floats_is_named_as_such():
    agent = Agent.build(
        "Custom-v0",
        gym.spaces.Box(0, 255, (6,), np.uint8),
        gym.spaces.Discrete(2),
        "test",
        policy_kwargs={"hidden_sizes": [8]},
    )
    with pytest.raises(
        InputError, match=r"an image scaled to floats\? the agent takes the env's own uint8 pixels"
    ):
        agent.predict(np.full(6, 0.5, np.float32))


def test_odd_observation_types_and_values_get_an_action_or_one_line():
    agent = make_agent()
    observation = np.array([0.01, -0.02, 0.03, 0.04], dtype=np.float32)
    assert agent.predict(torch.as_tensor(observation, dtype=torch.bfloat16)) == agent.predict(
        torch.as_tensor(observation, dtype=torch.bfloat16).float().numpy()
    )
    with pytest.raises(InputError, match=r"beyond float32's range"):
        agent.predict(np.full(4, 1e39))
    with pytest.raises(InputError, match="NaN or Inf"):
        agent.predict(np.array([0.0, np.nan, 0.0, 0.0]))
    tabular = Agent.build(
        "Custom-v0",
        gym.spaces.Discrete(5),
        gym.spaces.Discrete(2),
        "test",
        policy_kwargs={"hidden_sizes": [8]},
    )
    for huge in (np.uint64(2**64 - 1), np.array([1e30])):
        with pytest.raises(InputError, match="outside the agent's observation space"):
            tabular.predict(huge)
    for path in (None, 5):
        with pytest.raises(InputError, match="Agent.load takes the path of an agent checkpoint"):
            Agent.load(path)


def test_evaluate_caps_an_env_instance_without_a_time_limit_and_checks_the_video_before_any_episode(tmp_path):
    from gymnasium.envs.classic_control.pendulum import PendulumEnv

    from agents.agent import EVALUATION_STEP_LIMIT, _unlimited
    from errors import RenderError, WriteError

    agent = make_agent("Pendulum-v1")
    result = agent.evaluate(
        PendulumEnv(), episodes=1
    )  # made without a registration, it never ends on its own
    assert result.lengths.tolist() == [EVALUATION_STEP_LIMIT]
    assert agent.evaluate(gym.make("Pendulum-v1", max_episode_steps=7), episodes=1).lengths.tolist() == [7]
    assert agent.evaluate(gym.wrappers.TimeLimit(PendulumEnv(), 5), episodes=1).lengths.tolist() == [5]
    # an id registered without a limit is capped as evaluate("CliffWalking-v1") caps it; Atari's games end on
    # their own, past 1,000 steps, and stay whole
    assert _unlimited(gym.make("CliffWalking-v1")) and _unlimited(PendulumEnv())
    assert not _unlimited(gym.make("ale_py:ALE/Pong-v5"))
    # a registered env stripped of its limit keeps its spec but never ends either
    unwrapped = gym.make("Pendulum-v1").unwrapped
    assert _unlimited(unwrapped) and not _unlimited(gym.make("Pendulum-v1"))
    assert agent.evaluate(unwrapped, episodes=1).lengths.tolist() == [EVALUATION_STEP_LIMIT]
    (tmp_path / "file").write_text("")
    played = []
    agent._play = lambda *args: played.append(args)
    with pytest.raises(
        WriteError, match=r"Could not write .*file/video.mp4 \(its folder: a file stands in its path\)"
    ):
        agent.evaluate(episodes=1, video_path=tmp_path / "file" / "video.mp4")
    import dict_env  # noqa: F401 - registers GoalReach-v0, whose constructor takes no render_mode

    observation_space = gym.make("GoalReach-v0").observation_space
    goal = Agent.build(
        "GoalReach-v0", observation_space, gym.spaces.Discrete(4), "test", policy_kwargs={"hidden_sizes": [8]}
    )
    goal._play = agent._play
    with pytest.raises(
        RenderError, match="GoalReach-v0 cannot render frames: its constructor takes no render_mode"
    ):
        goal.evaluate(episodes=1, video_path=tmp_path / "goal.mp4")
    assert played == []


def test_save_replaces_only_a_checkpoint_and_takes_a_trailing_slash_as_a_folder(tmp_path, monkeypatch):
    import os

    agent = make_agent("CartPole-v1")
    monkeypatch.chdir(tmp_path)
    assert agent.save("models/") == Path("models/agent.ckpt") and Path("models/agent.ckpt").is_file()
    assert agent.save("models/agent.ckpt") == Path("models/agent.ckpt")  # its own kind: replaced
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    with pytest.raises(InputError, match="notes.txt is a file that is not an agent checkpoint"):
        agent.save(notes)
    assert notes.read_text() == "my notes"
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(InputError, match="pipe is not a regular file"):
        agent.save(tmp_path / "pipe")
    for bad in ("", None, 3):
        with pytest.raises(InputError, match="Agent.save takes the path of a file or folder"):
            agent.save(bad)


@pytest.mark.parametrize("flag", ["False", None, 0, np.array([True])])
def test_deterministic_takes_a_bool_only(flag):
    agent = make_agent("CartPole-v1")
    with pytest.raises(InputError, match=r"predict\(deterministic=\.\.\.\) takes True or False"):
        agent.predict(np.zeros(4, np.float32), deterministic=flag)
    with pytest.raises(InputError, match=r"evaluate\(deterministic=\.\.\.\) takes True or False"):
        agent.evaluate(episodes=1, deterministic=flag)
    assert agent.predict(np.zeros(4, np.float32), deterministic=np.False_) in (0, 1)


def test_evaluate_refuses_env_kwargs_that_are_not_a_dict_and_an_empty_video_path():
    agent = make_agent("CartPole-v1")
    with pytest.raises(InputError, match="env_kwargs takes a dict"):
        agent.evaluate(episodes=1, env_kwargs=["max_episode_steps=5"])
    with pytest.raises(InputError, match="video_path takes the path of a video file or folder, got ''"):
        agent.evaluate(episodes=1, video_path="")
