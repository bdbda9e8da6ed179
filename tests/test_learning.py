"""Learning tests: each algorithm reaches its reward threshold on a real task with a fixed seed."""

import pytest

from recipes import ppo

pytestmark = pytest.mark.learning


def quiet(config, output_dir):
    config.run.output_dir, config.run.logger, config.run.video, config.run.progress = (
        output_dir,
        "none",
        False,
        False,
    )
    return config


def test_ppo_default_config_solves_cartpole(output_dir):
    summary = ppo.main(quiet(ppo.PPOConfig(), output_dir))
    assert summary["solved_at_frames"] is not None and summary["solved_at_frames"] <= 100_000
    assert summary["eval_return_mean"] >= 475
