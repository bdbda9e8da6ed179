"""Learning tests of Evolution Strategies: CartPole-v1 solved and Pendulum-v1 learned with a fixed seed."""

import pytest

from recipes import es
from training import quiet

pytestmark = pytest.mark.learning


def test_es_solves_cartpole(output_dir):
    """The defaults reach 475 (they stop there): at 44k frames (20 generations) for seed 0, 44k-121k frames
    (20-50 generations) over seeds 0-2."""
    config = quiet(es.ESConfig(), output_dir)
    config.run.total_frames = 300_000
    summary = es.main(config)
    assert summary["solved_at_frames"] is not None
    assert summary["eval_return_mean"] >= 475


def test_es_learns_pendulum(output_dir):
    """The defaults on Pendulum-v1, stopped at the first evaluation >= -300 (seed 0: 1.1M frames; a random
    policy scores about -1200)."""
    config = quiet(es.ESConfig(), output_dir)
    config.run.env_id, config.run.total_frames, config.run.eval_every = "Pendulum-v1", 1_500_000, 100_000
    config.run.stop_at_return = -300.0
    summary = es.main(config)
    assert summary["eval_return_mean"] > -400
