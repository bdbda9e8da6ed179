"""The benchmark suite: runs each (algorithm, env, seed) once, continues stopped runs, and reports against the
reference scores."""

import csv
import json
import os
import random
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from benchmarks import suite


def test_commands_start_continue_or_replace_a_run(tmp_path):
    job = suite.Job("sac", "LunarLander-v3 continuous=true", 1)
    folder = job.folder(tmp_path)
    assert folder == tmp_path / "runs" / "sac" / "LunarLander-v3__continuous=true" / "seed1"
    fresh = suite.command(job, tmp_path, 5_000, 1_000)
    assert fresh[:3] == [sys.executable, "-m", "recipes.sac"]
    assert fresh[fresh.index("--env-kwargs") + 1] == "continuous=true"
    assert fresh[fresh.index("--total-frames") + 1] == "5000" and "--overwrite" not in fresh
    assert fresh[fresh.index("--stop-at-return") + 1] == "inf"  # the whole budget
    assert fresh[fresh.index("--threads") + 1] == "1"  # a core each: no preset's threads = 0 oversubscribes
    assert "--threads" not in suite.command(job, tmp_path, 5_000, 1_000, threads=None)  # the recipe's own
    folder.mkdir(parents=True)
    assert "--overwrite" in suite.command(job, tmp_path, 5_000, 1_000)  # a run that failed early
    (folder / "resume.ckpt").write_bytes(b"")
    resumed = suite.command(job, tmp_path, 5_000, 1_000)
    assert resumed[3:5] == ["--resume", str(folder)] and "--env-id" not in resumed
    own = suite.Job("ppo", "guess_env:Guess-v0", 0)  # an env of the user's module: restated, to be imported
    own.folder(tmp_path).mkdir(parents=True)
    (own.folder(tmp_path) / "resume.ckpt").write_bytes(b"")
    resumed = suite.command(own, tmp_path, 5_000, 1_000)
    assert resumed[3:7] == ["--resume", str(own.folder(tmp_path)), "--env-id", "guess_env:Guess-v0"]


class Recorded:
    """A stand-in for subprocess.Popen: keeps the command lines and the signals sent, exits with ``status``."""

    commands: ClassVar[list] = []
    status = 0

    def __init__(self, arguments, **kwargs):
        Recorded.commands.append(arguments)
        self.signals = []
        self.returncode = Recorded.status

    def wait(self):
        return Recorded.status

    def send_signal(self, number):
        self.signals.append(number)


@pytest.fixture
def recorded(monkeypatch):
    suite.recipe_config("sac", "Hopper-v5")  # MuJoCo's imports start processes of their own: done before
    Recorded.commands, Recorded.status = [], 0
    monkeypatch.setattr(suite.subprocess, "Popen", Recorded)
    return Recorded


def test_runs_get_one_thread_when_they_fill_the_cores_or_run_beside_sb3(recorded, monkeypatch, tmp_path):
    def threads(jobs, with_sb3, job=None):
        job = job or suite.Job("ppo", "ALE/Pong-v5", 0)
        suite.Runner(jobs, with_sb3).run(job, tmp_path, 1_000, 1_000)
        arguments = recorded.commands[-1]
        return arguments[arguments.index("--threads") + 1] if "--threads" in arguments else None

    monkeypatch.setattr(suite.os, "cpu_count", lambda: 2)
    assert threads(2, False) == "1" and threads(1, True) == "1"  # SB3's runs have one thread too
    for algorithm in ("ppo", "dqn", "rnd_ppo"):  # every Atari preset: all cores, for the CNN
        assert suite.recipe_config(algorithm, "ALE/Pong-v5").run.threads == 0
    assert threads(1, False) == "2"  # a run alone: its share is every core
    assert threads(1, False, suite.Job("ppo", "CartPole-v1", 0)) is None  # the preset's own (one)
    monkeypatch.setattr(suite.os, "cpu_count", lambda: 16)
    sac_hopper = suite.Job("sac", "Hopper-v5", 0)  # its preset says threads = 0: all cores
    assert suite.recipe_config("sac", "Hopper-v5").run.threads == 0
    assert threads(2, False, sac_hopper) == "8"  # its share, not all 16 for each of two runs
    assert threads(2, False, suite.Job("ppo", "CartPole-v1", 0)) is None  # its preset's one thread
    # images with no preset: the recipe's one thread would become all 16 for the CNN (training.seeding)
    assert threads(2, False, suite.Job("ppo", "space_envs:Look-v0 layout=hwc", 0)) == "8"
    assert threads(2, False, suite.Job("ppo", "space_envs:Sign-v0 kind=scalar", 0)) is None


def test_a_stop_reaches_every_run_and_starts_none_after_it(recorded, monkeypatch, tmp_path):
    runner = suite.Runner(2)
    job = suite.Job("ppo", "CartPole-v1", 0)
    building = suite.command

    def command_then_stop(*arguments):  # the stop arrives while the command line is built
        line = building(*arguments)
        runner.stop(signal.SIGINT, None)
        return line

    monkeypatch.setattr(suite, "command", command_then_stop)
    assert runner.run(job, tmp_path, 1_000, 1_000) == -1 and recorded.commands == []
    assert runner.run(job, tmp_path, 1_000, 1_000) == -1 and runner.stopping == signal.SIGINT
    running = suite.Runner(2)
    process = Recorded(["x"])
    running.processes.add(process)
    running.stop(signal.SIGHUP, None)  # a closed terminal: the runs get the SIGTERM they save on
    assert process.signals == [signal.SIGTERM] and running.stopping == signal.SIGHUP
    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = {number: signal.getsignal(number) for number in numbers}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # started under nohup
    try:
        running.handle_signals()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == running.stop
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)


def test_failed_and_stopped_runs_set_the_exit_status_and_say_why(tmp_path, capsys):
    arguments = ["--algos", "ppo", "--envs", "NoSuchEnv-v0", "--seeds", "0", "--frames", "512",
                 "--results", str(tmp_path), "--jobs", "1"]  # fmt: skip
    with pytest.raises(SystemExit) as stopped:
        suite.main(arguments)
    output = capsys.readouterr().out
    assert stopped.value.code == 1 and "1 of 1 runs failed:" in output
    log = tmp_path / "logs" / "ppo-NoSuchEnv-v0-seed0.log"
    assert (
        "ppo NoSuchEnv-v0 seed 0: exit 2: error: " in output
        and "NoSuchEnv-v0" in output
        and str(log) in output
    )
    runner = suite.Runner(1)
    runner.stopping = signal.SIGTERM
    runner.finish(suite.Job("reinforce", "CartPole-v1", 0), tmp_path, 143, log, resuming=False)
    assert [job.algorithm for job in runner.restarting] == ["reinforce"] and not runner.failures
    runner = suite.Runner(1)
    (tmp_path / "runs" / "ppo" / "CartPole-v1" / "seed0").mkdir(parents=True)
    runner.finish(suite.Job("ppo", "CartPole-v1", 0), tmp_path, 2, log, resuming=True)
    assert "if that file is damaged, delete the run folder to start the run over" in runner.failures[0][1]


@pytest.mark.parametrize(
    "arguments,message",
    [
        (["--algos", "ppo"], "give --algos and --envs"),
        (
            ["--algos", "evaluate", "--envs", "CartPole-v1"],
            "no training recipe 'evaluate'; the suite runs a2c",
        ),
        (["--algos", "ppo", "--envs", "CartPole-v1", "--seeds", "-1"], "--seeds must be in [0, 2**32)"),
        (["--algos", "ppo", "--envs", "CartPole-v1 gravity"], "--envs 'CartPole-v1 gravity': "),
        (["--algos", "ppo", "--envs", " "], "an empty --envs item"),
        (
            ["--algos", "ppo", "--envs", "Pendulum-v1 g=+9", "Pendulum-v1 g=,9"],
            "would share the records folder",
        ),
        (
            ["--algos", "sac", "--envs", "Pendulum-v1", "--with-sb3"],
            "no RL Zoo settings for sac on Pendulum-v1",
        ),
    ],
)
def test_what_cannot_run_is_refused_before_any_run_starts(arguments, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as refused:
        suite.main([*arguments, "--results", str(tmp_path / "results")])
    assert refused.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "results" / "runs").exists()


def test_a_relative_results_folder_is_the_callers(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        suite.main(["--report-only", "--results", "nowhere"])  # a typo: no new folder
    assert f"--results {tmp_path / 'nowhere'} is no folder" in capsys.readouterr().err
    assert not (tmp_path / "nowhere").exists()


def test_a_stopped_run_is_not_finished_and_sb3_runs_at_the_recipes_budget(tmp_path):
    job = suite.Job("ppo", "CartPole-v1", 0)
    folder = job.folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"interrupted_by": "SIGTERM"}')  # stopped: resume.ckpt beside it
    (folder / "resume.ckpt").write_bytes(b"")
    assert not suite.finished(job, tmp_path) and "--resume" in suite.command(job, tmp_path, None, 1_000)
    sb3 = suite.command(suite.Job("sb3-sac", "Hopper-v5", 2), tmp_path, 20_000, 1_000)
    assert sb3[1:3] == ["-m", "benchmarks.sb3_runner"] and sb3[sb3.index("--algo") + 1] == "sac"
    assert sb3[sb3.index("--frames") + 1] == "20000" and sb3[sb3.index("--eval-every") + 1] == "20000"
    assert (
        sb3[sb3.index("--eval-episodes") + 1] == "10" and sb3[sb3.index("--seed") + 1] == "2"
    )  # SAC's preset


def test_sb3_runs_pair_with_the_recipe_runs_of_the_same_seed():
    jobs = suite.make_jobs(["sac"], ["Hopper-v5"], [0, 1], with_sb3=True)
    assert [(job.algorithm, job.seed) for job in jobs] == [
        ("sac", 0),
        ("sb3-sac", 0),
        ("sac", 1),
        ("sb3-sac", 1),
    ]
    assert len(suite.make_jobs(["ppo", "a2c"], ["CartPole-v1", "Acrobot-v1"], [0], with_sb3=False)) == 4


def test_statistics():
    assert suite.interquartile_mean([[0, 1, 2, 3, 4, 5, 6, 100]]) == 3.5
    low, high = suite.bootstrap_interval([[1.0, 2.0, 3.0], [10.0, 11.0, 12.0]], suite.interquartile_mean)
    assert 1.0 <= low <= high <= 12.0
    assert suite.pooled_mean([[1.0, 2.0], [6.0]]) == 3.0


def test_the_iqm_is_rliables_for_equal_seeds_and_weighs_tasks_equally_for_unequal_ones():
    """As many seeds per task: scipy's ``trim_mean(runs, 0.25)``, which rliable computes. Unequal seeds: each
    task weighs the same, where pooling the runs let a task of many seeds outweigh the rest."""

    def trim_mean(values):  # scipy.stats.trim_mean(values, 0.25): int(n / 4) dropped from each end
        ordered = sorted(values)
        cut = len(ordered) // 4
        return sum(ordered[cut : len(ordered) - cut]) / (len(ordered) - 2 * cut)

    generator = random.Random(0)
    for tasks, seeds in [(1, 1), (1, 6), (3, 1), (3, 5), (4, 3), (7, 2)]:
        groups = [[generator.gauss(0, 1) for _ in range(seeds)] for _ in range(tasks)]
        pooled = [value for group in groups for value in group]
        assert suite.interquartile_mean(groups) == pytest.approx(trim_mean(pooled), abs=1e-12)
    # ten seeds at 1 and two tasks of one seed at 0: pooled, the IQM would be 1; weighted, 30 positions of
    # which 20 hold 0 and the kept middle [7, 23) holds 13 zeros and 3 ones
    assert suite.interquartile_mean([[1.0] * 10, [0.0], [0.0]]) == pytest.approx(3 / 16)
    # each run of a 2-seed task counts as two runs of 1-seed tasks: the IQM of [0, 0, 1, 2, 5, 5] (L = 2)
    assert suite.interquartile_mean([[0.0], [1.0, 2.0], [5.0]]) == pytest.approx((0 + 1 + 2 + 5) / 4)


def test_suite_runs_each_seed_once_and_reports(tmp_path, capsys):
    arguments = ["--algos", "ppo", "--envs", "CartPole-v1", "--seeds", "0", "1", "--frames", "512",
                 "--results", str(tmp_path)]  # fmt: skip
    suite.main(arguments)
    output = capsys.readouterr().out
    assert "0 of 2 runs already finished; 2 to run" in output
    for seed in (0, 1):
        assert (tmp_path / "runs" / "ppo" / "CartPole-v1" / f"seed{seed}" / "summary.json").exists()
    report = (tmp_path / "report.md").read_text()
    row = next(line for line in report.splitlines() if line.startswith("| ppo | CartPole-v1 |"))
    assert "| 2 | 512 |" in row and "500.0 at 100,000*" in row and "RL Zoo" in row
    assert "| ppo | 1 |" in report  # the aggregate: one (algorithm, env) pair
    assert (tmp_path / "curves_CartPole-v1.png").exists() and (tmp_path / "aggregate.png").exists()
    with open(tmp_path / "summary.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["seed"] for row in rows] == ["0", "1"] and {row["preset"] for row in rows} == {"CartPole-v1"}
    record = json.loads((tmp_path / "records" / "ppo" / "CartPole-v1" / "seed1.json").read_text())
    assert (
        record["summary"]["output_dir"]
        == record["config"]["run"]["output_dir"]
        == "runs/ppo/CartPole-v1/seed1"
    )
    preset_budget = [
        "--algos",
        "ppo",
        "--envs",
        "CartPole-v1",
        "--seeds",
        "0",
        "2",
        "--results",
        str(tmp_path),
    ]
    for other in ([*arguments, "--frames", "1024"], preset_budget):  # another budget; the preset's is 100k
        with pytest.raises(SystemExit) as refused:
            suite.main(other)
        error = capsys.readouterr().err
        assert refused.value.code == 2 and "ppo CartPole-v1 seed 0 has a budget of 512 frames in " in error
    assert "asks for 1,024" in suite.budget_conflicts([suite.Job("ppo", "CartPole-v1", 1)], tmp_path, 1024)[0]
    assert not (tmp_path / "runs" / "ppo" / "CartPole-v1" / "seed2").exists()  # nothing ran
    shutil.rmtree(tmp_path / "runs")  # a new checkout: the records, kept in the repository, are what counts
    suite.main(arguments)  # nothing left to do; --frames is not a preset change
    output = capsys.readouterr().out
    assert "2 of 2 runs already finished; 0 to run" in output and "warning" not in output
    assert "Made with a preset that has changed" not in (tmp_path / "report.md").read_text()
    record_path = tmp_path / "records" / "ppo" / "CartPole-v1" / "seed1.json"
    record = json.loads(record_path.read_text())  # as if run before the preset's lr and epochs changed
    record["config"]["run"]["preset_applied"]["set"] |= {"lr": 1e-3, "num_epochs": 10}
    record_path.write_text(json.dumps(record))
    suite.main(arguments)
    output = capsys.readouterr().out
    assert (
        "warning: ppo CartPole-v1 seed 1 was run with another preset (lr: 0.001 -> 0.002; num_epochs: 10 -> 8)"
        in output
    )
    assert (
        "- ppo CartPole-v1 seed 1: lr: 0.001 -> 0.002; num_epochs: 10 -> 8"
        in (tmp_path / "report.md").read_text()
    )


def test_report_only_without_runs(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    suite.main(["--report-only", "--results", str(tmp_path / "empty")])
    assert "no finished runs yet" in capsys.readouterr().out
    assert not Path(tmp_path / "empty" / "report.md").exists()


def test_budgets_take_scientific_notation_and_refuse_fractions(tmp_path, capsys):
    suite.main(["--frames", "2.5e4", "--report-only", "--results", str(tmp_path)])
    for bad in ("1.5", "1e-3", "inf", "many"):
        with pytest.raises(SystemExit):
            suite.main(["--frames", bad, "--results", str(tmp_path)])
        assert f"{bad!r} is not a whole number" in capsys.readouterr().err


def test_a_worker_that_cannot_see_the_results_folder_sends_the_run_back(tmp_path):
    """On a node without the head's filesystem the run goes to a temporary folder and its files travel back."""
    job = suite.Job("reinforce", "CartPole-v1", 0)
    unseen = tmp_path / "head" / "results"  # its runs/ folder does not exist on this "node"
    arguments = suite.command(job, unseen, 500, 1_000)
    result = suite.run_on_worker(arguments, str(job.folder(unseen)), shipped=False)
    assert result["status"] == 0 and not result["shared"], result["output"][-2000:]
    assert set(result["files"]) == set(suite.RUN_FILES) and not job.folder(unseen).exists()
    suite.RayRunner("local").collect(job, unseen, result)
    record = json.loads(job.record(unseen).read_text())
    assert record["summary"]["frames"] > 0 and record["curve"]
    assert (unseen / "logs" / "reinforce-CartPole-v1-seed0.log").read_text() == result["output"]


def finished_run_files(seed=0):
    summary = {"frames": 1000, "seed": seed, "eval_return_mean": 9.0, "wall_time_s": 1.0, "fps": 1000.0}
    return {
        "summary.json": json.dumps(summary),
        "config.json": json.dumps({"run": {"output_dir": "elsewhere", "total_frames": 1000}}),
        "evaluations.csv": "frames,return_mean\n500,5.0\n1000,9.0\n",
    }


def test_run_files_that_are_not_a_finished_runs_give_no_record_and_a_warning(tmp_path, capsys):
    job = suite.Job("ppo", "CartPole-v1", 0)
    folder = job.folder(tmp_path)
    folder.mkdir(parents=True)
    for name, text in finished_run_files().items():
        (folder / name).write_text(text)
    suite.write_record(job, tmp_path)
    assert json.loads(job.record(tmp_path).read_text())["curve"] == [[500, 5.0], [1000, 9.0]]
    job.record(tmp_path).unlink()
    (folder / "evaluations.csv").unlink()
    os.mkfifo(folder / "evaluations.csv")  # read, it would wait for a writer for ever
    suite.write_record(job, tmp_path)
    assert f"{folder / 'evaluations.csv'} is not a regular file" in capsys.readouterr().out
    for name, text in (("evaluations.csv", "frames,return_mean\n500,NaN\n"), ("summary.json", "[]")):
        (folder / "evaluations.csv").unlink()
        (folder / "evaluations.csv").write_text(finished_run_files()["evaluations.csv"])
        (folder / name).write_text(text)
        suite.write_record(job, tmp_path)
        assert f"warning: {folder} does not hold a finished run's files" in capsys.readouterr().out
        assert not job.record(tmp_path).exists()
        (folder / "summary.json").write_text(finished_run_files()["summary.json"])


def test_files_sent_back_by_a_worker_replace_links_in_the_run_folder_and_never_write_through_them(tmp_path):
    job = suite.Job("ppo", "CartPole-v1", 0)
    folder = job.folder(tmp_path / "results")
    folder.mkdir(parents=True)
    outside = tmp_path / "another-runs-summary.json"
    outside.write_text("kept")
    (folder / "summary.json").symlink_to(outside)
    result = {"status": 0, "output": "", "files": finished_run_files(), "shared": False}
    suite.RayRunner("local").collect(job, tmp_path / "results", result)
    assert outside.read_text() == "kept" and not (folder / "summary.json").is_symlink()
    assert json.loads(job.record(tmp_path / "results").read_text())["summary"]["frames"] == 1000


@pytest.mark.xdist_group("ray")
def test_suite_on_a_ray_cluster(tmp_path, capsys, ray_cluster):
    arguments = ["--algos", "reinforce", "--envs", "CartPole-v1", "--seeds", "0", "1", "--frames", "500",
                 "--results", str(tmp_path), "--ray-address", "local"]  # fmt: skip
    suite.main(arguments)
    output = capsys.readouterr().out
    assert "reinforce CartPole-v1 seed 0: done" in output and "reinforce CartPole-v1 seed 1: done" in output
    for seed in (0, 1):
        assert (tmp_path / "records" / "reinforce" / "CartPole-v1" / f"seed{seed}.json").exists()
        assert (
            tmp_path / "runs" / "reinforce" / "CartPole-v1" / f"seed{seed}" / "agent.ckpt"
        ).exists()  # shared
    suite.main(arguments)
    assert "2 of 2 runs already finished; 0 to run" in capsys.readouterr().out


def test_sb3_settings_convert_and_carry_env_kwargs(tmp_path):
    from benchmarks import sb3_runner

    arguments = sb3_runner.model_arguments(sb3_runner.ZOO_SETTINGS[("ppo", "CartPole-v1")])
    assert "n_envs" not in arguments and arguments["n_epochs"] == 20
    assert arguments["learning_rate"](1.0) == 1e-3 and arguments["learning_rate"](0.5) == 5e-4
    network = sb3_runner.model_arguments(sb3_runner.ZOO_SETTINGS[("ppo", "Hopper-v5")])["policy_kwargs"]
    assert network["activation_fn"].__name__ == "ReLU" and network["net_arch"]["pi"] == [256, 256]
    sb3 = suite.command(suite.Job("sb3-ppo", "LunarLander-v3 continuous=true", 0), tmp_path, 2_000, 1_000)
    assert sb3[-2:] == ["--env-kwargs", "continuous=true"] and sb3[sb3.index("--env") + 1] == "LunarLander-v3"
    missing = subprocess.run(
        [sys.executable, "-m", "benchmarks.sb3_runner", "--algo", "sac", "--env", "CartPole-v1", "--frames", "10",
         "--eval-every", "10", "--output-dir", str(tmp_path / "none")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert missing.returncode == 2 and "no RL Zoo settings for sac on CartPole-v1" in missing.stderr


def test_sb3_runner_writes_a_run_folder_the_suite_reads(tmp_path):
    pytest.importorskip("stable_baselines3")
    from benchmarks import sb3_runner

    folder = tmp_path / "runs" / "sb3-ppo" / "Acrobot-v1" / "seed0"
    sb3_runner.main(["--algo", "ppo", "--env", "Acrobot-v1", "--frames", "4096", "--eval-every", "2048",
                     "--eval-episodes", "1", "--output-dir", str(folder)])  # fmt: skip
    with open(folder / "evaluations.csv") as file:
        assert [int(row["frames"]) for row in csv.DictReader(file)] == [2048, 4096]
    job = suite.Job("sb3-ppo", "Acrobot-v1", 0)
    assert suite.finished(
        job, tmp_path
    )  # VecNormalize'd PPO: 16 envs x 256 steps, evaluated through its stats
    record = json.loads(job.record(tmp_path).read_text())
    assert record["summary"]["frames"] == 4096 and record["config"]["settings"]["normalize"] is True


def test_a_record_that_cannot_be_compared_with_todays_preset_says_so():
    gone = suite.preset_changes({"algorithm": "nosuch", "env": "CartPole-v1", "config": {}})
    assert gone and gone[0].startswith("not comparable with today's preset (ModuleNotFoundError")
    assert "KeyError" in suite.preset_changes({"algorithm": "ppo", "env": "CartPole-v1", "config": {}})[0]
    assert suite.preset_changes({"algorithm": "sb3-ppo", "env": "CartPole-v1", "config": {}}) == []


def test_random_scores_of_atari_games_are_whole_games_of_the_real_score(tmp_path, monkeypatch):
    import envs.atari

    built = []

    def make_atari_env(env_id, training, **kwargs):
        built.append(training)
        return original(env_id, training, **kwargs)

    original = envs.atari.make_atari_env
    monkeypatch.setattr(envs.atari, "make_atari_env", make_atari_env)
    cache = tmp_path / "random_scores.json"
    score = suite.random_score("ALE/Breakout-v5", cache, episodes=1)
    assert built == [False]  # the evaluation envs: whole games, unclipped points
    assert score >= 0 and float(score).is_integer()
    assert json.loads(cache.read_text()) == {"ALE/Breakout-v5": score}


def test_damaged_records_are_left_out_of_the_report_with_a_warning(tmp_path, capsys):
    folder = tmp_path / "records" / "ppo" / "CartPole-v1"
    folder.mkdir(parents=True)
    (folder / "seed0.json").write_text("[" * 100_000 + "]" * 100_000)
    (folder / "seed1.json").write_text(json.dumps({"algorithm": "ppo", "seed": 1}))
    (folder / "seed2.json").write_text(
        json.dumps({"algorithm": "ppo", "env": "CartPole-v1", "seed": 2, "summary": {}, "curve": "up"})
    )
    os.mkfifo(folder / "seed3.json")  # read, it would wait for a writer for ever
    suite.main(["--report-only", "--results", str(tmp_path)])
    output = capsys.readouterr().out
    for seed, reason in (
        (0, "RecursionError"),
        (1, "KeyError: 'summary'"),
        (2, "KeyError: 'frames'"),
        (3, "OSError: " + str(folder / "seed3.json") + " is not a regular file"),
    ):
        assert (
            f"warning: {folder / f'seed{seed}.json'} is not a run record the suite can read ({reason}"
            in output
        )
    assert "| ppo |" not in (tmp_path / "report.md").read_text()


def test_a_stopped_run_at_another_budget_is_not_continued_to_the_old_one(tmp_path):
    job = suite.Job("ppo", "CartPole-v1", 0)
    folder = job.folder(tmp_path)
    folder.mkdir(parents=True)
    (folder / "resume.ckpt").write_bytes(b"")
    (folder / "config.json").write_text(json.dumps({"run": {"total_frames": 60_000}}))
    assert suite.budget_conflicts([job], tmp_path, 60_000) == []
    [conflict] = suite.budget_conflicts([job], tmp_path, 12_000)
    assert (
        conflict
        == f"ppo CartPole-v1 seed 0 has a budget of 60,000 frames in {folder}, this suite asks for 12,000"
    )


def test_records_that_are_not_finite_misplaced_or_copies_stay_out_of_the_report(tmp_path, capsys):
    def record(algorithm, env, seed, final, **config_run):
        return {"algorithm": algorithm, "env": env, "seed": seed, "preset": None, "curve": [[1000, final]],
                "summary": {"frames": 1000, "seed": seed, "eval_return_mean": final, "wall_time_s": 1.0, "fps": 1000.0},
                "config": {"run": {"total_frames": 1000, **config_run}}}  # fmt: skip

    folder = tmp_path / "records" / "ppo" / "CartPole-v1"
    folder.mkdir(parents=True)
    (folder / "seed0.json").write_text(json.dumps(record("ppo", "CartPole-v1", 0, 100.0)))
    (folder / "seed0.old.json").write_text(json.dumps(record("ppo", "CartPole-v1", 0, 300.0)))  # a copy
    (folder / "seed1.json").write_text(json.dumps(record("ppo", "CartPole-v1", 1, float("nan"))))
    (folder / "seed2.json").write_text(json.dumps(record("ppo", "Pendulum-v1", 2, -200.0)))  # moved
    (folder / "seed3.json").write_text(json.dumps(record("ppo", "CartPole-v1", 3, 10**400)))
    (folder / "seed4.json").write_text(json.dumps(record("ppo", "CartPole-v1", 4, 1.0, preset_applied=[1])))
    (tmp_path / "random_scores.json").write_text('{"CartPole-v1": NaN')  # cut short
    suite.main(["--report-only", "--results", str(tmp_path)])
    output = capsys.readouterr().out
    for seed in (1, 3, 4):
        assert (
            f"{folder / f'seed{seed}.json'} is not a run record the suite can read (ValueError: fields"
            in output
        )
    assert "whose place is records/ppo/Pendulum-v1/seed2.json" in output
    assert (
        "random_scores.json cannot be read (JSONDecodeError); the random scores are measured again" in output
    )
    report = (tmp_path / "report.md").read_text()
    assert "| ppo | CartPole-v1 | 1 | 1,000 | 100.0 | 100.0 |" in report and "Pendulum" not in report
    assert json.loads((tmp_path / "random_scores.json").read_text())["CartPole-v1"] > 0  # measured again
    assert "Plots: [aggregate.png](aggregate.png), [curves_CartPole-v1.png](curves_CartPole-v1.png)" in report
    (folder / "seed0.json").unlink()  # no run left: no plots listed from before
    suite.main(["--report-only", "--results", str(tmp_path)])
    assert "no finished runs yet" not in capsys.readouterr().out
    assert "Plots: \n" in (tmp_path / "report.md").read_text() + "\n"


def test_a_run_summary_that_cannot_be_read_is_not_a_finished_run(tmp_path, capsys):
    job = suite.Job("ppo", "CartPole-v1", 0)
    job.folder(tmp_path).mkdir(parents=True)
    (job.folder(tmp_path) / "summary.json").write_text('{"frames": ')
    assert not suite.finished(job, tmp_path)
    assert "summary.json cannot be read (JSONDecodeError)" in capsys.readouterr().out


def test_sb3_runner_refuses_budgets_below_one(capsys):
    from benchmarks import sb3_runner

    for option in ("--frames", "--eval-every", "--eval-episodes"):
        arguments = {"--frames": "10", "--eval-every": "10", "--eval-episodes": "1", option: "0"}
        with pytest.raises(SystemExit):
            sb3_runner.main(["--algo", "ppo", "--env", "CartPole-v1", "--output-dir", "x",
                             *[item for pair in arguments.items() for item in pair]])  # fmt: skip
        assert "must be positive" in capsys.readouterr().err


def test_a_stop_on_a_ray_cluster_cancels_what_was_submitted_and_submits_nothing_more(tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import types

    import ray

    import training.distributed

    runner = suite.RayRunner("local")
    submitted, cancelled = [], []

    class Task:
        def options(self, **options):
            return self

        def remote(self, arguments, folder, shipped):
            submitted.append(len(submitted))
            if (
                len(submitted) == 1
            ):  # SIGTERM while the suite hands out tasks (in this thread, as a handler runs)
                runner.stop(signal.SIGTERM, None)
            return submitted[-1]

    cluster = types.SimpleNamespace(
        remote=lambda **options: lambda function: Task(),
        wait=lambda references, num_returns: ([references[0]], references[1:]),
        get=lambda reference: {"status": -15, "output": "", "files": {}, "shared": True},
        cancel=cancelled.append,
    )
    monkeypatch.setattr(training.distributed, "init_ray", lambda address, workers: cluster)
    monkeypatch.setattr(ray, "cancel", cancelled.append)
    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    handlers = {number: signal.getsignal(number) for number in numbers}
    try:
        runner.run_all([suite.Job("ppo", "CartPole-v1", seed) for seed in range(4)], tmp_path, 1_000, 1_000)
    finally:
        for number, handler in handlers.items():
            signal.signal(number, handler)
    assert submitted == [0] and cancelled == [0] and runner.stopping == signal.SIGTERM


def test_old_sb3_records_have_their_recipe_runs_budget(tmp_path, capsys):
    def record(algorithm, seed, frames, **run):
        return {"algorithm": algorithm, "env": "CartPole-v1", "seed": seed, "preset": None,
                "curve": [[frames, 500.0]], "config": {"run": run},
                "summary": {"frames": frames, "seed": seed, "eval_return_mean": 500.0, "wall_time_s": 10.0,
                            "fps": 100.0}}  # fmt: skip

    for algorithm, run in (("ppo", {"total_frames": 1_000}), ("sb3-ppo", {})):  # SB3's before it kept one
        folder = tmp_path / "records" / algorithm / "CartPole-v1"
        folder.mkdir(parents=True)
        (folder / "seed0.json").write_text(json.dumps(record(algorithm, 0, 1_024, **run)))
    jobs = suite.make_jobs(["ppo"], ["CartPole-v1"], [0], with_sb3=True)
    assert suite.budget_conflicts(jobs, tmp_path, 1_000) == []  # 1,024 frames: one rollout past its 1,000
    assert (
        "sb3-ppo CartPole-v1 seed 0 has a budget of 1,000 frames"
        in suite.budget_conflicts(jobs, tmp_path, 2_000)[1]
    )
    suite.main(["--report-only", "--results", str(tmp_path)])
    report = (tmp_path / "report.md").read_text()
    assert (
        "| ppo | CartPole-v1 | 1 / 1 | 1,024 | 500.0 | 500.0 | 10 / 10 | 1.00x |" in report
    )  # paired with SB3


def test_a_failed_runs_reason_is_its_latest_attempts_error(tmp_path):
    log = tmp_path / "run.log"
    log.write_text(
        "$ python -m recipes.ppo\nerror: --env-kwargs bad\n$ python -m recipes.ppo\nTraceback\nOSError: x\n"
    )
    assert suite.last_error(log) == "OSError: x"
    log.write_text(
        "$ python -m recipes.ppo --resume runs/x\nerror: Another run is writing into runs/x right now\n"
    )
    runner = suite.Runner(1)
    runner.finish(suite.Job("ppo", "CartPole-v1", 0), tmp_path, 2, log, resuming=True)
    [(_, why)] = runner.failures
    assert "that run is still going" in why and "delete" not in why  # no advice to delete a live run's folder


def test_failures_are_named_when_a_signal_stopped_the_suite_too(tmp_path, monkeypatch, capsys):
    def run_all(self, jobs, results, frames, checkpoint_every):
        self.failures.append((jobs[0], "exit 2: error: no such env (log: x.log)"))
        self.stopping = signal.SIGTERM

    monkeypatch.setattr(suite.Runner, "run_all", run_all)
    with pytest.raises(SystemExit) as stopped:
        suite.main(["--algos", "ppo", "--envs", "CartPole-v1", "--seeds", "0", "--frames", "512",
                    "--results", str(tmp_path)])  # fmt: skip
    output = capsys.readouterr().out
    assert stopped.value.code == 128 + signal.SIGTERM and "stopped; run the same command again" in output
    assert "1 of 1 runs failed:\n  ppo CartPole-v1 seed 0: exit 2: error: no such env (log: x.log)" in output


def _record(algorithm, env, seed, final, curve=None):
    return {"algorithm": algorithm, "env": env, "seed": seed, "preset": None, "curve": curve or [[1000, final]],
            "summary": {"frames": 1000, "seed": seed, "eval_return_mean": final, "wall_time_s": 1.0, "fps": 1000.0},
            "config": {"run": {"total_frames": 1000}}}  # fmt: skip


def test_the_report_replaces_links_in_the_results_folder_and_never_writes_through_them(tmp_path):
    results, outside = tmp_path / "results", tmp_path / "outside"
    outside.mkdir()
    folder = results / "records" / "ppo" / "CartPole-v1"
    folder.mkdir(parents=True)
    (folder / "seed0.json").write_text(json.dumps(_record("ppo", "CartPole-v1", 0, 100.0)))
    names = ("summary.csv", "report.md", "curves_CartPole-v1.png", "aggregate.png", "random_scores.json")
    for name in names:
        (outside / name).write_text("kept")
        (results / name).symlink_to(outside / name)
    suite.main(["--report-only", "--results", str(results)])
    for name in names:
        assert (outside / name).read_text() == "kept", name
        assert (results / name).is_file() and not (results / name).is_symlink(), name
    assert "| ppo | CartPole-v1 | 1 | 1,000 | 100.0 |" in (results / "report.md").read_text()


def test_a_runs_log_that_is_a_link_starts_afresh_and_leaves_its_target_alone(tmp_path):
    outside = tmp_path / "someone-elses.log"
    outside.write_text("kept")
    log = tmp_path / "ppo-CartPole-v1-seed0.log"
    log.symlink_to(outside)
    with suite.open_log(log) as file:
        file.write("$ command\n")
    assert outside.read_text() == "kept" and not log.is_symlink() and log.read_text() == "$ command\n"


def test_linked_folders_and_other_runs_in_a_jobs_place_are_refused_before_any_run_starts(tmp_path, capsys):
    results, outside = tmp_path / "results", tmp_path / "someone-elses-run"
    outside.mkdir()
    (outside / "config.json").write_text(json.dumps({"run": {"env_id": "CartPole-v1", "seed": 0}}))
    job = suite.Job("ppo", "CartPole-v1", 0)
    job.folder(results).parent.mkdir(parents=True)
    job.folder(results).symlink_to(outside)
    arguments = ["--algos", "ppo", "--envs", "CartPole-v1", "--seeds", "0", "--frames", "512",
                 "--results", str(results)]  # fmt: skip
    with pytest.raises(SystemExit) as refused:
        suite.main(arguments)
    error = capsys.readouterr().err
    assert refused.value.code == 2
    assert f"{job.folder(results)} is a link (to {outside}): the suite writes only into folders" in error
    assert sorted(path.name for path in outside.iterdir()) == ["config.json"]  # nothing ran there
    assert not (results / "logs").exists()

    job.folder(results).unlink()
    job.folder(results).mkdir()
    config = {"run": {"env_id": "Acrobot-v1", "seed": 7, "env_kwargs": []}}
    (job.folder(results) / "config.json").write_text(json.dumps(config))
    (job.folder(results) / "summary.json").write_text(
        json.dumps({"algorithm": "ppo", "env_id": "Acrobot-v1", "seed": 7})
    )
    with pytest.raises(SystemExit) as refused:
        suite.main(arguments)
    captured = capsys.readouterr()
    assert refused.value.code == 2
    assert (
        f"{job.folder(results)} holds a run of env 'Acrobot-v1', seed 7, not ppo CartPole-v1 seed 0"
        in captured.err
    )
    assert "does not hold a finished run's files (ValueError: it holds a run of env" in captured.out
    assert not job.record(results).exists() and not (results / "logs").exists()
    config["run"] |= {"env_id": "CartPole-v1", "seed": 0}
    (job.folder(results) / "config.json").write_text(json.dumps(config))
    assert suite.foreign_run(job, results) == "a summary.json and a config.json of two runs"
    (job.folder(results) / "summary.json").write_text(
        json.dumps({"algorithm": "dqn", "env_id": "CartPole-v1"})
    )
    assert suite.foreign_run(job, results) == "a run of algorithm 'dqn'"
    (job.folder(results) / "summary.json").unlink()
    config["run"]["env_kwargs"] = ["sutton_barto_reward=true"]
    (job.folder(results) / "config.json").write_text(json.dumps(config))
    assert suite.foreign_run(job, results) == "a run of env kwargs ['sutton_barto_reward=true']"


def test_a_results_path_that_is_a_file_and_oversized_run_files_are_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    for results in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(SystemExit):
            suite.main(["--algos", "ppo", "--envs", "CartPole-v1", "--results", str(results)])
        assert f"--results {results}" in capsys.readouterr().err
    big = tmp_path / "seed0.json"
    with open(big, "wb") as file:
        file.truncate(suite.MAX_RUN_FILE_BYTES + 1)  # sparse: no disk used
    with pytest.raises(ValueError, match="more than a run writes"):
        suite.read_regular(big)
    long_curve = [[frame, 1.0] for frame in range(suite.MAX_CURVE_POINTS + 1)]
    with pytest.raises(ValueError, match="fields missing"):
        suite._check_record(_record("ppo", "CartPole-v1", 0, 1.0, curve=long_curve))
