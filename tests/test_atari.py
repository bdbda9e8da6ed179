"""Atari: preprocessing, training-only tricks, the Nature CNN, agents and a PPO smoke run on ALE/Pong-v5."""

import copy
import csv
import json
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

import agents.agent
from agents import Agent, input_encoder, make_actor, make_critic
from agents.networks import NatureCNN, critic_on_cnn_trunk, observation_encoder
from envs import make_env
from envs.atari import is_atari, make_atari_env
from envs.vector import check_env_id, check_env_kwargs
from errors import InputError
from recipes import a2c, dqn, ppo
from training import RunConfig

PONG = "ALE/Pong-v5"
ROOT = Path(__file__).resolve().parent.parent
FRAMES = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)


def test_observations_are_four_stacked_84x84_uint8_frames():
    for training in (True, False):
        env = make_atari_env(PONG, training=training)
        assert env.observation_space == FRAMES and env.action_space == gym.spaces.Discrete(6)
        observation, _ = env.reset(seed=0)
        assert observation.shape == (4, 84, 84) and observation.dtype == np.uint8
        for _ in range(3):
            observation, *_ = env.step(env.action_space.sample())
        assert FRAMES.contains(observation) and observation.any()
        env.close()
    env = make_env(PONG, num_envs=2, seed=0)
    assert env.observation_spec["observation"].dtype == torch.uint8
    rollout = env.rollout(4)
    assert rollout["next", "observation"].shape == (2, 4, 4, 84, 84)
    assert rollout["next", "observation"].dtype == torch.uint8
    env.close()


def test_frames_are_those_of_gymnasiums_preprocessing_on_the_full_colour_env():
    """The ALE env underneath makes grayscale screens (the preprocessing reads the screen itself) and the
    preprocessing's frame-skipping loop drives the emulator directly: the frames, rewards, flags and infos are
    those Gymnasium's preprocessing gives on ALE's default full-colour env, through lost lives and resets."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    from envs.atari import DirectAtariPreprocessing, EpisodicLife, FireAtLifeStart, SignReward

    breakout = "ALE/Breakout-v5"  # five lives, each lost within a few dozen random steps
    ours = make_atari_env(breakout, training=True)
    assert ours.unwrapped._obs_type == "grayscale"
    colour = gym.make(breakout, frameskip=1)
    colour = AtariPreprocessing(
        colour, noop_max=30, frame_skip=4, screen_size=84, terminal_on_life_loss=False
    )
    colour = FrameStackObservation(SignReward(EpisodicLife(FireAtLifeStart(colour))), 4)
    rng = np.random.default_rng(0)
    np.testing.assert_array_equal(ours.reset(seed=5)[0], colour.reset(seed=5)[0])
    episodes = 0
    for _ in range(400):
        action = int(rng.integers(ours.action_space.n))
        step, colour_step = ours.step(action), colour.step(action)
        np.testing.assert_array_equal(step[0], colour_step[0])
        assert step[1:] == colour_step[1:]  # rewards, flags and the last frame's info
        if step[2] or step[3]:
            episodes += 1
            np.testing.assert_array_equal(ours.reset()[0], colour.reset()[0])
    assert episodes >= 3
    preprocessing = ours
    while not isinstance(preprocessing, DirectAtariPreprocessing):
        preprocessing = preprocessing.env
    assert preprocessing._direct_env() is ours.unwrapped  # the steps above drove the emulator directly
    ours.close()
    colour.close()


def test_preprocessing_takes_gymnasiums_loop_where_a_frame_step_does_more_than_pass_through():
    """A wrapper between the preprocessing and the emulator (here a time limit counted in frames), and the
    wrappers' first-step checks, keep Gymnasium's loop, and with it their effect."""
    from gymnasium.wrappers import AtariPreprocessing, TimeLimit

    from envs.atari import DirectAtariPreprocessing, register_atari_envs

    register_atari_envs()

    def limited(preprocessing):  # 20 frames: 5 agent steps
        env = TimeLimit(gym.make(PONG, frameskip=1, obs_type="grayscale"), max_episode_steps=20)
        return preprocessing(env, noop_max=0, frame_skip=4, screen_size=84, terminal_on_life_loss=False)

    ours, reference = limited(DirectAtariPreprocessing), limited(AtariPreprocessing)
    ours.reset(seed=0)
    reference.reset(seed=0)
    for step in range(5):
        result, expected = ours.step(0), reference.step(0)
        np.testing.assert_array_equal(result[0], expected[0])
        assert result[1:] == expected[1:] and result[3] == (step == 4)
    assert ours._direct_env() is None
    plain = make_atari_env(PONG, training=False)
    preprocessing = plain
    while not isinstance(preprocessing, DirectAtariPreprocessing):
        preprocessing = preprocessing.env
    assert preprocessing._direct_env() is None  # before reset, and before the checker's first steps
    plain.reset(seed=0)  # its no-ops step through the wrappers
    plain.step(0)
    plain.step(0)
    assert preprocessing._direct_env() is plain.unwrapped
    for env in (ours, reference, plain):
        env.close()


def paired_run(env_id: str, steps: int, seed: int = 3):
    """Step a training env and an evaluation env of ``env_id`` with the same seed and actions until the training
    env's episode ends; both see the same game up to there."""
    training_env = make_atari_env(env_id, training=True)
    evaluation_env = make_atari_env(env_id, training=False)
    training_env.reset(seed=seed)
    evaluation_env.reset(seed=seed)
    rng = np.random.default_rng(seed)
    rewards, flags = [], []
    for _ in range(steps):
        action = rng.integers(training_env.action_space.n)
        observation, reward, terminated, truncated, _ = training_env.step(action)
        real_observation, real_reward, real_terminated, _, _ = evaluation_env.step(action)
        np.testing.assert_array_equal(observation, real_observation)
        rewards.append((reward, real_reward))
        flags.append((terminated, real_terminated))
        if terminated or truncated:
            break
    return training_env, evaluation_env, np.array(rewards), np.array(flags)


def test_rewards_are_clipped_to_their_sign_in_training_only():
    # Space Invaders scores 5 to 30 points per invader
    _, _, rewards, _ = paired_run("ALE/SpaceInvaders-v5", steps=400)
    training_rewards, real_rewards = rewards.T
    assert real_rewards.max() > 1  # the evaluation env keeps the game's score
    np.testing.assert_array_equal(training_rewards, np.sign(real_rewards))


def test_a_lost_life_ends_the_episode_in_training_only_and_the_game_goes_on():
    training_env, evaluation_env, _, flags = paired_run("ALE/SpaceInvaders-v5", steps=1000)
    ale = training_env.unwrapped.ale
    # a life was lost: the training episode ends, the game does not
    assert flags[-1].tolist() == [True, False]
    assert not flags[:-1].any()
    assert ale.lives() == evaluation_env.unwrapped.ale.lives() == 2 and not ale.game_over()
    training_env.reset()
    assert ale.lives() == 2  # the next training episode is the same game's next life, not a new game


def test_env_ids_and_options_are_checked():
    assert is_atari(PONG) and not is_atari("CartPole-v1")
    check_env_id(PONG)
    with pytest.raises(InputError, match="Unknown Gymnasium env id"):
        check_env_id("ALE/NoSuchGame-v5")
    with pytest.raises(InputError, match="frameskip"):
        make_atari_env(PONG, training=True, frameskip=4)
    with pytest.raises(InputError, match="obs_type"):
        make_atari_env(PONG, training=True, obs_type="rgb")
    with pytest.raises(InputError, match="not an Atari id"):
        make_atari_env("CartPole-v1", training=True)


def test_missing_ale_py_is_reported(monkeypatch):
    monkeypatch.setitem(sys.modules, "ale_py", None)  # makes `import ale_py` fail
    with pytest.raises(InputError, match="pip install 'ale-py"):
        check_env_id(PONG)


def test_render_mode_in_env_kwargs_is_refused_before_anything_is_built():
    """The toolkit renders Atari evaluation envs itself: the agent's make_env passes render_mode too, so one given
    in the env kwargs failed at the final evaluation, losing the run."""
    breakout = "ALE/Breakout-v5"
    with pytest.raises(InputError, match="--env-kwargs render_mode='rgb_array': render_mode cannot be set"):
        RunConfig(env_id=breakout, env_kwargs=("render_mode=rgb_array",)).validate()
    with pytest.raises(
        InputError, match="--eval-env-kwargs render_mode='rgb_array': render_mode cannot be set"
    ):
        RunConfig(env_id=breakout, eval_env_kwargs=("render_mode=rgb_array",)).validate()
    with pytest.raises(InputError, match="env_kwargs render_mode='human'"):
        check_env_kwargs(breakout, {"render_mode": "human"}, "env_kwargs")  # an agent's own kwargs
    check_env_kwargs(PONG, {"repeat_action_probability": 0.0, "max_episode_steps": 10})


def test_continuous_actions_are_refused_in_one_line():
    """ALE's continuous actions would fail an assertion inside ale_py; the preprocessing plays discrete ones."""
    with pytest.raises(InputError, match="continuous cannot be set for Atari envs"):
        make_atari_env(PONG, training=True, continuous=True)
    with pytest.raises(InputError, match="--env-kwargs continuous=True: continuous cannot be set"):
        RunConfig(env_id=PONG, env_kwargs=("continuous=true",)).validate()


def test_max_episode_steps_counts_agent_steps_and_truncates(tmp_path):
    """A time limit above the preprocessing: N agent steps (not N emulator frames, no-ops included), a truncation,
    in training and evaluation envs alike, with the preprocessing still driving the emulator directly."""
    from envs.atari import DirectAtariPreprocessing

    for training in (True, False):
        env = make_atari_env(PONG, training=training, max_episode_steps=12)
        for _ in range(2):  # the next game is cut at 12 steps too
            env.reset(seed=0)
            for step in range(1, 13):
                _, _, terminated, truncated, _ = env.step(0)
                assert not terminated and truncated == (step == 12)
        preprocessing = next(layer for layer in _layers(env) if isinstance(layer, DirectAtariPreprocessing))
        assert preprocessing._direct_env() is env.unwrapped
        env.close()
    env = make_env(PONG, num_envs=1, seed=0, env_kwargs={"max_episode_steps": 6})
    rollout = env.rollout(8, break_when_any_done=False)
    assert rollout["next", "truncated"].squeeze(-1).tolist() == [[False] * 5 + [True, False, False]]
    assert not rollout["next", "terminated"].any() and rollout["next", "episode_length"][0, 5].item() == 6
    env.close()
    agent = Agent.build(PONG, FRAMES, gym.spaces.Discrete(6), "test", policy_kwargs={"hidden_sizes": []})
    result = agent.evaluate(episodes=2, seed=0, env_kwargs={"max_episode_steps": 25})
    assert result.lengths.tolist() == [25, 25]


LEGACY_IDS = {
    "PongNoFrameskip-v4": PONG,
    "Pong-v4": PONG,
    "Pong-v0": PONG,
    "BreakoutDeterministic-v4": "ALE/Breakout-v5",  # ids of older ale-py versions, not registered by 0.10+
    "Pong-ram-v4": PONG,
}


def test_older_ale_ids_are_refused_naming_their_v5_id():
    """ALE's older ids register raw full-colour envs once ale_py is imported: refused (not built without the
    preprocessing), naming the ALE/...-v5 id; other packages' -v0 and -v4 ids are left alone."""
    from envs.atari import register_atari_envs

    register_atari_envs()
    for env_id, replacement in LEGACY_IDS.items():
        message = f"{env_id!r} is one of ALE's older ids.*use {replacement!r}.*Machado"
        with pytest.raises(InputError, match=message):
            check_env_id(env_id)
        with pytest.raises(InputError, match=message):
            make_atari_env(env_id, training=False)
    with pytest.raises(InputError, match="use 'ALE/Pong-v5'"):
        make_env("PongNoFrameskip-v4", num_envs=1)
    with pytest.raises(InputError, match="not train on the console's RAM"):
        check_env_id("Pong-ram-v4")
    from envs.atari import legacy_atari_id

    for env_id in (
        "Taxi-v4",
        "FrozenLake-v1",
        "CartPole-v0",
        "Hopper-v4",
        "Ant-v4",
        "Blackjack-v0",
        "Foo-v4",
    ):
        assert legacy_atari_id(env_id) is None, env_id
    check_env_id("CartPole-v0")
    with pytest.raises(InputError, match="Unknown Gymnasium env id 'Foo-v4'"):
        check_env_id("Foo-v4")


def test_older_ale_ids_are_refused_before_ale_py_is_imported():
    """In a fresh process (the command line), an older id is refused as such, not as an unknown id; other ids do
    not import ale_py."""
    code = (
        "import sys\n"
        "from envs.vector import check_env_id\n"
        "from errors import InputError\n"
        "check_env_id('CartPole-v0'); check_env_id('Hopper-v4')\n"
        "assert 'ale_py' not in sys.modules\n"
        "try:\n"
        "    check_env_id('PongNoFrameskip-v4')\n"
        "except InputError as error:\n"
        "    print(error)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert "use 'ALE/Pong-v5'" in result.stdout


def test_async_vectorization_builds_an_async_vector_env_of_atari_envs(monkeypatch):
    # A real AsyncVectorEnv spawns processes that each import torch (tens of seconds on a loaded 2-core machine):
    # check the wiring with a recording stand-in that steps the same sub-envs in this process.
    calls = []

    def recording_async_vector_env(env_fns, **kwargs):
        calls.append((len(env_fns), kwargs))
        return gym.vector.SyncVectorEnv(env_fns, **kwargs)

    monkeypatch.setattr(gym.vector, "AsyncVectorEnv", recording_async_vector_env)
    env = make_env(PONG, num_envs=2, seed=0, vectorization="async")
    assert calls == [(2, {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})]
    assert env.rollout(3)["next", "observation"].shape == (2, 3, 4, 84, 84)
    env.close()


def test_nature_cnn_shapes_and_errors():
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    assert cnn.linear[0].in_features == 64 * 7 * 7  # Mnih et al. (2015)
    assert NatureCNN((3, 64, 64)).linear[0].in_features == 64 * 4 * 4
    observations = torch.randint(0, 256, (2, 3, 4, 84, 84), dtype=torch.uint8)
    features = cnn(observations)
    assert features.shape == (2, 3, 512) and (features >= 0).all()
    torch.testing.assert_close(cnn(observations[1, 2]), features[1, 2])  # leading dims are only batch dims
    features.sum().backward()
    assert all(parameter.grad is not None for parameter in cnn.parameters())
    image_spec = make_env(PONG, num_envs=1).observation_spec["observation"]
    encoder, width = observation_encoder(image_spec, normalize=False)
    assert isinstance(encoder, NatureCNN) and width == 512
    with pytest.raises(InputError, match="drop --normalize-obs"):
        observation_encoder(image_spec, normalize=True)
    with pytest.raises(InputError, match="too small"):
        NatureCNN((210, 160, 3))  # channels last


def test_the_cnn_leaves_float_input_as_it_was_under_vmap():
    cnn = NatureCNN((4, 84, 84))
    pixels = torch.full((2, 1, 4, 84, 84), 255.0)
    torch.vmap(cnn)(pixels)  # TorchRL's ensembles call networks this way
    assert bool((pixels == 255.0).all())


def test_the_cnn_hands_its_gradient_back_channels_last_with_flattens_values():
    from agents.networks import ChannelsLastFlatten

    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    observations = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    layouts = []
    for relu in cnn.convolutions[1:6:2]:  # the ReLUs after the convolutions: the layout of their gradient
        relu.register_full_backward_hook(
            lambda module, grad_input, grad_output: layouts.append(
                grad_output[0].is_contiguous(memory_format=torch.channels_last)
            )
        )
    gradients = []
    for flatten in (torch.nn.Flatten(), ChannelsLastFlatten()):
        cnn.convolutions[-1] = flatten
        cnn.zero_grad()
        cnn(observations).pow(2).sum().backward()
        gradients.append([parameter.grad.clone() for parameter in cnn.parameters()])
    assert not all(layouts[:3]) and all(layouts[3:])  # nn.Flatten's: channels first into some of them
    for expected, got in zip(*gradients, strict=True):
        assert torch.equal(expected, got)
    maps = torch.randn(2, 64, 7, 7).contiguous(memory_format=torch.channels_last)
    assert torch.equal(ChannelsLastFlatten()(maps), maps.flatten(1))
    traced = torch.jit.trace(ChannelsLastFlatten(), (maps.requires_grad_(),), check_trace=False)
    assert "PythonOp" not in str(traced.graph)  # ONNX export sees a plain flatten


def test_pong_actor_acts_and_critic_shares_its_cnn():
    env = make_env(PONG, num_envs=2, seed=0)
    observation_spec = env.observation_spec["observation"]
    actor = make_actor(observation_spec, env.action_spec, hidden_sizes=())
    critic = make_critic(observation_spec, hidden_sizes=(), encoder=input_encoder(actor))
    assert isinstance(input_encoder(actor), NatureCNN) and critic.module[0] is input_encoder(actor)
    cnn_parameters = {id(parameter) for parameter in input_encoder(actor).parameters()}
    assert cnn_parameters <= {id(parameter) for parameter in critic.parameters()}
    rollout = env.rollout(3, actor)
    assert rollout["action"].shape == (2, 3) and ((rollout["action"] >= 0) & (rollout["action"] < 6)).all()
    assert critic(rollout)["state_value"].shape == (2, 3, 1)
    env.close()


def test_collection_writes_the_critics_values_running_the_shared_cnn_once_a_step(monkeypatch):
    """PPO's collector on Pong writes the critic's values beside the policy's outputs, the CNN running once a step
    (the critic gets the actor's features), and the advantages from them are those of running the critic over
    the batch."""
    from agents import OneCallGAE
    from training import make_collector

    env = make_env(PONG, num_envs=2, seed=0)
    observation_spec = env.observation_spec["observation"]
    actor = make_actor(observation_spec, env.action_spec, hidden_sizes=())
    critic = make_critic(observation_spec, hidden_sizes=(), encoder=input_encoder(actor))
    collector = make_collector(
        RunConfig(num_envs=2), env, actor, torch.device("cpu"), 2 * 8, 2 * 8, critic=critic
    )
    trunk_runs = []
    convolutions = input_encoder(actor).convolutions
    monkeypatch.setattr(
        convolutions,
        "forward",
        lambda x: trunk_runs.append(len(x)) or type(convolutions).forward(convolutions, x),
    )
    batch = next(iter(collector))
    collector.shutdown()
    env.close()
    assert critic_on_cnn_trunk(actor, critic) and trunk_runs == [2] * 8  # one CNN run a step for both
    with torch.no_grad():
        recomputed = critic(batch.exclude("state_value"))["state_value"]
        torch.testing.assert_close(batch["state_value"], recomputed)
        arguments = {"gamma": 0.99, "lmbda": 0.95, "value_network": critic, "average_gae": False}
        expected = OneCallGAE(**arguments)(batch.exclude("state_value"))
        trunk_runs.clear()
        result = OneCallGAE(**arguments, collected_values=True)(batch.clone())
    assert trunk_runs == [2]  # the last step's next observations
    for key in ["advantage", "value_target", ("next", "state_value")]:
        torch.testing.assert_close(result[key], expected[key])


@pytest.mark.parametrize("loss_class", ["ClipPPOLoss", "TensorClipPPOLoss"])
def test_shared_cnn_runs_once_per_ppo_minibatch_with_the_same_gradients(loss_class):
    """Actor and critic share the Nature CNN: the PPO loss (TorchRL's, and the tensor one recipes.ppo runs) calls
    both on one minibatch, and the convolutions run once, with the gradients of running them twice."""
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    from agents import TensorClipPPOLoss

    loss_class = {"ClipPPOLoss": ClipPPOLoss, "TensorClipPPOLoss": TensorClipPPOLoss}[loss_class]

    losses, gradients, forward_calls = [], [], []
    for reuse in (False, True):
        torch.manual_seed(0)
        env = make_env(PONG, num_envs=2, seed=0)
        observation_spec = env.observation_spec["observation"]
        actor = make_actor(observation_spec, env.action_spec, hidden_sizes=())
        critic = make_critic(observation_spec, hidden_sizes=(), encoder=input_encoder(actor))
        cnn = input_encoder(actor)
        assert cnn.reuse_features  # make_critic turned it on for the shared trunk
        cnn.reuse_features = reuse
        with torch.no_grad():
            batch = env.rollout(8, actor, break_when_any_done=False)
            GAE(gamma=0.99, lmbda=0.95, value_network=critic)(batch)
        loss_module = loss_class(actor, critic, entropy_coeff=0.01, functional=False)
        calls = []
        handle = cnn.convolutions[0].register_forward_hook(lambda *args, calls=calls: calls.append(1))
        loss = loss_module(batch.reshape(-1))
        total = loss["loss_objective"] + loss["loss_critic"] + loss["loss_entropy"]
        total.backward()
        handle.remove()
        losses.append(total.detach())
        gradients.append([parameter.grad.clone() for parameter in cnn.parameters()])
        forward_calls.append(len(calls))
        assert cnn._memo is None  # the backward pass dropped the features it went through
        env.close()
    assert forward_calls == [2, 1]
    torch.testing.assert_close(losses[1], losses[0])
    for reused, recomputed in zip(gradients[1], gradients[0], strict=True):
        torch.testing.assert_close(reused, recomputed)


def test_cnn_reuses_features_only_for_the_same_input_parameters_and_grad_mode():
    torch.manual_seed(0)
    cnn = NatureCNN((4, 84, 84))
    cnn.reuse_features = True
    observation = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    features = cnn(observation)
    assert cnn(observation) is features
    assert cnn(observation.clone()) is not features  # another tensor with the same values
    again = cnn(observation)
    with torch.no_grad():
        assert cnn(observation) is not again  # another grad mode
    again = cnn(observation)
    observation[0, 0, 0, 0] += 1  # changed in place: its version moves on
    assert cnn(observation) is not again
    again = cnn(observation)
    with torch.no_grad():
        cnn.linear[0].bias.add_(1.0)  # what an optimizer step does
    assert cnn(observation) is not again
    copy.deepcopy(cnn), pickle.dumps(cnn)  # copies never carry the features or their graph
    assert copy.deepcopy(cnn)._memo is None
    plain = NatureCNN((4, 84, 84))  # off by default: a CNN that is not shared keeps no features
    assert plain(observation) is not plain(observation) and plain._memo is None
    vmapped = torch.vmap(cnn)(torch.stack([observation, observation]))  # under vmap: no memory formats
    torch.testing.assert_close(vmapped[0], cnn(observation.clone()))


def test_pong_agent_round_trip_and_evaluation_env(tmp_path, monkeypatch):
    torch.manual_seed(0)
    env = make_atari_env(PONG, training=False)
    agent = Agent.build(
        PONG, env.observation_space, env.action_space, "test", policy_kwargs={"hidden_sizes": []}
    )
    path = agent.save(tmp_path / "agent.ckpt")
    with zipfile.ZipFile(path) as archive:
        manifest = json.loads(archive.read("manifest.json"))
    assert manifest["metadata"]["observation_space"]["low"] == 0  # pixel bounds saved once
    loaded = Agent.load(path)
    assert loaded.observation_space == FRAMES
    observations = np.stack([env.reset(seed=seed)[0] for seed in range(4)])
    np.testing.assert_array_equal(loaded.predict(observations), agent.predict(observations))
    assert env.action_space.contains(int(loaded.predict(observations[0])))

    built = []

    def short_games(env_id, training, **kwargs):  # evaluation envs, cut to 50 agent steps to keep this fast
        built.append(training)
        return make_atari_env(env_id, training, max_num_frames_per_episode=200, **kwargs)

    monkeypatch.setattr(agents.agent, "make_atari_env", short_games)
    result = loaded.evaluate(episodes=2, seed=0, video_path=tmp_path / "pong.mp4")
    assert built == [False, False]  # whole games, real scores
    assert (result.lengths <= 50).all() and (tmp_path / "pong.mp4").stat().st_size > 0


def read_evaluations(output_dir):
    with (output_dir / "evaluations.csv").open() as file:
        return list(csv.DictReader(file))


def short_pong_run(output_dir, frames: int) -> RunConfig:
    """A run of ``frames`` frames on Pong with 2 envs and one evaluation game at its end, writing no logs."""
    return RunConfig(
        env_id=PONG,
        num_envs=2,
        total_frames=frames,
        eval_every=frames,
        eval_episodes=1,
        output_dir=output_dir,
        logger="none",
        video=False,
        progress=False,
    )


def test_ppo_smoke_on_pong(output_dir):
    config = ppo.PPOConfig(
        run=short_pong_run(output_dir, 64),
        collector=ppo.CollectorConfig(steps_per_env=16),
        optim=ppo.OptimConfig(minibatch_size=16, num_epochs=1, lr=2.5e-4),
        network=ppo.NetworkConfig(hidden_sizes=()),
    )
    summary = ppo.main(config)
    assert summary["frames"] == 64 and summary["env_id"] == PONG
    # one whole game of Pong (the first side to 21 points wins; an untrained agent's lasts 750-900 steps),
    # scored by the game
    evaluation = read_evaluations(output_dir)
    assert len(evaluation) == 1 and float(evaluation[0]["length_mean"]) > 600
    assert summary["eval_return_mean"] in range(-21, 22)
    agent = Agent.load(output_dir)
    assert isinstance(input_encoder(agent.policy), NatureCNN)


@pytest.mark.parametrize("gae_lambda", [None, 0.95])
def test_a2c_on_pong_reads_the_collected_values(output_dir, monkeypatch, gae_lambda):
    """A2C's n-step and GAE advantages on Pong read the values the collector wrote: the CNN runs over each
    batch's last next observations only, not over the whole batch again."""
    from agents.advantages import _OneCriticCall

    batch_rows = []
    call = _OneCriticCall._call_value_nets

    def spy(self, data, *args, **kwargs):
        batch_rows.append((self.collected_values, data.get("state_value", default=None) is not None))
        return call(self, data, *args, **kwargs)

    monkeypatch.setattr(_OneCriticCall, "_call_value_nets", spy)
    config = a2c.A2CConfig(
        run=short_pong_run(output_dir, 20),
        collector=a2c.CollectorConfig(steps_per_env=5),
        loss=a2c.LossConfig(gae_lambda=gae_lambda),
        network=a2c.NetworkConfig(hidden_sizes=()),
    )
    assert a2c.main(config)["frames"] == 20
    assert batch_rows == [(True, True)] * 2


def test_dqn_smoke_on_pong(output_dir):
    run = RunConfig(
        env_id=PONG,
        num_envs=2,
        total_frames=64,
        eval_every=64,
        eval_episodes=1,
        output_dir=output_dir,
        logger="none",
        video=False,
        progress=False,
    )
    config = dqn.DQNConfig(
        run=run,
        collector=dqn.CollectorConfig(steps_per_env=16, updates_per_batch=2, learning_starts=32),
        buffer=dqn.BufferConfig(buffer_size=1_000, batch_size=8),
        network=dqn.NetworkConfig(hidden_sizes=()),
    )
    summary = dqn.main(config)
    assert summary["frames"] == 64 and summary["env_id"] == PONG
    evaluation = read_evaluations(output_dir)
    assert len(evaluation) == 1 and float(evaluation[0]["length_mean"]) > 600
    assert summary["eval_return_mean"] in range(-21, 22)
    agent = Agent.load(output_dir)
    assert isinstance(agent.policy[0].module[0].module[0], NatureCNN)
    assert agent.predict(np.zeros((4, 84, 84), dtype=np.uint8)) in range(6)


def test_dqn_on_pong_stores_frames_once_and_its_replay_buffer_resumes(tmp_path, monkeypatch):
    """The Atari replay buffer is a FrameStackStorage, and a resumed run starts with the very transitions the
    interrupted one had (the emulator's state is not saved, so the episodes themselves start anew)."""
    from run_helpers import interrupt_at

    from training import FrameStackStorage, Run

    storages, at_start = [], []
    original = Run.__init__

    def record_storage(self, algorithm, config, run_config, agent, training, **options):
        # a resumed run is restored here
        original(self, algorithm, config, run_config, agent, training, **options)
        storage = training.replay_buffer.storage
        storages.append(storage)
        at_start.append(storage.get(torch.arange(len(storage))) if len(storage) else None)

    monkeypatch.setattr(Run, "__init__", record_storage)

    def config(output_dir, **run):
        return dqn.DQNConfig(
            run=RunConfig(
                env_id=PONG,
                env_kwargs=("max_num_frames_per_episode=400",),  # short evaluation games
                num_envs=2,
                total_frames=192,
                eval_every=192,
                eval_episodes=1,
                output_dir=output_dir,
                logger="none",
                video=False,
                progress=False,
                **run,
            ),
            collector=dqn.CollectorConfig(steps_per_env=16, updates_per_batch=4, learning_starts=32),
            buffer=dqn.BufferConfig(buffer_size=100, batch_size=8),
            loss=dqn.LossConfig(target_update_interval=4),
            network=dqn.NetworkConfig(hidden_sizes=()),
        )

    dqn.main(config(tmp_path / "straight"))
    assert isinstance(storages[0], FrameStackStorage) and len(storages[0]) == 100  # wrapped around
    assert storages[0].frames_held <= 1.2 * 100
    with monkeypatch.context() as patch:
        interrupt_at(patch, 128)
        stopped = dqn.main(config(tmp_path / "stopped"))
    assert stopped["interrupted_by"] == "SIGINT"
    saved = storages[1].get(torch.arange(len(storages[1])))
    with pytest.warns(UserWarning, match="starts new episodes"):
        resumed = dqn.main(config(tmp_path / "stopped", resume=tmp_path / "stopped"))
    assert resumed["frames"] == 192
    restored = at_start[2]
    assert restored is not None and restored.shape == saved.shape == (100,)
    for key in saved.keys(True, True):
        assert torch.equal(restored.get(key), saved.get(key)), key


def test_fire_starts_each_life_in_games_that_wait_for_it():
    from envs.atari import FireAtLifeStart

    breakout = make_atari_env("ALE/Breakout-v5", training=False)
    assert any(isinstance(layer, FireAtLifeStart) for layer in _layers(breakout))
    breakout.reset(seed=0)
    # a policy that never presses FIRE: the ball is launched at each life all the same, so the game ends (5 lives)
    # long before the frame limit (27,000 agent steps) where it would otherwise stand still
    for step in range(5000):
        _, _, terminated, truncated, _ = breakout.step(0)
        if terminated or truncated:
            break
    assert terminated and not truncated and step < 5000
    training = make_atari_env("ALE/Breakout-v5", training=True)
    training.reset(seed=0)
    lives = training.unwrapped.ale.lives()
    for _ in range(5000):  # one life a training episode; the next starts with the ball in play again
        _, _, terminated, _, _ = training.step(0)
        if terminated:
            break
    assert terminated and training.unwrapped.ale.lives() == lives - 1
    freeway = make_atari_env("ALE/Freeway-v5", training=False)  # no FIRE button: nothing to press
    assert not any(isinstance(layer, FireAtLifeStart) for layer in _layers(freeway))


def _layers(env):
    while True:
        yield env
        if not hasattr(env, "env"):
            return
        env = env.env


def test_an_ale_id_behind_its_module_gets_the_preprocessing_and_the_checks():
    env = make_env("ale_py:ALE/Pong-v5", num_envs=1, seed=0)
    assert env.observation_spec["observation"].shape == (1, 4, 84, 84)  # not ALE's raw 210x160 screen
    env.close()
    with pytest.raises(InputError, match="frameskip cannot be set for Atari envs"):
        check_env_kwargs("ale_py:ALE/Pong-v5", {"frameskip": 2})
