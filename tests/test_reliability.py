"""Reliability: SIGINT/SIGTERM save and exit cleanly, NaN or Inf stops a run keeping the last good checkpoint,
periodic checkpoints, and a W&B logger that fails to start never stops training."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from agents import Agent
from envs.classic import CartPoleEnv
from errors import InputError, NonFiniteError
from recipes import ppo
from training import RunConfig


def tiny_ppo(output_dir, **run_overrides):
    options = {
        "num_envs": 4,
        "total_frames": 2_048,
        "eval_every": 512,
        "eval_episodes": 2,
        "output_dir": output_dir,
        "logger": "none",
        "video": False,
        "progress": False,
        "stop_at_return": math.inf,
    }
    return ppo.PPOConfig(
        run=RunConfig(**{**options, **run_overrides}),
        collector=ppo.CollectorConfig(steps_per_env=32),
        optim=ppo.OptimConfig(minibatch_size=64, num_epochs=2),
    )


def start_long_ppo(output_dir, *options, new_session=False):
    """A PPO run with a budget it never reaches, started in a subprocess; returns once it has evaluated."""
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "recipes.ppo",
            "--total-frames",
            "100000000",
            "--eval-every",
            "2048",
            "--stop-at-return",
            "inf",
            "--logger",
            "none",
            "--no-progress",
            "--output-dir",
            str(output_dir),
            *options,
        ],
        cwd=Path(__file__).parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=new_session,
    )
    deadline = time.monotonic() + 300  # 16 env processes start slowly on a loaded 2-core machine
    while not (output_dir / "evaluations.csv").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (output_dir / "evaluations.csv").exists(), "the run did not start within 300 s"
    return process


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_saves_a_checkpoint_and_exits_cleanly(number, tmp_path):
    output_dir = tmp_path / "run"
    process = start_long_ppo(output_dir)
    assert process.poll() is None, process.communicate()
    process.send_signal(number)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 128 + number, stderr
    assert f"stopped by {signal.Signals(number).name}" in stdout
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["interrupted_by"] == signal.Signals(number).name
    assert 0 < summary["frames"] < 100_000_000
    assert Agent.load(output_dir / "agent.ckpt").algorithm == "ppo"
    assert not (output_dir / "video.mp4").exists()  # skipped when interrupted


@pytest.mark.parametrize(
    "options",
    [("--collector-backend", "multiprocess"), ("--vectorization", "async")],
    ids=["worker-collectors", "async-envs"],
)
def test_ctrl_c_in_a_terminal_with_worker_processes_saves_and_exits_cleanly(options, tmp_path):
    """Ctrl-C reaches the whole process group: the workers (collectors, or the envs' subprocesses) ignore it and
    the training loop saves and stops."""
    output_dir = tmp_path / "run"
    process = start_long_ppo(output_dir, *options, new_session=True)
    try:
        os.killpg(process.pid, signal.SIGINT)
        stdout, stderr = process.communicate(timeout=180)
        assert "stopped by SIGINT" in stdout
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert process.returncode == 130, stderr
    assert json.loads((output_dir / "summary.json").read_text())["interrupted_by"] == "SIGINT"
    assert Agent.load(output_dir / "agent.ckpt").algorithm == "ppo"


def _report_sigint_blocked(queue):
    queue.put(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))


@pytest.mark.parametrize("start_method", ["spawn", "fork"])
def test_processes_started_for_envs_never_see_ctrl_c_and_this_process_never_loses_it(start_method):
    """A Ctrl-C pressed while env or collector processes start (seconds, for many async envs) reaches this process,
    not the new ones; ignoring SIGINT for that time would drop it and the run would go on."""
    import multiprocessing

    from envs.vector import sigint_ignored_by_children

    received = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: received.append(number))
    try:
        context = multiprocessing.get_context(start_method)
        queue = context.Queue()
        with sigint_ignored_by_children():
            child = context.Process(target=_report_sigint_blocked, args=(queue,))
            child.start()
            os.kill(os.getpid(), signal.SIGINT)  # pressed while it starts
        blocked_in_child = queue.get(timeout=60)
        child.join(timeout=60)
        deadline = time.monotonic() + 10
        while not received and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert blocked_in_child and received == [signal.SIGINT]
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])


def test_ctrl_c_outside_the_training_loop_is_one_line_and_status_130(monkeypatch, capsys):
    from training import run_cli

    def main(config):
        raise KeyboardInterrupt  # as while async envs start

    monkeypatch.setattr(sys, "argv", ["recipes.ppo", "--preset", "none"])
    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, ppo.PPOConfig, ppo.__doc__)
    assert exit_info.value.code == 130
    expected = (
        "error: stopped by SIGINT outside the training loop (while the run was being set up or finished); what "
        "it had written is kept."
    )
    assert capsys.readouterr().err.strip().splitlines() == [expected]


def test_periodic_checkpoints_are_written(output_dir):
    config = tiny_ppo(output_dir, checkpoint_every=512, total_frames=1_024)
    saved = []
    original = Agent.save

    def counting_save(self, path):
        saved.append(Path(path).name)
        return original(self, path)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Agent, "save", counting_save)
        ppo.main(config)
    assert saved.count("agent.ckpt") == 2  # at 512 and 1024 frames, the end (not written twice)


def test_nan_reward_stops_the_run_and_keeps_the_last_good_checkpoint(output_dir, monkeypatch):
    calls = {"steps": 0}
    original = CartPoleEnv.dynamics

    def dynamics(self, state, action):
        calls["steps"] += 1
        state, reward, terminated = original(self, state, action)
        return state, reward if calls["steps"] < 300 else reward * float("nan"), terminated

    monkeypatch.setattr(CartPoleEnv, "dynamics", dynamics)
    config = tiny_ppo(output_dir, env_backend="torch", checkpoint_every=128, total_frames=100_000)
    with pytest.raises(NonFiniteError, match=r"NaN or Inf in rewards at frame \d+ of ppo on CartPole-v1"):
        ppo.main(config)
    agent = Agent.load(output_dir / "agent.ckpt")  # written before the NaN appeared, and still loadable
    assert all(torch.isfinite(p).all() for p in agent.policy.parameters())


SPOILED = "spoiled_env:Spoiled-v0"


@pytest.mark.parametrize(
    "spoil, message",
    [
        (("nan_at=3",), r"Observation contains NaN or Inf"),
        (("nan_at=3", "nan_reward=true"), r"NaN or Inf in the evaluation env's rewards"),
    ],
    ids=["observation", "reward"],
)
def test_an_evaluation_env_gone_wrong_stops_the_run_with_the_trained_agent_saved(output_dir, spoil, message):
    """The training env is sound, the evaluation env's observations or rewards turn NaN: the run stops with one
    error naming the evaluation, and keeps the agent it trained (it had none saved before the first evaluation)."""
    config = tiny_ppo(output_dir, env_id=SPOILED, eval_env_kwargs=spoil, total_frames=1_024, eval_every=512)
    with pytest.raises(
        InputError, match=rf"evaluation at frame 512 on {SPOILED} failed: .*{message}"
    ) as stop:
        ppo.main(config)
    assert "agent.ckpt holds the agent trained so far" in str(stop.value)
    assert all(torch.isfinite(p).all() for p in Agent.load(output_dir / "agent.ckpt").policy.parameters())
    assert not (output_dir / "summary.json").exists()


@pytest.mark.parametrize("box", [False, True], ids=["discrete", "box"])
def test_nan_in_the_first_observations_stops_the_run_before_the_policy_acts_on_them(output_dir, box):
    """NaN already at reset: refused in one line there, before a categorical draw fails on it or a Gaussian's NaN
    action reaches the env (which raises on an action outside its space)."""
    config = tiny_ppo(output_dir, env_id=SPOILED, env_kwargs=("nan_at=0", f"box={str(box).lower()}"))
    with pytest.raises(
        InputError, match=r"returned NaN or Inf in an observation at reset \(sub-envs \[0, 1, 2, 3\]\)"
    ):
        ppo.main(config)


def test_nan_loss_is_named(output_dir, monkeypatch):
    from agents import TensorClipPPOLoss  # the loss recipes.ppo runs

    original = TensorClipPPOLoss.forward

    def forward(self, tensordict):
        loss = original(self, tensordict)
        loss.set("loss_critic", loss.get("loss_critic") * float("nan"))
        return loss

    monkeypatch.setattr(TensorClipPPOLoss, "forward", forward)
    with pytest.raises(NonFiniteError, match=r"NaN or Inf in .*train/loss_critic \(nan\)"):
        ppo.main(tiny_ppo(output_dir))


def test_a_loss_failing_on_diverged_parameters_stops_the_run_with_the_nan_error(output_dir, monkeypatch):
    """A step that leaves NaN in the weights makes the next minibatch's loss fail inside the distribution
    (Categorical refuses NaN probabilities) before the batch's metrics are checked: the run still stops with the
    NaN error and releases its folder, not with the distribution's traceback."""
    from training import learner as learner_module

    original = learner_module.clip_and_step

    def poisoning_step(optimizer, max_norm):
        norm = original(optimizer, max_norm)
        with torch.no_grad():
            optimizer.param_groups[0]["params"][0].fill_(float("nan"))
        return norm

    monkeypatch.setattr(learner_module, "clip_and_step", poisoning_step)
    config = tiny_ppo(output_dir)
    config.loss.entropy_coef = 0.01  # the entropy of the next minibatch's distribution samples from it
    with pytest.raises(
        NonFiniteError,
        match=r"NaN or Inf in the trained parameters after gradient step 1 \(the next loss failed: ",
    ):
        ppo.main(config)
    monkeypatch.undo()
    ppo.main(tiny_ppo(output_dir, overwrite=True))  # the folder was released


def test_a_loss_error_on_finite_parameters_is_not_called_divergence():
    from training import Learner

    network = torch.nn.Linear(2, 1)

    def loss(minibatch):
        raise RuntimeError("shape mismatch")

    learner = Learner(loss, torch.optim.SGD(network.parameters(), lr=0.1), {"network": network})
    with pytest.raises(RuntimeError, match="shape mismatch") as error:
        learner.step(TensorDict(batch_size=[]))
    assert not isinstance(error.value, NonFiniteError)
    with torch.no_grad():
        network.weight.fill_(float("inf"))
    with pytest.raises(
        NonFiniteError,
        match=r"trained parameters after gradient step 0 \(the next loss failed: shape mismatch",
    ):
        learner.step(TensorDict(batch_size=[]))


def test_wandb_failing_to_start_falls_back_to_csv_logging(output_dir, monkeypatch):
    from torchrl.record import loggers

    def broken(*args, **kwargs):
        raise RuntimeError("wandb: network unreachable")

    monkeypatch.setattr(loggers, "WandbLogger", broken)
    config = tiny_ppo(output_dir, logger="wandb", total_frames=512)
    with pytest.warns(UserWarning, match="W&B failed to start"):
        summary = ppo.main(config)
    assert summary["frames"] >= 512
    assert (output_dir / "csv").is_dir()


def test_online_wandb_without_a_key_falls_back_to_an_offline_wandb_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: no key
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    config = tiny_ppo(tmp_path / "run", logger="wandb", wandb_online=True, total_frames=512)
    with pytest.warns(UserWarning, match=r"online W&B failed to start .*; training goes on with offline W&B"):
        summary = ppo.main(config)
    assert Path(summary["wandb_offline_run"]).is_relative_to(tmp_path / "run")  # not CSV


def test_a_failed_run_leaves_no_wandb_run_for_the_next_one_to_log_into(tmp_path):
    import wandb

    from training import Callback

    class Fails(Callback):
        def on_batch(self, run, batch, metrics):
            raise RuntimeError("a callback's own bug")

    with pytest.raises(RuntimeError, match="own bug"):
        ppo.main(tiny_ppo(tmp_path / "failed", logger="wandb", total_frames=512), callbacks=[Fails()])
    summary = ppo.main(tiny_ppo(tmp_path / "next", logger="wandb", total_frames=512))
    assert Path(summary["wandb_offline_run"]).is_relative_to(tmp_path / "next")  # a W&B run of its own
    assert wandb.run is None  # and finished


def test_tensorboard_missing_is_refused_before_the_run_claims_its_folder(output_dir, monkeypatch):
    import importlib.util

    from errors import InputError

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else find_spec(name, *a)
    )
    with pytest.raises(InputError, match="--logger tensorboard needs the tensorboard package"):
        ppo.main(tiny_ppo(output_dir, logger="tensorboard"))
    assert not (output_dir / "config.json").exists()


EXPLODING_ENV = """
import sys
import gymnasium as gym


class Exploding(gym.Wrapper):
    def __init__(self):
        super().__init__(gym.make("CartPole-v1"))
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps > 100:
            raise ValueError("boom: the env's own error")
        return self.env.step(action)


gym.register("Exploding-v0", entry_point=Exploding, max_episode_steps=500)
if __name__ == "__main__":
    from recipes import ppo
    from training import run_cli

    sys.argv = ["ppo", "--env-id", "Exploding-v0", "--logger", "none", "--no-progress", "--no-video",
                "--num-envs", "2", "--minibatch-size", "16", "--output-dir", sys.argv[2], "--collector-backend", sys.argv[1]]
    run_cli(ppo.main, ppo.PPOConfig, "")
"""


@pytest.mark.parametrize("backend", ["single", "multiprocess"])
def test_an_env_raising_in_step_surfaces_its_own_traceback(backend, tmp_path):
    script = tmp_path / "exploding.py"
    script.write_text(EXPLODING_ENV)
    result = subprocess.run(
        [sys.executable, str(script), backend, str(tmp_path / "run")],
        check=False,
        cwd=Path(__file__).parents[1],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode != 0
    assert 'raise ValueError("boom: the env\'s own error")' in result.stderr
    assert "ValueError: boom: the env's own error" in result.stderr


SAVE_FOREVER = """
import sys
import gymnasium as gym
from agents import Agent

space = gym.spaces.Box(-1, 1, (64,))
agent = Agent.build("Pendulum-v1", space, gym.spaces.Box(-2, 2, (1,)), "sac",
                    policy_kwargs={"hidden_sizes": [1024, 1024]})
while True:
    agent.save(sys.argv[1])
"""


@pytest.mark.parametrize("delay_s", [0.3, 0.7, 1.1])
def test_a_process_killed_mid_write_leaves_a_loadable_checkpoint(delay_s, tmp_path):
    """SIGKILL while an agent (about 4 MB) is saved again and again: the file is always a complete checkpoint."""
    script, path = tmp_path / "save_forever.py", tmp_path / "agent.ckpt"
    script.write_text(SAVE_FOREVER)
    process = subprocess.Popen([sys.executable, str(script), str(path)], cwd=Path(__file__).parents[1])
    deadline = time.monotonic() + 60
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(delay_s)
    process.kill()
    process.wait(timeout=30)
    assert Agent.load(path).algorithm == "sac"
    leftovers = [p.name for p in tmp_path.iterdir() if p.name not in ("agent.ckpt", "save_forever.py")]
    assert all(".agent.ckpt." in name for name in leftovers), leftovers  # hidden partial files only


def test_a_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import os

    import gymnasium as gym

    path = tmp_path / "agent.ckpt"
    agent = Agent.build("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), "ppo")
    agent.save(path)
    before = [p.detach().clone() for p in agent.policy.parameters()]
    with torch.no_grad():
        for parameter in agent.policy.parameters():
            parameter.add_(1.0)

    def full_disk(source, destination):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full_disk)
    with pytest.raises(OSError, match="No space left"):
        agent.save(path)
    monkeypatch.undo()
    loaded = Agent.load(path)
    for old, new in zip(before, loaded.policy.parameters()):
        torch.testing.assert_close(old, new)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent.ckpt"]  # the partial file is removed


def test_a_run_stopped_by_sigterm_resumes_from_where_it_stopped(tmp_path):
    output_dir = tmp_path / "run"
    process = start_long_ppo(output_dir)
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=60)
    assert process.returncode == 143, stderr
    assert f"continue with: --resume {output_dir}" in stdout
    stopped_at = json.loads((output_dir / "summary.json").read_text())["frames"]
    evaluations = (output_dir / "evaluations.csv").read_text().splitlines()

    resumed = subprocess.Popen(
        [sys.executable, "-m", "recipes.ppo", "--resume", str(output_dir), "--no-progress"],
        cwd=Path(__file__).parents[1],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while (
        len((output_dir / "evaluations.csv").read_text().splitlines()) <= len(evaluations)
        and time.monotonic() < deadline
    ):
        time.sleep(0.2)
    resumed.send_signal(signal.SIGINT)
    stdout, stderr = resumed.communicate(timeout=60)
    assert resumed.returncode == 130, stderr
    summary = json.loads((output_dir / "summary.json").read_text())
    assert summary["frames"] > stopped_at
    assert summary["resumed_from"] == str(output_dir)
    rows = (output_dir / "evaluations.csv").read_text().splitlines()
    assert rows[: len(evaluations)] == evaluations  # the history goes on: earlier evaluations kept
    frames = [int(row.split(",")[0]) for row in rows[1:]]
    assert frames == sorted(frames) and frames[-1] > stopped_at


def test_a_run_that_fails_leaves_the_callers_signal_handlers_in_place(output_dir, monkeypatch):
    from agents import TensorClipPPOLoss  # the loss recipes.ppo runs

    def broken(self, tensordict):
        raise RuntimeError("a loss that fails")

    monkeypatch.setattr(TensorClipPPOLoss, "forward", broken)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="a loss that fails"):
        ppo.main(tiny_ppo(output_dir))
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_all_finite_agrees_with_torch(dtype, bad):
    from training.metrics import all_finite

    for shape in [(1, 1, 3), (4, 7, 2), (0, 3)]:
        value = torch.randn(shape).to(dtype)
        if bad is not None and value.numel():
            value.view(-1)[value.numel() // 2] = bad
        assert all_finite(value) == bool(torch.isfinite(value).all())
        assert all_finite(value[..., ::2]) == bool(torch.isfinite(value[..., ::2]).all())  # a strided view
    assert all_finite(torch.tensor([1.0, bad if bad is not None else 2.0], requires_grad=True)) == (
        bad is None
    )
