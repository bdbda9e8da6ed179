"""Every recipe trains, checkpoints, resumes and evaluates with ``--device cuda`` (skipped without a GPU).

Each run is a subprocess of a few hundred frames with gradient steps in it, so a GPU machine checks the whole
path from the command line: networks, losses, replay buffers and normalisers on the device, envs on the CPU (or on
the device with ``--env-backend torch``), checkpoints that load back on the GPU and on the CPU.
"""

import json

import pytest
import run_helpers
import torch
from run_helpers import interrupt_at, with_options
from test_resume import CASES, parameters
from torchrl.data.replay_buffers.samplers import prioritized

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

COMMON = (
    "--device cuda --total-frames 1024 --eval-every 512 --eval-episodes 2 --logger none --no-video "
    "--no-progress --stop-at-return inf"
)
ATARI = "--env-id ALE/Pong-v5 --total-frames 512 --eval-every 512 --eval-episodes 1"
OFF_POLICY = "--env-id Pendulum-v1 --learning-starts 256 --batch-size 64"

RUNS = {
    "ppo": ("ppo", ""),
    "ppo-continuous-normalized": ("ppo", "--env-id Pendulum-v1 --normalize-obs"),
    "ppo-env-options": (
        "ppo",
        (
            "--env-wrappers gymnasium.wrappers.TimeAwareObservation --max-total-reward 50 "
            "--eval-env-kwargs sutton_barto_reward=true --video-every-eval"
        ),
    ),
    "ppo-torch-env": ("ppo", "--env-backend torch --num-envs 64 --total-frames 4096"),
    "ppo-compiled": ("ppo", "--compile"),
    "ppo-lstm": (
        "ppo",
        "--env-id rlkit/CartPoleNoVelocity-v1 --recurrent lstm --num-envs 4 --steps-per-env 32 --minibatch-size 64",
    ),
    "a2c": ("a2c", ""),
    "a2c-gru": ("a2c", "--env-id rlkit/CartPoleNoVelocity-v1 --recurrent gru"),
    "rnd-ppo": ("rnd_ppo", "--env-id rlkit/DeepSea-v0"),
    "reinforce": ("reinforce", ""),
    "vpg": ("vpg", ""),
    "dqn": ("dqn", "--learning-starts 256 --batch-size 64"),
    "dqn-rainbow-parts": ("dqn", "--learning-starts 256 --n-steps 3 --dueling --noisy"),
    "dqn-c51": (
        "dqn",
        "--learning-starts 256 --batch-size 64 --distributional --dueling --noisy --noisy-type independent",
    ),
    "sac": ("sac", OFF_POLICY),
    "sac-sde": ("sac", f"{OFF_POLICY} --use-sde"),
    "sac-sde-warmup": (
        "sac",
        f"{OFF_POLICY} --use-sde --sde-at-warmup --normalize-obs --normalize-obs-warmup 500",
    ),
    "sac-tf32": ("sac", f"{OFF_POLICY} --matmul-precision high"),
    "sac-discrete": ("sac", "--env-id CartPole-v1 --learning-starts 256 --batch-size 64"),
    "td3": ("td3", OFF_POLICY),
    "ddpg": ("ddpg", OFF_POLICY),
    "es": ("es", "--num-envs 8 --total-frames 8192 --eval-every 4096"),
    "ppo-atari": ("ppo", ATARI),
    "ppo-atari-async": ("ppo", f"{ATARI} --vectorization async"),
    "dqn-atari": ("dqn", f"{ATARI} --learning-starts 256 --buffer-size 1000"),
}


def run_module(*args):
    result = run_helpers.run_module(*args, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.parametrize("name", sorted(RUNS))
def test_recipe_trains_on_cuda(name, tmp_path):
    recipe, args = RUNS[name]
    output_dir = tmp_path / "run"
    run_module(f"recipes.{recipe}", *f"{COMMON} {args}".split(), "--output-dir", str(output_dir))
    summary = json.loads((output_dir / "summary.json").read_text())
    config = json.loads((output_dir / "config.json").read_text())
    assert summary["frames"] >= 512 and config["run"]["device"] == "cuda"
    for device in ("cuda", "cpu"):
        result = run_module("recipes.evaluate", str(output_dir), "--device", device, "--episodes", "1")
        assert json.loads(result.stdout)["episodes"] == 1


@pytest.mark.parametrize(
    "case",
    [
        "ppo",
        pytest.param(
            "dqn-rainbow",
            marks=pytest.mark.skipif(
                prioritized.SumSegmentTreeFp32 is None, reason="TorchRL's compiled extension did not load"
            ),
        ),
        "sac-normalized",
        "td3",
        "rnd_ppo",
    ],
)
def test_interrupted_and_resumed_cuda_run_ends_where_an_uninterrupted_one_does(case, tmp_path, monkeypatch):
    """resume.ckpt of a GPU run (the CUDA generator's state with it) continues it to the parameters of a run that
    was not interrupted (to float tolerance: CUDA kernels may add up in another order between runs)."""
    main, make_config, options = CASES[case]

    def config(output_dir, **run):
        return with_options(make_config(output_dir, device="cuda", **run), options)

    straight = main(config(tmp_path / "straight"))
    with monkeypatch.context() as patch:
        interrupt_at(patch, config(None).run.total_frames // 2)
        stopped = main(config(tmp_path / "stopped"))
    assert stopped["interrupted_by"] == "SIGINT" and stopped["frames"] < straight["frames"]
    resumed = main(config(tmp_path / "stopped", resume=tmp_path / "stopped"))
    assert resumed["frames"] == straight["frames"]
    expected, actual = parameters(tmp_path / "straight"), parameters(tmp_path / "stopped")
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-4, atol=1e-5, msg=key)
