"""Env options of every run: --env-wrappers (and what a checkpoint may import), --max-episode-steps,
--max-total-reward, a separate evaluation env (--eval-env-id, --eval-env-kwargs) and recipes.evaluate --render."""

import json
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from run_helpers import interrupt_at, tiny_ppo

from agents import Agent
from envs import make_env
from envs.wrappers import MaxTotalReward, apply_wrappers, parse_env_wrappers, wrapper_functions
from errors import InputError
from recipes import evaluate, ppo
from training import Callback, RunConfig
from training.cli import report

TESTS = Path(__file__).resolve().parent
SCALE = "reward_wrapper.ScaleReward"
TOO_MANY_CELLS = 2**45  # 256 TiB of float64: refused by the system at once


def hungry_cartpole(cells: int = 4) -> gym.Env:
    """CartPole after reserving ``cells`` float64 values: an env whose memory is one of its keyword arguments."""
    np.zeros(cells)
    return gym.envs.classic_control.CartPoleEnv()


gym.register("rlkit-test/HungryCartPole-v0", entry_point=hungry_cartpole, max_episode_steps=50)


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


class Episodes(Callback):
    """Every finished training episode's return and length, and whether it was truncated."""

    def __init__(self):
        self.returns, self.lengths, self.truncated = [], [], []

    def on_batch(self, run, batch, metrics):
        done = batch.get(("next", "done")).squeeze(-1)
        self.returns += batch.get(("next", "episode_return"))[done].flatten().tolist()
        self.lengths += batch.get(("next", "episode_length"))[done].flatten().tolist()
        self.truncated += batch.get(("next", "truncated")).squeeze(-1)[done].tolist()


def test_wrapper_items_parse_and_bad_ones_say_how():
    assert parse_env_wrappers(["gymnasium.wrappers.TimeAwareObservation", f'{SCALE}={{"scale": 2}}']) == [
        {"path": "gymnasium.wrappers.TimeAwareObservation", "kwargs": {}},
        {"path": SCALE, "kwargs": {"scale": 2}},
    ]
    for item in ["TimeAwareObservation", "gymnasium.wrappers.ClipReward=[1]", "a.b={oops", "os.system; rm=1"]:
        with pytest.raises(InputError, match="import path|IMPORT.PATH"):
            parse_env_wrappers([item])
    for number in ("NaN", "-Infinity", "1e999"):
        with pytest.raises(InputError, match=f"--env-wrappers {SCALE}: {number} is not a finite number"):
            parse_env_wrappers([f'{SCALE}={{"scale": {number}}}'])


def test_json_arrays_reach_wrappers_as_the_tuples_and_arrays_their_annotations_name():
    items = [
        'gymnasium.wrappers.RescaleAction={"min_action": [-0.5], "max_action": [0.5]}',
        'gymnasium.wrappers.ReshapeObservation={"shape": [3, 1]}',
    ]
    specs = parse_env_wrappers(items)
    env = apply_wrappers(gym.make("Pendulum-v1"), wrapper_functions(specs))
    assert env.observation_space.shape == (3, 1)
    assert env.action_space.dtype == np.float32 and env.action_space.high.tolist() == [0.5]
    assert specs[0]["kwargs"]["min_action"] == [-0.5]  # saved as given: JSON
    env.close()


def test_only_wrapper_classes_are_accepted(on_path):
    for path, message in [
        ("gymnasium.spaces.Box", "not a gymnasium.Wrapper subclass"),
        ("reward_wrapper.NOT_A_WRAPPER", "not a gymnasium.Wrapper subclass"),
        ("no_such_module_here.Wrapper", "Cannot import the wrapper"),
    ]:
        with pytest.raises(InputError, match=message):
            wrapper_functions(parse_env_wrappers([path]), allowed=[path])


def test_a_run_trains_and_evaluates_in_wrapped_envs_and_the_agent_keeps_them(output_dir, on_path):
    episodes = Episodes()
    wrappers = ("gymnasium.wrappers.TimeAwareObservation", f'{SCALE}={{"scale": 2.0}}')
    summary = ppo.main(tiny_ppo(output_dir, env_wrappers=wrappers), callbacks=[episodes])
    assert all(value == 2 * length for value, length in zip(episodes.returns, episodes.lengths))
    agent = Agent.load(output_dir, allow_wrappers=[SCALE])
    assert Agent.load(output_dir, allow_wrappers=SCALE).allowed_wrappers == {SCALE}  # one path, as a string
    assert agent.observation_space.shape == (5,)  # TimeAwareObservation adds the step count
    assert agent.env_wrappers == [
        {"path": "gymnasium.wrappers.TimeAwareObservation", "kwargs": {}},
        {"path": SCALE, "kwargs": {"scale": 2.0}},
    ]
    result = agent.evaluate(episodes=2, seed=1_000_000)
    assert result.returns.tolist() == (2 * result.lengths).tolist()
    rows = (output_dir / "evaluations.csv").read_text().splitlines()[1:]
    assert all(
        float(row.split(",")[2]) == 2 * float(row.split(",")[-1]) for row in rows
    )  # return = 2 x length
    assert summary["eval_return_mean"] == float(rows[-1].split(",")[2])


def test_a_checkpoint_imports_no_wrapper_unless_the_user_allows_it(output_dir, on_path):
    ppo.main(tiny_ppo(output_dir, total_frames=256, eval_every=256, env_wrappers=(SCALE,)))
    agent = Agent.load(output_dir)
    with pytest.raises(InputError, match=rf"wrapped by {SCALE}.*allow_wrappers=\['{SCALE}'\]"):
        agent.evaluate(episodes=1)
    with pytest.raises(InputError, match=f"--allow-wrappers {SCALE}"):
        evaluate.main(evaluate.EvaluateConfig(output_dir, episodes=1))
    summary = evaluate.main(evaluate.EvaluateConfig(output_dir, episodes=1, allow_wrappers=(SCALE,)))
    assert summary["returns"][0] == summary["lengths"][0]  # scale 1
    # loading alone imports nothing: the module stays unimported in a fresh process
    code = (
        "import sys; from agents import Agent; agent = Agent.load(sys.argv[1]); "
        "print(agent.env_wrappers[0]['path'], 'reward_wrapper' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(output_dir)],
        capture_output=True,
        text=True,
        check=True,
        cwd=TESTS.parent,
        env={"PYTHONPATH": f"{TESTS}:{TESTS.parent}", "PATH": "/usr/bin:/bin"},
    )
    assert result.stdout.split() == [SCALE, "False"]


def test_a_resumed_run_imports_its_saved_wrappers_only_when_allowed(output_dir, on_path, monkeypatch):
    interrupt_at(monkeypatch, 1_024)
    ppo.main(tiny_ppo(output_dir, env_wrappers=(SCALE,)))
    with pytest.raises(InputError, match=f"--allow-wrappers {SCALE}"):
        ppo.main(tiny_ppo(output_dir, env_wrappers=(SCALE,), resume=output_dir))
    resumed = ppo.main(
        tiny_ppo(output_dir, env_wrappers=(SCALE,), resume=output_dir, allow_wrappers=(SCALE,))
    )
    assert resumed["frames"] == 2_048


def test_a_checkpoint_naming_a_wrapper_that_writes_files_runs_it_only_when_allowed(output_dir, tmp_path):
    ppo.main(tiny_ppo(output_dir, total_frames=256, eval_every=256))
    agent = Agent.load(output_dir)
    outside = tmp_path / "outside"
    record = "gymnasium.wrappers.RecordVideo"
    agent.env_wrappers = [{"path": record, "kwargs": {"video_folder": str(outside)}}]
    agent.save(output_dir / "forged.ckpt")
    forged = Agent.load(output_dir / "forged.ckpt")
    with pytest.raises(
        InputError, match=rf"wrapped by {record}, named in the file being read, which writes files"
    ):
        forged.evaluate(episodes=1)
    assert not outside.exists()
    allowed = Agent.load(output_dir / "forged.ckpt", allow_wrappers=[record])
    assert wrapper_functions(allowed.env_wrappers, allowed.allowed_wrappers)  # the user's to trust


def test_forged_wrapper_descriptions_are_refused_on_load(output_dir):
    ppo.main(tiny_ppo(output_dir, total_frames=256, eval_every=256))
    agent = Agent.load(output_dir)
    for forged in [[{"path": "os.system", "kwargs": {}, "extra": 1}], [{"path": "os;system", "kwargs": {}}]]:
        agent.env_wrappers = forged
        agent.save(output_dir / "forged.ckpt")
        with pytest.raises(InputError):
            Agent.load(output_dir / "forged.ckpt")


def test_max_episode_steps_cuts_training_and_evaluation_episodes(output_dir):
    episodes = Episodes()
    summary = ppo.main(tiny_ppo(output_dir, max_episode_steps=12), callbacks=[episodes])
    assert max(episodes.lengths) == 12 and summary["eval_return_mean"] <= 12
    assert all(truncated for length, truncated in zip(episodes.lengths, episodes.truncated) if length == 12)
    agent = Agent.load(output_dir)
    assert agent.env_kwargs == {"max_episode_steps": 12}
    assert agent.evaluate(episodes=3).lengths.max() <= 12
    with pytest.raises(InputError, match="Give max_episode_steps once"):
        ppo.main(
            tiny_ppo(output_dir, max_episode_steps=12, env_kwargs=("max_episode_steps=5",), overwrite=True)
        )


def test_max_total_reward_truncates_an_episode_once_its_return_reaches_it(output_dir):
    episodes = Episodes()
    summary = ppo.main(tiny_ppo(output_dir, max_total_reward=15.0), callbacks=[episodes])
    assert max(episodes.returns) == 15 and summary["eval_return_mean"] <= 15
    assert all(truncated for value, truncated in zip(episodes.returns, episodes.truncated) if value == 15)
    assert Agent.load(output_dir).evaluate(episodes=3).returns.max() <= 15
    env = MaxTotalReward(
        __import__("gymnasium").make("Pendulum-v1"), -5.0
    )  # negative rewards: first step ends
    env.reset(seed=0)
    with pytest.warns(UserWarning, match="--max-total-reward -5 ended an episode at its first step"):
        assert env.step(env.action_space.sample())[3] is True


def test_evaluation_env_options_apply_to_evaluations_only(output_dir):
    episodes = Episodes()
    summary = ppo.main(tiny_ppo(output_dir, eval_env_kwargs=("max_episode_steps=7",)), callbacks=[episodes])
    assert summary["eval_return_mean"] <= 7 and max(episodes.lengths) > 7
    rows = (output_dir / "evaluations.csv").read_text().splitlines()[1:]
    assert all(float(row.split(",")[-1]) <= 7 for row in rows)
    assert Agent.load(output_dir).env_kwargs == {}  # the agent keeps the training env's
    config = json.loads((output_dir / "config.json").read_text())["run"]
    assert config["eval_env_kwargs"] == ["max_episode_steps=7"]


def test_another_evaluation_env_id_with_the_same_spaces(output_dir, monkeypatch, capsys):
    made = []
    make_env_of_agent = Agent.make_env

    def recording(self, env_id=None, env_kwargs=None, render_mode=None):
        made.append((env_id, env_kwargs))
        return make_env_of_agent(self, env_id, env_kwargs, render_mode)

    monkeypatch.setattr(Agent, "make_env", recording)
    summary = ppo.main(
        tiny_ppo(output_dir, eval_env_id="CartPole-v0", eval_env_kwargs=("max_episode_steps=9",))
    )
    assert made and all(
        env_id == "CartPole-v0" and kwargs == {"max_episode_steps": 9} for env_id, kwargs in made
    )
    rows = (output_dir / "evaluations.csv").read_text().splitlines()[1:]
    assert summary["eval_return_mean"] <= 9 and all(float(row.split(",")[-1]) <= 9 for row in rows)
    assert Agent.load(output_dir).env_id == "CartPole-v1"  # the agent keeps its training env
    assert summary["eval_env_id"] == "CartPole-v0"
    report(summary)
    assert "ppo on CartPole-v1 (evaluated on CartPole-v0): evaluation return" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"eval_env_id": "Acrobot-v1"}, "the env given has"),
        (
            {"eval_env_kwargs": ("no_such_option=1",)},
            (
                "--eval-env-kwargs no_such_option=1: CartPole-v1 takes no argument 'no_such_option'; it takes: "
                "sutton_barto_reward, render_mode"
            ),
        ),
        ({"env_kwargs": ("nonexistent=3",)}, "--env-kwargs nonexistent=3: CartPole-v1 takes no argument"),
        (
            {"env_id": "LunarLander-v3", "env_kwargs": ("continuous=ture",)},
            r"continuous='ture': LunarLander-v3's continuous is true or false \(default False\)",
        ),
        (
            {"env_id": "LunarLander-v3", "env_kwargs": ("gravity=low",)},
            r"gravity='low': LunarLander-v3's gravity is a number \(default -10.0\)",
        ),
        ({"env_id": "HalfCheetah-v5", "env_kwargs": ("whatever=3",)}, "HalfCheetah-v5 takes no argument"),
        ({"eval_env_kwargs": ("oops",)}, "--eval-env-kwargs takes KEY=VALUE"),
        ({"eval_env_id": "NoSuchEnv-v9"}, "NoSuchEnv"),
        ({"max_total_reward": float("nan")}, "finite"),
        ({"env_wrappers": ("gymnasium.wrappers.TimeAwareObservation",), "env_backend": "torch"}, "gymnasium"),
    ],
)
def test_bad_env_options_are_refused_before_any_work(output_dir, options, message):
    with pytest.raises(InputError, match=message):
        ppo.main(tiny_ppo(output_dir, **options))
    assert not output_dir.exists()


def test_training_envs_drawn_in_a_window_warn_that_they_run_at_its_frame_rate():
    with pytest.warns(UserWarning, match="render_mode=human draws every step of every training env"):
        RunConfig(env_kwargs=("render_mode=human",)).validate()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        RunConfig(eval_env_kwargs=("render_mode=human",)).validate()


def test_render_needs_a_display_and_shows_episodes_where_one_exists(output_dir, monkeypatch):
    ppo.main(tiny_ppo(output_dir, total_frames=256, eval_every=256))
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(InputError, match="no display"):
        evaluate.main(evaluate.EvaluateConfig(output_dir, episodes=1, render=True))
    with pytest.raises(InputError, match="record a video without it"):
        evaluate.main(evaluate.EvaluateConfig(output_dir, episodes=1, render=True, video=True))
    monkeypatch.setenv("DISPLAY", ":99")
    monkeypatch.setenv("SDL_VIDEODRIVER", "dummy")  # pygame opens its window on SDL's dummy display
    import gymnasium as gym

    modes = []
    make = gym.make

    def recording_make(*args, **kwargs):
        modes.append(kwargs.get("render_mode"))
        return make(*args, **kwargs)

    monkeypatch.setattr(gym, "make", recording_make)
    summary = evaluate.main(evaluate.EvaluateConfig(output_dir, episodes=2, render=True))
    assert len(summary["returns"]) == 2 and modes == ["human"]  # one window, episodes one after another


def test_wrapped_envs_in_worker_processes(output_dir):
    config = tiny_ppo(
        output_dir,
        env_wrappers=("gymnasium.wrappers.TimeAwareObservation",),
        collector_backend="multiprocess",
        total_frames=512,
    )
    summary = ppo.main(config)
    assert summary["frames"] == 512 and Agent.load(output_dir).observation_space.shape == (5,)


def test_make_env_applies_wrappers_innermost_first():
    functions = wrapper_functions(
        parse_env_wrappers(
            [
                "gymnasium.wrappers.TimeAwareObservation",
                'envs.wrappers.MaxTotalReward={"max_total_reward": 3}',
            ]
        )
    )
    env = make_env("CartPole-v1", num_envs=2, seed=0, wrappers=functions)
    assert env.observation_spec["observation"].shape == torch.Size([2, 5])
    steps = env.rollout(5, break_when_any_done=False)
    assert steps.get(("next", "truncated"))[:, 2].all()  # the third reward of 1 reaches 3


@pytest.mark.parametrize(
    "options, message",
    [
        (
            {"env_id": "FrozenLake-v1", "env_kwargs": ("map_name=9x9",)},
            r"with --env-kwargs map_name=9x9 failed \(KeyError: '9x9'\)",
        ),
        (
            {"env_wrappers": ('gymnasium.wrappers.ResizeObservation={"shape": [2]}',)},
            r"with --env-wrappers gymnasium.wrappers.ResizeObservation=.* failed \(ValueError: ResizeObservation requires",
        ),
        (
            {"env_id": "rlkit-test/HungryCartPole-v0", "env_kwargs": (f"cells={TOO_MANY_CELLS}",)},
            rf"with --env-kwargs cells={TOO_MANY_CELLS}, 4 envs \(--num-envs\) failed \(MemoryError: Unable to allocate",
        ),
    ],
    ids=["env-kwargs", "env-wrappers", "out-of-memory"],
)
def test_an_env_that_its_options_fail_to_build_is_one_line_naming_them(output_dir, options, message):
    with pytest.raises(InputError, match=message):
        ppo.main(tiny_ppo(output_dir, **options))
    assert not output_dir.exists() or not any(output_dir.iterdir())


def test_a_wrapper_whose_arguments_fail_once_stepping_is_named_in_one_line(output_dir):
    wrapper = 'gymnasium.wrappers.ClipReward={"max_reward": "1"}'  # text where a number belongs
    with pytest.raises(InputError, match=rf"The env wrapper {wrapper} failed in CartPole-v1's step: .*ufunc"):
        ppo.main(tiny_ppo(output_dir, env_wrappers=(wrapper,)))


class FailingStep(gym.Env):
    """An env whose own step raises."""

    observation_space = gym.spaces.Box(-1, 1, (2,))
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        raise RuntimeError("the env's own failure")


def test_an_envs_own_error_under_a_wrapper_stays_the_envs():
    functions = wrapper_functions(parse_env_wrappers(['gymnasium.wrappers.ClipReward={"max_reward": 1}']))
    env = make_env(FailingStep(), wrappers=functions)
    env.reset()
    with pytest.raises(RuntimeError, match="the env's own failure"):
        env.rand_step()


def test_an_agent_whose_env_description_runs_out_of_memory_says_so_in_one_line():
    agent = Agent.build(
        "rlkit-test/HungryCartPole-v0",
        gym.envs.classic_control.CartPoleEnv().observation_space,
        gym.spaces.Discrete(2),
        "test",
        policy_builder="mlp_actor",
        policy_kwargs={"hidden_sizes": [8]},
    )
    assert agent.evaluate(episodes=1).lengths[0] >= 1
    agent.env_kwargs = {"cells": TOO_MANY_CELLS}  # as a forged checkpoint could say
    with pytest.raises(InputError, match=r"ran out of memory \(Unable to allocate .*pass other env_kwargs"):
        agent.evaluate(episodes=1)


def test_async_vectorization_is_refused_for_torch_envs():
    with pytest.raises(InputError, match="--vectorization async runs Gymnasium envs in subprocesses"):
        RunConfig(env_id="CartPole-v1", env_backend="torch", vectorization="async").validate()
    RunConfig(env_id="CartPole-v1", env_backend="torch").validate()
