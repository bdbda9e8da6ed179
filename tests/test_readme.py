"""The README's examples run exactly as written."""

import re
import warnings
from pathlib import Path

README = Path(__file__).parents[1] / "README.md"


def readme_example(name: str) -> str:
    match = re.search(rf"<!-- example: {name} -->\n```python\n(.*?)```", README.read_text(), re.DOTALL)
    assert match, f"README has no example {name!r}"
    return match.group(1)


def test_own_loop_example_trains_and_saves(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        exec(compile(readme_example("own-loop"), "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    assert not [warning for warning in caught if issubclass(warning.category, FutureWarning)]
    assert "return" in capsys.readouterr().out
    assert namespace["result"].mean > 100  # a random policy scores about 20
    assert (tmp_path / "my_agent.ckpt").exists()


def test_callbacks_example_stops_the_run_where_it_says(tmp_path, monkeypatch, capsys):
    import csv

    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_example("callbacks"), "README.md", "exec"), namespace)  # noqa: S102 - the README's own code
    summary = namespace["summary"]
    rows = list(csv.DictReader((Path(summary["output_dir"]) / "evaluations.csv").read_text().splitlines()))
    printed = [line for line in capsys.readouterr().out.splitlines() if " frames: " in line]
    assert len(printed) == len(rows)  # one line per evaluation
    last = rows[-1]
    steady = float(last["return_mean"]) > 200 and float(last["return_std"]) < 50
    ended_anyway = summary["solved_at_frames"] is not None or summary["frames"] >= config_total(namespace)
    # the callback is named when it stopped the run, not when the run ended at that evaluation anyway
    assert (summary["stopped_by_callback"] == "StopWhenSteady") == (steady and not ended_anyway)
    assert summary["stopped_by_callback"] == "StopWhenSteady" or ended_anyway


def config_total(namespace) -> int:
    """The budget the example's run had (its preset's, as applied to the config)."""
    return namespace["config"].run.total_frames


def test_onnx_example_runs_an_exported_policy(tmp_path, monkeypatch, capsys):
    import gymnasium as gym

    from agents import Agent
    from recipes import export

    monkeypatch.chdir(tmp_path)
    env = gym.make("CartPole-v1")
    Agent.build("CartPole-v1", env.observation_space, env.action_space, "ppo").save("runs/demo/agent.ckpt")
    export.main(export.ExportConfig(Path("runs/demo")))
    exec(compile(readme_example("onnx"), "README.md", "exec"), {})  # noqa: S102 - the README's own code
    assert float(capsys.readouterr().out.split()[-1]) >= 8  # a CartPole episode lasts at least 8 steps
