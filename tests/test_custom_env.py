"""Every recipe trains on an env registered by the user's own module, named ``module:EnvId`` as Gymnasium takes it
(the env lives in ``tests/guess_env.py``)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents import Agent
from errors import InputError
from recipes import a2c, dqn, es, ppo, qlearning, reinforce, rnd_ppo, sac, vpg
from training import quiet

TESTS = Path(__file__).parent
ENV_ID = "guess_env:Guess-v0"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


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
    summary = dqn.main(config)
    assert summary["solved_at_frames"] is not None and summary["eval_return_mean"] >= 9.5
    assert (tmp_path / "video.mp4").stat().st_size > 0
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-m", "recipes.evaluate", str(tmp_path), "--episodes", "2"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=TESTS.parent,
        env=environment,
    )
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
