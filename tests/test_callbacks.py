"""Callbacks: each hook is called when its docstring says, a hook returning False stops the run (which still ends
with its evaluation, checkpoint and summary), every recipe's main takes them, and anything else is refused before
any work."""

import csv
import json

import pytest
from run_helpers import (
    tiny_a2c,
    tiny_dqn,
    tiny_es,
    tiny_off_policy,
    tiny_ppo,
    tiny_qlearning,
    tiny_reinforce,
    tiny_rnd_ppo,
    tiny_vpg,
)

from errors import InputError
from recipes import a2c, ddpg, dqn, es, ppo, qlearning, reinforce, rnd_ppo, sac, td3, vpg
from training import Callback


class Recorder(Callback):
    """Records every call; returns False from ``stop_hook`` once ``run.frames`` reaches ``stop_at``."""

    def __init__(self, stop_hook=None, stop_at=None):
        self.calls = []
        self.stop_hook, self.stop_at = stop_hook, stop_at

    def _stop(self, hook, run):
        return False if hook == self.stop_hook and run.frames >= self.stop_at else None

    def on_start(self, run):
        self.calls.append(("start", run.frames))

    def on_batch(self, run, batch, metrics):
        self.calls.append(("batch", run.frames, batch.numel(), dict(metrics)))
        return self._stop("batch", run)

    def on_evaluation(self, run, evaluation):
        self.calls.append(("evaluation", run.frames, dict(evaluation)))
        return self._stop("evaluation", run)

    def on_checkpoint(self, run, path):
        self.calls.append(("checkpoint", run.frames, path.name, path.is_file()))
        return self._stop("checkpoint", run)

    def on_end(self, run, summary):
        self.calls.append(("end", run.frames, summary))

    def hooks(self, name):
        return [call for call in self.calls if call[0] == name]


def test_every_hook_is_called_when_due(output_dir):
    recorder = Recorder()
    summary = ppo.main(tiny_ppo(output_dir, checkpoint_every=1_024), callbacks=[recorder])
    assert recorder.calls[0] == ("start", 0) and recorder.calls[-1] == ("end", 2_048, summary)
    batches = recorder.hooks("batch")
    assert [call[1] for call in batches] == list(range(128, 2_049, 128))  # frames count the batch
    assert all(call[2] == 128 and "train/loss_objective" in call[3] for call in batches)
    rows = list(csv.DictReader((output_dir / "evaluations.csv").open()))
    evaluations = recorder.hooks("evaluation")
    assert [call[1] for call in evaluations] == [512, 1_024, 1_536, 2_048]
    assert [call[2]["return_mean"] for call in evaluations] == [float(row["return_mean"]) for row in rows]
    checkpoints = [(frames, name) for _, frames, name, exists in recorder.hooks("checkpoint") if exists]
    assert len(checkpoints) == len(recorder.hooks("checkpoint"))  # each written before its hook
    assert (1_024, "agent.ckpt") in checkpoints and (1_024, "resume.ckpt") in checkpoints
    assert (2_048, "agent.ckpt") in checkpoints  # the final one
    assert len(set(checkpoints)) == len(checkpoints)  # each file once per frame count
    assert summary["stopped_by_callback"] is None


@pytest.mark.parametrize(
    "eval_every", [512, 100_000]
)  # the last evaluation in the last batch, or in finish()
def test_a_hook_returning_false_as_the_budget_ends_stops_nothing(output_dir, eval_every):
    recorder = Recorder(stop_hook="evaluation", stop_at=2_048)
    summary = ppo.main(tiny_ppo(output_dir, eval_every=eval_every), callbacks=[recorder])
    assert summary["frames"] == 2_048 and summary["stopped_by_callback"] is None
    assert recorder.hooks("evaluation")[-1][1] == 2_048


@pytest.mark.parametrize("hook", ["batch", "evaluation", "checkpoint"])
def test_a_hook_returning_false_stops_the_run_which_ends_as_usual(output_dir, hook):
    recorder = Recorder(stop_hook=hook, stop_at=1_024)
    summary = ppo.main(tiny_ppo(output_dir, checkpoint_every=512), callbacks=[recorder, Callback()])
    assert summary["frames"] == 1_024 and summary["stopped_by_callback"] == "Recorder"
    assert json.loads((output_dir / "summary.json").read_text())["stopped_by_callback"] == "Recorder"
    assert (output_dir / "agent.ckpt").is_file() and recorder.calls[-1][0] == "end"
    assert recorder.hooks("evaluation")[-1][1] == 1_024  # the final evaluation at the stop


def test_callbacks_see_the_frames_of_a_resumed_run(output_dir, monkeypatch):
    from run_helpers import interrupt_at

    interrupt_at(monkeypatch, 1_024)
    ppo.main(tiny_ppo(output_dir))
    recorder = Recorder()
    ppo.main(tiny_ppo(output_dir, resume=output_dir), callbacks=[recorder])
    assert recorder.calls[0] == ("start", 1_024)
    assert [call[1] for call in recorder.hooks("batch")] == list(range(1_152, 2_049, 128))


RECIPES = [
    (ppo, tiny_ppo),
    (a2c, tiny_a2c),
    (rnd_ppo, tiny_rnd_ppo),
    (reinforce, tiny_reinforce),
    (vpg, tiny_vpg),
    (dqn, tiny_dqn),
    (sac, tiny_off_policy(sac.SACConfig)),
    (td3, tiny_off_policy(td3.TD3Config)),
    (ddpg, tiny_off_policy(ddpg.DDPGConfig)),
    (qlearning, tiny_qlearning),
    (es, tiny_es),
]


@pytest.mark.filterwarnings("ignore:The run ended without a gradient step")
@pytest.mark.parametrize(("recipe", "make_config"), RECIPES, ids=[recipe.__name__ for recipe, _ in RECIPES])
def test_every_recipe_stops_when_a_callback_says_so(output_dir, recipe, make_config):
    recorder = Recorder(stop_hook="batch", stop_at=1)  # stop after the first batch
    summary = recipe.main(make_config(output_dir), callbacks=[recorder])
    first_batch = recorder.hooks("batch")[0]
    assert len(recorder.hooks("batch")) == 1 and summary["frames"] == first_batch[1]
    assert summary["stopped_by_callback"] == "Recorder" and recorder.hooks("end")


@pytest.mark.parametrize("callbacks", [[print], [Recorder], ["stop"], [Recorder(), None]])
def test_anything_but_callback_instances_is_refused_before_any_work(output_dir, callbacks):
    with pytest.raises(InputError, match="callbacks takes training.Callback instances"):
        ppo.main(tiny_ppo(output_dir), callbacks=callbacks)
    assert not output_dir.exists()


class Returns(Callback):
    """Returns ``value`` from on_batch."""

    def __init__(self, value):
        self.value = value

    def on_batch(self, run, batch, metrics):
        return self.value


def test_numpy_false_stops_the_run_like_false(output_dir):
    import numpy as np

    summary = ppo.main(tiny_ppo(output_dir), callbacks=[Returns(np.False_)])
    assert summary["stopped_by_callback"] == "Returns" and summary["frames"] == 128


@pytest.mark.parametrize("value", [0, "stop", [], 0.0])
def test_a_hook_returning_neither_a_bool_nor_none_is_refused(output_dir, value):
    with pytest.raises(InputError, match=r"Returns\.on_batch returned .* a hook returns False to stop"):
        ppo.main(tiny_ppo(output_dir), callbacks=[Returns(value)])


def test_main_refuses_another_recipes_config_a_config_class_and_positional_callbacks(output_dir):
    with pytest.raises(
        InputError, match=r"recipes.ppo.main takes a PPOConfig instance \(PPOConfig\(\)\), got DQNConfig"
    ):
        ppo.main(dqn.DQNConfig())
    with pytest.raises(InputError, match="got the class PPOConfig"):
        ppo.main(ppo.PPOConfig)
    with pytest.raises(
        InputError, match=r"Callbacks go by keyword: recipes.ppo.main\(config, callbacks=\[...\]\)"
    ):
        ppo.main(tiny_ppo(output_dir), [Recorder()])
    assert not output_dir.exists()
