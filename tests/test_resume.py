"""Exact resume: a run stopped half-way (as by SIGINT) and continued with --resume ends with the same parameters as
one that ran straight through; what resume refuses, and how."""

import json
import pickle
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from run_helpers import (
    interrupt_at,
    tiny_a2c,
    tiny_dqn,
    tiny_es,
    tiny_off_policy,
    tiny_ppo,
    tiny_qlearning,
    tiny_reinforce,
    tiny_rnd_ppo,
    tiny_vpg,
    with_options,
)

from agents import Agent, NStepReturns
from errors import InputError
from recipes import a2c, ddpg, dqn, es, ppo, qlearning, reinforce, rnd_ppo, sac, td3, vpg
from training import Run, TrainingState
from training.resume import RESUME_FILE, config_from_dict, explicit_options


def parameters(output_dir):
    return Agent.load(output_dir / "agent.ckpt").policy.state_dict()


CASES = {
    "dqn": (dqn.main, tiny_dqn, {}),
    "dqn-rainbow": (dqn.main, tiny_dqn, {"variant": "rainbow"}),
    "ppo": (ppo.main, tiny_ppo, {}),
    "sac": (sac.main, tiny_off_policy(sac.SACConfig), {}),
    "td3": (td3.main, tiny_off_policy(td3.TD3Config), {}),
    "sac-normalized": (sac.main, tiny_off_policy(sac.SACConfig), {"network.normalize_obs": True}),
    "td3-normalized": (td3.main, tiny_off_policy(td3.TD3Config), {"network.normalize_obs": True}),
    "ddpg-ou": (ddpg.main, tiny_off_policy(ddpg.DDPGConfig), {"network.noise": "ou"}),
    "td3-ou": (td3.main, tiny_off_policy(td3.TD3Config), {"network.noise": "ou"}),
    "a2c": (a2c.main, tiny_a2c, {}),
    "ppo-sde": (ppo.main, tiny_ppo, {"network.use_sde": True, "run.env_id": "Pendulum-v1"}),
    "qlearning": (qlearning.main, tiny_qlearning, {}),
    "qlearning-grid": (
        qlearning.main,
        tiny_qlearning,
        {"run.env_id": "MountainCar-v0", "table.grid_size": 8},
    ),
    "rnd_ppo": (rnd_ppo.main, tiny_rnd_ppo, {}),
    "ppo-lstm": (ppo.main, tiny_ppo, {"network.recurrent": "lstm", "optim.sequence_length": 8}),
    "a2c-gru": (a2c.main, tiny_a2c, {"network.recurrent": "gru"}),
    "es": (es.main, tiny_es, {}),
    # episodes assembled across batches: the unfinished ones and those not yet handed over are saved too
    "reinforce": (reinforce.main, tiny_reinforce, {}),
    "vpg": (vpg.main, tiny_vpg, {}),
    "vpg-box": (vpg.main, tiny_vpg, {"run.env_id": "Pendulum-v1", "run.max_episode_steps": 50}),
}
GYMNASIUM_ONLY = {"qlearning", "rnd_ppo"}  # envs without a torch implementation


@pytest.mark.parametrize(
    ("case", "backend"),
    [(case, "gymnasium") for case in CASES]
    + [(case, "torch") for case in CASES if case not in GYMNASIUM_ONLY],
)
def test_interrupted_and_resumed_run_ends_with_the_parameters_of_an_uninterrupted_one(
    case, backend, tmp_path, monkeypatch
):
    main, make_config, options = CASES[case]

    def config(output_dir, **run):
        return with_options(make_config(output_dir, env_backend=backend, **run), options)

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


@pytest.mark.parametrize("case", ["dqn", "ppo", "td3", "a2c-gru", "qlearning", "es", "reinforce", "vpg"])
@pytest.mark.parametrize("ending", ["budget", "target"])
def test_resuming_a_run_that_had_ended_trains_no_further(case, ending, tmp_path):
    main, make_config, options = CASES[case]

    def config(output_dir, **run):
        run = {"checkpoint_every": 512, **run}  # resume.ckpt written at the end too
        if ending == "target":
            run["stop_at_return"] = -1e9  # reached at the first evaluation
        return with_options(make_config(output_dir, **run), options)

    ended = main(config(tmp_path / "run"))
    assert (ending == "target") == (ended["solved_at_frames"] is not None)

    def evaluations():  # the final evaluation is in the last resume.ckpt: not made again, its time included
        return (tmp_path / "run" / "evaluations.csv").read_text()

    evaluated = evaluations()
    before = parameters(tmp_path / "run")
    for _ in range(2):
        resumed = main(config(tmp_path / "run", resume=tmp_path / "run"))
        assert resumed["frames"] == ended["frames"]
        assert resumed["eval_return_mean"] == ended["eval_return_mean"]
        assert evaluations() == evaluated
        after = parameters(tmp_path / "run")
        assert all(torch.equal(before[key], after[key]) for key in before)


def test_an_ended_run_whose_budget_falls_between_evaluations_keeps_its_final_one(tmp_path):
    """The final evaluation (here at 2,048 frames, between the scheduled ones at 768 and 1,536) comes before the
    last resume.ckpt: a resumed ended run has it and does not evaluate again."""
    ppo.main(tiny_ppo(tmp_path / "run", eval_every=768, checkpoint_every=512))
    rows = (tmp_path / "run" / "evaluations.csv").read_text()
    assert [line.split(",")[0] for line in rows.splitlines()[1:]] == ["768", "1536", "2048"]
    resumed = ppo.main(
        tiny_ppo(tmp_path / "run", eval_every=768, checkpoint_every=512, resume=tmp_path / "run")
    )
    assert (tmp_path / "run" / "evaluations.csv").read_text() == rows  # its wall time too: not made again
    assert resumed["frames"] == 2_048


def test_a_run_interrupted_among_the_last_batches_of_episodes_resumes_them(tmp_path, monkeypatch):
    """One poll of an episode collector can complete several batches of episodes: a run stopped after the first
    of the last poll's batches has spent the collector's budget but not its own, and trains on the rest."""

    def config(output_dir, **run):
        made = tiny_reinforce(output_dir, total_frames=1_024, **run)
        made.collector.episodes_per_update = 1
        return made

    straight = reinforce.main(config(tmp_path / "straight"))
    original = Run.record_batch

    def stop_once_the_collector_is_spent(self, batch, metrics):
        collector = self.checkpoints.training.collector
        if self.run.resume is None and collector._frames >= collector.total_frames:
            self.signals.interrupted_by = "SIGINT"
        return original(self, batch, metrics)

    with monkeypatch.context() as patch:
        patch.setattr(Run, "record_batch", stop_once_the_collector_is_spent)
        stopped = reinforce.main(config(tmp_path / "stopped"))
    assert stopped["frames"] < straight["frames"]
    resumed = reinforce.main(config(tmp_path / "stopped", resume=tmp_path / "stopped"))
    assert resumed["frames"] == straight["frames"]
    expected, actual = parameters(tmp_path / "straight"), parameters(tmp_path / "stopped")
    assert all(torch.equal(expected[key], actual[key]) for key in expected)


def test_resume_refuses_other_options_another_recipe_and_agent_checkpoints(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    changed = tiny_dqn(tmp_path / "run", resume=tmp_path / "run")
    changed.optim.lr = 1e-2
    with pytest.raises(InputError, match=r"other options: --lr \(saved 0.003, now 0.01\)"):
        dqn.main(changed)
    with pytest.raises(
        InputError, match=r"other options: .*--env-id \(saved 'CartPole-v1', now 'Acrobot-v1'\)"
    ):
        dqn.main(tiny_dqn(tmp_path / "run", resume=tmp_path / "run", env_id="Acrobot-v1"))
    with pytest.raises(InputError, match=r"written by recipes.dqn; resume it with python -m recipes.dqn"):
        ppo.main(tiny_ppo(tmp_path / "run", resume=tmp_path / "run"))
    # on the command line too, where the saved options are read as this recipe's first (a2c's do not fit ppo's)
    from training.resume import resumed_config

    for recipe in (ppo, a2c, sac):
        with pytest.raises(InputError, match=r"written by recipes.dqn; resume it with python -m recipes.dqn"):
            config_type = {ppo: ppo.PPOConfig, a2c: a2c.A2CConfig, sac: sac.SACConfig}[recipe]
            resumed_config(config_type, config_type(run=tiny_dqn(None, resume=tmp_path / "run").run), [])
    # and as python -m runs it, the recipe's module being __main__ (A2C's saved options do not fit PPO's)
    with monkeypatch.context() as patch:
        interrupt_at(patch, 512)
        a2c.main(tiny_a2c(tmp_path / "a2c"))
    refused = subprocess.run(
        [sys.executable, "-m", "recipes.ppo", "--resume", str(tmp_path / "a2c")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2
    assert f"written by recipes.a2c; resume it with python -m recipes.a2c --resume {tmp_path / 'a2c'}" in (
        refused.stderr
    )
    with pytest.raises(InputError, match="not a resume checkpoint"):
        dqn.main(tiny_dqn(None, resume=tmp_path / "run" / "agent.ckpt"))
    with pytest.raises(InputError, match="No resume checkpoint at"):
        dqn.main(tiny_dqn(None, resume=tmp_path / "missing"))
    (tmp_path / "broken.ckpt").write_bytes((tmp_path / "run" / RESUME_FILE).read_bytes()[:5_000])
    with pytest.raises(InputError, match="broken.ckpt is not a"):
        dqn.main(tiny_dqn(None, resume=tmp_path / "broken.ckpt"))


def test_resume_is_refused_by_recipes_without_training_state_and_with_worker_collectors(tmp_path):
    from training.checkpoints import read_resume

    with pytest.raises(InputError, match="recipes.custom cannot resume a run"):
        read_resume(tmp_path, "custom", {}, None)  # a Run given no TrainingState
    config = tiny_dqn(tmp_path, resume=tmp_path, collector_backend="multiprocess")
    with pytest.raises(InputError, match="--collector-backend single only"):
        dqn.main(config)


def test_config_round_trips_through_its_json_form():
    from training import config_to_dict

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


class Payload:
    def __init__(self, sentinel):
        self.sentinel = sentinel

    def __reduce__(self):
        return (open, (str(self.sentinel), "w"))


def test_loading_a_resume_checkpoint_never_unpickles(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    sentinel = tmp_path / "pwned"
    saved = tmp_path / "run" / RESUME_FILE
    sidecar = tmp_path / "sidecar.ckpt"
    with zipfile.ZipFile(saved) as source, zipfile.ZipFile(sidecar, "w") as target:
        for name in source.namelist():
            target.writestr(name, source.read(name))
        target.writestr("components/0000-training/state/other.pickle", pickle.dumps(Payload(sentinel)))
    with pytest.raises(InputError, match="unexpected file"):
        dqn.main(tiny_dqn(None, resume=sidecar))
    pickled = tmp_path / "pickled.ckpt"
    pickled.write_bytes(pickle.dumps(Payload(sentinel)))
    with pytest.raises(InputError, match="pickled.ckpt is not a resume checkpoint"):
        dqn.main(tiny_dqn(None, resume=pickled))
    assert not sentinel.exists()


def test_envs_whose_state_cannot_be_captured_resume_with_new_episodes_and_a_warning(tmp_path, monkeypatch):
    """The n-step windows pending at the interruption end there (truncated): none reaches into a new episode."""
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run", vectorization="async"))
    windows = []
    window = NStepReturns._inv_call
    monkeypatch.setattr(
        NStepReturns, "_inv_call", lambda self, batch: windows.append(window(self, batch)) or windows[-1]
    )
    config = tiny_dqn(tmp_path / "run", vectorization="async", resume=tmp_path / "run")
    with pytest.warns(UserWarning, match=r"envs' state was not saved \(AsyncVectorEnv.*starts new episodes"):
        summary = dqn.main(config)
    assert summary["frames"] == 2_048
    # the resumed run's first transitions are the interrupted run's last n steps: each window ends by the last
    n = config.buffer.n_steps
    first = windows[0]
    assert n > 1 and first is not None
    steps = first.get("steps_to_next_obs")[:, :n]
    assert (steps + torch.arange(n) <= n).all(), steps
    assert first.get(("next", "done"))[:, n - 1].all()


def test_env_runtime_state_round_trips_a_gymnasium_vector_env_mid_episode():
    from envs import make_env
    from envs.runtime_state import env_runtime_state, load_env_runtime_state

    env = make_env("Pendulum-v1", num_envs=3, seed=0)
    env.reset()
    action = env.full_action_spec.zero()
    for _ in range(5):
        env.rand_step()
    state, reason = env_runtime_state(env)
    assert reason is None
    expected = [env.step(action.clone())["next", "observation"] for _ in range(3)]
    fresh = make_env("Pendulum-v1", num_envs=3, seed=1)
    fresh.reset()
    load_env_runtime_state(fresh, state)
    actual = [fresh.step(action.clone())["next", "observation"] for _ in range(3)]
    for left, right in zip(expected, actual, strict=True):
        assert torch.equal(left, right)


def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        stopped = dqn.main(tiny_dqn(tmp_path / "run", logger="wandb"))
    resumed = dqn.main(tiny_dqn(tmp_path / "run", logger="wandb", resume=tmp_path / "run"))
    # W&B names offline runs offline-run-TIMESTAMP-ID, adding -1, -2, ... when the name is already taken
    run_id = re.fullmatch(r".*offline-run-\d+_\d+-(\w+)", stopped["wandb_offline_run"]).group(1)
    assert re.fullmatch(rf".*offline-run-\d+_\d+-{run_id}(-\d+)?", resumed["wandb_offline_run"])


def test_a_run_that_crashed_resumes_exactly_from_its_last_periodic_checkpoint(tmp_path, monkeypatch):
    """Periodic resume checkpoints neither disturb the run that writes them nor lose exactness: a run that dies
    after its checkpoint at 1,024 frames and is resumed from it ends like one that never checkpointed."""
    straight = dqn.main(tiny_dqn(tmp_path / "straight"))
    original = Run.record_batch

    def crash_after_the_checkpoint(self, batch, metrics):
        if self.frames >= 1_536 and self.run.resume is None:
            raise RuntimeError("the machine went away")
        return original(self, batch, metrics)

    with monkeypatch.context() as patch:
        patch.setattr(Run, "record_batch", crash_after_the_checkpoint)
        with pytest.raises(RuntimeError, match="the machine went away"):
            dqn.main(tiny_dqn(tmp_path / "crashed", checkpoint_every=1_024))
    resumed = dqn.main(tiny_dqn(tmp_path / "crashed", checkpoint_every=1_024, resume=tmp_path / "crashed"))
    assert resumed["frames"] == straight["frames"]
    expected, actual = parameters(tmp_path / "straight"), parameters(tmp_path / "crashed")
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key


def schema_items(node, *keys):
    """The [key, value] items of a TorchRL state description reached through the mappings named ``keys``."""
    for key in keys:
        node = next(value for name, value in node["items"] if name.get("value") == key)
    return node["items"]


def forge_resume(path, change):
    """Rewrite ``path``'s manifest and state descriptions with ``change(manifest, state)``."""
    name = "components/0000-training/state.json"
    with zipfile.ZipFile(path) as archive:
        entries = {entry: archive.read(entry) for entry in archive.namelist()}
    manifest, state = json.loads(entries["manifest.json"]), json.loads(entries[name])
    change(manifest, state)
    entries["manifest.json"], entries[name] = json.dumps(manifest).encode(), json.dumps(state).encode()
    with zipfile.ZipFile(path, "w") as archive:
        for entry, data in entries.items():
            archive.writestr(entry, data)


def set_item(items, key, value):
    """Set (or add) the item ``key`` of a description's items to the plain value ``value``."""
    node = {"kind": "value", "value": value}
    for item in items:
        if item[0].get("value") == key:
            item[1] = node
            return
    items.append([{"kind": "value", "value": key}, node])


def cartpole_values(state):
    layer = schema_items(state, "training", "env", "sub_envs")[0]["items"][
        -1
    ]  # the CartPoleEnv under its wrappers
    return schema_items(layer, "values")


def add_generator(state, layer, name):
    """Add a random generator called ``name`` to the ``layer``-th env layer's state (0: the outermost wrapper),
    a copy of the CartPoleEnv's own."""
    layers = schema_items(state, "training", "env", "sub_envs")[0]["items"]
    template = next(value for key, value in schema_items(layers[-1], "generators"))
    schema_items(layers[layer], "generators").append([{"kind": "value", "value": name}, template])


FORGERIES = {
    "registration": (
        lambda manifest, state: manifest["metadata"].update(env_registration=7),
        "damaged env registration",
    ),
    "collector-frames": (
        lambda manifest, state: set_item(schema_items(state, "training", "collector"), "frames", "many"),
        r"the training state.collector.frames holds 'many' where this run keeps int",
    ),
    "collector-frames-beyond-int64": (
        lambda manifest, state: set_item(schema_items(state, "training", "collector"), "frames", 2**80),
        r"the collector's frame count is 1208925819614629174706176, not a whole number from 0 to",
    ),
    "run-frames-negative": (
        lambda manifest, state: set_item(schema_items(state, "run"), "frames", -5),
        r"the run's state.frames holds -5 where this run keeps a count from 0 to 9,223,372,036,854,775,807",
    ),
    "run-best-return-nan": (
        lambda manifest, state: set_item(schema_items(state, "run"), "best_return", float("nan")),
        r"the run's state.best_return holds nan where this run keeps float",
    ),
    "run-state": (
        lambda manifest, state: set_item(schema_items(state, "run"), "best_return", [1]),
        r"the run's state.best_return holds \[1\] where this run keeps float",
    ),
    "replay-cursor": (
        lambda manifest, state: set_item(
            schema_items(state, "training", "replay_buffer", "writer"), "_cursor", 10**9
        ),
        "cursor 1000000000 is past its capacity",
    ),
    "env-attribute": (
        lambda manifest, state: set_item(cartpole_values(state), "state", "upright"),
        r"sets CartPoleEnv.state to 'upright', which does not fit",
    ),
    "optimizer-moment": (
        lambda manifest, state: schema_items(state, "training", "optimizers", "adam", "state", 0).pop(),
        r"does not fit this run: the adam optimizer's state lacks \['exp_avg",
    ),
    "optimizer-learning-rate": (
        lambda manifest, state: set_item(
            schema_items(state, "training", "optimizers", "adam", "param_groups")[0]["items"], "lr", -1.0
        ),
        r"the adam optimizer's learning rate is -1.0, not a finite number >= 0",
    ),
    "vector-env-size": (
        lambda manifest, state: set_item(
            schema_items(state, "training", "env", "vector", "values"), "num_envs", 2**27
        ),
        r"sets SyncVectorEnv.num_envs to 134217728, which does not fit",
    ),
    "env-attribute-set-at-reset": (
        lambda manifest, state: set_item(cartpole_values(state), "steps_beyond_terminated", "boom"),
        r"sets CartPoleEnv.steps_beyond_terminated to 'boom', which does not fit",
    ),
    "env-observations-of-more-envs": (
        lambda manifest, state: set_item(
            schema_items(state, "training", "env", "vector", "values"), "_env_obs", [[0.0] * 4] * 3
        ),
        r"sets SyncVectorEnv._env_obs to .*, which does not fit",
    ),
    "env-method": (
        lambda manifest, state: set_item(cartpole_values(state), "step", 1),
        r"sets CartPoleEnv.step to 1",
    ),
    "env-seed": (
        lambda manifest, state: set_item(schema_items(state, "training", "env"), "seed", "abc"),
        r"env seed 'abc' is not a seed",
    ),
    "env-method-as-generator": (
        lambda manifest, state: add_generator(state, -1, "step"),
        r"puts a random generator in CartPoleEnv.step, which is part of its class",
    ),
    "env-layer-as-generator": (
        lambda manifest, state: add_generator(state, 0, "env"),
        r"puts a random generator in \w+.env, which is a \w+ in this env",
    ),
}


@pytest.mark.parametrize("forgery", FORGERIES)
def test_a_forged_resume_checkpoint_is_refused_in_one_line_before_the_run_folder_changes(
    tmp_path, monkeypatch, forgery
):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    change, message = FORGERIES[forgery]
    forge_resume(tmp_path / "run" / RESUME_FILE, change)
    before = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    with pytest.raises(InputError, match=message) as refusal:
        dqn.main(tiny_dqn(None, resume=tmp_path / "run"))
    assert ".;" not in str(refusal.value)  # a reason ending in a full stop is not punctuated twice
    assert {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()} == before


def test_a_resume_checkpoint_naming_another_env_than_its_config_is_refused_without_importing_it(
    tmp_path, monkeypatch
):
    """Continued in another folder (its own folder's records are not read), a resume.ckpt whose manifest names an
    env module beside a config on CartPole is refused before the env's registration is looked up (which imports
    the module a ``module:EnvId`` id names)."""
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    forge_resume(
        tmp_path / "run" / RESUME_FILE,
        lambda manifest, state: manifest["metadata"].update(env_id="resume_forgery_module:CartPole-v1"),
    )
    with pytest.raises(InputError, match="names the env 'resume_forgery_module:CartPole-v1' beside a config"):
        dqn.main(tiny_dqn(tmp_path / "elsewhere", resume=tmp_path / "run"))
    assert "resume_forgery_module" not in sys.modules


def forged_state(monkeypatch, change):
    """Resume with ``change(state)`` applied to the training state as read from the file (tensors included)."""
    load = TrainingState.load_state_dict

    def forged_load(self, state):
        change(state)
        return load(self, state)

    monkeypatch.setattr(TrainingState, "load_state_dict", forged_load)


def set_action(state):
    state["replay_buffer"]["storage"]["_storage"]["action"][3] = -1


def nan_priority(state):
    state["replay_buffer"]["sampler"]["sum_tree"][5] = float("nan")


@pytest.mark.parametrize(
    "options, change, message",
    [
        ({}, set_action, "the replay buffer holds actions outside the env's action space"),
        (
            {"prioritized": True},
            nan_priority,
            "the replay buffer's priorities hold NaN, Inf or negative values",
        ),
        (
            {"prioritized": True},
            lambda state: state["replay_buffer"]["sampler"].update(alpha=0.9),
            r"priority exponent and offset \(0.9, 1e-08\) are not this run's \(0.6, 1e-08\)",
        ),
        (
            {"prioritized": True},
            lambda state: state["replay_buffer"]["sampler"].update(beta=float("nan")),
            r"importance exponent nan is not in \[0, 1\]",
        ),
        (
            {"prioritized": True},
            lambda state: state["replay_buffer"]["sampler"].update(max_priority=(-1.0, 3)),
            r"largest priority \(-1.0, 3\) is not a finite priority of a stored transition",
        ),
        ({}, lambda state: state["modules"]["loss"].update(), None),  # unchanged: resumes
    ],
    ids=["action", "priority", "alpha", "beta", "max-priority", "unchanged"],
)
def test_a_forged_replay_state_is_refused_before_the_first_update(
    tmp_path, monkeypatch, options, change, message
):
    def config(output_dir, **run):
        made = tiny_dqn(output_dir, **run)
        for name, value in options.items():
            setattr(made.buffer, name, value)
        return made

    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(config(tmp_path / "run"))
    forged_state(monkeypatch, change)
    if message is None:
        assert dqn.main(config(None, resume=tmp_path / "run"))["frames"] == 2_048
        return
    before = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    with pytest.raises(InputError, match=message):
        dqn.main(config(None, resume=tmp_path / "run"))
    assert {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()} == before


def test_a_resumed_optimizer_keeps_this_runs_options_whatever_the_file_says(tmp_path, monkeypatch):
    dqn.main(tiny_dqn(tmp_path / "straight"))
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "forged"))

    def flags(manifest, state):  # gradient ascent, and options the fused kernel refuses
        group = schema_items(state, "training", "optimizers", "adam", "param_groups")[0]["items"]
        for option in ("maximize", "differentiable", "capturable"):
            set_item(group, option, True)

    forge_resume(tmp_path / "forged" / RESUME_FILE, flags)
    dqn.main(tiny_dqn(None, resume=tmp_path / "forged"))
    expected, actual = parameters(tmp_path / "straight"), parameters(tmp_path / "forged")
    for key in expected:
        assert torch.equal(expected[key], actual[key]), key


def forge_moment(state):
    moments = state["optimizers"]["adam"]["state"][0]["exp_avg_sq"]
    moments.view(-1)[0] = -1.0


def test_a_negative_second_moment_or_variance_in_the_file_is_refused(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    with monkeypatch.context() as patch:
        forged_state(patch, forge_moment)
        with pytest.raises(
            InputError, match="the adam optimizer's exp_avg_sq holds NaN, Inf or a negative value"
        ):
            dqn.main(tiny_dqn(None, resume=tmp_path / "run"))

    def normalized_ppo(output_dir, **run):
        config = tiny_ppo(output_dir, **run)
        config.network.normalize_obs = True
        return config

    def negative_variance(state):
        for module in state["modules"].values():
            for name, value in module.items():
                if name.endswith("var"):
                    value.fill_(-1.0)

    with monkeypatch.context() as patch:
        interrupt_at(patch, 512)
        ppo.main(normalized_ppo(tmp_path / "ppo"))
    forged_state(monkeypatch, negative_variance)
    with pytest.raises(InputError, match=r"module's \S*var holds NaN, Inf or a negative value"):
        ppo.main(normalized_ppo(None, resume=tmp_path / "ppo"))


@pytest.mark.parametrize(
    "section, option, value, message",
    [
        ("run", "seed", None, "run.seed holds None, not int"),
        ("run", "total_frames", 1.5, "run.total_frames holds 1.5, not int"),
        ("network", "activation", "gelu", "network.activation holds 'gelu', not one of 'relu', 'tanh'"),
        ("network", "hidden_sizes", [64, "x"], "network.hidden_sizes holds 'x', not int"),
        ("network", "hidden_sizes", 64, "network.hidden_sizes holds 64, not a list of int"),
        ("run", "video", 1, "run.video holds 1, not bool"),
    ],
)
def test_the_command_line_refuses_saved_options_of_the_wrong_type(
    tmp_path, monkeypatch, section, option, value, message
):
    from training.resume import resumed_config

    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    forge_resume(
        tmp_path / "run" / RESUME_FILE,
        lambda manifest, state: manifest["metadata"]["config"][section].update({option: value}),
    )
    with pytest.raises(
        InputError, match=f"resume.ckpt cannot be resumed: the saved option {re.escape(message)}"
    ):
        resumed_config(dqn.DQNConfig, tiny_dqn(None, resume=tmp_path / "run"), ["--resume", "run"])


def test_a_resumed_run_never_takes_its_allowed_wrappers_from_the_file(tmp_path, monkeypatch):
    from training.resume import resumed_config

    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    forged = "this.Wrapper"  # importing the standard library's `this` prints a poem: code run from the file
    forge_resume(
        tmp_path / "run" / RESUME_FILE,
        lambda manifest, state: manifest["metadata"]["config"]["run"].update(
            env_wrappers=[forged], allow_wrappers=[forged]
        ),
    )
    monkeypatch.delitem(sys.modules, "this", raising=False)
    config = resumed_config(dqn.DQNConfig, tiny_dqn(None, resume=tmp_path / "run"), ["--resume", "run"])
    assert config.run.allow_wrappers == () and config.run.env_wrappers == (forged,)
    with pytest.raises(InputError, match=rf"allow_wrappers=\['{forged}'\]"):
        dqn.main(config)
    assert "this" not in sys.modules
    # allowed on the command line, the wrapper is the user's to trust: the resumed config takes it
    config = resumed_config(
        dqn.DQNConfig,
        tiny_dqn(None, resume=tmp_path / "run", allow_wrappers=(forged,)),
        ["--resume", "run", "--allow-wrappers", forged],
    )
    assert config.run.allow_wrappers == (forged,)


def test_saved_options_describing_networks_larger_than_the_file_are_refused_before_building_them(
    tmp_path, monkeypatch
):
    from training.resume import network_floor, resumed_config

    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))
    config = resumed_config(dqn.DQNConfig, tiny_dqn(None, resume=tmp_path / "run"), ["--resume", "run"])
    assert 0 < 4 * network_floor(config) <= (tmp_path / "run" / RESUME_FILE).stat().st_size
    forge_resume(
        tmp_path / "run" / RESUME_FILE,
        lambda manifest, state: manifest["metadata"]["config"]["network"].update(
            hidden_sizes=[20_000, 20_000]
        ),
    )
    with pytest.raises(InputError, match="describe networks of at least 400,000,000 parameters"):
        resumed_config(dqn.DQNConfig, tiny_dqn(None, resume=tmp_path / "run"), ["--resume", "run"])


def test_a_saved_buffer_size_the_file_or_the_machine_cannot_back_is_refused_before_allocating(
    tmp_path, monkeypatch
):
    from torchrl.data import LazyTensorStorage

    from training.resume import resumed_config

    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        dqn.main(tiny_dqn(tmp_path / "run"))

    def resume_with(**buffer):
        forge_resume(
            tmp_path / "run" / RESUME_FILE,
            lambda manifest, state: manifest["metadata"]["config"]["buffer"].update(buffer),
        )
        return dqn.main(
            resumed_config(dqn.DQNConfig, tiny_dqn(None, resume=tmp_path / "run"), ["--resume", "run"])
        )

    monkeypatch.setattr("training.replay.physical_memory", lambda: 16 * 2**30)
    with pytest.raises(InputError, match=r"--buffer-size 4,000,000,000 needs at least 183.2 GiB"):
        resume_with(buffer_size=4_000_000_000, prioritized=True)

    def never(self, state):
        raise AssertionError("the saved storage was loaded")

    monkeypatch.setattr(LazyTensorStorage, "load_state_dict", never)
    with pytest.raises(InputError, match="holds 1000 rows of storage, not its capacity 50000000"):
        resume_with(buffer_size=50_000_000, prioritized=False)


def test_a_checkpoint_from_before_an_option_existed_still_resumes():
    from training.resume import config_differences

    saved = {"run": {"env_id": "CartPole-v1", "seed": 0}, "loss": {"gamma": 0.99}}
    current = {"run": {"env_id": "CartPole-v1", "seed": 0, "env_kwargs": []}, "loss": {"gamma": 0.99}}
    assert config_differences(saved, current) == []
    current["loss"]["gamma"] = 0.9
    assert config_differences(saved, current) == ["--gamma (saved 0.99, now 0.9)"]


def held_episode_collector(batches):
    """REINFORCE's collector (episodes assembled across batches) on 2 CartPole envs, after ``batches`` batches."""
    from agents import make_actor
    from envs import make_env
    from training.lean_collector import LeanCollector

    env = make_env("CartPole-v1", num_envs=2, seed=0)
    actor = make_actor(env.observation_spec["observation"], env.action_spec)
    collector = LeanCollector(
        env, actor, frames_per_batch=32, total_frames=3_200, trajs_per_batch=2, traj_format="cat",
        track_traj_ids=True,
    )  # fmt: skip
    iterator = iter(collector)
    for _ in range(batches):
        next(iterator)
    return collector


def test_held_episodes_must_be_whole_episodes_with_this_runs_entries():
    source = held_episode_collector(batches=1)
    held = source.held_episodes()
    finished = [bool(episode.get(("next", "done"))[-1]) for episode in held]
    assert held and not all(finished)  # at least the two envs' episodes in the making
    fresh = held_episode_collector(batches=0)
    fresh.restore_held_episodes(held, unfinished=False)
    assert len(fresh.held_episodes()) == sum(finished)  # envs that start over keep the finished ones only
    with pytest.raises(InputError, match="not one of the episodes the envs are in"):
        fresh.restore_held_episodes(held)  # this collector's envs are in other episodes
    running = ("collector", "traj_ids")
    fresh._carrier.set(
        running, source._carrier.get(running).clone()
    )  # as a resumed run's carrier is restored
    fresh.restore_held_episodes([episode.to_dict() for episode in held])  # as read from resume.ckpt
    assert all((left == right).all() for left, right in zip(fresh.held_episodes(), held, strict=True))

    def changed(episode, key, value):
        return episode.clone().set(key, value)

    unfinished = held[finished.index(False)]
    steps, done = unfinished.numel(), unfinished.get(("next", "done"))
    forgeries = {
        "an extra entry": ([changed(unfinished, "extra", torch.zeros(steps))], "batch entries"),
        "a wrong dtype": ([changed(unfinished, "action", unfinished.get("action").float())], "action is"),
        "a wrong shape": ([changed(unfinished, "observation", torch.zeros(steps, 5))], "observation is"),
        "an action outside the space": (
            [changed(unfinished, "action", torch.full_like(unfinished.get("action"), 7))], "outside the action space"
        ),
        "two trajectories": ([changed(unfinished, running, torch.arange(steps))], "not one episode"),
        "an end mid-way": ([torch.cat([changed(unfinished, ("next", "done"), torch.ones_like(done)), unfinished])],
                           "not one episode"),
        "a termination without done": (
            [changed(unfinished, ("next", "terminated"), torch.ones_like(done))], "done is not terminated"
        ),
        "one episode twice": ([unfinished, unfinished], "not one of the episodes the envs are in"),
        "no steps": ([unfinished[:0]], "batch entries"),
        "more than a collector holds": ([unfinished] * 100, "more than a collector holds"),
    }  # fmt: skip
    for name, (episodes, message) in forgeries.items():
        with pytest.raises(InputError, match=message):
            fresh.restore_held_episodes(episodes)
        assert name


@pytest.mark.parametrize(
    "episodes, message",
    [([7], "does not fit this run"), ([{"observation": 1.0}], "does not have this run's batch entries")],
)
def test_forged_held_episodes_in_a_resume_checkpoint_are_refused_in_one_line(
    tmp_path, monkeypatch, episodes, message
):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 400)
        reinforce.main(tiny_reinforce(tmp_path / "run"))
    forge_resume(
        tmp_path / "run" / RESUME_FILE,
        lambda manifest, state: set_item(schema_items(state, "training", "collector"), "episodes", episodes),
    )
    before = {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()}
    with pytest.raises(InputError, match=message):
        reinforce.main(tiny_reinforce(None, resume=tmp_path / "run"))
    assert {path: path.read_bytes() for path in (tmp_path / "run").rglob("*") if path.is_file()} == before


def test_envs_that_start_new_episodes_on_resume_keep_only_the_finished_held_episodes(tmp_path, monkeypatch):
    from training.lean_collector import LeanCollector

    with monkeypatch.context() as patch:
        interrupt_at(patch, 400)
        reinforce.main(tiny_reinforce(tmp_path / "run", vectorization="async"))
    kept = []
    restore = LeanCollector.restore_held_episodes

    def recording(self, episodes, *, unfinished=True):
        kept.append(unfinished)
        return restore(self, episodes, unfinished=unfinished)

    monkeypatch.setattr(LeanCollector, "restore_held_episodes", recording)
    config = tiny_reinforce(tmp_path / "run", vectorization="async", resume=tmp_path / "run")
    with pytest.warns(UserWarning, match=r"envs' state was not saved \(AsyncVectorEnv.*starts new episodes"):
        summary = reinforce.main(config)
    assert kept == [False] and summary["frames"] >= config.run.total_frames // 2


def test_a_checkpoint_copied_or_linked_in_from_another_run_is_refused_before_the_folder_changes(
    tmp_path, monkeypatch
):
    for name, env_id in (("cartpole", "CartPole-v1"), ("acrobot", "Acrobot-v1")):
        with monkeypatch.context() as patch:
            interrupt_at(patch, 1_024)
            ppo.main(tiny_ppo(tmp_path / name, env_id=env_id))
    kept = {path.name: path.read_bytes() for path in (tmp_path / "cartpole").iterdir() if path.is_file()}
    (tmp_path / "cartpole" / RESUME_FILE).unlink()
    (tmp_path / "cartpole" / RESUME_FILE).symlink_to(tmp_path / "acrobot" / RESUME_FILE)
    with pytest.raises(InputError, match=r"resume.ckpt is a link to .*acrobot/resume.ckpt: a run continues"):
        ppo.main(tiny_ppo(None, resume=tmp_path / "cartpole"))
    (tmp_path / "cartpole" / RESUME_FILE).unlink()
    (tmp_path / "cartpole" / RESUME_FILE).write_bytes((tmp_path / "acrobot" / RESUME_FILE).read_bytes())
    refused = subprocess.run(
        [sys.executable, "-m", "recipes.ppo", "--resume", str(tmp_path / "cartpole"), "--no-progress"],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert refused.returncode == 2
    assert (
        "is the checkpoint of a run of env 'Acrobot-v1', but its folder holds a run of env 'CartPole-v1': the "
        "checkpoint was copied in from another run" in refused.stderr
    )
    kept.pop(RESUME_FILE)
    assert {name: (tmp_path / "cartpole" / name).read_bytes() for name in kept} == kept  # nothing replaced
    # continued in a new folder, the copied checkpoint is that run's own
    moved = tiny_ppo(tmp_path / "moved", env_id="Acrobot-v1", resume=tmp_path / "cartpole" / RESUME_FILE)
    assert ppo.main(moved)["env_id"] == "Acrobot-v1"


def test_options_edited_in_config_json_are_named_in_a_warning_and_not_read(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        interrupt_at(patch, 1_024)
        ppo.main(tiny_ppo(tmp_path / "run"))
    config_path = tmp_path / "run" / "config.json"
    config = json.loads(config_path.read_text())
    config["run"]["total_frames"] = 1_536
    config_path.write_text(json.dumps(config))
    with pytest.warns(UserWarning) as caught:
        summary = ppo.main(tiny_ppo(tmp_path / "run", resume=tmp_path / "run"))
    [edited] = [
        str(warning.message)
        for warning in caught
        if "config.json holds other options" in str(warning.message)
    ]
    assert "--total-frames (checkpoint 2048, config.json 1536)" in edited and "start a new run" in edited
    assert summary["frames"] == 2_048 and json.loads(config_path.read_text())["run"]["total_frames"] == 2_048
