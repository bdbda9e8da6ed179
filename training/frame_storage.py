"""A replay storage that keeps each frame of stacked image observations once.

Atari observations are stacks of the last 4 frames, and the next observation of a transition shares 3 of them with
the observation, which shares 3 with the one before: a storage of whole stacks holds every frame 8 times (56 KB per
transition, 56 GB for the replay buffer of Mnih et al. 2015). :class:`FrameStackStorage` keeps each distinct frame
once, in a pool, and a transition keeps only the pool slots of its frames; a sampled batch gets its stacks rebuilt
from them. The frames are matched by content (a hash, then an exact comparison), so the rebuilt stacks are exactly
what was written, whatever the write order, the number of envs, the padding at episode starts or an n-step next
observation: a frame that matches nothing is simply stored. With 4-frame stacks a transition costs about one 84x84
frame (7 KB) plus 64 bytes of slot numbers: about 7.2 GB per million transitions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from tensordict import NestedKey, TensorDictBase
from torchrl.data import LazyTensorStorage

from errors import InputError

CHUNK_FRAMES = 1 << 16  # frames per pool chunk: the pool grows a chunk at a time, never by copying


class FramePool:
    """Distinct frames, each stored once and reference-counted, found again by content.

    :meth:`add` returns a slot per frame (an existing slot for a frame already held), :meth:`retain` and
    :meth:`release` count the users of slots; a slot whose count drops to zero is free for another frame.
    Frames live in chunks allocated as the pool fills (memory not yet written is not resident); the bookkeeping
    (counts, hashes, slot numbers given to :meth:`retain` and :meth:`release`) stays on the CPU.

    Args:
        device: where the frames live.
        max_frames: the most slots the pool may ever need (its owner's bound on distinct live frames).
        first_chunk: frames in the first chunk (the frames a full buffer usually holds: a batch read from one
            chunk is one gather); later chunks hold :data:`CHUNK_FRAMES`.
    """

    def __init__(
        self, device: torch.device | str = "cpu", max_frames: int = 2**40, first_chunk: int = CHUNK_FRAMES
    ):
        self.device = torch.device(device)
        self.max_frames = max_frames
        self.first_chunk = max(1, min(first_chunk, max_frames))
        self.starts: list[int] = []  # first slot of each chunk
        self.frame_shape: tuple[int, ...] | None = None
        self.dtype: torch.dtype | None = None
        self.chunks: list[torch.Tensor] = []
        self.counts = torch.zeros(0, dtype=torch.int64)
        self.hashes = torch.zeros(0, dtype=torch.int64)
        self.fresh = 0  # slots below this have held a frame; above it, never
        self.free: list[int] = []
        self.index: dict[int, int] = {}  # frame hash -> a live slot holding a frame with that hash
        self._weights: torch.Tensor | None = None

    # ------------------------------------------------------------------ frames in
    def add(self, frames: torch.Tensor) -> torch.Tensor:
        """Slots holding ``frames`` (``[M, *frame_shape]``): existing slots for frames already held (and for frames
        repeated within ``frames``), new slots for the others. The new slots have a count of zero: :meth:`retain`
        them."""
        if frames.shape[0] == 0:
            return torch.zeros(0, dtype=torch.int64, device=self.device)
        if self.frame_shape is None:
            self.frame_shape, self.dtype = tuple(frames.shape[1:]), frames.dtype
        elif tuple(frames.shape[1:]) != self.frame_shape or frames.dtype != self.dtype:
            raise InputError(
                f"Frames of shape {tuple(frames.shape[1:])} and dtype {frames.dtype} cannot join a pool of "
                f"{self.frame_shape} {self.dtype} frames: every observation of a replay buffer has one shape."
            )
        frames = frames.to(self.device)
        hashes = self._hash(frames)
        unique_hashes, inverse = torch.unique(hashes, return_inverse=True)
        first = torch.full((len(unique_hashes),), len(hashes), dtype=torch.int64, device=self.device)
        first.scatter_reduce_(0, inverse, torch.arange(len(hashes), device=self.device), reduce="amin")
        if not _rows_equal(frames, frames[first[inverse]]).all():  # two frames of one hash: a collision
            return torch.cat([self.add(frame[None]) for frame in frames])
        representatives = frames[first]
        slots = torch.tensor(
            [self.index.get(key, -1) for key in unique_hashes.tolist()], dtype=torch.int64, device=self.device
        )
        found = slots >= 0
        if found.any():  # a hash match is checked frame against frame
            found_at = found.nonzero().squeeze(1)
            same = _rows_equal(self.get(slots[found_at]), representatives[found_at])
            found[found_at[~same]] = False
        missing = (~found).nonzero().squeeze(1)
        if len(missing):
            new_slots = self._allocate(len(missing))
            self._write(new_slots, representatives[missing])
            slots[missing] = new_slots
            self.hashes[new_slots.cpu()] = unique_hashes[missing].cpu()
            self.index.update(zip(unique_hashes[missing].tolist(), new_slots.tolist(), strict=True))
        return slots[inverse]

    def retain(self, slots: torch.Tensor) -> None:
        """Count one more user of each of ``slots`` (repeats count repeatedly)."""
        slots = slots.reshape(-1).cpu()
        self.counts.index_add_(0, slots, torch.ones_like(slots))

    def release(self, slots: torch.Tensor) -> None:
        """Count one user less of each of ``slots``; slots nobody uses any more are freed."""
        slots = slots.reshape(-1).cpu()
        if not len(slots):
            return
        self.counts.index_add_(0, slots, -torch.ones_like(slots))
        touched = torch.unique(slots)
        unused = touched[self.counts[touched] == 0].tolist()
        for slot, key in zip(unused, self.hashes[unused].tolist(), strict=True):
            if self.index.get(key) == slot:
                del self.index[key]
        self.free.extend(unused)

    # ------------------------------------------------------------------ frames out
    def get(self, slots: torch.Tensor) -> torch.Tensor:
        """The frames in ``slots`` (any shape): a tensor of shape ``[*slots.shape, *frame_shape]``."""
        flat = slots.reshape(-1).to(self.device)
        if len(self.chunks) == 1 or not len(flat) or int(flat.max()) < self.first_chunk:
            out = (
                self.chunks[0][flat] if self.chunks else torch.empty((0, *self.frame_shape), dtype=self.dtype)
            )
        else:
            out = torch.empty((len(flat), *self.frame_shape), dtype=self.dtype, device=self.device)
            chunk_of = self._chunk_of(flat)
            for chunk in torch.unique(chunk_of).tolist():
                where = (chunk_of == chunk).nonzero().squeeze(1)
                out[where] = self.chunks[chunk][flat[where] - self.starts[chunk]]
        return out.reshape(*slots.shape, *self.frame_shape)

    def _chunk_of(self, slots: torch.Tensor) -> torch.Tensor:
        starts = torch.tensor(self.starts, dtype=torch.int64, device=slots.device)
        return torch.searchsorted(starts, slots, right=True) - 1

    def __len__(self) -> int:
        """Frames held (slots in use)."""
        return self.fresh - len(self.free)

    @property
    def nbytes(self) -> int:
        """Bytes of the frames held."""
        if self.frame_shape is None:
            return 0
        return len(self) * int(torch.Size(self.frame_shape).numel()) * self.dtype.itemsize

    def clear(self) -> None:
        """Forget every frame (the chunks are kept for reuse)."""
        self.counts.zero_()
        self.fresh, self.free, self.index = 0, [], {}

    # ------------------------------------------------------------------ internals
    def _allocate(self, count: int) -> torch.Tensor:
        reused = [self.free.pop() for _ in range(min(count, len(self.free)))]
        new = count - len(reused)
        if self.fresh + new > self.max_frames:
            raise RuntimeError(f"The frame pool is full ({self.max_frames} frames); this is a bug.")
        while self.fresh + new > self._capacity:
            self._grow()
        slots = reused + list(range(self.fresh, self.fresh + new))
        self.fresh += new
        return torch.tensor(slots, dtype=torch.int64, device=self.device)

    @property
    def _capacity(self) -> int:
        return self.starts[-1] + len(self.chunks[-1]) if self.chunks else 0

    def _grow(self) -> None:
        capacity = self._capacity
        size = min(self.first_chunk if not self.chunks else CHUNK_FRAMES, self.max_frames - capacity)
        self.chunks.append(torch.empty((size, *self.frame_shape), dtype=self.dtype, device=self.device))
        self.starts.append(capacity)
        padding = torch.zeros(size, dtype=torch.int64)
        self.counts = torch.cat([self.counts, padding])
        self.hashes = torch.cat([self.hashes, padding])

    def _write(self, slots: torch.Tensor, frames: torch.Tensor) -> None:
        chunk_of = self._chunk_of(slots)
        for chunk in torch.unique(chunk_of).tolist():
            where = (chunk_of == chunk).nonzero().squeeze(1)
            self.chunks[chunk][slots[where] - self.starts[chunk]] = frames[where]

    def _hash(self, frames: torch.Tensor) -> torch.Tensor:
        """A 64-bit hash per frame: its bytes read as int64 words, weighted by fixed random odd words (arithmetic
        modulo 2**64). Equal frames get equal hashes; unequal ones almost never do, and :meth:`add` checks."""
        words = frames.reshape(len(frames), -1).view(torch.uint8)
        if words.shape[1] % 8:
            words = torch.nn.functional.pad(words, (0, 8 - words.shape[1] % 8))
        words = words.view(torch.int64)
        if self._weights is None or len(self._weights) != words.shape[1]:
            generator = torch.Generator().manual_seed(words.shape[1])  # the same weights in every process
            weights = torch.randint(-(2**62), 2**62, (words.shape[1],), generator=generator) * 2 + 1
            self._weights = weights.to(self.device)
        return (words * self._weights).sum(1)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self, live_slots: torch.Tensor) -> dict[str, Any]:
        """The frames of ``live_slots`` (the slots the owner still refers to), compacted: ``{"frames": [N, ...],
        "slots": [N]}``, so that a checkpoint holds no freed frames."""
        live = torch.unique(live_slots.reshape(-1))
        live = live[live >= 0]
        empty = torch.zeros(
            0, *(self.frame_shape or ()), dtype=self.dtype or torch.uint8
        )  # of the pool's shape
        return {"frames": self.get(live) if len(live) else empty, "slots": live}


def _rows_equal(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    """Per leading index, whether ``left`` and ``right`` hold the same bytes (a frame holding NaN equals itself)."""
    left, right = left.contiguous().view(torch.uint8), right.contiguous().view(torch.uint8)
    return (left == right).reshape(len(left), -1).all(1)


class FrameStackStorage(LazyTensorStorage):
    """A :class:`~torchrl.data.LazyTensorStorage` that keeps stacked image observations as frames, each once.

    The entries ``keys`` (default ``"observation"`` and ``("next", "observation")``) of every transition written are
    taken apart into their frames along their first dim (``(4, 84, 84)`` Atari stacks: four 84x84 frames; ``(4, 96,
    96, 3)``: four RGB frames); the frames go into a :class:`FramePool` and the transition keeps their slots.
    Everything else is stored as :class:`~torchrl.data.LazyTensorStorage` stores it. Reading rebuilds the stacks:
    what comes out is exactly what went in. Use it as any TorchRL storage::

        replay_buffer = TensorDictReplayBuffer(storage=FrameStackStorage(1_000_000), sampler=RandomSampler())

    Args:
        max_size: transitions held.
        keys: the stacked image entries.
        device: where everything is stored.

    Raises:
        InputError: an entry of ``keys`` is missing from written data, or is not at least 3-dimensional per
            transition; a write whose positions and transitions differ in number. A write of more transitions than
            ``max_size`` keeps the last at each position, as TorchRL's storages do.
    """

    def __init__(
        self,
        max_size: int,
        keys: Sequence[NestedKey] = ("observation", ("next", "observation")),
        device: torch.device | str = "cpu",
    ):
        super().__init__(max_size, device=device)
        self.frame_keys = list(keys)
        self.pool: FramePool | None = None
        self._slots: torch.Tensor | None = None  # [max_size, len(keys), frames per stack], -1 where empty
        self._stack_shapes: list[torch.Size] | None = None

    # ------------------------------------------------------------------ write
    def set(
        self, cursor: int | Sequence[int] | slice, data: TensorDictBase, *, set_cursor: bool = True
    ) -> None:
        if not isinstance(data, TensorDictBase):
            raise InputError(f"{type(self).__name__} stores TensorDicts, got {type(data).__name__}.")
        positions = self._positions(cursor)
        if data.batch_dims == 0:
            data = data.unsqueeze(0)
        if len(positions) != data.shape[0]:
            raise InputError(
                f"{type(self).__name__} writes one transition per position: got {data.shape[0]} transitions for "
                f"{len(positions)} positions; pass as many positions as transitions."
            )
        unique, inverse = torch.unique(positions, return_inverse=True)
        if len(unique) != len(positions):  # a write larger than the storage: the last at each position stays
            rows = torch.arange(len(positions))
            last = torch.full((len(unique),), -1).scatter_reduce_(0, inverse, rows, "amax").sort().values
            data, positions = data[last], positions[last]
            cursor = positions
        stacks = []
        for key in self.frame_keys:
            stack = data.get(key, None)
            if stack is None or stack.ndim < 4:
                raise InputError(
                    f"{type(self).__name__} needs {key!r} in every transition as a stack of frames (frames, "
                    f"height, width[, channels]); got {None if stack is None else tuple(stack.shape[1:])}."
                )
            stacks.append(stack)
        shapes = [stack.shape[1:] for stack in stacks]
        if any(shape != shapes[0] for shape in shapes):
            raise InputError(
                f"{type(self).__name__} needs {self.frame_keys} of one shape, got {[tuple(s) for s in shapes]}."
            )
        if self._stack_shapes is None:
            self._stack_shapes = shapes
            self._frames_per_stack = shapes[0][0]  # frames along the first dim, whatever their layout
            self.pool = self._make_pool(self.device if self.device != "auto" else data.device)
            self._slots = torch.full(
                (self.max_size, len(self.frame_keys), self._frames_per_stack), -1, dtype=torch.int64
            )
        elif shapes != self._stack_shapes:
            raise InputError(
                f"Observations of shapes {[tuple(s) for s in shapes]} cannot join a buffer of "
                f"{[tuple(s) for s in self._stack_shapes]}."
            )
        frames = torch.stack(stacks, 1)  # [transitions, keys, frames per stack, *frame shape]
        new_slots = self.pool.add(frames.flatten(0, 2)).reshape(frames.shape[:3]).cpu()
        self.pool.retain(new_slots)
        old_slots = self._slots[positions]
        self.pool.release(old_slots[old_slots >= 0])  # after retain: frames shared with new transitions stay
        self._slots[positions] = new_slots
        super().set(cursor, data.exclude(*self.frame_keys), set_cursor=set_cursor)

    def _positions(self, cursor: int | Sequence[int] | slice) -> torch.Tensor:
        if isinstance(cursor, slice):
            return torch.arange(self.max_size)[cursor]
        return torch.as_tensor(cursor, dtype=torch.int64).reshape(-1).cpu()

    def _make_pool(self, device: torch.device | str) -> FramePool:
        # at most every transition's own frames, none shared, for a full buffer and a write of as many again (the
        # frames a write replaces are released after it); usually a little over one frame per transition
        max_frames = 2 * self.max_size * len(self.frame_keys) * self._frames_per_stack
        return FramePool(device, max_frames, first_chunk=self.max_size + self.max_size // 4 + CHUNK_FRAMES)

    # ------------------------------------------------------------------ read
    def get(self, index: int | Sequence[int] | slice) -> TensorDictBase:
        data = super().get(index)
        if isinstance(index, torch.Tensor):
            index = index.cpu()  # the slot table lives on the CPU, the rest of the storage on its device
        slots = self._slots[: len(self)][index] if not self._is_full else self._slots[index]
        for position, (key, shape) in enumerate(zip(self.frame_keys, self._stack_shapes, strict=True)):
            stacks = self.pool.get(slots[..., position, :])
            data.set(key, stacks.reshape(*slots.shape[:-2], *shape))
        return data

    def _empty(self) -> None:
        if self.pool is not None:
            self.pool.clear()
            self._slots.fill_(-1)
        super()._empty()

    @property
    def frames_held(self) -> int:
        """Distinct frames in the pool."""
        return 0 if self.pool is None else len(self.pool)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.pool is None:
            return {**state, "frames": {}}
        pool = self.pool.state_dict(self._slots)
        return {
            **state,
            "frames": {
                "frames": pool["frames"],
                "slots": pool["slots"],
                "refs": self._slots,
                "stack_shapes": [list(shape) for shape in self._stack_shapes],
            },
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        frames_state = state_dict.get("frames")
        if not isinstance(frames_state, dict):
            raise InputError("A frame-stack replay buffer state needs its 'frames' entry.")
        super().load_state_dict({key: value for key, value in state_dict.items() if key != "frames"})
        if not frames_state:
            return
        self._restore_frames(frames_state)

    def _restore_frames(self, state: dict[str, Any]) -> None:
        """Rebuild the pool from a checkpoint's compacted frames, checking every number it holds (a checkpoint
        may be hostile): slot numbers in range and unique, references only to saved frames, shapes consistent."""
        frames, saved_slots, refs = state["frames"], state["slots"], state["refs"]
        shapes = [torch.Size(int(size) for size in shape) for shape in state["stack_shapes"]]
        if len(shapes) != len(self.frame_keys) or any(
            len(shape) < 3 or shape != shapes[0] for shape in shapes
        ):
            raise InputError(
                f"A frame-stack replay buffer state has unusable stack shapes {state['stack_shapes']}."
            )
        frames_per_stack = shapes[0][0]
        if (
            refs.dtype != torch.int64
            or tuple(refs.shape) != (self.max_size, len(self.frame_keys), frames_per_stack)
            or saved_slots.dtype != torch.int64
            or saved_slots.ndim != 1
            or frames.shape[:1] != saved_slots.shape
            or tuple(frames.shape[1:]) != tuple(shapes[0][1:])
        ):
            raise InputError("A frame-stack replay buffer state does not fit this buffer (its sizes differ).")
        if len(saved_slots) and (saved_slots.min() < 0 or len(torch.unique(saved_slots)) != len(saved_slots)):
            raise InputError("A frame-stack replay buffer state holds invalid slot numbers.")
        if len(refs) and refs.min() < -1:
            raise InputError("A frame-stack replay buffer state holds invalid frame references.")
        # the saved frames get new slots; each reference is looked up among the saved slot numbers
        order = torch.argsort(saved_slots)
        sorted_slots = saved_slots[order]
        used = refs >= 0
        at = torch.searchsorted(sorted_slots, refs[used]).clamp(max=max(len(sorted_slots) - 1, 0))
        if used.any() and (not len(sorted_slots) or not (sorted_slots[at] == refs[used]).all()):
            raise InputError("A frame-stack replay buffer state refers to frames it does not hold.")
        self._stack_shapes, self._frames_per_stack = shapes, frames_per_stack
        self.pool = self._make_pool(self.device if self.device != "auto" else "cpu")
        new_slots = self.pool.add(frames).cpu() if len(frames) else torch.zeros(0, dtype=torch.int64)
        self._slots = torch.full_like(refs, -1)
        self._slots[used] = new_slots[order[at]] if used.any() else self._slots[used]
        self.pool.retain(self._slots[used])
        unused = new_slots[self.pool.counts[new_slots] == 0]
        self.pool.retain(unused)  # saved but unreferenced: counted once, then freed
        self.pool.release(unused)
