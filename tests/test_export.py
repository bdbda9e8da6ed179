"""ONNX export: for every policy builder, the exported model run by onnxruntime gives the actions of
``Agent.predict(obs, deterministic=True)`` on a batch of real observations (exactly for discrete actions, to float
tolerance for continuous ones), whatever the batch size."""

import json
import os
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch

from agents import Agent
from agents.export import DeterministicPolicy, export_onnx, onnx_actions
from envs import make_atari_env
from errors import InputError
from recipes import export
from training.cli import run_command

pytest.importorskip("onnxruntime")


def observations(env, count=7, seed=0):
    """Observations an env gives: resets and random steps."""
    rows = []
    observation, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(count):
        rows.append(observation)
        observation, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            observation, _ = env.reset()
    if isinstance(rows[0], dict):
        return {key: np.stack([row[key] for row in rows]) for key in rows[0]}
    return np.stack(rows)


def build(env, builder, **kwargs):
    torch.manual_seed(0)
    agent = Agent.build("test", env.observation_space, env.action_space, "test", builder, kwargs)
    normalizer = agent.normalizer
    if normalizer is not None:  # statistics far from the identity, so that a missing normaliser shows
        normalizer.update(torch.as_tensor(observations(env, 50, seed=1), dtype=torch.float32) * 3 + 1)
    return agent.eval()


def as_inputs(agent, batch):
    if isinstance(agent.observation_space, gym.spaces.Dict):
        return [batch[key] for key in agent.observation_space.spaces]
    dtype = np.int64 if isinstance(agent.observation_space, gym.spaces.Discrete) else None
    array = np.asarray(batch, dtype=dtype)
    return [array if array.dtype in (np.uint8, np.int64) else array.astype(np.float32)]


CASES = {
    "categorical": ("CartPole-v1", "mlp_actor", {"normalize_obs": True}),
    "tanh-normal": ("Pendulum-v1", "mlp_actor", {"normalize_obs": True}),
    "gsde": ("Pendulum-v1", "gsde_actor", {"normalize_obs": True}),
    "gsde-squashed": ("Pendulum-v1", "gsde_actor", {"squash": True}),
    "deterministic": ("Pendulum-v1", "deterministic_actor", {"normalize_obs": True}),
    "deterministic-ou": ("MountainCarContinuous-v0", "deterministic_actor", {"noise": "ou"}),
    "es": ("Acrobot-v1", "es_policy", {"normalize_obs": True}),
    "es-box": ("Pendulum-v1", "es_policy", {}),
    "q-network": ("CartPole-v1", "q_actor", {"dueling": True, "noisy": True, "normalize_obs": True}),
    "c51": (
        "Acrobot-v1",
        "q_actor",
        {"distributional": True, "num_atoms": 11, "v_min": -100.0, "v_max": 0.0},
    ),
    "q-table": ("FrozenLake-v1", "q_table", {}),
    "q-table-grid": ("MountainCar-v0", "q_table", {"grid_size": 8}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_actions_equal_predict(case, tmp_path):
    env_id, builder, kwargs = CASES[case]
    env = gym.make(env_id)
    agent = build(env, builder, **kwargs)
    if builder == "q_table":  # a table with values, so that the greedy action is not always 0
        with torch.no_grad():
            for parameter in agent.policy.parameters():
                parameter.copy_(torch.randn_like(parameter))
    path = export_onnx(agent, tmp_path / "policy.onnx")
    batch = observations(env)
    for rows in (batch, batch[:1]):  # any batch size
        (actions,) = onnx_actions(path, *as_inputs(agent, rows))
        expected = agent.predict(rows, deterministic=True)
        assert (
            actions.shape == expected.shape
            and actions.dtype == expected.dtype
            or (isinstance(agent.action_space, gym.spaces.Discrete) and actions.dtype == np.int64)
        )
        if isinstance(agent.action_space, gym.spaces.Box):
            np.testing.assert_allclose(actions, expected, rtol=1e-5, atol=1e-5)
            assert agent.action_space.contains(actions[0].astype(agent.action_space.dtype))
        else:
            np.testing.assert_array_equal(actions, expected)
    assert len(set(np.asarray(onnx_actions(path, *as_inputs(agent, batch))[0]).ravel().tolist())) >= 1


def test_cnn_policies_take_uint8_frames(tmp_path):
    env = make_atari_env("ALE/Pong-v5", training=False)
    batch = observations(env, count=4)
    assert batch.dtype == np.uint8
    for builder, kwargs in (("mlp_actor", {}), ("q_actor", {"dueling": True})):
        agent = build(env, builder, hidden_sizes=[32], **kwargs)
        path = export_onnx(agent, tmp_path / f"{builder}.onnx")
        (actions,) = onnx_actions(path, batch)
        np.testing.assert_array_equal(actions, agent.predict(batch))
    env.close()


def test_multidiscrete_actions_keep_their_start(tmp_path):
    env = gym.make("CartPole-v1")
    space = gym.spaces.MultiDiscrete([3, 4], start=[-1, 2])
    agent = Agent.build("test", env.observation_space, space, "test", "mlp_actor", {})
    path = export_onnx(agent, tmp_path / "policy.onnx")
    batch = observations(env)
    (actions,) = onnx_actions(path, batch.astype(np.float32))
    np.testing.assert_array_equal(actions, agent.predict(batch))
    assert actions.min() >= -1


def test_masked_policies_take_the_mask(tmp_path):
    env = gym.make("CartPole-v1")
    agent = Agent.build(
        "test", env.observation_space, gym.spaces.Discrete(5), "test", "mlp_actor", {"action_mask": True}
    ).eval()
    path = export_onnx(agent, tmp_path / "policy.onnx")
    batch = observations(env).astype(np.float32)
    masks = np.random.default_rng(0).random((len(batch), 5)) < 0.4
    masks[:, 0] = True  # at least one allowed action per row
    (actions,) = onnx_actions(path, batch, masks)
    np.testing.assert_array_equal(actions, agent.predict(batch, action_mask=masks))
    assert masks[np.arange(len(batch)), actions].all()
    assert DeterministicPolicy(agent).input_names == ["observation", "action_mask"]
    # a row that allows nothing (a terminal state's) allows everything, as in training and predict
    masks[::2] = False
    (actions,) = onnx_actions(path, batch, masks)
    np.testing.assert_array_equal(actions, agent.predict(batch, action_mask=masks))
    unmasked = agent.predict(batch, action_mask=np.ones_like(masks))
    np.testing.assert_array_equal(actions[::2], unmasked[::2])
    assert (unmasked[::2] != 0).any()  # an all-False mask read as given gives action 0 in the exported file


def test_dict_observations_are_one_input_per_entry(tmp_path):
    space = gym.spaces.Dict(
        {"position": gym.spaces.Box(-1, 1, (3,)), "mode": gym.spaces.Discrete(4, start=1)}
    )
    agent = build(_SpaceEnv(space), "mlp_actor")
    path = export_onnx(agent, tmp_path / "policy.onnx")
    space.seed(0)
    batch = {
        "position": np.stack([space["position"].sample() for _ in range(6)]),
        "mode": np.array([space["mode"].sample() for _ in range(6)], dtype=np.int64),
    }
    names = DeterministicPolicy(agent).input_names
    assert names == list(space.spaces)  # the space's order (Gymnasium sorts the keys)
    (actions,) = onnx_actions(path, *(batch[name] for name in names))
    np.testing.assert_array_equal(actions, agent.predict(batch))


def test_a_dict_observations_own_mask_entry_is_one_input_serving_as_entry_and_mask(tmp_path):
    space = gym.spaces.Dict(
        {"observation": gym.spaces.Box(0.0, 1.0, (4,), np.float32), "action_mask": gym.spaces.MultiBinary(4)}
    )
    torch.manual_seed(0)
    agent = Agent.build(
        "test", space, gym.spaces.Discrete(4), "test", "mlp_actor", {"action_mask": True}
    ).eval()
    path = export_onnx(agent, tmp_path / "policy.onnx")
    rng = np.random.default_rng(0)
    masks = (rng.random((8, 4)) < 0.4).astype(np.int8)
    masks[:, 1] = 1  # at least one allowed action per row
    batch = {"action_mask": masks, "observation": rng.random((8, 4)).astype(np.float32)}
    names = DeterministicPolicy(agent).input_names
    assert names == ["action_mask", "observation"]
    (actions,) = onnx_actions(path, batch["action_mask"].astype(np.float32), batch["observation"])
    np.testing.assert_array_equal(actions, agent.predict(batch))
    assert masks[np.arange(8), actions].all()


def test_integer_box_observations_are_float32_inputs(tmp_path):
    space = gym.spaces.Box(0, 10, (3,), np.int64)
    agent = build(_SpaceEnv(space), "mlp_actor")
    path = export_onnx(agent, tmp_path / "policy.onnx")
    batch = np.random.default_rng(0).integers(0, 11, (5, 3))
    (actions,) = onnx_actions(path, batch.astype(np.float32))
    np.testing.assert_array_equal(actions, agent.predict(batch))


class _SpaceEnv:
    def __init__(self, observation_space):
        self.observation_space, self.action_space = observation_space, gym.spaces.Discrete(3)


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_recurrent_policies_carry_their_state_as_inputs_and_outputs(kind, tmp_path):
    env = gym.make("rlkit/CartPoleNoVelocity-v1")
    agent = build(env, "mlp_actor", recurrent=kind, recurrent_size=16)
    path = export_onnx(agent, tmp_path / "policy.onnx")
    module = DeterministicPolicy(agent)
    keys = module.state_keys
    assert module.input_names == ["observation", "is_init", *keys]
    assert module.output_names == ["action", *(f"next_{key}" for key in keys)]
    steps = observations(env, count=12).reshape(6, 2, 2)  # 6 steps of 2 envs
    state = {key: np.zeros((2, 1, 16), np.float32) for key in keys}
    agent.reset_state()
    for step, batch in enumerate(steps):
        is_init = np.full((2, 1), step == 0)
        action, *next_states = onnx_actions(path, batch.astype(np.float32), is_init, *state.values())
        np.testing.assert_array_equal(action, agent.predict(batch, episode_start=step == 0))
        for key, value in zip(keys, next_states):
            np.testing.assert_allclose(value, agent.state.get(key).numpy(), rtol=1e-5, atol=1e-6)
        state = dict(zip(keys, next_states))


def test_export_command_writes_beside_the_checkpoint(tmp_path):
    env = gym.make("CartPole-v1")
    agent = build(env, "mlp_actor")
    agent.env_id = "CartPole-v1"
    agent.save(tmp_path / "agent.ckpt")
    summary = export.main(export.ExportConfig(tmp_path))
    assert (
        summary["output"] == str(tmp_path / "policy.onnx") and (tmp_path / "policy.onnx").stat().st_size > 0
    )
    assert summary["inputs"] == ["observation"] and summary["outputs"] == ["action"]
    json.dumps(summary)
    with pytest.raises(InputError, match="No agent checkpoint"):
        export.main(export.ExportConfig(tmp_path / "missing"))
    nested = tmp_path / "exports" / "v1" / "cartpole.onnx"  # folders that do not exist yet are made
    assert export.main(export.ExportConfig(tmp_path, output=str(nested)))["output"] == str(nested)
    assert nested.stat().st_size > 0
    folder = tmp_path / "exports"  # an existing folder: policy.onnx in it
    assert export.main(export.ExportConfig(tmp_path, output=str(folder)))["output"] == str(
        folder / "policy.onnx"
    )
    assert (folder / "policy.onnx").stat().st_size > 0
    blocked = tmp_path / "policy.onnx" / "inside.onnx"  # under a file: refused as --output-dir under one is
    with pytest.raises(InputError, match="policy.onnx is a file, not a folder; give another --output"):
        export.main(export.ExportConfig(tmp_path, output=str(blocked)))


def saved_agent(folder):
    """A CartPole agent saved as ``folder/agent.ckpt``."""
    agent = build(gym.make("CartPole-v1"), "mlp_actor")
    agent.env_id = "CartPole-v1"
    agent.save(folder / "agent.ckpt")
    return folder / "agent.ckpt"


def run_export_command(monkeypatch, capsys, *args):
    """``python -m recipes.export ARGS`` in this process: the exit status (0 when it ends normally) and stderr."""
    monkeypatch.setattr("sys.argv", ["export", *map(str, args)])
    try:
        run_command(export.main, export.ExportConfig, export.__doc__)
        status = 0
    except SystemExit as exit:
        status = exit.code
    return status, capsys.readouterr().err


def test_export_refuses_to_replace_the_checkpoint_or_a_file_that_is_not_onnx(tmp_path, monkeypatch, capsys):
    checkpoint = saved_agent(tmp_path)
    content = checkpoint.read_bytes()
    status, error = run_export_command(monkeypatch, capsys, tmp_path, "--output", checkpoint)
    assert status == 2 and len(error.splitlines()) == 1 and "is the agent checkpoint being exported" in error
    assert checkpoint.read_bytes() == content
    link = tmp_path / "link.onnx"  # another name for the checkpoint
    link.symlink_to(checkpoint)
    with pytest.raises(InputError, match="is the agent checkpoint"):
        export.main(export.ExportConfig(checkpoint, output=str(link)))
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me")
    fake = tmp_path / "fake.onnx"  # named .onnx, but a checkpoint's bytes
    fake.write_bytes(content)
    for other, message in ((notes, "name a file ending in .onnx"), (fake, "is not an ONNX model")):
        status, error = run_export_command(monkeypatch, capsys, checkpoint, "--output", other)
        assert status == 2 and len(error.splitlines()) == 1 and message in error
    # a new file too is named *.onnx, so that the next export knows it for its own and replaces it
    status, error = run_export_command(monkeypatch, capsys, checkpoint, "--output", tmp_path / "model")
    assert status == 2 and "name a file ending in .onnx" in error and not (tmp_path / "model").exists()
    assert notes.read_text() == "keep me" and fake.read_bytes() == content
    pipe, dangling = tmp_path / "pipe.onnx", tmp_path / "dangling.onnx"  # not files an export replaces
    os.mkfifo(pipe)
    dangling.symlink_to(tmp_path / "missing.onnx")
    for other in (pipe, dangling):
        with pytest.raises(InputError, match="is not an ONNX model"):
            export.main(export.ExportConfig(checkpoint, output=str(other)))
    assert pipe.is_fifo() and dangling.is_symlink() and not (tmp_path / "missing.onnx").exists()
    earlier = export.main(export.ExportConfig(checkpoint))["output"]  # an earlier export is replaced
    assert export.main(export.ExportConfig(checkpoint))["output"] == earlier
    empty = tmp_path / "empty.onnx"
    empty.touch()
    assert export.main(export.ExportConfig(checkpoint, output=str(empty)))["output"] == str(empty)
    assert empty.stat().st_size > 0


def test_an_output_ending_in_a_separator_is_a_folder(tmp_path, monkeypatch, capsys):
    saved_agent(tmp_path)
    status, _ = run_export_command(monkeypatch, capsys, tmp_path, "--output", f"{tmp_path / 'new' / 'dir'}/")
    assert status == 0
    assert (tmp_path / "new" / "dir").is_dir() and (
        tmp_path / "new" / "dir" / "policy.onnx"
    ).stat().st_size > 0
    summary = export.main(export.ExportConfig(tmp_path, output=f"{tmp_path / 'new' / 'dir'}/"))  # existing
    assert summary["output"] == str(tmp_path / "new" / "dir" / "policy.onnx")


def test_an_empty_output_or_a_file_in_its_path_is_one_line(tmp_path):
    saved_agent(tmp_path)
    with pytest.raises(InputError, match="--output is empty"):
        export.main(export.ExportConfig(tmp_path, output=""))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match=r"afile is a file, not a folder; give another --output"):
        export.main(export.ExportConfig(tmp_path, output=str(tmp_path / "afile" / "x.onnx")))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
@pytest.mark.parametrize("builder", ["mlp_actor", "deterministic_actor"])
def test_box_actions_come_in_the_boxs_dtype(dtype, builder, tmp_path):
    env = gym.make("Pendulum-v1")
    space = gym.spaces.Box(np.array([-1.5, 0.0], dtype), np.array([2.0, 0.25], dtype), dtype=dtype)
    torch.manual_seed(0)
    agent = Agent.build("test", env.observation_space, space, "test", builder, {}).eval()
    with torch.no_grad():  # large weights: actions at both bounds and between them
        for parameter in agent.policy.parameters():
            parameter.copy_(3 * torch.randn_like(parameter))
    path = export_onnx(agent, tmp_path / "policy.onnx")
    batch = np.random.default_rng(0).uniform(-1, 1, (20, 3)).astype(np.float32)
    (actions,) = onnx_actions(path, batch)
    expected = agent.predict(batch, deterministic=True)
    assert actions.dtype == expected.dtype == dtype and actions.shape == expected.shape
    np.testing.assert_allclose(actions, expected, rtol=1e-3 if dtype == np.float16 else 1e-5, atol=1e-5)
    assert all(space.contains(action) for action in actions)


@pytest.mark.parametrize("builder", ["mlp_actor", "q_actor", "q_table"])
def test_multidiscrete_observations_keep_their_start(builder, tmp_path):
    space = gym.spaces.MultiDiscrete([3, 4], start=[-1, 5])
    space.seed(0)
    torch.manual_seed(0)
    agent = Agent.build("test", space, gym.spaces.Discrete(5), "test", builder, {}).eval()
    with torch.no_grad():  # a table or network whose greedy action depends on the observation
        for parameter in agent.policy.parameters():
            parameter.copy_(torch.randn_like(parameter))
    path = export_onnx(agent, tmp_path / "policy.onnx")
    batch = np.stack([space.sample() for _ in range(12)])
    (actions,) = onnx_actions(path, batch)
    expected = agent.predict(batch)
    np.testing.assert_array_equal(actions, expected)
    assert len(set(expected.tolist())) > 1


def test_an_existing_output_that_cannot_be_read_is_refused_in_one_line(tmp_path, monkeypatch):
    checkpoint = saved_agent(tmp_path)
    locked = tmp_path / "locked.onnx"
    locked.write_bytes(b"\x08")
    real_open = Path.open

    def guarded_open(self, *args, **kwargs):  # as for a file without read permission (tests may run as root)
        if self == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", guarded_open)
    with pytest.raises(InputError, match=r"exists and cannot be read \(Permission denied\)"):
        export.main(export.ExportConfig(checkpoint, output=str(locked)))
    monkeypatch.undo()
    assert locked.read_bytes() == b"\x08"
