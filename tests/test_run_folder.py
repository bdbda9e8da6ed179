"""A run never writes into another run's folder unless told to, never writes through a link out of its folder,
fails to resume before it changes anything, and cleans up what interrupted writes left behind."""

import errno
import fcntl
import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import gymnasium as gym
import pytest
import torch
from run_helpers import interrupt_at, tiny_dqn

from agents import Agent, files
from agents.archive import holds_only_its_entries
from agents.files import remove_stale_temporaries, write_atomically, write_text
from errors import InputError, WriteError
from recipes import dqn, ppo
from training import Callback, RunConfig, quiet
from training.cli import integral_notation
from training.seeding import set_matmul_precision
from training.state import TrainingState

ROOT = Path(__file__).parents[1]


def tiny_ppo(output_dir, **run):
    options = {"num_envs": 4, "total_frames": 512, "eval_every": 512, "eval_episodes": 1, **run}
    config = quiet(ppo.PPOConfig(), output_dir, stop_at_return=math.inf, **options)
    config.collector.steps_per_env, config.optim.minibatch_size, config.optim.num_epochs = 32, 64, 1
    return config


def run_recipe(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, "-m", *args], check=False, capture_output=True, text=True, timeout=300, cwd=cwd
    )


def dead_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_new_run_refuses_a_folder_that_holds_a_run_and_overwrite_replaces_only_the_run(output_dir):
    ppo.main(tiny_ppo(output_dir))
    summary = json.loads((output_dir / "summary.json").read_text())
    (output_dir / "notes.txt").write_text("mine")
    with pytest.raises(
        InputError,
        match=r"already holds a run .*cannot be continued \(it wrote no resume.ckpt\), .*--overwrite",
    ):
        dqn.main(quiet(dqn.DQNConfig(), output_dir, total_frames=256))
    assert json.loads((output_dir / "summary.json").read_text()) == summary  # nothing was touched
    ppo.main(tiny_ppo(output_dir, overwrite=True, seed=1))
    assert json.loads((output_dir / "summary.json").read_text())["seed"] == 1
    assert (output_dir / "notes.txt").read_text() == "mine"  # not the run's: kept
    assert not (output_dir / "csv").exists() or not any((output_dir / "csv").rglob("*.csv"))


def test_command_line_refusal_is_one_line_and_default_folders_never_collide(tmp_path):
    base = [
        "recipes.ppo",
        "--total-frames",
        "256",
        "--num-envs",
        "4",
        "--eval-every",
        "256",
        "--eval-episodes",
        "1",
    ]
    base += ["--minibatch-size", "64", "--logger", "none", "--no-video", "--no-progress"]
    assert run_recipe(*base, "--output-dir", str(tmp_path / "run")).returncode == 0
    result = run_recipe(*base, "--output-dir", str(tmp_path / "run"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "already holds a run" in errors[0]
    # the default folder of every second of the next minute already holds a run: the new one takes a suffix
    now = datetime.now()
    taken = [
        tmp_path / "runs" / f"ppo-CartPole-v1-0-{(now + timedelta(seconds=second)).strftime('%Y%m%d-%H%M%S')}"
        for second in range(60)
    ]
    for folder in taken:
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text("{}")
    assert run_recipe(*base, cwd=tmp_path).returncode == 0
    new = [folder for folder in (tmp_path / "runs").iterdir() if folder not in taken]
    assert len(new) == 1 and new[0].name.endswith("-2") and (new[0] / "agent.ckpt").exists()
    assert all((folder / "summary.json").read_text() == "{}" for folder in taken)


@pytest.mark.parametrize(
    "make_path, message",
    [
        (lambda tmp: (tmp / "file").write_text("x") and tmp / "file", "is a file"),
        (
            lambda tmp: (tmp / "file").write_text("x") and tmp / "file" / "run",
            r"Cannot create the run folder .*Not a directory",
        ),
    ],
    ids=["a-file", "under-a-file"],
)
def test_output_dir_that_cannot_be_a_folder_is_one_line(tmp_path, make_path, message):
    with pytest.raises(InputError, match=message):
        ppo.main(tiny_ppo(make_path(tmp_path)))


def test_a_quoted_tilde_in_output_dir_is_the_home_folder_for_every_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    summary = dqn.main(tiny_dqn(Path("~/run")))
    assert summary["output_dir"] == str(tmp_path / "home" / "run")
    assert {"agent.ckpt", "best_agent.ckpt", "summary.json"} <= {
        path.name for path in (tmp_path / "home" / "run").iterdir()
    }
    assert not (tmp_path / "~").exists()


def test_the_filesystem_root_is_refused_as_output_dir():
    with pytest.raises(InputError, match="--output-dir / is the filesystem's root"):
        ppo.main(tiny_ppo(Path("/")))


def test_an_unwritable_output_dir_is_one_line(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, *args, **kwargs):  # the folder's write test fails as on a read-only file system
        if ".write-test-" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(InputError, match=r"Cannot write in the run folder .*Read-only file system"):
        ppo.main(tiny_ppo(tmp_path / "run"))


def test_links_in_a_run_folder_are_replaced_never_followed(tmp_path, monkeypatch):
    output_dir, outside = tmp_path / "run", tmp_path / "outside"
    outside.mkdir()
    interrupt_at(monkeypatch, 256)
    ppo.main(tiny_ppo(output_dir))
    victims = {}
    for name in ("config.json", "summary.json", "evaluations.csv", "learning_curve.png", "agent.ckpt"):
        victims[name] = outside / name
        victims[name].write_text("precious")
        (output_dir / name).unlink()
        (output_dir / name).symlink_to(victims[name])
    summary = ppo.main(tiny_ppo(output_dir, resume=output_dir))
    assert summary["frames"] == 512
    for name, victim in victims.items():
        assert victim.read_text() == "precious", name
        assert not (output_dir / name).is_symlink(), name
    # an evaluation video written over a link replaces the link
    (outside / "video.mp4").write_text("precious")
    (output_dir / "agent-evaluation.mp4").symlink_to(outside / "video.mp4")
    result = run_recipe("recipes.evaluate", str(output_dir), "--episodes", "1", "--video")
    assert result.returncode == 0, result.stderr
    assert (outside / "video.mp4").read_text() == "precious"
    assert not (output_dir / "agent-evaluation.mp4").is_symlink()


def test_a_resume_checkpoint_that_does_not_fit_fails_before_anything_is_written(tmp_path, monkeypatch):
    output_dir = tmp_path / "run"
    ppo.main(tiny_ppo(output_dir, checkpoint_every=256))
    before = {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()}

    def broken(self, state):
        raise RuntimeError("size mismatch for critic.0.weight")

    monkeypatch.setattr(TrainingState, "load_state_dict", broken)
    with pytest.raises(InputError, match=r"does not fit this run .*size mismatch.*nothing in the run folder"):
        ppo.main(tiny_ppo(output_dir, resume=output_dir, checkpoint_every=256))
    assert {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()} == before


def test_resume_refuses_an_env_registered_with_other_settings(tmp_path):
    env_id = "RunFolderTestCartPole-v0"
    gym.register(env_id, entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=200)
    try:
        output_dir = tmp_path / "run"
        ppo.main(tiny_ppo(output_dir, env_id=env_id, checkpoint_every=256))
        gym.register(env_id, entry_point="gymnasium.envs.classic_control:CartPoleEnv", max_episode_steps=50)
        with pytest.raises(
            InputError, match=r"registered with other settings.*max_episode_steps \(saved 200, now 50\)"
        ):
            ppo.main(tiny_ppo(output_dir, env_id=env_id, resume=output_dir, checkpoint_every=256))
    finally:
        gym.registry.pop(env_id, None)


def test_stale_temporaries_of_dead_processes_are_removed_at_the_next_save(tmp_path):
    hex32, host, other = (
        "0123456789abcdef" * 2,
        files._HOST,
        "ffffffff" if files._HOST != "ffffffff" else "eeeeeeee",
    )
    old = [  # untouched for two minutes or more
        stale_file := tmp_path / f".agent.ckpt.writing-{host}-{dead_pid()}-{hex32}.ckpt",
        live := tmp_path
        / f".agent.ckpt.writing-{host}-{os.getppid()}-{hex32}.ckpt",  # a process that is running
        other_recent := tmp_path / f".best_agent.ckpt.writing-{other}-{dead_pid()}-{hex32}.ckpt",
        unnamed_old := tmp_path / f".resume.ckpt.writing-{hex32}",
        unrelated := tmp_path / ".agent.ckpt.writing-notes",
    ]
    dead_recent = (
        tmp_path / f".summary.json.writing-{host}-{dead_pid()}-{hex32}.json"
    )  # maybe another namespace's
    other_old = tmp_path / f".video.mp4.writing-{other}-1-{hex32}.mp4"
    stale_stage = tmp_path / f"..agent.ckpt.writing-{host}-{dead_pid()}-{hex32}.ckpt.stage-{hex32}"
    for path in (*old, dead_recent, other_old):
        path.write_bytes(b"x" * 1000)
    stale_stage.mkdir()
    (stale_stage / "manifest.json").write_text("{}")
    for path in (*old, stale_stage, stale_stage / "manifest.json"):
        os.utime(path, (time.time() - 120, time.time() - 120))
    os.utime(unnamed_old, (0, 0))
    os.utime(other_old, (0, 0))
    agent = Agent.build("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), "test")
    agent.save(tmp_path / "agent.ckpt")
    removed = (stale_file, stale_stage, unnamed_old, other_old)
    kept = (live, other_recent, dead_recent, unrelated)
    assert not any(path.exists() for path in removed) and all(path.exists() for path in kept)
    assert remove_stale_temporaries(tmp_path) == []


def test_a_failed_write_names_the_file_and_keeps_the_previous_one(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    write_text(path, "previous")

    def full_disk(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(WriteError) as error:
        write_text(path, "new")
    assert (
        str(error.value)
        == f"Could not write {path} (No space left on device); the previous summary.json is intact."
    )
    monkeypatch.undo()
    assert path.read_text() == "previous" and [entry.name for entry in tmp_path.iterdir()] == ["summary.json"]


def test_a_full_disk_during_a_checkpoint_ends_the_command_with_one_line(tmp_path):
    script = (
        "import errno, sys; from torchrl.checkpoint import Checkpoint\n"
        "def full(self, *a, **k): raise OSError(errno.ENOSPC, 'No space left on device')\n"
        "Checkpoint.save = full\n"
        "from recipes import ppo; from training import run_cli\n"
        "sys.argv = ['ppo', '--total-frames', '256', '--num-envs', '4', '--eval-every', '256', '--eval-episodes', '1',"
        " '--minibatch-size', '64', '--logger', 'none', '--no-video', '--no-progress', '--output-dir', sys.argv[1]]\n"
        "run_cli(ppo.main, ppo.PPOConfig, 'ppo')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "run")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert (
        len(errors) == 1 and errors[0].startswith("error: Could not write ") and "No space left" in errors[0]
    )


def test_run_config_refuses_seeds_numpy_cannot_take():
    with pytest.raises(InputError, match=r"--seed must be in \[0, 2\*\*32\), got -1"):
        RunConfig(seed=-1).validate()


@pytest.mark.parametrize(
    "option, value, choices",
    [
        ("collector_backend", "multi", "single, multiprocess, ray"),
        ("logger", "mlflow", "wandb, csv, tensorboard, none"),
        ("env_backend", "jax", "gymnasium, torch"),
        ("vectorization", "threads", "sync, async"),
        ("matmul_precision", "low", "highest, high, medium"),
    ],
)
def test_run_config_refuses_a_choice_it_does_not_have(option, value, choices, tmp_path):
    """From Python nothing checks a Literal option: an unknown collector backend used to fall through to Ray."""
    config = tiny_ppo(tmp_path / "run")
    setattr(config.run, option, value)
    with pytest.raises(InputError) as error:
        ppo.main(config)
    flag = "--" + option.replace("_", "-")
    assert str(error.value) == f"{flag} must be one of {choices}; got {value!r}."
    assert not (tmp_path / "run").exists()  # refused before any work


@pytest.fixture
def float32_products_restored():
    yield
    set_matmul_precision("highest")


def test_matmul_precision_sets_torchs_products_and_convolutions_for_the_run(
    tmp_path, float32_products_restored
):
    ppo.main(tiny_ppo(tmp_path / "reduced", matmul_precision="medium"))
    assert torch.get_float32_matmul_precision() == "medium"
    assert torch.backends.mkldnn.matmul.fp32_precision == torch.backends.mkldnn.conv.fp32_precision == "bf16"
    assert (
        json.loads((tmp_path / "reduced" / "config.json").read_text())["run"]["matmul_precision"] == "medium"
    )
    ppo.main(tiny_ppo(tmp_path / "default"))  # the next run, at the default, puts float32 back
    assert torch.get_float32_matmul_precision() == "highest"
    assert torch.backends.mkldnn.matmul.fp32_precision == "ieee"
    assert torch.backends.mkldnn.conv.fp32_precision == "none"


@pytest.fixture
def gradual_underflow_restored():
    yield
    torch.set_flush_denormal(False)


def test_flush_denormal_sets_cpu_arithmetic_for_the_run(tmp_path, gradual_underflow_restored):
    denormal = torch.tensor([1e-39])
    ppo.main(tiny_ppo(tmp_path / "default"))
    assert (denormal * 1.0).item() == 0.0  # flushed
    ppo.main(tiny_ppo(tmp_path / "ieee", flush_denormal=False))
    assert (denormal * 1.0).item() == pytest.approx(1e-39)
    assert json.loads((tmp_path / "ieee" / "config.json").read_text())["run"]["flush_denormal"] is False


def test_a_link_among_the_csv_logs_of_a_continued_run_is_refused(tmp_path, monkeypatch):
    output_dir, outside = tmp_path / "run", tmp_path / "outside.csv"
    interrupt_at(monkeypatch, 256)
    ppo.main(tiny_ppo(output_dir, logger="csv"))
    log = next((output_dir / "csv").rglob("*.csv"))
    outside.write_text("precious")
    log.unlink()
    log.symlink_to(outside)
    with pytest.raises(
        InputError, match="is a symbolic link; a run writes its logs and videos only to files inside"
    ):
        ppo.main(tiny_ppo(output_dir, logger="csv", resume=output_dir))
    assert outside.read_text() == "precious"


def test_a_link_in_place_of_the_wandb_folder_is_refused_for_a_wandb_run(tmp_path):
    output_dir, outside = tmp_path / "run", tmp_path / "outside"
    output_dir.mkdir()
    outside.mkdir()
    (output_dir / "wandb").symlink_to(outside)
    with pytest.raises(InputError, match=r"wandb is a symbolic link; a run writes its logs"):
        ppo.main(tiny_ppo(output_dir, logger="wandb"))
    assert list(outside.iterdir()) == []
    ppo.main(tiny_ppo(output_dir, logger="csv", total_frames=64))  # another logger never writes there


def test_the_write_test_never_follows_a_link_under_its_name(tmp_path):
    output_dir, target = tmp_path / "run", tmp_path / "outside" / "created-by-the-probe"
    output_dir.mkdir()
    target.parent.mkdir()
    probe = output_dir / f".write-test-{os.getpid()}"  # the run's in this process
    probe.symlink_to(target)
    ppo.main(tiny_ppo(output_dir, total_frames=64))
    assert not target.exists() and not probe.exists()


def test_loading_extracts_only_into_a_temporary_folder_it_removes(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    agent = Agent.build("CartPole-v1", gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2), "test")
    path = agent.save(tmp_path / "agent.ckpt")
    Agent.load(path)
    assert list(scratch.iterdir()) == [] and sorted(entry.name for entry in tmp_path.iterdir()) == [
        "agent.ckpt",
        "scratch",
    ]


def test_a_failed_resume_into_an_overwrite_target_leaves_the_target_alone(tmp_path, monkeypatch):
    source, target = tmp_path / "source", tmp_path / "target"
    ppo.main(tiny_ppo(source, checkpoint_every=256))
    ppo.main(tiny_ppo(target))
    before = sorted(path.name for path in target.iterdir())

    def broken(self, state):
        raise KeyError("optimizers")

    monkeypatch.setattr(TrainingState, "load_state_dict", broken)
    with pytest.raises(InputError, match="does not fit this run"):
        ppo.main(tiny_ppo(target, resume=source, checkpoint_every=256, overwrite=True))
    assert sorted(path.name for path in target.iterdir()) == before


def test_logger_folders_alone_are_not_a_run_and_are_never_removed(tmp_path):
    (tmp_path / "csv").mkdir()
    (tmp_path / "csv" / "measurements.csv").write_text("mine")
    (tmp_path / "wandb" / "run-otherproject").mkdir(parents=True)
    ppo.main(tiny_ppo(tmp_path, overwrite=True, logger="none"))
    assert (tmp_path / "csv" / "measurements.csv").read_text() == "mine"
    assert (tmp_path / "wandb" / "run-otherproject").is_dir() and (tmp_path / "summary.json").exists()


def test_of_two_runs_claiming_one_folder_the_second_is_refused(tmp_path):
    from training.outputs import prepare_run_folder

    run = RunConfig(output_dir=tmp_path / "run")
    assert prepare_run_folder("ppo", run, resumed=False) == tmp_path / "run"  # claimed: config.json exists
    with pytest.raises(InputError, match="already holds a run"):
        prepare_run_folder("dqn", run, resumed=False)


def test_resume_accepts_an_env_registered_with_a_function_in_its_kwargs(tmp_path):
    from envs.vector import registration

    env_id = "RunFolderTestShaped-v0"

    def shaping(reward):
        return reward

    gym.register(
        env_id, entry_point="gymnasium.envs.classic_control:CartPoleEnv", kwargs={"render_mode": None}
    )
    try:
        gym.registry[env_id].kwargs["reward_fn"] = (
            shaping  # stored as module:qualname, the same in every process
        )
        assert registration(env_id)["kwargs"]["reward_fn"].endswith(
            ":test_resume_accepts_an_env_registered_with_a_function_in_its_kwargs.<locals>.shaping"
        )
        assert registration(env_id) == registration(env_id)
    finally:
        gym.registry.pop(env_id, None)


def test_whole_numbers_in_scientific_notation_are_read_by_integer_options(tmp_path):
    assert (
        integral_notation("1e6") == "1000000"
        and integral_notation("--total-frames=2.5e5") == "--total-frames=250000"
    )
    for unchanged in ("3e-4", "1.5e0", "1e400", "x=1e5", "CartPole-v1", "100"):
        assert integral_notation(unchanged) == unchanged
    result = run_recipe(
        "recipes.ppo", "--total-frames", "2.56e2", "--num-envs", "1e3", "--output-dir", str(tmp_path / "run")
    )
    assert result.returncode == 2
    assert "--num-envs 1000 is more than --total-frames 256" in result.stderr  # parsed, then refused


def test_pytorch_s_report_of_a_full_disk_is_a_write_error_and_other_runtime_errors_pass(tmp_path):
    path = tmp_path / "resume.ckpt"
    write_text(path, "previous")

    def torch_full_disk(temporary):
        raise RuntimeError(
            f"unable to write to file <{temporary}/tensor_00000064.memmap>: No space left on device (28)"
        )

    with pytest.raises(WriteError) as error:
        write_atomically(path, torch_full_disk)
    assert error.value.errno == errno.ENOSPC
    assert (
        str(error.value)
        == f"Could not write {path} (No space left on device); the previous resume.ckpt is intact."
    )

    def bug(temporary):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")

    with pytest.raises(RuntimeError, match="mat1 and mat2"):
        write_atomically(path, bug)
    assert path.read_text() == "previous" and [entry.name for entry in tmp_path.iterdir()] == ["resume.ckpt"]


def test_a_config_json_that_is_not_a_run_s_is_never_replaced_and_its_folder_is_left_alone(output_dir):
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config.json").write_text('{"theme": "dark"}')
    (output_dir / "videos").mkdir()
    (output_dir / "videos" / "holiday.mp4").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(InputError, match=r"config.json is not a run's configuration"):
            ppo.main(tiny_ppo(output_dir, overwrite=overwrite))
    assert (output_dir / "config.json").read_text() == '{"theme": "dark"}'
    assert (output_dir / "videos" / "holiday.mp4").read_text() == "mine"


@pytest.mark.parametrize(
    "name, content",
    [
        ("summary.json", '{"score": 3}'),
        ("evaluations.csv", "step,score\n1,2\n"),
        ("agent.ckpt", "not an archive"),
        ("video.mp4", "a holiday"),
        ("best_agent.ckpt", None),  # a folder under a checkpoint's name
    ],
    ids=["summary", "evaluations", "checkpoint", "video-alone", "folder"],
)
def test_files_named_as_a_run_s_are_not_a_run_and_are_never_replaced(output_dir, name, content):
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / name
    if content is None:
        path.mkdir()
        (path / "mine.txt").write_text("mine")
    else:
        path.write_text(content)
    for folder in ("videos", "wandb", "tensorboard"):  # a user's own, beside it: never removed
        (output_dir / folder).mkdir()
        (output_dir / folder / "mine.txt").write_text("mine")
    for overwrite in (False, True):
        with pytest.raises(InputError, match=rf"{name} is not a run's file, .*move it away"):
            ppo.main(tiny_ppo(output_dir, overwrite=overwrite))
    assert sorted(entry.name for entry in output_dir.iterdir()) == sorted(
        [name, "videos", "wandb", "tensorboard", ".run.lock"]
    )
    assert all(path.read_text() == "mine" for path in output_dir.rglob("mine.txt"))
    if content is not None:
        assert path.read_text() == content


def test_a_run_is_recognised_by_any_one_of_its_records(output_dir):
    ppo.main(tiny_ppo(output_dir))
    for name in ("config.json", "summary.json", "agent.ckpt", "best_agent.ckpt"):
        (output_dir / name).unlink()  # what is left: evaluations.csv, the plot, the logs
    with (output_dir / "evaluations.csv").open("a") as rows:  # a long run's: past a megabyte of rows
        rows.write("512,1.0,9.0,0.0,9.0\n" * 60_000)
    with pytest.raises(InputError, match=r"already holds a run \(evaluations.csv, learning_curve.png"):
        ppo.main(tiny_ppo(output_dir))
    ppo.main(tiny_ppo(output_dir, overwrite=True, seed=1))
    assert json.loads((output_dir / "summary.json").read_text())["seed"] == 1


def test_a_run_that_can_be_continued_is_offered_resume(output_dir):
    ppo.main(tiny_ppo(output_dir, checkpoint_every=256))
    with pytest.raises(
        InputError, match=rf"already holds a run .*continue it with --resume {output_dir}, .*--overwrite"
    ):
        ppo.main(tiny_ppo(output_dir))


class FailsToStart(Callback):
    def on_start(self, run):
        raise ValueError("my callback's bug")


def test_a_run_that_fails_before_training_gives_up_its_folder_and_can_be_started_again(output_dir):
    (output_dir / "wandb").mkdir(parents=True)  # the user's, there before: kept
    with pytest.raises(ValueError, match="my callback's bug"):
        ppo.main(tiny_ppo(output_dir), callbacks=[FailsToStart()])
    assert not (output_dir / "config.json").exists() and (output_dir / "wandb").is_dir()
    summary = ppo.main(tiny_ppo(output_dir))  # the same command again, no --overwrite
    assert summary["frames"] >= 256 and (output_dir / "wandb").is_dir()
    # a resumed run that fails to start keeps everything of the run it continues
    ppo.main(tiny_ppo(output_dir, overwrite=True, checkpoint_every=256, total_frames=256))
    before = {path.name: path.read_bytes() for path in output_dir.iterdir() if path.is_file()}
    with pytest.raises(ValueError, match="my callback's bug"):
        ppo.main(
            tiny_ppo(output_dir, resume=output_dir, checkpoint_every=256, total_frames=256),
            callbacks=[FailsToStart()],
        )
    assert json.loads((output_dir / "config.json").read_text())["run"]["seed"] == 0  # still the run's
    assert (output_dir / "summary.json").read_bytes() == before["summary.json"]
    # continued in a new folder: what it carried there goes too, and the same command works afterwards
    new = output_dir.parent / "new"
    continued = tiny_ppo(new, resume=output_dir, checkpoint_every=256, total_frames=256)
    with pytest.raises(ValueError, match="my callback's bug"):
        ppo.main(continued, callbacks=[FailsToStart()])
    assert sorted(path.name for path in new.iterdir() if path.is_file()) == [".run.lock"]
    assert ppo.main(tiny_ppo(new, resume=output_dir, checkpoint_every=256, total_frames=256))["frames"] == 256
    assert (output_dir / "resume.ckpt").read_bytes() == before["resume.ckpt"]


def hold_lock(folder):
    """A process holding ``folder``'s run lock, as a live run does, until killed."""
    script = (
        "import fcntl, os, sys, time\n"
        "descriptor = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.flock(descriptor, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "time.sleep(120)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script, str(folder / ".run.lock")], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout.readline() == "locked\n"
    return process


def test_a_folder_a_live_run_is_writing_into_is_refused_even_with_overwrite_or_resume(output_dir):
    ppo.main(tiny_ppo(output_dir, checkpoint_every=256))
    files_before = {path: path.read_bytes() for path in output_dir.rglob("*") if path.is_file()}
    holder = hold_lock(output_dir)
    try:
        with pytest.raises(InputError, match=f"Another run is writing into {output_dir} right now"):
            ppo.main(tiny_ppo(output_dir, overwrite=True, seed=1))
        with pytest.raises(InputError, match="Another run is writing into"):
            ppo.main(tiny_ppo(None, resume=output_dir))
    finally:
        holder.kill()
        holder.wait()
    assert {path: path.read_bytes() for path in output_dir.rglob("*") if path.is_file()} == files_before
    ppo.main(tiny_ppo(output_dir, overwrite=True, seed=1))  # free again once the other run is gone
    # and released by the run that ended: another process could take the lock now
    descriptor = os.open(output_dir / ".run.lock", os.O_RDWR)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(descriptor)


def test_a_link_in_place_of_the_lock_is_refused(output_dir, tmp_path):
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / ".run.lock").symlink_to(tmp_path / "outside")
    with pytest.raises(InputError, match=r"Cannot make the run folder's lock .*\.run\.lock"):
        ppo.main(tiny_ppo(output_dir))
    assert not (tmp_path / "outside").exists()


def test_a_run_continued_in_a_new_folder_brings_its_evaluations_and_best_agent(tmp_path, monkeypatch):
    old, new, ended = tmp_path / "old", tmp_path / "new", tmp_path / "ended"
    with monkeypatch.context() as patch:
        interrupt_at(patch, 256)
        ppo.main(tiny_ppo(old, eval_every=128, checkpoint_every=512))
    rows = (old / "evaluations.csv").read_text()
    assert len(rows.splitlines()) == 3  # a header and two evaluations
    summary = ppo.main(tiny_ppo(new, resume=old, eval_every=128, checkpoint_every=512))
    lines = (new / "evaluations.csv").read_text().splitlines()
    assert lines[: len(rows.splitlines())] == rows.splitlines() and len(lines) == 5
    assert (new / "best_agent.ckpt").exists()
    best = max(float(line.split(",")[2]) for line in lines[1:])
    assert summary["best_eval_return_mean"] == best
    assert (old / "evaluations.csv").read_text() == rows  # the old folder is left as it was
    # a run that had ended, continued in a new folder: nothing more to train, its records all come along
    ppo.main(tiny_ppo(ended, resume=new, eval_every=128, checkpoint_every=512))
    assert (ended / "evaluations.csv").read_text().splitlines() == lines
    assert (ended / "best_agent.ckpt").read_bytes() == (new / "best_agent.ckpt").read_bytes()
    # another run's best agent in the checkpoint's folder is not taken for this run's
    ppo.main(tiny_ppo(tmp_path / "other", seed=1))
    other = (tmp_path / "other" / "best_agent.ckpt").read_bytes()
    (new / "best_agent.ckpt").write_bytes(other)
    ppo.main(tiny_ppo(ended, resume=new, eval_every=128, checkpoint_every=512, overwrite=True))
    assert not (ended / "best_agent.ckpt").exists()


def test_a_padded_best_agent_is_not_copied_into_the_new_folder(tmp_path):
    old, new = tmp_path / "old", tmp_path / "new"
    ppo.main(tiny_ppo(old, eval_every=128, checkpoint_every=512))  # ended: continued, it trains no more
    best = old / "best_agent.ckpt"
    assert holds_only_its_entries(best) and holds_only_its_entries(old / "resume.ckpt")
    # the same archive behind a hole of a gigabyte: still a readable zip of this run's agent, 20 kB on disk
    archive = best.read_bytes()
    with best.open("wb") as padded:
        padded.seek(2**30)
        padded.write(archive)
    assert Agent.load(best).algorithm == "ppo" and not holds_only_its_entries(best)
    with pytest.warns(UserWarning, match=r"best_agent\.ckpt holds more bytes than its entries .* not copied"):
        ppo.main(tiny_ppo(new, resume=old, eval_every=128, checkpoint_every=512))
    assert (new / "evaluations.csv").exists() and not (new / "best_agent.ckpt").exists()
    assert not holds_only_its_entries(tmp_path / "absent.ckpt") and not holds_only_its_entries(
        old / "config.json"
    )
