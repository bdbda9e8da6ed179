"""Every recipe trains on an env registered by the user's own module, named ``module:EnvId`` as Gymnasium takes it
(the env lives in ``tests/guess_env.py``)."""

import json
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from run_helpers import run_module

from agents import Agent
from errors import InputError
from recipes import a2c, dqn, es, ppo, qlearning, reinforce, rnd_ppo, sac, vpg
from training import quiet

TESTS = Path(__file__).parent
ENV_ID = "guess_env:Guess-v0"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def shell(*arguments, paths=(TESTS,)):
    """``python -m ARGUMENTS`` in a new process with ``paths`` (the tests, where the user's env lives) on
    PYTHONPATH."""
    return run_module(*arguments, paths=paths)


@pytest.mark.parametrize(
    "recipe, config_type, options",
    [
        (ppo, ppo.PPOConfig, {}),
        (a2c, a2c.A2CConfig, {}),
        (reinforce, reinforce.ReinforceConfig, {}),
        (vpg, vpg.VPGConfig, {}),
        (sac, sac.SACConfig, {"discrete": True}),
        (es, es.ESConfig, {}),
        (rnd_ppo, rnd_ppo.RNDPPOConfig, {}),
        (qlearning, qlearning.QLearningConfig, {"table.grid_size": 3}),
    ],
    ids=["ppo", "a2c", "reinforce", "vpg", "sac-discrete", "es", "rnd_ppo", "qlearning-grid"],
)
def test_every_recipe_trains_on_a_users_own_env(recipe, config_type, options, tmp_path, on_path):
    config = quiet(config_type(), tmp_path, env_id=ENV_ID, total_frames=640, eval_every=640, eval_episodes=2)
    for path, value in options.items():
        section, _, name = path.rpartition(".")
        setattr(getattr(config, section) if section else config, name, value)
    summary = recipe.main(config)
    assert summary["env_id"] == ENV_ID and summary["frames"] >= 640
    assert Agent.load(tmp_path).env_id == ENV_ID


def test_a_users_own_env_trains_to_its_target_with_a_video_and_evaluates_from_the_shell(tmp_path, on_path):
    config = quiet(dqn.DQNConfig(), tmp_path, env_id=ENV_ID, total_frames=4_096, eval_every=1_024, video=True)
    config.run.preset = "CartPole-v1"  # no preset for this env: CartPole's quick settings fit it
    summary = dqn.main(config)
    assert summary["solved_at_frames"] is not None and summary["eval_return_mean"] >= 9.5
    assert (tmp_path / "video.mp4").stat().st_size > 0
    result = shell("recipes.evaluate", str(tmp_path), "--episodes", "2", "--env-id", ENV_ID)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["return_mean"] >= 9.5


def test_a_module_that_cannot_be_imported_is_one_line(tmp_path):
    with pytest.raises(InputError, match="names the module 'no_such_module', which cannot be imported"):
        ppo.main(quiet(ppo.PPOConfig(), tmp_path, env_id="no_such_module:Guess-v0"))


def test_an_env_that_cannot_render_keeps_the_run_and_warns(tmp_path, on_path, monkeypatch):
    import guess_env

    monkeypatch.delattr(guess_env.Guess, "render")
    config = quiet(ppo.PPOConfig(), tmp_path, env_id=ENV_ID, total_frames=640, eval_every=640, video=True)
    with pytest.warns(UserWarning, match="No video.mp4: guess_env:Guess-v0 could not be rendered"):
        summary = ppo.main(config)
    assert not (tmp_path / "video.mp4").exists()
    assert (tmp_path / "summary.json").exists() and summary["frames"] >= 640


def test_a_checkpoint_never_makes_the_toolkit_import_the_module_its_env_id_names(tmp_path):
    """A downloaded run folder holding ``evil.py`` and an agent whose env id is ``evil:CartPole-v1``."""
    (tmp_path / "evil_module_for_tests.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('code ran')\n"
    )
    agent = Agent.build(
        "evil_module_for_tests:CartPole-v1",
        gym.spaces.Box(-5, 5, (4,)),
        gym.spaces.Discrete(2),
        "ppo",
        policy_kwargs={"hidden_sizes": [8]},
    )
    agent.save(tmp_path / "agent.ckpt")
    result = subprocess.run(
        [sys.executable, "-m", "recipes.evaluate", ".", "--episodes", "1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert (
        result.returncode == 2
        and "is not imported; a checkpoint never makes this toolkit import code" in result.stderr
    )
    assert not (tmp_path / "ran").exists()
    with pytest.raises(InputError, match="is not imported"):
        Agent.load(tmp_path / "agent.ckpt").evaluate(episodes=1)
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("env_id", [":CartPole-v1", ".relative:CartPole-v1", "a..b:CartPole-v1"])
def test_a_malformed_module_name_is_one_line(env_id):
    from envs.vector import env_spec

    with pytest.raises(InputError, match="not an importable module name"):
        env_spec(env_id)


def test_a_resumed_run_imports_the_module_of_its_env_only_when_the_command_line_names_it(tmp_path, on_path):
    """``--resume`` takes the run's options from resume.ckpt: a module its env id names is imported only when the
    command line restates the id (a downloaded run folder could name any module)."""
    module = "resume_module_for_tests"
    (tmp_path / f"{module}.py").write_text(
        f"open({str(tmp_path / 'ran')!r}, 'w').write('code ran')\n"
        "import gymnasium, guess_env\n"
        "gymnasium.register('GuessAgain-v0', entry_point=guess_env.Guess, max_episode_steps=10)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        env_id = f"{module}:GuessAgain-v0"
        config = quiet(ppo.PPOConfig(), tmp_path / "run", env_id=env_id, total_frames=256, eval_every=256)
        config.run.checkpoint_every = 128
        ppo.main(config)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(module, None)
    (tmp_path / "ran").unlink()

    def resume(*options):
        run = str(tmp_path / "run")
        return shell("recipes.ppo", "--resume", run, "--no-progress", *options, paths=(tmp_path, TESTS))

    result = resume()
    assert result.returncode == 2 and f"--env-id {env_id}" in result.stderr, result.stderr
    assert not (tmp_path / "ran").exists()
    result = resume("--env-id", env_id)  # named on the command line: imported, as a new run's would be
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "ran").exists()
    result = resume("--env-id", "guess_env:Guess-v0")  # another env is another run's option
    assert result.returncode == 2 and "drop --env-id" in result.stderr, result.stderr
