"""Helpers shared by the tests of runs that stop and resume, small configurations of each recipe, and running a
module in a new process."""

import math
import os
import subprocess
import sys
from pathlib import Path

from recipes import a2c, dqn, es, ppo, qlearning, reinforce, rnd_ppo, vpg
from training import Run, RunConfig

ROOT = Path(__file__).parents[1]


def run_module(*arguments, paths=(), timeout=300):
    """``python -m ARGUMENTS`` in a new process (nothing this test process imported) from the repository root, with
    ``paths`` put first on PYTHONPATH; the finished process, whatever its exit status."""
    environment = None
    if paths:
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([*map(str, paths), os.environ.get("PYTHONPATH", "")]),
        }
    return subprocess.run(
        [sys.executable, "-m", *arguments],
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=environment,
    )


def interrupt_at(monkeypatch, frames):
    """Make the run behave as if SIGINT arrived during the batch that reaches ``frames`` (then it saves
    ``resume.ckpt`` and stops); a resumed run (``run.resume`` set) is left alone."""
    original = Run.record_batch

    def record_batch(self, batch, metrics):
        if self.frames + batch.numel() >= frames and self.run.resume is None:
            self.signals.interrupted_by = "SIGINT"
        return original(self, batch, metrics)

    monkeypatch.setattr(Run, "record_batch", record_batch)


RUN = {
    "num_envs": 4,
    "eval_episodes": 2,
    "logger": "none",
    "video": False,
    "progress": False,
    "stop_at_return": math.inf,
}


def with_options(config, options):
    """``config`` with each ``"section.field": value`` of ``options`` set (assigned, as a user's would be)."""
    for name, value in options.items():
        *path, field = name.split(".")
        target = config
        for part in path:
            target = getattr(target, part)
        setattr(target, field, value)
    return config


def small_run(output_dir, **run):
    """A run of 2,048 frames evaluated every 512 (options as keyword arguments)."""
    return RunConfig(**{**RUN, "total_frames": 2_048, "eval_every": 512, "output_dir": output_dir, **run})


def tiny_dqn(output_dir, **run):
    return dqn.DQNConfig(
        run=small_run(output_dir, **run),
        collector=dqn.CollectorConfig(steps_per_env=32, updates_per_batch=8, learning_starts=256),
        buffer=dqn.BufferConfig(batch_size=32, buffer_size=1_000),
        loss=dqn.LossConfig(target_update_interval=16),
    )


def tiny_ppo(output_dir, **run):
    return ppo.PPOConfig(
        run=small_run(output_dir, **run),
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=2),
    )


def tiny_off_policy(config_type):
    """SAC, TD3 or DDPG on Pendulum-v1 for 1,024 frames, learning from frame 256."""

    def make(output_dir, **run):
        config = config_type(
            run=small_run(output_dir, **{"env_id": "Pendulum-v1", "total_frames": 1_024, **run})
        )
        config.collector.learning_starts = 256
        config.buffer.batch_size = 32
        return config

    return make


def tiny_a2c(output_dir, **run):
    return a2c.A2CConfig(run=small_run(output_dir, **run))


def tiny_qlearning(output_dir, **run):
    run = {"env_id": "FrozenLake-v1", "total_frames": 4_096, "eval_every": 1_024, **run}
    return qlearning.QLearningConfig(run=small_run(output_dir, **run))


def tiny_rnd_ppo(output_dir, **run):
    return rnd_ppo.RNDPPOConfig(
        run=small_run(output_dir, **{"env_id": "rlkit/DeepSea-v0", **run}),
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=2),
    )


def tiny_es(output_dir, **run):
    config = es.ESConfig(
        run=small_run(output_dir, **{"num_envs": 8, "total_frames": 8_192, "eval_every": 2_048, **run})
    )
    config.network.hidden_sizes = (8,)
    return config


def tiny_reinforce(output_dir, **run):
    return reinforce.ReinforceConfig(
        run=small_run(output_dir, **run), collector=reinforce.CollectorConfig(episodes_per_update=4)
    )


def tiny_vpg(output_dir, **run):
    return vpg.VPGConfig(
        run=small_run(output_dir, **run), collector=vpg.CollectorConfig(episodes_per_update=4)
    )
