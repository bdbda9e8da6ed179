"""recipes.tune: a tiny Optuna study runs, prunes a trial, continues from its storage, survives Ctrl-C with the
trial marked failed, and writes a preset file that a recipe then trains with."""

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from run_helpers import interrupt_at

from errors import InputError
from recipes import ppo, tune
from training.tuning import read_search_space

optuna = pytest.importorskip("optuna")
ROOT = Path(__file__).resolve().parents[1]


def space_file(tmp_path):
    path = tmp_path / "space.toml"
    path.write_text("lr = { low = 1e-4, high = 1e-2, log = true }\nnum_epochs = { choices = [1, 2] }\n")
    return path


def tiny(tmp_path, **options):
    settings = {
        "algorithm": "ppo",
        "env_id": "CartPole-v1",
        "trials": 2,
        "frames_per_trial": 1_024,
        "eval_every": 512,
        "eval_episodes": 2,
        "jobs": 1,
        "search_space": space_file(tmp_path),
        "output_dir": tmp_path / "study",
        **options,
    }
    return tune.TuneConfig(**settings)


def states(tmp_path):
    study = optuna.load_study(
        study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    )
    return [trial.state.name for trial in study.get_trials(deepcopy=False)]


def test_a_study_runs_prunes_continues_and_its_best_trial_becomes_a_preset(tmp_path):
    first = tune.main(tiny(tmp_path))
    assert first["trials"] == {"complete": 2} and states(tmp_path) == ["COMPLETE", "COMPLETE"]
    # the same storage continues the study; a threshold no run reaches prunes the new trial at its first evaluation
    summary = tune.main(tiny(tmp_path, trials=3, pruner="threshold", prune_below=1e9))
    assert states(tmp_path) == ["COMPLETE", "COMPLETE", "PRUNED"]
    folder = tmp_path / "study"
    assert sorted(path.name for path in (folder / "trials").iterdir()) == [
        "trial-0000",
        "trial-0001",
        "trial-0002",
    ]
    pruned_rows = (folder / "trials" / "trial-0002" / "evaluations.csv").read_text().splitlines()
    assert len(pruned_rows) == 2  # header and the one evaluation it was pruned at
    assert (folder / "results.md").read_text().count("\n") == 4  # header, rule, the two complete trials
    assert (folder / "optimization_history.png").stat().st_size > 0
    preset = json.loads(Path(summary["best_preset"]).read_text())
    ((name, table),) = preset.items()
    assert name == "tuned-ppo-CartPole-v1" and table["env_id"] == "CartPole-v1"
    assert table["num_epochs"] in (1, 2) and 1e-4 <= table["lr"] <= 1e-2
    # what CartPole-v1's preset set beside the sample, and the trial's budget: the trial is reproduced
    assert table["num_envs"] == 16 and table["total_frames"] == 1_024
    # a recipe takes the file: --preset auto finds the tuned preset for the env first
    config = ppo.PPOConfig()
    run = config.run
    run.total_frames, run.eval_every, run.eval_episodes = 512, 512, 2
    run.preset_file, run.output_dir = Path(summary["best_preset"]), tmp_path / "run"
    run.logger, run.video, run.progress = "none", False, False
    result = ppo.main(config)
    assert config.run.preset_applied["name"] == "tuned-ppo-CartPole-v1"
    assert (
        config.optim.lr == table["lr"]
        and config.optim.num_epochs == table["num_epochs"]
        and result["frames"] >= 512
    )


def test_ctrl_c_marks_the_running_trial_failed_and_the_study_goes_on(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 512)
        summary = tune.main(tiny(tmp_path))
    assert summary["trials"] == {"fail": 1} and states(tmp_path) == ["FAIL"]
    assert summary["interrupted_by"] == "SIGINT"  # the command line exits 130 after writing the results
    summary = tune.main(tiny(tmp_path))
    assert states(tmp_path) == ["FAIL", "COMPLETE", "COMPLETE"] and summary["best_trial"] in (1, 2)
    assert summary["interrupted_by"] is None


def test_trials_run_in_worker_processes_from_the_command_line(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "recipes.tune",
            "ppo",
            "--trials",
            "3",
            "--frames-per-trial",
            "512",
            "--eval-every",
            "512",
            "--eval-episodes",
            "1",
            "--jobs",
            "2",
            "--search-space",
            str(space_file(tmp_path)),
            "--output-dir",
            str(tmp_path / "study"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()  # TorchRL logs a line or two before the summary
    summary = json.loads("\n".join(lines[lines.index("{") : lines.index("}") + 1]))
    assert (
        summary["trials"].get("complete", 0) + summary["trials"].get("pruned", 0) == 3
    )  # none from a second job
    assert "--preset-file" in result.stderr and "--preset tuned-ppo-CartPole-v1" in result.stderr


def test_the_recipes_search_spaces_fit_their_recipes():
    for algorithm in tune.RECIPES:
        space = read_search_space(algorithm)
        tune.check_space_fits(space, tune.recipe_config(tune.TuneConfig(algorithm)), "search_spaces.toml")


@pytest.mark.parametrize(
    ("options", "space", "message"),
    [
        (
            {},
            "no_such_option = { low = 1, high = 2 }",
            "no_such_option is not a hyperparameter of this recipe",
        ),
        ({}, "lr = { low = 0.0, high = 1.0, log = true }", "log scale, so low must be above 0"),
        ({}, "lr = { low = 2.0, high = 1.0 }", "needs finite low < high"),
        ({}, "lr = { low = 1e-4, high = inf }", "needs finite low < high"),
        ({}, "lr = { low = -inf, high = 1.0 }", "needs finite low < high"),
        (
            {},
            "[dqn]\nlr = { low = 1e-4, high = 1e-2 }",
            r"no search space for recipes.ppo \(its tables are for dqn\)",
        ),
        ({}, "num_epochs = { low = 1, high = 1" + "0" * 400 + " }", "needs finite low < high"),
        ({}, "activation = { choices = ['sigmoid'] }", "activation cannot be"),
        ({}, "lr = { low = 1e-4, high = 1e-2, log = true, step = 1e-4 }", "lr cannot be sampled"),
        ({}, 'lr = { low = 1e-4, high = 1e-3, step = "a" }', "lr's step must be a positive number"),
        ({}, "lr = { low = 1e-4, high = 1e-3, step = true }", "lr's step must be a positive number"),
        (
            {},
            "num_epochs = { low = 1, high = 10, step = 0.5 }",
            "num_epochs's step must be a positive integer",
        ),
        ({}, 'lr = { low = 1e-4, high = 1e-3, log = "false" }', "lr's log must be true or false"),
        ({"prune_below": 5.0}, "lr = { low = 1e-4, high = 1e-3 }", "--prune-below is for --pruner threshold"),
        ({"seed": -1}, "lr = { low = 1e-4, high = 1e-3 }", r"--seed must be in \[0, 2\*\*32\), got -1"),
        (
            {"seed": 2**32},
            "lr = { low = 1e-4, high = 1e-3 }",
            r"--seed must be in \[0, 2\*\*32\), got 4294967296",
        ),
        (
            {"pruner": "threshold"},
            "lr = { low = 1e-4, high = 1e-3 }",
            "--pruner threshold needs --prune-below",
        ),
    ],
)
def test_bad_options_are_refused_before_any_trial(tmp_path, options, space, message):
    path = tmp_path / "bad.toml"
    path.write_text(space + "\n")
    with pytest.raises(InputError, match=message):
        tune.main(tiny(tmp_path, search_space=path, **options))
    assert not (tmp_path / "study" / "trials").exists()


def test_a_study_continued_with_other_settings_is_refused(tmp_path):
    tune.main(tiny(tmp_path, trials=1))
    with pytest.raises(
        InputError, match=r"^Study 'ppo-CartPole-v1' in .* tunes frames_per_trial=1024, not 2048"
    ):
        tune.main(tiny(tmp_path, trials=1, frames_per_trial=2_048))  # the refusal itself, not a "damaged" one
    # trials scored another way: stopped at a return, over other episodes, from another base preset
    for option, value, message in [
        ("stop_at_return", 100.0, "tunes stop_at_return=inf, not 100.0"),
        ("eval_episodes", 5, "tunes eval_episodes=2, not 5"),
        ("preset", "none", "tunes preset='auto', not 'none'"),
    ]:
        with pytest.raises(InputError, match=re.escape(message)):
            tune.main(tiny(tmp_path, trials=1, **{option: value}))


def test_list_presets_shows_a_preset_file_first(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({"mine": {"source": "a test", "env_id": "CartPole-v1", "lr": 0.001}}))
    result = subprocess.run(
        [sys.executable, "-m", "recipes.ppo", "--list-presets", "--preset-file", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        check=True,
    )
    assert "mine  [CartPole-v1]" in result.stdout and "source: a test" in result.stdout
    assert "--lr 0.001" in result.stdout and result.stdout.index("mine") < result.stdout.index("ppo.toml")


def test_results_replace_a_link_instead_of_writing_through_it(tmp_path):
    outside = tmp_path / "outside.md"
    outside.write_text("precious")
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "results.md").symlink_to(outside)
    tune.main(tiny(tmp_path, trials=1))
    assert outside.read_text() == "precious" and not (tmp_path / "study" / "results.md").is_symlink()


@pytest.mark.parametrize("name", ["study.db", ".trials.lock"])
def test_a_link_in_place_of_the_study_s_own_files_is_refused(tmp_path, name):
    outside = tmp_path / "outside"
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / name).symlink_to(outside)
    with pytest.raises(InputError, match=f"{name} is a link; the study writes its own files there"):
        tune.main(tiny(tmp_path, trials=1))
    assert not outside.exists()


def test_a_study_file_that_is_not_a_database_is_one_line(tmp_path):
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "study.db").write_bytes(bytes(range(256)) * 20)
    with pytest.raises(
        InputError, match=r"Could not open the study's storage .*study.db \(file is not a database\)"
    ):
        tune.main(tiny(tmp_path, trials=1))


def test_a_trial_over_several_seeds_scores_their_mean_and_its_steps_run_on(tmp_path):
    summary = tune.main(tiny(tmp_path, trials=1, seeds_per_trial=2))
    trial_folder = tmp_path / "study" / "trials" / "trial-0000"
    assert sorted(path.name for path in trial_folder.iterdir()) == ["seed-0", "seed-1"]
    finals = []
    for seed in (0, 1):
        rows = (trial_folder / f"seed-{seed}" / "evaluations.csv").read_text().splitlines()
        header = rows[0].split(",")
        finals.append(float(rows[-1].split(",")[header.index("return_mean")]))
        run = json.loads((trial_folder / f"seed-{seed}" / "config.json").read_text())["run"]
        # every trial trains its whole budget: the env's reward threshold does not end it at a lucky evaluation
        assert run["seed"] == seed and run["stop_at_return"] == float("inf")
    study = optuna.load_study(
        study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    )
    (trial,) = study.get_trials(deepcopy=False)
    assert trial.value == pytest.approx(sum(finals) / 2) and trial.user_attrs["returns"] == pytest.approx(
        finals
    )
    # the second seed's evaluations are reported after the first's: the pruner compares like with like
    steps = sorted(trial.intermediate_values)
    assert len(steps) == 4 and steps[1] <= 1_024 < steps[2] and steps[-1] <= 2_048
    assert (
        "over 2 seeds"
        in json.loads(Path(summary["best_preset"]).read_text())["tuned-ppo-CartPole-v1"]["source"]
    )
    assert "| 0 |" in (tmp_path / "study" / "results.md").read_text()
    # the next trial trains the next seeds; a study is continued only with its own seeds per trial
    tune.main(tiny(tmp_path, trials=2, seeds_per_trial=2))
    assert sorted(path.name for path in (trial_folder.parent / "trial-0001").iterdir()) == [
        "seed-2",
        "seed-3",
    ]
    with pytest.raises(InputError, match="tunes seeds_per_trial=2, not 1"):
        tune.main(tiny(tmp_path, trials=3))


def test_trial_seeds_past_the_last_seed_wrap_around_to_zero(tmp_path):
    tune.main(tiny(tmp_path, seed=2**32 - 1))
    seeds = [
        json.loads((tmp_path / "study" / "trials" / f"trial-000{number}" / "config.json").read_text())["run"][
            "seed"
        ]
        for number in (0, 1)
    ]
    assert seeds == [2**32 - 1, 0]


def test_a_trial_stops_at_a_given_return_and_nan_is_refused(tmp_path):
    tune.main(
        tiny(tmp_path, trials=1, stop_at_return=-1e9)
    )  # any evaluation reaches it: the run ends at the first
    rows = (tmp_path / "study" / "trials" / "trial-0000" / "evaluations.csv").read_text().splitlines()
    assert len(rows) == 2
    with pytest.raises(InputError, match="--stop-at-return must be a number"):
        tune.main(tiny(tmp_path, stop_at_return=float("nan")))


def test_a_study_whose_trials_all_fail_stops_with_the_failure(tmp_path):
    space = tmp_path / "bad.toml"  # a minibatch larger than any batch of the trial: every sample fails
    space.write_text("minibatch_size = { choices = [100000] }\n")
    with pytest.raises(InputError, match="All 2 trials failed; the last with: .*minibatch"):
        tune.main(tiny(tmp_path, search_space=space))
    assert states(tmp_path) == ["FAIL", "FAIL"]


def test_a_study_stops_on_as_many_failed_trials_as_asked_for_with_a_warning(tmp_path, monkeypatch, capsys):
    def every_other_fails(config, space, trial):  # trials 0, 2, 4, ... fail
        if trial.number % 2 == 0:
            trial.set_user_attr("error", f"trial {trial.number} failed.")
            raise InputError(f"trial {trial.number} failed.")
        return float(trial.number)

    monkeypatch.setattr(tune, "objective", every_other_fails)
    summary = tune.main(tiny(tmp_path, trials=2))
    assert states(tmp_path) == ["FAIL", "COMPLETE", "FAIL"] and summary["best_trial"] == 1
    assert (
        "warning: 2 trials failed, so the study stopped with 1 finished trials of the 2 asked; the last failure: "
        "trial 2 failed." in capsys.readouterr().err
    )
    # a continued study counts its own failures: trials 3 and 5 complete the 3 asked for, 4 fails
    summary = tune.main(tiny(tmp_path, trials=3))
    assert states(tmp_path) == ["FAIL", "COMPLETE", "FAIL", "COMPLETE", "FAIL", "COMPLETE"]
    assert "warning" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("second", "message"),
    [
        ("minibatch_size = { choices = [64] }", "sampled minibatch_size from CategoricalDistribution"),
        ("minibatch_size = { low = 32, high = 64 }", "sampled minibatch_size from CategoricalDistribution"),
        ("lr = { low = 1e-4, high = 1e-2 }", "sampled lr from FloatDistribution.*log=True"),
    ],
)
def test_a_study_continued_with_a_search_space_optuna_cannot_continue_is_refused(tmp_path, second, message):
    first = tmp_path / "first.toml"
    first.write_text(
        "minibatch_size = { choices = [32, 64] }\nlr = { low = 1e-4, high = 1e-2, log = true }\n"
    )
    tune.main(tiny(tmp_path, search_space=first, trials=1))
    changed = tmp_path / "second.toml"
    changed.write_text(second + "\n")
    with pytest.raises(InputError, match=message):
        tune.main(tiny(tmp_path, search_space=changed, trials=2))
    assert states(tmp_path) == ["COMPLETE"]  # refused before any trial
    # other bounds of a range continue, as Optuna allows
    changed.write_text("lr = { low = 1e-3, high = 1e-2, log = true }\n")
    tune.main(tiny(tmp_path, search_space=changed, trials=2))
    assert states(tmp_path) == ["COMPLETE", "COMPLETE"]


def test_a_continued_study_draws_new_options(tmp_path):
    tune.main(tiny(tmp_path, trials=2, frames_per_trial=512, eval_every=512))
    tune.main(tiny(tmp_path, trials=4, frames_per_trial=512, eval_every=512))
    study = optuna.load_study(
        study_name="ppo-CartPole-v1", storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}"
    )
    learning_rates = [trial.params["lr"] for trial in study.get_trials(deepcopy=False)]
    assert len(learning_rates) == 4 and len(set(learning_rates)) == 4  # not trials 0 and 1 over again


def test_each_worker_process_gives_its_trials_its_share_of_the_cores(tmp_path, monkeypatch):
    tune.main(tiny(tmp_path, trials=1, frames_per_trial=512, eval_every=512))  # the study holds its one trial
    monkeypatch.setattr(tune.os, "cpu_count", lambda: 8)
    threads, handler = torch.get_num_threads(), signal.getsignal(signal.SIGTERM)
    try:
        # a worker of two: a recipe keeping torch's default threads (SAC's, TD3's on large networks) gets 8 / 2
        assert tune.run_worker(tiny(tmp_path, trials=1, jobs=2), 0) is None
        assert torch.get_num_threads() == 4
        torch.set_num_threads(1)
        # one job: the process's threads are the recipe's
        tune.run_worker(tiny(tmp_path, trials=1, jobs=1), 0)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
        signal.signal(signal.SIGTERM, handler)


def test_sigterm_with_one_job_is_named_as_itself(tmp_path, monkeypatch):
    original = tune.objective

    def objective(config, space, trial):  # the trial's run saved and stopped on SIGTERM
        raise tune.Stop("SIGTERM")

    monkeypatch.setattr(tune, "objective", objective)
    assert tune.main(tiny(tmp_path, trials=1))["interrupted_by"] == "SIGTERM"
    monkeypatch.setattr(tune, "objective", original)


def test_sigterm_to_a_study_with_worker_processes_stops_them_and_writes_the_results(tmp_path):
    import signal
    import time

    command = [sys.executable, "-m", "recipes.tune", "ppo", "--trials", "4", "--frames-per-trial", "200000",
               "--eval-every", "100000", "--eval-episodes", "1", "--jobs", "2", "--search-space",
               str(space_file(tmp_path)), "--output-dir", str(tmp_path / "study")]  # fmt: skip
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while (
        time.monotonic() < deadline and len(list((tmp_path / "study").glob("trials/trial-*/config.json"))) < 2
    ):
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    _, error = process.communicate(timeout=240)
    assert process.returncode == 128 + signal.SIGTERM, error[-2000:]
    assert states(tmp_path) == ["FAIL", "FAIL"]  # both workers ended their trials, and took no more
    assert json.loads((tmp_path / "study" / ".study").read_text()) == {"study": "ppo-CartPole-v1"}


def test_a_folder_of_another_study_or_with_links_or_a_foreign_database_is_refused(tmp_path):
    import sqlite3

    tune.main(tiny(tmp_path, trials=1))
    with pytest.raises(
        InputError, match="holds the study 'ppo-CartPole-v1', whose trials and results this study"
    ):
        tune.main(tiny(tmp_path, trials=1, algorithm="a2c", search_space=None))
    (tmp_path / "links").mkdir()
    (tmp_path / "links" / "trials").symlink_to(tmp_path / "study" / "trials")
    with pytest.raises(InputError, match="trials is a link; the study writes its own files there"):
        tune.main(tiny(tmp_path, trials=1, output_dir=tmp_path / "links"))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with sqlite3.connect(foreign / "study.db") as connection:
        connection.execute("create table customers(name text)")
    connection.close()
    with pytest.raises(InputError, match=r"study.db is a database of another program \(tables customers\)"):
        tune.main(tiny(tmp_path, trials=1, output_dir=foreign))
    with sqlite3.connect(foreign / "study.db") as connection:
        tables = [row[0] for row in connection.execute("select name from sqlite_master where type='table'")]
    connection.close()
    assert tables == ["customers"] and not (foreign / ".study").exists()  # nothing written there
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(InputError, match="cannot be a folder"):
        tune.main(tiny(tmp_path, trials=1, output_dir=tmp_path / "file"))
    (tmp_path / "locked" / ".trials.lock").mkdir(parents=True)
    with pytest.raises(InputError, match="is not a file; the study keeps its lock there"):
        tune.main(tiny(tmp_path, trials=1, output_dir=tmp_path / "locked"))
    (tmp_path / "piped").mkdir()
    os.mkfifo(tmp_path / "piped" / ".study")  # read, it would wait for a writer
    with pytest.raises(InputError, match=r"\.study is damaged; move it away"):
        tune.main(tiny(tmp_path, trials=1, output_dir=tmp_path / "piped"))


def test_a_trial_folder_that_is_a_link_fails_that_trial_only(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "notes.txt").write_text("keep")
    (tmp_path / "study" / "trials").mkdir(parents=True)
    (tmp_path / "study" / "trials" / "trial-0000").symlink_to(outside)
    tune.main(tiny(tmp_path, trials=2))
    assert states(tmp_path) == ["FAIL", "COMPLETE", "COMPLETE"] and sorted(
        path.name for path in outside.iterdir()
    ) == ["notes.txt"]


@pytest.mark.parametrize(
    "edit",
    [
        "update trial_user_attributes set value_json = '\"abc\"' where key = 'returns'",
        "update trial_user_attributes set value_json = '[1, 2]' where key = 'preset_set'",
        "update trial_params set distribution_json = '{bad'",
        "update trial_params set param_value = 7.0 where param_name = 'num_epochs'",
        "update study_user_attributes set value_json = '{bad' where key = 'algorithm'",
    ],
)
def test_a_study_database_with_damaged_records_is_one_line(tmp_path, edit):
    import sqlite3

    tune.main(tiny(tmp_path, trials=1))
    with sqlite3.connect(tmp_path / "study" / "study.db") as connection:
        assert connection.execute(edit).rowcount > 0
    connection.close()
    with pytest.raises(
        InputError, match=r"study.db holds records no study writes \(\w+: .*\); it is damaged"
    ):
        tune.main(tiny(tmp_path, trials=1))  # no trial to run: the results are read from the storage


def test_a_study_folder_that_cannot_be_written_and_another_programs_storage_are_refused(tmp_path):
    import sqlite3

    tune.main(tiny(tmp_path, trials=1))
    folder = tmp_path / "study"
    if subprocess.run(["chattr", "+i", str(folder)], check=False, capture_output=True).returncode != 0:
        folder.chmod(0o500)  # enough where the tests do not run as root
    try:
        with pytest.raises(InputError, match=r"Cannot write in the study folder .*study \("):
            tune.main(tiny(tmp_path, trials=2))
    finally:
        subprocess.run(["chattr", "-i", str(folder)], check=False, capture_output=True)
        folder.chmod(0o755)
    with sqlite3.connect(tmp_path / "theirs.db") as connection:
        connection.execute("create table users(id int, name text)")
    connection.close()
    storage = f"sqlite:///{tmp_path / 'theirs.db'}"
    with pytest.raises(InputError, match=r"theirs.db is a database of another program \(tables users\)"):
        tune.main(tiny(tmp_path, trials=1, output_dir=tmp_path / "other", storage=storage))
    with sqlite3.connect(tmp_path / "theirs.db") as connection:
        tables = [row[0] for row in connection.execute("select name from sqlite_master where type='table'")]
    connection.close()
    assert tables == ["users"]
