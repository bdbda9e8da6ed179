"""LeanReplayBuffer: TorchRL's TensorDictReplayBuffer, same contents, draws and state through its direct path."""

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict
from tensordict.utils import assert_close
from torchrl.data import (
    Bounded,
    Composite,
    LazyMemmapStorage,
    LazyTensorStorage,
    PrioritizedSampler,
    SamplerWithoutReplacement,
    TensorDictReplayBuffer,
    Unbounded,
)
from torchrl.data.replay_buffers.samplers import prioritized

from agents.networks import check_mlp_memory, physical_memory
from errors import InputError
from training.replay import LeanReplayBuffer, check_replay_memory, off_policy_storage
from training.state import _load_replay_buffer_state, _replay_buffer_state

CAPACITY = 10


def transitions(count: int, start: int, extra: bool = False) -> TensorDict:
    """``count`` distinct transitions (values from ``start``), with a nested ``next`` and a doubly nested entry."""
    values = torch.arange(start, start + count, dtype=torch.float32)
    data = TensorDict(
        {
            "observation": values[:, None].expand(count, 3).clone(),
            "action": (values[:, None] * 10).long(),
            "next": {
                "observation": values[:, None].expand(count, 3) + 0.5,
                "reward": -values[:, None],
                "done": (values[:, None] % 3) == 0,
                "info": {"cost": values[:, None, None].expand(count, 2, 2).clone()},
            },
        },
        batch_size=[count],
    )
    if extra:
        data["extra"] = values
    return data


def buffer_pair(**kwargs):
    """A TorchRL buffer and a lean one over identical storages, each with a generator seeded the same."""
    kwargs = {"batch_size": 4} | kwargs
    storage = kwargs.pop("storage", lambda: LazyTensorStorage(CAPACITY))
    return tuple(
        cls(storage=storage(), generator=torch.Generator().manual_seed(7), **kwargs)
        for cls in (TensorDictReplayBuffer, LeanReplayBuffer)
    )


def assert_same_state(reference, lean, last_cursor=True):
    assert len(reference) == len(lean)
    assert reference._writer._cursor == lean._writer._cursor
    assert reference._writer._write_count == lean._writer._write_count
    if last_cursor:  # not part of TorchRL's saved state
        assert torch.equal(
            torch.as_tensor(reference._storage._last_cursor), torch.as_tensor(lean._storage._last_cursor)
        )
    filled = len(reference)  # the rows beyond are uninitialised memory
    assert_close(reference._storage._storage[:filled], lean._storage._storage[:filled])


def test_the_direct_path_runs_for_uniform_sampling_from_a_lazy_tensor_storage():
    _, lean = buffer_pair()
    lean.extend(transitions(2, 0))  # the first write initialises the storage through the parent
    assert lean._lean_entries() is not None
    reasons = [{"sampler": SamplerWithoutReplacement()}, {"storage": lambda: LazyMemmapStorage(CAPACITY)}]
    if prioritized.SumSegmentTreeFp32 is not None:  # TorchRL's compiled extension loads with the pinned torch
        reasons.append({"sampler": PrioritizedSampler(CAPACITY, alpha=0.6, beta=0.4)})
    for reason in reasons:
        _, other = buffer_pair(**reason)
        other.extend(transitions(2, 0))
        assert other._lean_entries() is None, reason


def test_extend_writes_what_torchrl_writes_through_wrap_around_and_a_full_lap():
    reference, lean = buffer_pair()
    start = 0
    for count in (1, 3, 4, 1, 5, CAPACITY, 2, 7):  # wraps the ring buffer, once by a whole lap
        given_reference, given_lean = transitions(count, start), transitions(count, start)
        index_reference = reference.extend(given_reference)
        index_lean = lean.extend(given_lean)
        assert torch.equal(index_reference, index_lean)
        assert set(given_reference.keys(True)) == set(given_lean.keys(True))  # the caller's data left alike
        assert_same_state(reference, lean)
        start += count


SELECTED = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "done"),
    ("next", "mask"),
)


def collected(envs: int, steps: int, start: int) -> TensorDict:
    """A collected ``[envs, steps]`` batch, its time dimension named as a collector names it: the keys of
    :data:`SELECTED` but the absent mask, and one more."""
    flat = transitions(envs * steps, start)
    del flat["next", "info"]
    flat["loc"] = flat["observation"] * 2  # not selected
    batch = flat.reshape(envs, steps)
    batch.names = [None, "time"]
    return batch


def test_extend_selected_stores_the_selection_flattened_as_torchrl_stores_it(monkeypatch):
    reference, lean = buffer_pair()
    start = 0
    for envs, steps in ((1, 1), (2, 1), (1, 3), (2, 2), (1, 1), (3, 3), (1, 1)):  # wraps the ring buffer
        batch = collected(envs, steps, start)
        index_reference = reference.extend(batch.select(*SELECTED, strict=False).reshape(-1))
        index_lean = lean.extend_selected(batch, SELECTED)
        assert torch.equal(index_reference, index_lean)
        assert_same_state(reference, lean)
        # the batch left alone
        assert batch.get("loc", None) is not None and batch.batch_size == (envs, steps)
        if start == 0:  # from the second write on, the direct path: no selection is built
            monkeypatch.setattr("training.replay.flat_select", None)
        start += envs * steps
    # a batch whose selection does not fit the storage: stored as extend(flat_select(...)) stores it
    monkeypatch.undo()
    batch = collected(1, 2, 100)
    batch["next", "mask"] = torch.ones(1, 2, 1, dtype=torch.bool)  # an entry the storage has no room for
    outcomes = []
    for store in (
        lambda: reference.extend(batch.select(*SELECTED).reshape(-1)),
        lambda: lean.extend_selected(batch, SELECTED),
    ):
        try:
            outcomes.append(store())
        except Exception as error:  # noqa: BLE001 - the parent's outcome, whatever it is
            outcomes.append(type(error))
    assert outcomes[0] is outcomes[1] if not isinstance(outcomes[0], torch.Tensor) else torch.equal(*outcomes)
    assert_same_state(reference, lean)


def test_entries_numpy_cannot_view_are_written_alike():
    """A bfloat16 entry (no NumPy dtype) and a value that requires grad are copied as tensors, the rest through
    NumPy: the same contents either way."""
    reference, lean = buffer_pair()
    start = 0
    for count in (3, 4, 5):  # the last wraps around
        data = transitions(count, start)
        data["half"] = data["observation"].to(torch.bfloat16)
        data["weight"] = data["next", "reward"].clone().requires_grad_()
        reference.extend(data.clone())
        assert lean._lean_entries() is None or lean._writable(data, lean._lean_entries()) is not None
        lean.extend(data.clone())
        assert_same_state(reference, lean)
        start += count


@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes")
def test_sample_draws_what_torchrl_draws():
    reference, lean = buffer_pair()
    for start in range(0, 23, 3):
        reference.extend(transitions(3, start))
        lean.extend(transitions(3, start))
        for batch_size in (None, 1, 6):
            sample_reference, info_reference = reference.sample(batch_size, return_info=True)
            sample_lean, info_lean = lean.sample(batch_size, return_info=True)
            assert_close(sample_reference, sample_lean)
            assert sample_reference.device == sample_lean.device
            assert sample_lean["next"].batch_size == sample_lean.batch_size
            assert torch.equal(info_reference["index"], info_lean["index"])
        expected, actual = reference.sample(), lean.sample()  # the updates' call: the indices in the sample
        assert list(actual.keys(True, True)) == list(expected.keys(True, True))
        assert_close(expected, actual)
    sample = lean.sample()  # rows whole: every entry of a row comes from the same transition
    assert torch.equal(sample["next", "reward"], -sample["observation"][:, :1])
    assert torch.equal(sample["index"], lean._storage._storage["index"][sample["index"]])


def test_lean_sampling_does_not_go_through_torchrl_storage_indexing(monkeypatch):
    _, lean = buffer_pair()
    lean.extend(transitions(6, 0))

    def refuse(*args, **kwargs):
        raise AssertionError("the direct path took TorchRL's route")

    monkeypatch.setattr(TensorDictReplayBuffer, "_sample", refuse)
    monkeypatch.setattr(LazyTensorStorage, "set", refuse)
    lean.extend(transitions(3, 6))
    assert lean.sample().batch_size == (4,)


def test_inputs_outside_the_direct_path_are_the_parent_s():
    reference, lean = buffer_pair()
    for buffer in (reference, lean):
        buffer.extend(transitions(4, 0))
    for data in (
        transitions(CAPACITY + 3, 10),  # more rows than the storage holds
        LazyStackedTensorDict(*transitions(2, 30).unbind(0)),
        transitions(2, 40).apply(lambda value: value.double() if value.is_floating_point() else value),
        transitions(2, 50, extra=True),  # a key the storage has no room for
    ):
        outcomes = []
        for buffer in (reference, lean):
            try:
                outcomes.append(buffer.extend(data.clone()))
            except Exception as error:  # noqa: BLE001 - the parent's outcome, whatever it is
                outcomes.append(type(error))
        if isinstance(outcomes[0], torch.Tensor):
            assert torch.equal(outcomes[0], outcomes[1])
        else:
            assert outcomes[0] is outcomes[1]
        assert_same_state(reference, lean)
    torch.manual_seed(0)
    sample_reference = reference.sample()
    torch.manual_seed(0)
    assert_close(sample_reference, lean.sample())


def test_an_empty_buffer_raises_torchrl_s_error():
    reference, lean = buffer_pair()
    errors = []
    for buffer in (reference, lean):
        with pytest.raises(Exception) as raised:
            buffer.sample()
        errors.append(type(raised.value))
    assert errors[0] is errors[1]


def test_a_saved_lean_buffer_loads_into_either_kind_and_carries_on_alike():
    reference, lean = buffer_pair()
    for start in range(0, 14, 2):
        lean.extend(transitions(2, start))
        reference.extend(transitions(2, start))
    state = _replay_buffer_state(lean)
    restored_reference, restored_lean = buffer_pair()
    _load_replay_buffer_state(restored_reference, state)
    _load_replay_buffer_state(restored_lean, state)
    assert_same_state(reference, restored_lean, last_cursor=False)
    assert_same_state(restored_reference, restored_lean, last_cursor=False)
    for buffer in (restored_reference, restored_lean):
        buffer.extend(transitions(3, 100))
    assert_same_state(restored_reference, restored_lean)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.filterwarnings("ignore:Got conflicting batch_sizes")
def test_a_cuda_storage_holds_and_draws_what_torchrl_s_does():
    """CPU batches written into a storage on the GPU (through a wrap-around), drawn with the GPU's generator."""
    reference, lean = (
        cls(storage=LazyTensorStorage(CAPACITY, device="cuda"), batch_size=4)
        for cls in (TensorDictReplayBuffer, LeanReplayBuffer)
    )
    for start, count in ((0, 3), (3, 6), (9, 4)):
        indices = [buffer.extend(transitions(count, start)) for buffer in (reference, lean)]
        assert (
            indices[0].device == indices[1].device == torch.device("cpu")
        )  # the data's device, as TorchRL's
        assert torch.equal(*indices)
        assert lean._lean_entries() is not None
        assert_same_state(reference, lean)
        samples = []
        for buffer in (reference, lean):
            torch.manual_seed(start)
            samples.append(buffer.sample(return_info=True))
        assert_close(samples[0][0], samples[1][0])
        assert samples[1][0].device.type == "cuda"
        assert torch.equal(samples[0][1]["index"], samples[1][1]["index"])


def test_a_buffer_is_checked_against_memory_for_what_it_reserves_whole(monkeypatch):
    """Two observations a transition; for frame stacks, the frame pool's first chunk and the slot numbers; the
    priorities' trees."""
    monkeypatch.setattr("training.replay.physical_memory", lambda: 2**31)  # 2 GiB
    stacks = Bounded(0, 255, shape=(8, 4, 84, 84), dtype=torch.uint8)  # 8 envs' Atari stacks
    # (100k x 1.25 + 65,536) frames of 7,056 bytes, and 64 bytes of slot numbers a transition: 1.3 GiB
    check_replay_memory(100_000, stacks, prioritized=False, frame_stacks=True)
    with pytest.raises(
        InputError, match=r"--buffer-size 200,000 needs at least 2.1 GiB for the replay buffer,"
    ):
        check_replay_memory(200_000, stacks, prioritized=False, frame_stacks=True)
    with pytest.raises(
        InputError, match=r"--buffer-size 100,000 needs at least 5.3 GiB for the replay buffer,"
    ):
        check_replay_memory(100_000, stacks, prioritized=False)  # whole stacks: 2 x 28,224 bytes a transition
    monkeypatch.setattr("training.replay.physical_memory", lambda: 2**30)  # 1 GiB
    numbers = Unbounded(shape=(8, 1))  # 4 bytes an observation: 60M transitions hold 0.45 GiB
    check_replay_memory(60_000_000, numbers, prioritized=False)
    with pytest.raises(InputError, match=r"at least 1.4 GiB for the replay buffer and its priorities"):
        check_replay_memory(60_000_000, numbers, prioritized=True)  # + two trees of 2 x 2^26 float32 nodes
    observations = Composite(
        image=Bounded(0, 255, shape=(8, 3, 8, 8), dtype=torch.uint8),
        vector=Unbounded(shape=(8, 5)),
        shape=(8,),
    )
    check_replay_memory(1_000_000, observations, prioritized=False)  # 2 x 212 bytes a transition
    with pytest.raises(
        InputError, match=r"--buffer-size 3,000,000 needs at least 1.2 GiB .* 1.0 GiB of memory"
    ):
        check_replay_memory(3_000_000, observations, prioritized=False)


def test_memory_checks_pass_where_the_system_does_not_say_how_much_memory_it_has(monkeypatch):
    monkeypatch.setattr("os.sysconf", lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert physical_memory() == 0
    check_replay_memory(10**9, Unbounded(shape=(8, 1)), prioritized=True)  # 32 GiB and more: not refused
    check_mlp_memory(10**5, 1, [10**5])  # 10^10 weights: not refused


def test_off_policy_storage_holds_every_frame_a_short_run_collects_and_is_checked_against_memory(monkeypatch):
    observations = Unbounded(shape=(2, 3))
    storage = off_policy_storage(1_000_000, 300, 8, observations, torch.device("cpu"))
    assert storage.max_size == 304  # 38 batches of 8: the last one passes --total-frames
    assert off_policy_storage(100, 300, 8, observations, torch.device("cpu")).max_size == 100
    monkeypatch.setattr("training.replay.physical_memory", lambda: 2**30)
    with pytest.raises(InputError, match=r"--buffer-size 100,000,000 needs at least 2.2 GiB"):
        off_policy_storage(10**8, 10**9, 8, observations, torch.device("cpu"))  # 2 x 12 bytes a transition
