"""TorchRL's ``TensorDictReplayBuffer``, with a direct path for the case off-policy recipes use: uniform sampling.

Storing one frame and drawing one batch of 256 each cost a few hundred microseconds in TorchRL's generic
plumbing (the writer's and the storage's TensorDict indexing, shape broadcasting, locks, index bookkeeping) where the
data movement itself is a few copies and gathers. With one frame collected and one gradient step per frame (SAC,
TD3, DDPG at their usual settings) that is a tenth of a run. :class:`LeanReplayBuffer` writes each entry of a
batch straight into the storage's tensors and gathers a sample with one ``index_select`` per entry, leaving the
storage, the writer and the sampler in exactly the state TorchRL's own calls leave them (cursor, length, write
count, last cursor), so checkpoints, resumed runs and every other method of the buffer are the parent's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torchrl.data import LazyTensorStorage, RandomSampler, TensorDictReplayBuffer, TensorSpec
from torchrl.data.replay_buffers.storages.utils import _collate_id
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter

from agents.fast_paths import NUMPY_DTYPES, flat_entries, flat_select
from agents.networks import physical_memory
from errors import InputError
from training.frame_storage import CHUNK_FRAMES

INDEX_KEY = "index"


class LeanReplayBuffer(TensorDictReplayBuffer):
    """A ``TensorDictReplayBuffer`` whose ``extend`` and ``sample`` move the data directly in the uniform case.

    The direct path runs when the buffer holds a ``LazyTensorStorage`` (already initialised by a first write) with
    a ``RandomSampler``, TorchRL's round-robin TensorDict writer without generation tracking, and none of a
    transform, a sample unit, prefetching, pinned memory, ``dim_extend``, a custom ``collate_fn`` or a locked
    (shared) storage; ``extend`` also needs a ``TensorDict`` of one batch dimension with the storage's entries
    (shapes and dtypes) and no priority, and :meth:`extend_selected` (a collected batch's chosen entries, stored
    without building their TensorDict) a plain ``TensorDict`` whose chosen entries are exactly those. Then the
    buffer's contents, the returned indices, the samples (the same draws from the storage's generator) and the
    state of the storage, writer and sampler are what the parent's calls give; tests compare them. Every other
    case is the parent's. Takes the parent's arguments.
    """

    def _lean_entries(self) -> list[tuple[tuple[str, ...], torch.Tensor]] | None:
        """The storage's entries, when the buffer's components allow the direct path; else None."""
        if not getattr(self, "_initialized", True):  # a delayed init: the parent's first call sets it up
            return None
        storage, writer = self._storage, self._writer
        lean = (
            type(storage) is LazyTensorStorage
            and storage.initialized
            and storage.ndim == 1
            and storage._storage_keys is None
            and isinstance(storage._storage, TensorDict)
            and type(self._sampler) is RandomSampler
            and type(writer) is TensorDictRoundRobinWriter
            and not writer._track_generations
            and writer._generation is None
            and not (self._transform is not None and len(self._transform))
            and self._sample_unit is None
            and not self._prefetch
            and not self._pin_memory
            and not self.dim_extend
            and self._collate_fn is _collate_id
        )
        return self._stored_entries() if lean else None

    def _stored_entries(self) -> list[tuple[tuple[str, ...], torch.Tensor]] | None:
        """The storage's entries (key path and whole tensor) besides the write index; None unless the write index
        is stored and the storage is plain tensors in plain TensorDicts of its one batch dimension."""
        stored = self._storage._storage
        if type(stored._tensordict.get(INDEX_KEY)) is not torch.Tensor:
            return None
        entries = plain_entries(stored, stored.batch_size)
        if entries is None:
            return None
        return [(key, value) for key, value in entries if key != (INDEX_KEY,)]

    def _writable(
        self, data: Any, stored: list[tuple[tuple[str, ...], torch.Tensor]]
    ) -> list[torch.Tensor] | None:
        """The values of ``data`` in the order of ``stored``, when they fit the storage exactly; else None."""
        if (
            type(data) is not TensorDict
            or data.batch_dims != 1
            or not 0
            < data.numel()
            <= self._storage.max_size  # larger: rows overwrite each other, as TorchRL does
        ):
            return None
        entries = plain_entries(data, data.batch_size)
        if entries is None:
            return None
        return _in_order(entries, stored, self.priority_key)

    def extend(self, tensordicts: TensorDictBase, *, update_priority: bool | None = None) -> torch.Tensor:
        """Store a batch (along its first dimension) and return the indices it was written at."""
        stored = self._lean_entries()
        values = None if stored is None else self._writable(tensordicts, stored)
        if values is None:
            return super().extend(tensordicts, update_priority=update_priority)
        return self._write(stored, values, len(tensordicts), tensordicts.device)

    def extend_selected(self, batch: TensorDictBase, keys: Sequence[NestedKey]) -> torch.Tensor:
        """``extend(flat_select(batch, keys))``: store the entries ``keys`` of a collected batch (those it holds)
        with its batch dimensions flattened into one, on the direct path straight from the batch's tensors
        (:func:`agents.fast_paths.flat_entries`), without building the selection's TensorDict."""
        stored = self._lean_entries()
        entries = None if stored is None else flat_entries(batch, keys)
        values = None
        if entries is not None and 0 < batch.numel() <= self._storage.max_size:
            values = _in_order(entries, stored, self.priority_key)
        if values is None:
            return self.extend(flat_select(batch, keys))
        return self._write(stored, values, batch.numel(), batch.device)

    def _write(
        self,
        stored: list[tuple[tuple[str, ...], torch.Tensor]],
        values: list[torch.Tensor],
        count: int,
        device: torch.device | None,
    ) -> torch.Tensor:
        """Write ``count`` rows of ``values`` (one per entry of ``stored``, the storage's) at the writer's cursor,
        as the writer and the storage would, and return their indices (on ``device``, the data's, where TorchRL's
        writer puts them)."""
        storage, writer = self._storage, self._writer
        with self._replay_lock, self._write_lock:
            capacity, cursor = storage.max_size, writer._cursor
            index = torch.arange(cursor, cursor + count, dtype=torch.long, device=device or "cpu")
            if cursor + count > capacity:
                index = index % capacity
            writer._cursor = (cursor + count) % capacity
            writer._write_count += count
            storage._set_last_cursor(index)
            storage._get_new_len(index, index)  # the length grows by the rows written (index has one per row)
            pairs = [(storage._storage.get(INDEX_KEY), index)] + [
                (whole, value) for (_, whole), value in zip(stored, values)
            ]
            if cursor + count <= capacity:  # one contiguous block
                for whole, value in pairs:
                    _write_rows(whole, cursor, value)
            else:
                for whole, value in pairs:
                    whole.index_copy_(0, index.to(whole.device), value.to(whole.device))
            storage._bump_mutation_revision()
            writer._mark_update_entities(index)  # the buffers reading this storage: their samplers
            self._sampler.extend(index)
        return index

    def sample(
        self, batch_size: int | None = None, return_info: bool = False, include_info: bool | None = None
    ) -> Any:
        """TorchRL's ``sample``. A call without arguments (the buffer's batch size: the recipes' updates) on the
        direct path draws and gathers as :meth:`_sample` does and puts the drawn indices under ``"index"`` as
        TorchRL's ``sample`` does, without its generic handling of prefetching, infos and locked results."""
        if (
            batch_size is None
            and not return_info
            and include_info is None
            and self._batch_size is not None
            and not self._service_shutdown
            and self._sample_dependency is None
            and self._storage._len > 0
            and self._lean_entries() is not None
        ):
            data, info = self._draw(self._batch_size)
            data._tensordict[INDEX_KEY] = info[INDEX_KEY]  # TensorDictReplayBuffer.sample's data.set(...)
            return data
        return super().sample(batch_size, return_info=return_info, include_info=include_info)

    def _sample(self, batch_size: int) -> tuple[Any, dict]:
        if self._lean_entries() is None or self._storage._len == 0:  # empty: the parent's error
            return super()._sample(batch_size)
        return self._draw(batch_size)

    def _draw(self, batch_size: int) -> tuple[TensorDict, dict]:
        """The direct path's sample: the draw of RandomSampler.sample (storage._rand_given_ndim) without its
        per-call compiler guards, and the rows it drew (without the write index), with their indices."""
        storage = self._storage
        with self._replay_lock, self._write_lock:
            index = torch.randint(
                0, storage._len, (batch_size,), generator=storage._rng, device=storage.device
            )
            data = gather_rows(storage._storage, index, skip=INDEX_KEY)
        return data, {INDEX_KEY: index}


def _in_order(
    entries: list[tuple[tuple[str, ...], torch.Tensor]],
    stored: list[tuple[tuple[str, ...], torch.Tensor]],
    priority_key: NestedKey,
) -> list[torch.Tensor] | None:
    """The values of ``entries`` (key path, rows) in the order of ``stored``, when they are exactly the storage's
    entries (dtypes and row shapes) besides the write index, and none is a priority; else None."""
    given = {key: value for key, value in entries if key != (INDEX_KEY,)}
    if len(given) != len(stored) or priority_key in given or (priority_key,) in given:
        return None
    values = []
    for key, whole in stored:
        value = given.get(key)
        if value is None or value.dtype != whole.dtype or value.shape[1:] != whole.shape[1:]:
            return None
        values.append(value)
    return values


def _write_rows(whole: torch.Tensor, start: int, value: torch.Tensor) -> None:
    """``whole[start : start + len(value)] = value`` for tensors of one dtype: through NumPy for CPU tensors
    NumPy can view (a few microseconds less than a tensor copy, which at one frame per batch is paid for every
    entry of every frame), else as a tensor copy."""
    rows = value.shape[0]
    if (
        whole.is_cpu
        and value.is_cpu
        and not (whole.requires_grad or value.requires_grad)
        and whole.dtype in NUMPY_DTYPES
    ):
        whole.numpy()[start : start + rows] = value.numpy()
    else:
        whole.narrow(0, start, rows).copy_(value)


def plain_entries(data: TensorDict, batch_size: torch.Size, prefix: tuple[str, ...] = ()) -> list | None:
    """Every tensor of ``data`` with its key path, when ``data`` is plain tensors in plain TensorDicts of
    ``batch_size`` without dimension names; else None."""
    if data.batch_size != batch_size or data._has_names():
        return None
    entries = []
    for name, value in data._tensordict.items():
        if type(value) is torch.Tensor:
            entries.append((prefix + (name,), value))
        elif type(value) is TensorDict:
            nested = plain_entries(value, batch_size, prefix + (name,))
            if nested is None:
                return None
            entries.extend(nested)
        else:
            return None
    return entries


def gather_rows(data: TensorDict, index: torch.Tensor, skip: str | None = None) -> TensorDict:
    """``data[index]`` for a 1-D ``index`` along the first dimension, for the TensorDicts :func:`plain_entries`
    accepts, without ``skip``."""
    return TensorDict._new_unsafe(
        {
            name: torch.index_select(value, 0, index)
            if type(value) is torch.Tensor
            else gather_rows(value, index)
            for name, value in data._tensordict.items()
            if name != skip
        },
        batch_size=index.shape + data.batch_size[1:],
        device=data.device,
    )


def device_memory(device: torch.device | str) -> tuple[int, str]:
    """The bytes of memory of ``device`` and how to name them: a GPU's own, else this machine's physical memory
    (0 where the system does not say: the memory checks then pass)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, f"{device}'s"
    return physical_memory(), "this machine's"


def check_replay_memory(
    buffer_size: int,
    observation_spec: TensorSpec,
    *,
    prioritized: bool,
    frame_stacks: bool = False,
    device: torch.device | str = "cpu",
) -> None:
    """Raise :class:`InputError` when a replay buffer of ``buffer_size`` transitions of ``observation_spec``
    observations (batched: ``[N, ...]``) cannot fit in the memory of ``device`` (a GPU's own, else this machine's
    physical memory, where the system says how much); call it before building the sampler. It counts what is reserved whole, not as the buffer
    fills: a prioritized sampler's sum and min trees (two float32 arrays of twice the power of two above
    ``buffer_size``, filled when it is built) and the storage, reserved at its first write: two observations per
    transition, or with ``frame_stacks`` (stacks kept by :class:`training.FrameStackStorage`) the frame pool's
    first chunk (1.25 frames per transition and :data:`training.frame_storage.CHUNK_FRAMES` more) and the slot
    numbers of two stacks a transition."""
    observation = observation_spec.zero()[0]
    observation_bytes = observation.bytes() if isinstance(observation, TensorDictBase) else observation.nbytes
    if frame_stacks:
        frames, frame_bytes = observation.shape[0], observation_bytes // observation.shape[0]
        storage = (buffer_size + buffer_size // 4 + CHUNK_FRAMES) * frame_bytes + buffer_size * 2 * frames * 8
    else:
        storage = buffer_size * 2 * observation_bytes
    trees = 16 * (1 << buffer_size.bit_length()) if prioritized else 0
    memory, where = device_memory(device)
    needed = storage + trees
    if memory and needed > memory:
        raise InputError(
            f"--buffer-size {buffer_size:,} needs at least {needed / 2**30:,.1f} GiB for the replay buffer"
            f"{' and its priorities' if prioritized else ''}, more than {where} {memory / 2**30:,.1f} GiB of "
            "memory: lower --buffer-size."
        )


def off_policy_storage(
    buffer_size: int,
    total_frames: int,
    frames_per_batch: int,
    observation_spec: TensorSpec,
    device: torch.device,
) -> LazyTensorStorage:
    """The replay storage of SAC, TD3 and DDPG, reserved at its first write: ``buffer_size`` transitions, or every
    one a shorter run collects (``total_frames`` rounded up to whole batches), once :func:`check_replay_memory` has
    found room for them."""
    capacity = min(buffer_size, -(-total_frames // frames_per_batch) * frames_per_batch)
    check_replay_memory(capacity, observation_spec, prioritized=False, device=device)
    return LazyTensorStorage(capacity, device=device)
