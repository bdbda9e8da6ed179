"""The warm-ups before learning: observation statistics from random steps (--normalize-obs-warmup) and gSDE
actions instead of uniform ones during SAC's --learning-starts (--sde-at-warmup)."""

import pytest
import torch
from run_helpers import interrupt_at, tiny_off_policy, tiny_ppo

from agents import Agent
from errors import InputError
from recipes import ppo, sac
from training import Callback


class FirstBatch(Callback):
    def __init__(self):
        self.batch = None

    def on_batch(self, run, batch, metrics):
        if self.batch is None:
            self.batch = batch.clone()


def normalizer_count(output_dir):
    return Agent.load(output_dir).normalizer.count.item()


def test_warmup_fills_the_statistics_from_separate_envs(tmp_path):
    first = {}
    for warmup in (0, 1_000):
        config = tiny_ppo(
            tmp_path / f"warmup-{warmup}", total_frames=512, eval_every=512, normalize_obs_warmup=warmup
        )
        config.network.normalize_obs = True
        first[warmup] = FirstBatch()
        ppo.main(config, callbacks=[first[warmup]])
    assert normalizer_count(tmp_path / "warmup-0") == 512
    assert normalizer_count(tmp_path / "warmup-1000") == 1_000 + 512  # 250 random steps of each of 4 envs
    # the training envs start where they would have: the warm-up stepped copies of them
    assert torch.equal(first[0].batch.get("observation")[:, 0], first[1_000].batch.get("observation")[:, 0])
    statistics = Agent.load(tmp_path / "warmup-1000").normalizer
    assert statistics.var.min() > 0 and not torch.equal(statistics.mean, torch.zeros(4))


def test_warmup_runs_once_and_an_off_policy_recipe_takes_it_too(tmp_path, monkeypatch):
    output_dir = tmp_path / "run"
    config = tiny_off_policy(sac.SACConfig)(output_dir, normalize_obs_warmup=300)
    config.network.normalize_obs = True
    interrupt_at(monkeypatch, 512)
    sac.main(config)
    resumed = tiny_off_policy(sac.SACConfig)(output_dir, normalize_obs_warmup=300, resume=output_dir)
    resumed.network.normalize_obs = True
    sac.main(resumed)
    assert normalizer_count(output_dir) == 300 + 1_024  # not warmed up again on resume


def test_the_warmup_s_random_actions_leave_the_run_s_random_numbers_alone(tmp_path):
    first = {}
    for warmup in (0, 300):
        config = tiny_off_policy(sac.SACConfig)(tmp_path / f"warmup-{warmup}", normalize_obs_warmup=warmup)
        config.network.normalize_obs = True
        first[warmup] = FirstBatch()
        sac.main(config, callbacks=[first[warmup]])
    # before --learning-starts SAC acts uniformly at random: the same actions, warmed up or not
    assert torch.equal(first[0].batch.get("action"), first[300].batch.get("action"))


def test_warmup_without_normalization_is_refused(output_dir):
    with pytest.raises(InputError, match="--normalize-obs-warmup fills the statistics of --normalize-obs"):
        ppo.main(tiny_ppo(output_dir, normalize_obs_warmup=100))
    with pytest.raises(InputError, match="--normalize-obs-warmup must be 0 or positive"):
        ppo.main(tiny_ppo(output_dir, normalize_obs_warmup=-1))


def test_ctrl_c_in_the_warmup_stops_it_after_its_batch_with_nothing_written(output_dir, monkeypatch):
    import os
    import signal

    from agents.networks import ObservationNormalizer
    from errors import Interrupted

    seen = []
    update = ObservationNormalizer.update

    def update_then_ctrl_c(self, observations):
        seen.append(observations.shape[:-1].numel())
        update(self, observations)
        os.kill(os.getpid(), signal.SIGINT)  # the handler records it; the warm-up ends after this batch

    monkeypatch.setattr(ObservationNormalizer, "update", update_then_ctrl_c)
    config = tiny_ppo(output_dir, normalize_obs_warmup=100_000_000)  # days of random steps
    config.network.normalize_obs = True
    handler = signal.getsignal(signal.SIGINT)
    with pytest.raises(
        Interrupted, match=r"stopped by SIGINT in the observation warm-up \(4,000 of 100,000,000"
    ):
        ppo.main(config)
    assert seen == [4_000] and not output_dir.exists()
    assert signal.getsignal(signal.SIGINT) is handler


@pytest.mark.parametrize("at_warmup", [False, True])
def test_sde_at_warmup_acts_with_the_gsde_policy_before_learning_starts(output_dir, at_warmup):
    config = tiny_off_policy(sac.SACConfig)(output_dir, total_frames=256)
    config.network.use_sde, config.network.sde_at_warmup = True, at_warmup
    config.collector.learning_starts = 256
    first = FirstBatch()
    sac.main(config, callbacks=[first])
    # a uniformly random action leaves the policy's outputs at zero; the gSDE policy writes its own
    policy_outputs = first.batch.get("gsde_action").abs().sum() + first.batch.get("loc").abs().sum()
    assert (policy_outputs > 0) == at_warmup


def test_sde_at_warmup_needs_sde(output_dir):
    config = tiny_off_policy(sac.SACConfig)(output_dir)
    config.network.sde_at_warmup = True
    with pytest.raises(
        InputError, match="--sde-at-warmup acts with the gSDE policy during the warm-up: add --use-sde"
    ):
        sac.main(config)
