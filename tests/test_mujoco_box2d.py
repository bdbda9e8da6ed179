"""Smoke tests on the envs people judge a toolkit by: every recipe that fits runs a few hundred frames on a MuJoCo
env (Hopper-v5) and on Box2D's LunarLander-v3, and videos render headless (MuJoCo through EGL), or are skipped with
one warning where no OpenGL backend can draw them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import Agent
from recipes import a2c, ddpg, dqn, ppo, sac, td3
from training import quiet

ROOT = Path(__file__).parents[1]


def smoke(recipe, config_type, env_id, output_dir, **run):
    config = quiet(
        config_type(), output_dir, env_id=env_id, total_frames=300, eval_every=300, eval_episodes=1, **run
    )
    if hasattr(config.collector, "learning_starts"):
        config.collector.learning_starts = 100
    if hasattr(config.optim, "minibatch_size"):
        config.run.num_envs, config.collector.steps_per_env, config.optim.minibatch_size = 4, 32, 64
    return recipe.main(config)


@pytest.mark.parametrize(
    "recipe, config_type",
    [
        (sac, sac.SACConfig),
        (td3, td3.TD3Config),
        (ddpg, ddpg.DDPGConfig),
        (ppo, ppo.PPOConfig),
        (a2c, a2c.A2CConfig),
    ],
    ids=["sac", "td3", "ddpg", "ppo", "a2c"],
)
def test_recipes_run_on_mujoco(recipe, config_type, tmp_path):
    summary = smoke(recipe, config_type, "Hopper-v5", tmp_path)
    assert summary["frames"] >= 300
    agent = Agent.load(tmp_path)
    assert agent.observation_space.shape == (11,) and agent.action_space.shape == (3,)


@pytest.mark.parametrize(
    "recipe, config_type, env_kwargs",
    [(dqn, dqn.DQNConfig, ()), (ppo, ppo.PPOConfig, ()), (sac, sac.SACConfig, ("continuous=true",))],
    ids=["dqn", "ppo", "sac-continuous"],
)
def test_recipes_run_on_lunar_lander(recipe, config_type, env_kwargs, tmp_path):
    summary = smoke(recipe, config_type, "LunarLander-v3", tmp_path, env_kwargs=env_kwargs)
    assert summary["frames"] >= 300


def test_mujoco_video_renders_headless(tmp_path):
    gl_before = os.environ.get("MUJOCO_GL")  # a user may have set it (MUJOCO_GL=egl): the child runs without
    environment = {key: value for key, value in os.environ.items() if key not in ("DISPLAY", "MUJOCO_GL")}
    smoke_command = [sys.executable, "-m", "recipes.sac", "--env-id", "Hopper-v5", "--total-frames", "300"]
    smoke_command += ["--eval-every", "300", "--eval-episodes", "1", "--logger", "none", "--no-progress"]
    result = subprocess.run(
        [*smoke_command, "--output-dir", str(tmp_path / "run")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=environment,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "run" / "video.mp4").stat().st_size > 0
    assert os.environ.get("MUJOCO_GL") == gl_before  # the child's choice of backend stays the child's


def test_without_an_opengl_backend_runs_keep_everything_but_the_video(tmp_path, monkeypatch):
    from gymnasium.envs.mujoco.mujoco_rendering import MujocoRenderer

    from recipes import evaluate

    def no_opengl(self, *args, **kwargs):
        raise RuntimeError("Cannot initialize a EGL device display.")

    monkeypatch.setattr(MujocoRenderer, "render", no_opengl)
    with pytest.warns(
        UserWarning, match="No video.mp4: Hopper-v5 could not be rendered .*MUJOCO_GL=egl or osmesa"
    ):
        smoke(sac, sac.SACConfig, "Hopper-v5", tmp_path, video=True)
    assert not (tmp_path / "video.mp4").exists() and (tmp_path / "agent.ckpt").exists()
    with pytest.warns(UserWarning, match="No video: the env could not be rendered"):
        summary = evaluate.main(evaluate.EvaluateConfig(path=tmp_path, episodes=1, video=True))
    assert summary["video"] is None and len(summary["returns"]) == 1


def test_a_mujoco_gl_backend_without_its_library_is_unset_with_one_warning(monkeypatch):
    from envs import rendering

    monkeypatch.setenv("MUJOCO_GL", "osmesa")
    monkeypatch.setenv("PYOPENGL_PLATFORM", "osmesa")
    monkeypatch.setattr(rendering.ctypes.util, "find_library", lambda name: None)
    with pytest.warns(
        UserWarning, match="MUJOCO_GL=osmesa was unset: its library libOSMesa is not installed"
    ):
        rendering.drop_unusable_mujoco_gl()
    assert "MUJOCO_GL" not in os.environ and "PYOPENGL_PLATFORM" not in os.environ
    for backend in ("glfw", "disable"):  # not headless library backends: left to MuJoCo
        monkeypatch.setenv("MUJOCO_GL", backend)
        rendering.drop_unusable_mujoco_gl()
        assert os.environ["MUJOCO_GL"] == backend
    monkeypatch.setattr(rendering.ctypes.util, "find_library", lambda name: f"lib{name}.so.1")
    monkeypatch.setenv("MUJOCO_GL", "egl")
    rendering.drop_unusable_mujoco_gl()  # installed: kept
    assert os.environ["MUJOCO_GL"] == "egl"


def test_recipes_import_and_train_whatever_mujoco_gl_names(tmp_path):
    """MuJoCo is imported with TorchRL: an uninstallable backend must not take every recipe down."""
    import ctypes.util

    script = (
        "import sys; sys.argv = ['ppo', '--env-id', 'InvertedPendulum-v5', '--total-frames', '64', '--eval-every', "
        f"'64', '--eval-episodes', '1', '--logger', 'none', '--no-progress', '--output-dir', r'{tmp_path / 'run'}']\n"
        "from recipes import ppo\nfrom training import run_cli\nrun_cli(ppo.main, ppo.PPOConfig, ppo.__doc__, "
        "presets=ppo.PRESETS)"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        env={**os.environ, "MUJOCO_GL": "osmesa", "PYTHONWARNINGS": "default"},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "run" / "agent.ckpt").exists()
    if ctypes.util.find_library("OSMesa") is None:
        assert result.stderr.count("MUJOCO_GL=osmesa was unset") == 1


def test_a_camera_the_model_lacks_skips_the_video_instead_of_ending_the_process(tmp_path):
    import gymnasium as gym

    from envs.rendering import check_mujoco_camera
    from errors import InputError

    for camera_id in (-1, 0):
        check_mujoco_camera(gym.make("Hopper-v5", camera_id=camera_id, render_mode="rgb_array"))
    with pytest.raises(
        InputError, match=r"camera_id=99 names no camera of this MuJoCo model \(it has 1: id 0"
    ):
        check_mujoco_camera(gym.make("Hopper-v5", camera_id=99, render_mode="rgb_array"))
    # MuJoCo's renderer would end this process on that id: the run warns, skips the video, saves the rest
    with pytest.warns(UserWarning, match="No video.mp4: .*camera_id=99 names no camera"):
        summary = smoke(sac, sac.SACConfig, "Hopper-v5", tmp_path, video=True, env_kwargs=("camera_id=99",))
    assert summary["frames"] >= 300 and (tmp_path / "summary.json").exists()
    assert not (tmp_path / "video.mp4").exists()
