import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from run_helpers import run_module

from agents import Agent
from errors import InputError
from recipes import evaluate, ppo
from training import RunConfig, evaluation_seed

SUMMARY_KEYS = {
    "algorithm",
    "env_id",
    "seed",
    "frames",
    "wall_time_s",
    "eval_return_mean",
    "eval_return_std",
    "eval_episodes",
    "solved_at_frames",
    "solved_at_s",
}


def tiny_ppo(output_dir, env_id="CartPole-v1", logger="csv", video=True, **run_overrides):
    options = {
        "env_id": env_id,
        "num_envs": 4,
        "total_frames": 512,
        "eval_every": 256,
        "eval_episodes": 2,
        "output_dir": output_dir,
        "logger": logger,
        "video": video,
        "progress": False,
    }
    run = RunConfig(**{**options, **run_overrides})
    return ppo.PPOConfig(
        run=run,
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=2),
    )


def test_ppo_smoke_writes_every_output(output_dir):
    summary = ppo.main(tiny_ppo(output_dir))
    assert SUMMARY_KEYS <= set(summary)
    assert summary["frames"] == 512 and summary["algorithm"] == "ppo" and summary["env_id"] == "CartPole-v1"
    assert json.loads((output_dir / "summary.json").read_text()) == summary
    for name in (
        "evaluations.csv",
        "learning_curve.png",
        "agent.ckpt",
        "best_agent.ckpt",
        "video.mp4",
        "config.json",
    ):
        assert (output_dir / name).stat().st_size > 0, name
    rows = list(csv.DictReader((output_dir / "evaluations.csv").open()))
    assert [int(row["frames"]) for row in rows] == [256, 512]
    assert float(rows[-1]["return_mean"]) == pytest.approx(summary["eval_return_mean"])
    assert (output_dir / "csv" / "scalars" / "train").exists() or list((output_dir / "csv").rglob("*.csv"))
    agent = Agent.load(output_dir)
    assert agent.algorithm == "ppo" and agent.config["run"]["total_frames"] == 512


def test_ppo_smoke_continuous_actions_with_normalization(output_dir):
    config = tiny_ppo(output_dir, env_id="Pendulum-v1", logger="none", video=False)
    config.network.normalize_obs, config.network.ortho_init = True, True
    summary = ppo.main(config)
    assert summary["solved_at_frames"] is None  # Pendulum-v1 registers no reward threshold
    agent = Agent.load(output_dir / "agent.ckpt")
    assert agent.normalizer.count.item() == 512  # every collected observation, folded in after its update
    assert summary["eval_return_mean"] == pytest.approx(
        agent.evaluate(episodes=2, seed=evaluation_seed(summary["seed"])).mean, rel=1e-6
    )


def test_early_stop_at_target_return(output_dir):
    summary = ppo.main(tiny_ppo(output_dir, logger="none", video=False, stop_at_return=5.0))
    assert summary["solved_at_frames"] == 256 and summary["frames"] == 256
    assert summary["eval_return_mean"] >= 5.0


def wandb_history(path):
    """Rows of the history records in a W&B transaction log (LevelDB log format, protobuf records)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, block_size, pending, rows = 7, 32768, b"", []
    while position + 7 <= len(data):
        if block_size - position % block_size < 7:  # block trailer padding
            position += block_size - position % block_size
            continue
        length, kind = int.from_bytes(data[position + 4 : position + 6], "little"), data[position + 6]
        if position + 7 + length > len(data):  # a record still being written
            break
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.history.item
                    }
                )
    return rows


def test_wandb_offline_run_holds_metrics(output_dir):
    summary = ppo.main(tiny_ppo(output_dir, logger="wandb", video=False))
    runs = list((output_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and summary["wandb_offline_run"] == str(runs[0])
    expected = [float(row["return_mean"]) for row in csv.DictReader((output_dir / "evaluations.csv").open())]
    deadline = time.monotonic() + 30  # W&B's service process may still be writing its log
    while True:
        history = wandb_history(next(runs[0].glob("run-*.wandb")))
        evaluations = [row["eval/return_mean"] for row in history if "eval/return_mean" in row]
        if len(evaluations) >= len(expected) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert evaluations == pytest.approx(expected)
    assert evaluations[-1] == pytest.approx(summary["eval_return_mean"])
    assert any("train/loss_objective" in row for row in history)


def test_wandb_run_does_not_mistake_our_agents_package_for_an_llm_library(tmp_path):
    env = {
        key: value for key, value in os.environ.items() if key not in ("WANDB_SILENT", "WANDB_DISABLE_WEAVE")
    }
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.ppo",
            "--total-frames",
            "256",
            "--num-envs",
            "4",
            "--eval-every",
            "256",
        ]
        + [
            "--eval-episodes",
            "1",
            "--minibatch-size",
            "64",
            "--logger",
            "wandb",
            "--no-video",
            "--no-progress",
        ]
        + ["--output-dir", str(tmp_path / "run")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[1],
        env={**env, "WANDB_MODE": "offline"},
    )
    assert result.returncode == 0, result.stderr
    assert "W&B offline run:" in result.stdout
    assert "Detected [" not in result.stdout + result.stderr and "Weave" not in result.stdout + result.stderr


def test_invalid_configs_raise_input_errors(output_dir):
    with pytest.raises(InputError, match="Unknown Gymnasium env id"):
        ppo.main(tiny_ppo(output_dir, env_id="NoSuchEnv-v0"))
    with pytest.raises(InputError, match="--total-frames must be a positive integer"):
        ppo.main(tiny_ppo(output_dir, total_frames=-5))
    config = tiny_ppo(output_dir)
    config.optim.minibatch_size = 10_000
    with pytest.raises(InputError, match="--minibatch-size"):
        ppo.main(config)


def test_cli_help_documents_the_common_options():
    result = run_module("recipes.ppo", "--help")
    assert result.returncode == 0
    for flag in (
        "--env-id",
        "--seed",
        "--total-frames",
        "--num-envs",
        "--device",
        "--output-dir",
        "--logger",
        "--eval-every",
        "--eval-episodes",
        "--stop-at-return",
        "--video",
        "--no-video",
        "--lr",
        "--clip-epsilon",
        "--normalize-obs",
    ):
        assert flag in result.stdout, flag


def test_a_run_prints_no_torchrl_info_lines(tmp_path):
    """TorchRL logs "Initialized LazyTensorStorage ..." at INFO on stdout when a replay buffer first fills."""
    result = run_module(
        "recipes.td3", "--env-id", "Pendulum-v1", "--total-frames", "400", "--learning-starts", "200",
        "--output-dir", str(tmp_path / "run"), "--no-progress", "--no-video",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "[torchrl][INFO]" not in result.stdout + result.stderr
    assert result.stdout.strip().splitlines()[-1].startswith("results in ")


def test_the_last_lines_count_the_evaluation_episodes_in_words(tmp_path, capsys):
    from training.cli import report

    summary = {"algorithm": "sac", "env_id": "Hopper-v5", "eval_return_mean": 26.0, "eval_return_std": 0.0,
               "frames": 600, "wall_time_s": 2.5, "solved_at_frames": None, "output_dir": str(tmp_path),
               "interrupted_by": None}  # fmt: skip
    for episodes, words in ((1, "over 1 episode after"), (10, "over 10 episodes after")):
        report(summary | {"eval_episodes": episodes})
        first, second = capsys.readouterr().out.splitlines()
        assert first == f"sac on Hopper-v5: evaluation return 26.0 ± 0.0 {words} 600 frames in 2.5 s"
        assert second == f"results in {tmp_path}/ (summary.json, learning_curve.png, agent.ckpt)"


COMMAND_MODULES = sorted(
    path.stem for path in (Path(__file__).parents[1] / "recipes").glob("*.py") if path.stem != "__init__"
)


@pytest.mark.parametrize("name", COMMAND_MODULES)
def test_help_shows_each_example_command_on_its_own_line(name):
    """tyro joins unindented docstring lines into one paragraph: example commands must be indented."""
    import importlib

    doc = importlib.import_module(f"recipes.{name}").__doc__
    examples = [line for line in doc.splitlines() if line.strip().startswith("python -m ")]
    assert examples, f"recipes.{name} shows no example command"
    for line in examples:
        assert line.startswith("    "), (
            f"recipes.{name}: {line!r} would be joined with its neighbours in --help"
        )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--env-id", "NoSuchEnv-v0"], "Unknown Gymnasium env id 'NoSuchEnv-v0'"),
        (["--total-frames", "-5"], "--total-frames must be a positive integer"),
        (["--lr", "-1"], "--lr must be in (0, inf)"),
        (["--lr", "inf"], "--lr must be in (0, inf), got inf"),
        (
            ["--hidden-sizes", "64", "0"],
            "--hidden-sizes must be positive integers up to 1,048,576 (units per hidden layer), got [64, 0]",
        ),
        (["--hidden-sizes", "64", "1e12"], "--hidden-sizes must be positive integers up to 1,048,576"),
        (["--hidden-sizes", "1048576", "1048576"], "of memory allows: use narrower layers"),
        (["--gamma", "1.5"], "--gamma must be in (0, 1]"),
        (["--clip-epsilon", "1.5"], "--clip-epsilon must be in (0, 1], got 1.5"),  # 1 - eps < 0: NaN bounds
        (["--entropy-coef", "inf"], "--entropy-coef must be in [0, inf), got inf"),
        (
            ["--device", "cuda:3"],
            "no CUDA device is available" if not torch.cuda.is_available() else "does not exist",
        ),
        (["--device", "banana"], "is not a torch device"),
        (["--device", "cpu:0"], "Device 'cpu:0': the CPU takes no index here; use 'cpu'."),
        (
            ["--device", "mps"],
            "Device 'mps' was asked for but this torch build or machine has none; use 'cpu'.",
        ),
        (["--log-std-init", "-1"], "--log-std-init sets the first scale of a Box action policy"),
    ],
)
def test_cli_bad_input_is_one_line(args, message, tmp_path):
    result = run_module("recipes.ppo", "--output-dir", str(tmp_path), *args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0]


def test_evaluate_command(output_dir):
    ppo.main(tiny_ppo(output_dir, logger="none", video=False))
    summary = evaluate.main(evaluate.EvaluateConfig(path=output_dir, episodes=3, video=True))
    assert len(summary["returns"]) == 3 and len(summary["lengths"]) == 3
    assert (
        Path(summary["video"]) == output_dir / "agent-evaluation.mp4"
        and Path(summary["video"]).stat().st_size > 0
    )
    assert not (output_dir / "video.mp4").exists()  # the run's own video's name is left to the run
    result = run_module("recipes.evaluate", str(output_dir), "--episodes", "2")
    assert result.returncode == 0 and json.loads(result.stdout)["episodes"] == 2
    result = run_module("recipes.evaluate", str(output_dir / "nothing.ckpt"))
    assert result.returncode == 2 and result.stderr.startswith("error: No agent checkpoint")
    result = run_module("recipes.evaluate", str(output_dir), "--env-id", "NoSuchEnv-v0")
    assert result.returncode == 2 and result.stderr.strip().splitlines() == [
        line
        for line in result.stderr.strip().splitlines()
        if line.startswith("error: Unknown Gymnasium env id")
    ]


def test_every_network_builder_refuses_hidden_sizes_that_are_not_positive_integers():
    from agents import make_q_actor
    from agents.continuous import make_qvalue_critic
    from agents.gsde import make_gsde_actor
    from agents.networks import make_actor
    from envs import make_env

    discrete, box = make_env("CartPole-v1"), make_env("Pendulum-v1")
    builders = [
        lambda sizes: make_actor(discrete.observation_spec["observation"], discrete.action_spec, sizes),
        lambda sizes: make_q_actor(discrete.observation_spec["observation"], discrete.action_spec, sizes),
        lambda sizes: make_q_actor(
            discrete.observation_spec["observation"], discrete.action_spec, sizes, dueling=True
        ),
        lambda sizes: make_qvalue_critic(box.observation_spec["observation"], box.action_spec, sizes),
        lambda sizes: make_gsde_actor(box.observation_spec["observation"], box.action_spec, sizes),
    ]
    for build in builders:
        build([8, 8])
        for sizes in ([0], [8, -3], [8.5], [True]):
            with pytest.raises(InputError, match="--hidden-sizes must be positive integers"):
                build(sizes)


def test_networks_too_large_for_memory_are_refused_before_any_allocation():
    from torchrl.data import Bounded, Unbounded

    from agents.gsde import make_gsde_actor
    from agents.networks import make_mlp
    from agents.qvalue import make_q_network

    wide = (2**20, 2**20)  # 1.1 trillion weights: 4 TiB of float32
    observations = Unbounded(shape=(1, 4))
    actions = Bounded(-1.0, 1.0, shape=(1, 2))
    for build in (
        lambda: make_mlp(4, 2, wide, "relu"),
        lambda: make_q_network(observations, 2, wide, dueling=True),
        lambda: make_q_network(observations, 2, wide, noisy=True),
        lambda: make_gsde_actor(observations, actions, wide),
    ):
        with pytest.raises(
            InputError, match=r"--hidden-sizes 1048576 1048576 on 4 input features gives a network"
        ):
            build()
