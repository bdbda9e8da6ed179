"""Exact resume: a run stopped half-way (as by SIGINT) and continued with --resume ends with the same parameters as
one that ran straight through; what resume refuses, and how."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agents import Agent
from envs import InputError
from recipes import a2c, ddpg, dqn, ppo, sac, td3
from recipes.common import Run, RunConfig
from recipes.resume import RESUME_FILE, config_from_dict, explicit_options

RUN = {
    "num_envs": 4,
    "eval_episodes": 2,
    "logger": "none",
    "video": False,
    "progress": False,
    "stop_at_return": math.inf,
}


def tiny_dqn(output_dir, **run):
    return dqn.DQNConfig(
        run=RunConfig(**{**RUN, "total_frames": 2_048, "eval_every": 512, "output_dir": output_dir, **run}),
        collector=dqn.CollectorConfig(steps_per_env=32, updates_per_batch=8, learning_starts=256),
        buffer=dqn.BufferConfig(batch_size=32, buffer_size=1_000),
        loss=dqn.LossConfig(target_update_interval=16),
    )


def tiny_ppo(output_dir, **run):
    return ppo.PPOConfig(
        run=RunConfig(**{**RUN, "total_frames": 2_048, "eval_every": 512, "output_dir": output_dir, **run}),
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=2),
    )


def tiny_sac(output_dir, **run):
    config = sac.SACConfig(
        run=RunConfig(
            **{
                **RUN,
                "env_id": "Pendulum-v1",
                "total_frames": 1_024,
                "eval_every": 512,
                "output_dir": output_dir,
                **run,
            }
        )
    )
    config.collector.learning_starts = 256
    config.buffer.batch_size = 32
    return config


def tiny_off_policy(module, config_type):
    def make(output_dir, **run):
        config = config_type(
            run=RunConfig(
                **{
                    **RUN,
                    "env_id": "Pendulum-v1",
                    "total_frames": 1_024,
                    "eval_every": 512,
                    "output_dir": output_dir,
                    **run,
                }
            )
        )
        config.collector.learning_starts = 256
        config.buffer.batch_size = 32
        return config

    return make


def tiny_a2c(output_dir, **run):
    return a2c.A2CConfig(
        run=RunConfig(**{**RUN, "total_frames": 2_048, "eval_every": 512, "output_dir": output_dir, **run})
    )


def interrupt_at(monkeypatch, frames):
    """Make the run behave as if SIGINT arrived during the batch that reaches ``frames``."""
    original = Run.record_batch

    def record_batch(self, batch, metrics):
        if self.frames + batch.numel() >= frames and self.run.resume is None:
            self.interrupted_by = "SIGINT"
        return original(self, batch, metrics)

    monkeypatch.setattr(Run, "record_batch", record_batch)


def parameters(output_dir):
    return Agent.load(output_dir / "agent.ckpt").policy.state_dict()


CASES = {
    "dqn": (dqn.main, tiny_dqn, {}),
    "dqn-rainbow": (dqn.main, tiny_dqn, {"variant": "rainbow"}),
    "ppo": (ppo.main, tiny_ppo, {}),
    "sac": (sac.main, tiny_sac, {}),
    "td3": (td3.main, tiny_off_policy(td3, td3.TD3Config), {}),
    "ddpg-ou": (ddpg.main, tiny_off_policy(ddpg, ddpg.DDPGConfig), {"network.noise": "ou"}),
    "a2c": (a2c.main, tiny_a2c, {}),
    "ppo-sde": (ppo.main, tiny_ppo, {"network.use_sde": True, "run.env_id": "Pendulum-v1"}),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("backend", ["gymnasium", "torch"])
def test_interrupted_and_resumed_run_ends_with_the_parameters_of_an_uninterrupted_one(
    case, backend, tmp_path, monkeypatch
):
    main, make_config, options = CASES[case]

    def config(output_dir, **run):
        config = make_config(output_dir, env_backend=backend, **run)
        for name, value in options.items():
            *path, field = name.split(".")
            target = config
            for part in path:
                target = getattr(target, part)
            setattr(target, field, value)
        return config

    straight = main(config(tmp_path / "straight"))

    with monkeypatch.context() as patch:
        interrupt_at(patch, config(None).run.total_frames // 2)
        stopped = main(config(tmp_path / "stopped"))
    assert stopped["interrupted_by"] == "SIGINT"
    assert stopped["frames"] < straight["frames"]
    assert (tmp_path / "stopped" / RESUME_FILE).exists()

    resumed = main(config(tmp_path / "stopped", resume=tmp_path / "stopped"))
    assert resumed["frames"] == straight["frames"]
    assert resumed["resumed_from"] == str(tmp_path / "stopped")
    expected, actual = parameters(tmp_path / "straight"), parameters(tmp_path / "stopped")
    assert expected.keys() == actual.keys()
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key
    assert resumed["eval_return_mean"] == straight["eval_return_mean"]


def test_resume_refuses_other_options_another_recipe_and_agent_checkpoints(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    changed = tiny_dqn(tmp_path / "run", resume=tmp_path / "run")
    changed.optim.lr = 1e-2
    with pytest.raises(InputError, match=r"other options: --lr \(saved 0.0023, now 0.01\)"):
        dqn.main(changed)
    with pytest.raises(InputError, match="other options: --env-id"):
        dqn.main(tiny_dqn(tmp_path / "run", resume=tmp_path / "run", env_id="Acrobot-v1"))
    with pytest.raises(InputError, match=r"written by recipes.dqn; resume it with python -m recipes.dqn"):
        ppo.main(tiny_ppo(tmp_path / "run", resume=tmp_path / "run"))
    with pytest.raises(InputError, match="not a resume checkpoint"):
        dqn.main(tiny_dqn(None, resume=tmp_path / "run" / "agent.ckpt"))
    with pytest.raises(InputError, match="No resume checkpoint at"):
        dqn.main(tiny_dqn(None, resume=tmp_path / "missing"))
    (tmp_path / "broken.ckpt").write_bytes((tmp_path / "run" / RESUME_FILE).read_bytes()[:5_000])
    with pytest.raises(InputError, match="broken.ckpt is not a"):
        dqn.main(tiny_dqn(None, resume=tmp_path / "broken.ckpt"))


def test_resume_is_refused_by_recipes_without_training_state_and_with_worker_collectors(tmp_path):
    from recipes import es

    config = es.ESConfig(run=RunConfig(**{**RUN, "output_dir": tmp_path, "resume": tmp_path}))
    with pytest.raises(InputError, match="recipes.es cannot resume a run"):
        es.main(config)
    config = tiny_dqn(tmp_path, resume=tmp_path, collector_backend="multiprocess")
    with pytest.raises(InputError, match="--collector-backend single only"):
        dqn.main(config)


def test_config_round_trips_through_its_json_form():
    from recipes.common import config_to_dict

    config = tiny_dqn(Path("out"))
    config.network.hidden_sizes = (32, 16)
    rebuilt = config_from_dict(dqn.DQNConfig, config_to_dict(config))
    assert rebuilt == config


def test_explicit_options_reads_flag_names():
    assert explicit_options(["--lr", "0.1", "--no-progress", "--resume=runs/x", "value"]) == {
        "lr",
        "progress",
        "resume",
    }


def test_cli_resume_continues_with_the_saved_options_and_refuses_new_ones(tmp_path):
    common = ["--logger", "none", "--no-video", "--no-progress", "--output-dir", str(tmp_path / "run")]
    first = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.dqn",
            "--total-frames",
            "1024",
            "--checkpoint-every",
            "512",
            "--eval-every",
            "512",
            "--eval-episodes",
            "2",
            "--learning-starts",
            "256",
            *common,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert first.returncode == 0, first.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "recipes.dqn", "--resume", str(tmp_path / "run"), "--lr", "0.1"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2
    assert "error: --resume continues the run with its saved options; drop --lr" in refused.stderr
    resumed = subprocess.run(
        [sys.executable, "-m", "recipes.dqn", "--resume", str(tmp_path / "run"), "--no-progress"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "after 1024 frames" in resumed.stdout
