"""Learning tests for REINFORCE, VPG and A2C: each reaches its reward threshold with a fixed seed."""

import pytest

from recipes import a2c, reinforce, vpg
from training import quiet

pytestmark = pytest.mark.learning


def assert_solved(summary, budget):
    assert summary["solved_at_frames"] is not None and summary["solved_at_frames"] <= budget
    assert summary["eval_return_mean"] >= 475


def test_reinforce_default_config_solves_cartpole(output_dir):
    summary = reinforce.main(quiet(reinforce.ReinforceConfig(), output_dir))
    assert_solved(summary, 100_000)


@pytest.mark.parametrize("baseline", ["value", "running-mean"])
def test_vpg_solves_cartpole(baseline, output_dir):
    config = quiet(vpg.VPGConfig(), output_dir)
    config.loss.baseline = baseline
    summary = vpg.main(config)
    assert_solved(summary, 100_000)


def test_a2c_default_config_solves_cartpole(output_dir):
    summary = a2c.main(quiet(a2c.A2CConfig(), output_dir))
    assert_solved(summary, 200_000)


def test_a2c_pendulum_settings_from_readme_learn(output_dir):
    config = quiet(a2c.A2CConfig(), output_dir)
    config.run.env_id, config.run.num_envs = "Pendulum-v1", 128
    config.run.total_frames, config.run.eval_every, config.run.stop_at_return = 400_000, 50_000, -200.0
    config.collector.steps_per_env = 4
    config.loss.gamma, config.loss.gae_lambda, config.loss.reward_scale = 0.9, 0.95, 0.1
    config.loss.entropy_coef = 0.01
    config.optim.lr = 3e-3
    config.network.normalize_obs = True
    summary = a2c.main(config)
    assert summary["eval_return_mean"] >= -250  # a random policy scores about -1200
