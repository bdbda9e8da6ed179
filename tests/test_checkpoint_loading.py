"""Loading a checkpoint is bounded by the file: forged sizes, compressed entries, oversized descriptions, deep JSON
and NaN weights are refused in one line, before anything large is allocated or extracted."""

import json
import zipfile

import gymnasium as gym
import pytest
import torch

from agents import Agent
from errors import InputError
from training.resume import load_resume_checkpoint, read_resume_metadata, save_resume_checkpoint


def saved_agent(tmp_path, builder="mlp_actor", observation_space=None, action_space=None, **kwargs):
    agent = Agent.build(
        "CartPole-v1",
        observation_space or gym.spaces.Box(-1, 1, (4,)),
        action_space or gym.spaces.Discrete(2),
        "test",
        policy_builder=builder,
        policy_kwargs={**({} if builder == "q_table" else {"hidden_sizes": [16]}), **kwargs},
    )
    return agent.save(tmp_path / "agent.ckpt")


def rewrite(path, change, compression=zipfile.ZIP_STORED):
    """Rewrite the archive at ``path`` with ``change(entries)`` applied to its {name: bytes}."""
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    change(entries)
    path.unlink()
    with zipfile.ZipFile(path, "w", compression=compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def manifest_metadata(entries, change):
    manifest = json.loads(entries["manifest.json"])
    change(manifest["metadata"])
    entries["manifest.json"] = json.dumps(manifest).encode()


def first_tensor(entries):
    return min(name for name in entries if name.endswith(".memmap"))


def test_a_compressed_entry_is_refused_before_extraction(tmp_path):
    path = saved_agent(tmp_path)
    rewrite(
        path, lambda entries: entries.update({first_tensor(entries): bytes(64 * 2**20)}), zipfile.ZIP_DEFLATED
    )
    assert path.stat().st_size < 2**20  # 64 MiB of zeros in a file of well under 1 MiB
    with pytest.raises(InputError, match="compressed entry .*stored uncompressed"):
        Agent.load(path)


@pytest.mark.parametrize("size", [0, 10, 10_000], ids=["empty", "short", "long"])
def test_a_tensor_file_of_another_size_than_declared_is_refused(tmp_path, size):
    path = saved_agent(tmp_path)
    rewrite(path, lambda entries: entries.update({first_tensor(entries): bytes(size)}))
    with pytest.raises(InputError, match=r"declares tensor .* but holds \d+ bytes"):
        Agent.load(path)


def test_a_declared_shape_beyond_the_file_is_refused(tmp_path):
    path = saved_agent(tmp_path)

    def grow(entries):
        name = next(name for name in entries if name.endswith("meta.json"))
        meta = json.loads(entries[name])
        key = next(key for key, leaf in meta.items() if isinstance(leaf, dict) and "shape" in leaf)
        meta[key]["shape"] = [100_000, 100_000]
        entries[name] = json.dumps(meta).encode()

    rewrite(path, grow)
    with pytest.raises(InputError, match=r"shape \(100000, 100000\).*40000000000 bytes"):
        Agent.load(path)


@pytest.mark.parametrize(
    "builder, change, message",
    [
        (
            "mlp_actor",
            {"hidden_sizes": [1_000_000, 1_000_000]},
            "whose tensors differ from those the file holds",
        ),
        ("q_actor", {"hidden_sizes": [100_000] * 3}, "whose tensors differ from those the file holds"),
        (
            "gsde_actor",
            {"hidden_sizes": [1_000_000, 1_000_000]},
            r"describes a policy \(gsde_actor\) of about",
        ),
    ],
)
def test_a_description_larger_than_the_tensors_is_refused_without_building_it(
    tmp_path, builder, change, message
):
    action_space = gym.spaces.Box(-1, 1, (1,)) if builder == "gsde_actor" else gym.spaces.Discrete(2)
    path = saved_agent(tmp_path, builder, action_space=action_space)
    rewrite(
        path, lambda entries: manifest_metadata(entries, lambda meta: meta["policy_kwargs"].update(change))
    )
    # refused either by the description-against-file check or, first on machines of less memory than such a
    # network takes, by the builders' own memory check: neither allocates the layers
    with pytest.raises(InputError, match=f"{message}|of memory allows: use narrower layers"):
        Agent.load(path)  # building a million-unit MLP would need terabytes


@pytest.mark.parametrize(
    "change, message",
    [
        ({"recurrent_size": 1_000_000}, "whose tensors differ from those the file holds"),
        ({"recurrent": "gru"}, "whose tensors differ from those the file holds"),
        ({"recurrent": "transformer"}, "--recurrent must be one of lstm, gru"),
        ({"recurrent_size": -1}, "--recurrent-size must be a positive integer"),
    ],
)
def test_a_forged_recurrent_layer_is_refused_without_building_it(tmp_path, change, message):
    path = saved_agent(tmp_path, recurrent="lstm", recurrent_size=8)
    assert Agent.load(path).recurrent
    rewrite(
        path, lambda entries: manifest_metadata(entries, lambda meta: meta["policy_kwargs"].update(change))
    )
    with pytest.raises(InputError, match=message):
        Agent.load(path)


def test_a_huge_grid_or_observation_shape_is_refused(tmp_path):
    path = saved_agent(tmp_path, "q_table", gym.spaces.Box(-1, 1, (4,)), grid_size=3)
    rewrite(
        path,
        lambda entries: manifest_metadata(
            entries, lambda meta: meta["policy_kwargs"].update(grid_size=10**4)
        ),
    )
    with pytest.raises(InputError, match=r"describes a policy \(q_table\) of about"):
        Agent.load(path)
    path = saved_agent(tmp_path)
    rewrite(
        path,
        lambda entries: manifest_metadata(
            entries, lambda meta: meta["observation_space"].update(shape=[10**6, 10**6])
        ),
    )
    with pytest.raises(InputError, match=r"describes a Box of shape \[1000000, 1000000\]"):
        Agent.load(path)


@pytest.mark.parametrize(
    "action_space, message",
    [
        ({"type": "MultiDiscrete", "nvec": [2] * 10**5}, "MultiDiscrete space of 100000 sub-actions"),
        ({"type": "MultiBinary", "n": [10**3, 10**3]}, r"MultiBinary space of \[1000, 1000\]"),
        ({"type": "Discrete", "n": 10**6, "start": 0}, "Discrete space of 1000000"),
        ({"type": "MultiDiscrete", "nvec": [[]]}, "not a list of sizes"),
    ],
)
def test_more_actions_than_the_policy_holds_weights_for_are_refused_before_building(
    tmp_path, action_space, message
):
    """Each action (each choice of a discrete one) has a weight of its own: a description of more, in a small
    file, would build a policy (and TorchRL's specs, which a MultiDiscrete of 10^6 entries made hang) for
    nothing."""
    path = saved_agent(tmp_path)
    rewrite(
        path, lambda entries: manifest_metadata(entries, lambda meta: meta.update(action_space=action_space))
    )
    with pytest.raises(InputError, match=message):
        Agent.load(path)


def test_deeply_nested_json_is_one_line(tmp_path):
    path = saved_agent(tmp_path)
    nested = "[" * 100_000 + "]" * 100_000
    rewrite(
        path,
        lambda entries: entries.update(
            {"manifest.json": entries["manifest.json"].rstrip()[:-1] + f', "deep": {nested}}}'.encode()}
        ),
    )
    with pytest.raises(InputError, match="nested too deeply"):
        Agent.load(path)


def test_nan_weights_are_refused(tmp_path):
    path = saved_agent(tmp_path)
    rewrite(
        path,
        lambda entries: entries.update(
            {
                first_tensor(entries): torch.full((len(entries[first_tensor(entries)]) // 4,), float("nan"))
                .numpy()
                .tobytes()
            }
        ),
    )
    with pytest.raises(InputError, match="holds NaN or Inf in .*Refusing to load it"):
        Agent.load(path)


def test_negative_observation_statistics_are_refused(tmp_path):
    path = saved_agent(tmp_path, normalize_obs=True)
    agent = Agent.load(path)
    normalizer = next(module for module in agent.policy.modules() if hasattr(module, "var"))
    for name, value in (("var", -1.0), ("count", -5.0)):
        original = getattr(normalizer, name).clone()
        getattr(normalizer, name).fill_(value)
        agent.save(tmp_path / "forged.ckpt")
        getattr(normalizer, name).copy_(original)
        with pytest.raises(
            InputError, match=rf"a negative variance or count in \S*{name}\); the file is damaged"
        ):
            Agent.load(tmp_path / "forged.ckpt")
    Agent.load(path)


def test_a_forged_resume_checkpoint_is_refused_before_loading(tmp_path):
    path = tmp_path / "resume.ckpt"
    save_resume_checkpoint(
        path, {"weights": torch.zeros(1000)}, {"algorithm": "ppo", "env_id": "CartPole-v1", "config": {}}
    )
    assert read_resume_metadata(path)["algorithm"] == "ppo"
    assert load_resume_checkpoint(path)["weights"].shape == (1000,)
    rewrite(path, lambda entries: entries.update({first_tensor(entries): bytes(400)}))
    with pytest.raises(InputError, match=r"declares tensor .* \(4000 bytes\) but holds 400 bytes"):
        read_resume_metadata(path)


def forge_state(path, change):
    """Apply ``change`` to the decoded state.json of the archive's first component."""

    def edit(entries):
        name = next(name for name in entries if name.endswith("/state.json"))
        state = json.loads(entries[name])
        change(state)
        entries[name] = json.dumps(state).encode()

    rewrite(path, edit)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"kind": "numpy", "key": "tensor_00000000", "dtype": "(100000000,)f8"}, "not a plain number type"),
        ({"kind": "numpy_scalar", "dtype": "V1000000000", "value": 0}, "not a plain number type"),
        ({"kind": "pickle", "value": "x"}, "unknown kind of value 'pickle'"),
        (
            {
                "kind": "list",
                "items": [{"kind": "tensor", "key": "tensor_00000000", "device": "cpu"}] * 20_000,
            },
            "refers to its tensors",
        ),
        ({"kind": "tensor", "key": "tensor_99999999", "device": "cpu"}, "does not hold"),
    ],
    ids=["numpy-subarray", "void-scalar", "unknown-kind", "many-references", "missing-tensor"],
)
def test_a_state_description_that_decodes_to_more_than_the_file_is_refused(tmp_path, extra, message):
    path = saved_agent(tmp_path, hidden_sizes=[64])
    forge_state(path, lambda state: state.update(metadata=extra))
    with pytest.raises(InputError, match=message):
        Agent.load(path)


def test_forged_tensor_references_and_components_are_named_with_the_file(tmp_path):
    path = saved_agent(tmp_path)

    def unhashable_key(state):
        state["items"][0][1]["key"] = ["tensor_00000000"]

    forge_state(path, unhashable_key)
    with pytest.raises(InputError, match=r"refers to a tensor \['tensor_00000000'\] it does not hold"):
        Agent.load(path)
    path = saved_agent(tmp_path)
    forge_state(path, lambda state: state["items"][0][1].update(kind=["tensor"]))
    with pytest.raises(InputError, match=r"unknown kind of value \['tensor'\]"):
        Agent.load(path)
    for field, value in (("dtype", ["torch.float32"]), ("shape", [4, -16]), ("shape", "16")):
        path = saved_agent(tmp_path)

        def forge_meta(entries, field=field, value=value):
            name = next(name for name in entries if name.endswith("/meta.json"))
            meta = json.loads(entries[name])
            meta["tensor_00000000"][field] = value
            entries[name] = json.dumps(meta).encode()

        rewrite(path, forge_meta)
        with pytest.raises(
            InputError, match="declares tensor 'tensor_00000000' with an unsupported shape or dtype"
        ):
            Agent.load(path)
    path = saved_agent(tmp_path)

    def rename_component(entries):
        entries.update(
            {
                name.replace("-policy/", "-critic/"): entries.pop(name)
                for name in list(entries)
                if "-policy/" in name
            }
        )
        listed_files(entries, lambda record: record.update(path=record["path"].replace("-policy", "-critic")))

    rewrite(path, rename_component)
    with pytest.raises(InputError, match=f"{path} holds no 'policy' tensors"):
        Agent.load(path)


def test_forged_descriptions_fail_in_one_line_not_in_a_traceback(tmp_path):
    path = saved_agent(tmp_path)
    rewrite(
        path,
        lambda entries: manifest_metadata(
            entries, lambda meta: meta["observation_space"].update(dtype="V2000000000")
        ),
    )
    with pytest.raises(InputError, match="not a plain number type"):
        Agent.load(path)
    path = saved_agent(tmp_path, "q_table", gym.spaces.Box(-1, 1, (4,)), grid_size=3)
    rewrite(
        path,
        lambda entries: manifest_metadata(
            entries, lambda meta: meta["policy_kwargs"].update(grid_size=10**4000)
        ),
    )
    with pytest.raises(InputError, match="describes a policy"):
        Agent.load(path)  # decided in log space: the power itself would take minutes
    path = saved_agent(tmp_path, "gsde_actor", action_space=gym.spaces.Box(-1, 1, (1,)))
    rewrite(
        path,
        lambda entries: manifest_metadata(
            entries, lambda meta: meta["policy_kwargs"].update(hidden_sizes=[-5])
        ),
    )
    with pytest.raises(InputError, match="invalid agent description"):
        Agent.load(path)
    path = saved_agent(tmp_path)
    rewrite(path, lambda entries: entries.update({"manifest.json": b"[1, 2]"}))
    with pytest.raises(InputError, match="not an agent checkpoint saved by this toolkit"):
        Agent.load(path)
    path = saved_agent(tmp_path)
    rewrite(
        path,
        lambda entries: entries.update({"manifest.json": b'{"metadata": {"format": ' + b"1" * 5000 + b"}}"}),
    )
    with pytest.raises(InputError, match="damaged JSON"):
        Agent.load(path)


def listed_files(entries, change):
    manifest = json.loads(entries["manifest.json"])
    (record,) = manifest["components"].values()
    change(record)
    entries["manifest.json"] = json.dumps(manifest).encode()


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda record: record["files"].extend([record["files"][-1]] * 1000), "twice"),
        (lambda record: record["files"].append("./" + record["files"][-1]), "twice"),
        (lambda record: record["files"].append("state/tensor_99999999.memmap"), "which it does not hold"),
        (lambda record: record.update(files="state.json"), "damaged list of component files"),
        (lambda record: record.update(path=None), "damaged list of component files"),
    ],
    ids=["repeated", "repeated-other-spelling", "absent", "not-a-list", "no-folder"],
)
def test_a_manifest_listing_files_twice_or_absent_ones_is_refused_before_extraction(
    tmp_path, change, message
):
    path = saved_agent(tmp_path)
    rewrite(path, lambda entries: listed_files(entries, change))
    with pytest.raises(InputError, match=message):
        Agent.load(path)
    with pytest.raises(InputError, match=message):  # a resume checkpoint is read through the same check
        read_resume_metadata(path)


def finishes_within(seconds, call, fifo):
    """Run ``call`` in a thread; the exception it raised, or an AssertionError if it still waits on ``fifo``
    after ``seconds`` (then a writer opens and closes the pipe, so that the reader sees its end)."""
    import os
    import threading

    outcome = {}

    def target():
        try:
            call()
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        raise AssertionError(f"reading {fifo} did not return within {seconds} s")
    return outcome.get("error")


def test_a_device_or_pipe_in_place_of_a_file_is_refused_without_reading_it(tmp_path):
    import os

    from training.presets import read_presets
    from training.tuning import read_search_space

    fifo = tmp_path / "agent.ckpt"
    os.mkfifo(fifo)
    calls = {
        "agent checkpoint": lambda: Agent.load(fifo),
        "resume checkpoint": lambda: read_resume_metadata(fifo),
        "preset file": lambda: read_presets(fifo),
        "search space": lambda: read_search_space("ppo", fifo),
    }
    for what, call in calls.items():
        error = finishes_within(30, call, fifo)
        assert isinstance(error, InputError), (what, error)
        assert (
            str(error) == f"The {what} {fifo} is not a regular file (a device, pipe or socket); name a file."
        )
    with pytest.raises(InputError, match=f"The preset file {tmp_path} is a folder; name a file."):
        read_presets(tmp_path)
