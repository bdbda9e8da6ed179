"""FrameStackStorage: stacked frames stored once, read back exactly as a plain storage would."""

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from agents import TRANSITION_KEYS, NStepReturns
from envs import make_env
from errors import InputError
from training import FrameStackStorage
from training.resume import load_resume_checkpoint, save_resume_checkpoint

STACK = 4


def frame_stream_batches(num_envs, steps, batches, seed, padding="reset", size=6, channels=None):
    """Collector-like ``[num_envs, steps]`` batches of 4-frame stacks from per-env streams of distinct frames
    (``size x size``, or ``size x size x channels``), episodes of 1 to 8 steps; at a reset the stack is padded with
    the first frame ("reset") or zeros."""
    frame_shape = (size, size) if channels is None else (size, size, channels)
    generator = torch.Generator().manual_seed(seed)
    counter = [1]

    def new_frame():
        counter[0] += 1
        return torch.randint(0, 256, frame_shape, generator=generator, dtype=torch.uint8)

    def reset_stack():
        first = new_frame()
        pad = first if padding == "reset" else torch.zeros_like(first)
        return torch.stack([pad] * (STACK - 1) + [first])

    stacks = [reset_stack() for _ in range(num_envs)]
    lengths = [0] * num_envs
    out = []
    for _ in range(batches):
        observation = torch.empty(num_envs, steps, STACK, *frame_shape, dtype=torch.uint8)
        next_observation = torch.empty_like(observation)
        done = torch.zeros(num_envs, steps, 1, dtype=torch.bool)
        for env in range(num_envs):
            for step in range(steps):
                observation[env, step] = stacks[env]
                following = torch.cat([stacks[env][1:], new_frame()[None]])
                next_observation[env, step] = following
                lengths[env] += 1
                if torch.randint(0, 8, (1,), generator=generator).item() == 0 or lengths[env] >= 8:
                    done[env, step] = True
                    stacks[env], lengths[env] = reset_stack(), 0
                else:
                    stacks[env] = following
        batch = TensorDict(
            {
                "observation": observation,
                "action": torch.randint(0, 4, (num_envs, steps), generator=generator),
                "next": {
                    "observation": next_observation,
                    "reward": torch.randn(num_envs, steps, 1, generator=generator),
                    "done": done,
                    "terminated": done.clone(),
                    "truncated": torch.zeros_like(done),
                },
            },
            batch_size=[num_envs, steps],
        )
        out.append(batch)
    return out


def assert_same_contents(plain, frames):
    assert len(plain) == len(frames)
    index = torch.arange(len(plain))
    expected, actual = plain.storage.get(index), frames.storage.get(index)
    assert set(actual.keys(True, True)) == set(expected.keys(True, True))
    for key in expected.keys(True, True):
        assert torch.equal(actual.get(key), expected.get(key)), key


@pytest.mark.parametrize("padding", ["reset", "zeros"])
@pytest.mark.parametrize("n_steps", [1, 3])
def test_stacks_read_back_exactly_as_a_plain_storage_holds_them(padding, n_steps):
    """Episode boundaries, the padded first stacks of an episode, n-step next observations and the ring buffer
    wrapping around several times: every transition reads back as written."""
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    frames = TensorDictReplayBuffer(storage=FrameStackStorage(50))
    n_step_returns = [NStepReturns(n_steps, 0.99), NStepReturns(n_steps, 0.99)]
    for batch in frame_stream_batches(num_envs=3, steps=7, batches=12, seed=n_steps, padding=padding):
        n_step_returns[0].extend(plain, batch)
        n_step_returns[1].extend(frames, batch)
        assert_same_contents(plain, frames)
    assert len(frames) == 50  # full and wrapped: 12 x 21 transitions written
    # frames of overwritten transitions are freed: about one new frame per transition, plus each episode's first
    held = frames.storage.frames_held
    assert held <= 50 * 2 + 3 * STACK, held
    assert frames.storage.pool.nbytes == held * 6 * 6
    # a replay buffer samples the same transitions from both with the same random state
    torch.manual_seed(0)
    expected = plain.sample(32)
    torch.manual_seed(0)
    actual = frames.sample(32)
    for key in expected.keys(True, True):
        assert torch.equal(actual.get(key), expected.get(key)), key


def test_atari_transitions_cost_about_one_frame_each():
    """Breakout with 4 envs: what comes back equals a plain storage, and a transition holds about one 84x84 frame
    (a plain storage holds eight)."""
    env = make_env("ALE/Breakout-v5", num_envs=4, seed=0)
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(300))
    frames = TensorDictReplayBuffer(storage=FrameStackStorage(300, device="cpu"))
    for _ in range(4):
        batch = env.rollout(40, break_when_any_done=False).select(*TRANSITION_KEYS)
        plain.extend(batch.reshape(-1))
        frames.extend(batch.reshape(-1))
        assert_same_contents(plain, frames)
    env.close()
    assert frames.storage.frames_held <= 1.1 * len(frames)
    assert frames.storage.pool.nbytes <= 1.1 * len(frames) * 84 * 84


def test_channels_last_stacks_keep_each_frame_once():
    """Stacks of RGB frames ``(4, H, W, 3)`` (FrameStackObservation over a pixel env) are taken apart into their
    four frames, not into rows of pixels: they read back as written, across episode ends and wrap-around, and a
    transition costs about one frame and eight slot numbers."""
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(50))
    frames = TensorDictReplayBuffer(storage=FrameStackStorage(50))
    for batch in frame_stream_batches(num_envs=3, steps=7, batches=6, seed=5, size=12, channels=3):
        plain.extend(batch.reshape(-1))
        frames.extend(batch.reshape(-1))
        assert_same_contents(plain, frames)
    assert len(frames) == 50  # full and wrapped: 6 x 21 transitions written
    storage = frames.storage
    assert storage.pool.frame_shape == (12, 12, 3) and tuple(storage._slots.shape) == (50, 2, STACK)
    held = storage.frames_held
    assert held <= 50 * 2 + 3 * STACK, held
    assert storage.pool.nbytes == held * 12 * 12 * 3


def test_a_write_larger_than_the_storage_keeps_its_last_transitions_as_torchrl_does():
    """A collected batch larger than the buffer (--buffer-size below num_envs x steps_per_env): the last
    transitions stay, each position holding the last written to it, as in a plain storage."""
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    frames = TensorDictReplayBuffer(storage=FrameStackStorage(10))
    for batch in frame_stream_batches(num_envs=2, steps=8, batches=3, seed=2):  # 16 transitions a write
        plain.extend(batch.reshape(-1))
        frames.extend(batch.reshape(-1))
        assert_same_contents(plain, frames)
    # the third write (16 transitions from position 2) left its last ten, the 7th to 16th, at positions 8, 9, 0, ...
    last_ten = batch.reshape(-1)[6:].get("observation")
    assert torch.equal(
        frames.storage.get(torch.arange(10)).get("observation"), last_ten[(torch.arange(10) - 8) % 10]
    )
    assert frames.storage.frames_held <= 10 * 2 + 2 * STACK


def test_hash_collisions_never_mix_frames_up(monkeypatch):
    from training.frame_storage import FramePool

    monkeypatch.setattr(FramePool, "_hash", lambda self, frames: torch.zeros(len(frames), dtype=torch.int64))
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(30))
    frames = TensorDictReplayBuffer(storage=FrameStackStorage(30))
    for batch in frame_stream_batches(num_envs=2, steps=5, batches=5, seed=1):
        plain.extend(batch.reshape(-1))
        frames.extend(batch.reshape(-1))
        assert_same_contents(plain, frames)


def test_empty_forgets_every_frame():
    frames = TensorDictReplayBuffer(storage=FrameStackStorage(20))
    frames.extend(frame_stream_batches(num_envs=2, steps=5, batches=1, seed=0)[0].reshape(-1))
    assert frames.storage.frames_held > 0
    frames.empty()
    assert len(frames) == 0 and frames.storage.frames_held == 0
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(20))
    batch = frame_stream_batches(num_envs=2, steps=5, batches=1, seed=1)[0].reshape(-1)
    plain.extend(batch)
    frames.extend(batch)
    assert_same_contents(plain, frames)


def test_bad_input_is_refused_with_a_reason():
    storage = FrameStackStorage(20)
    batch = frame_stream_batches(num_envs=1, steps=4, batches=1, seed=0)[0].reshape(-1)
    with pytest.raises(InputError, match="needs 'observation'"):
        storage.set(torch.arange(4), batch.exclude("observation"))
    with pytest.raises(InputError, match="got 4 transitions for 2 positions"):
        FrameStackStorage(2).set(torch.arange(2), batch)
    flat = batch.clone()
    flat.set("observation", torch.zeros(4, 5, dtype=torch.uint8))
    with pytest.raises(InputError, match="stack of frames"):
        storage.set(torch.arange(4), flat)
    storage.set(torch.arange(4), batch)
    other = frame_stream_batches(num_envs=1, steps=4, batches=1, seed=0, size=7)[0].reshape(-1)
    with pytest.raises(InputError, match="cannot join"):
        storage.set(torch.arange(4, 8), other)


def filled_storage():
    buffer = TensorDictReplayBuffer(storage=FrameStackStorage(40))
    for batch in frame_stream_batches(num_envs=2, steps=9, batches=4, seed=3):
        buffer.extend(batch.reshape(-1))
    return buffer


def test_state_round_trips_through_a_resume_checkpoint(tmp_path):
    buffer = filled_storage()
    path = tmp_path / "resume.ckpt"
    save_resume_checkpoint(path, {"storage": buffer.storage.state_dict()}, {})
    restored = FrameStackStorage(40)
    restored.load_state_dict(load_resume_checkpoint(path)["storage"])
    index = torch.arange(len(buffer))
    expected, actual = buffer.storage.get(index), restored.get(index)
    for key in expected.keys(True, True):
        assert torch.equal(actual.get(key), expected.get(key)), key
    assert restored.frames_held == buffer.storage.frames_held
    # writing on goes on exactly as in the original
    more = frame_stream_batches(num_envs=2, steps=9, batches=1, seed=4)[0].reshape(-1)
    cursor = torch.arange(len(more)) % 40
    buffer.storage.set(cursor, more)
    restored.set(cursor, more)
    expected, actual = buffer.storage.get(index), restored.get(index)
    for key in expected.keys(True, True):
        assert torch.equal(actual.get(key), expected.get(key)), key


def test_an_emptied_buffer_round_trips_through_a_resume_checkpoint(tmp_path):
    buffer = filled_storage()
    buffer.empty()
    path = tmp_path / "resume.ckpt"
    save_resume_checkpoint(path, {"storage": buffer.storage.state_dict()}, {})
    restored = FrameStackStorage(40)
    restored.load_state_dict(load_resume_checkpoint(path)["storage"])
    assert restored.frames_held == 0
    plain = TensorDictReplayBuffer(storage=LazyTensorStorage(40))
    batch = frame_stream_batches(num_envs=2, steps=9, batches=1, seed=5)[0].reshape(-1)
    plain.extend(batch)
    restored_buffer = TensorDictReplayBuffer(storage=restored)
    restored_buffer.extend(batch)
    assert_same_contents(plain, restored_buffer)


def test_float_frames_holding_nan_are_kept_once():
    """NaN is not equal to itself: frames are compared byte for byte, as they are hashed."""
    batch = frame_stream_batches(num_envs=1, steps=4, batches=1, seed=0)[0].reshape(-1)
    for key in ("observation", ("next", "observation")):
        observation = batch.get(key).float()
        observation[..., 0, 0] = float("nan")
        batch.set(key, observation)
    storage = FrameStackStorage(10)
    storage.set(torch.arange(4), batch)
    read = storage.get(torch.arange(4))
    for key in ("observation", ("next", "observation")):
        assert torch.equal(read.get(key).nan_to_num(-1.0), batch.get(key).nan_to_num(-1.0))


def test_a_forged_state_is_refused_before_anything_is_allocated():
    state = filled_storage().storage.state_dict()
    frames = state["frames"]

    def forged(**changes):
        return {**state, "frames": {**frames, **changes}}

    refs = frames["refs"].clone()
    refs[0, 0, 0] = int(frames["slots"].max()) + 10**12  # a slot that does not exist, far away
    with pytest.raises(InputError, match="does not hold"):
        FrameStackStorage(40).load_state_dict(forged(refs=refs))
    refs = frames["refs"].clone()
    refs[0, 0, 0] = -5
    with pytest.raises(InputError, match="invalid frame references"):
        FrameStackStorage(40).load_state_dict(forged(refs=refs))
    slots = frames["slots"].clone()
    slots[1] = slots[0]
    with pytest.raises(InputError, match="invalid slot numbers"):
        FrameStackStorage(40).load_state_dict(forged(slots=slots))
    with pytest.raises(InputError, match="sizes differ"):
        FrameStackStorage(41).load_state_dict(state)
    with pytest.raises(InputError, match="sizes differ"):
        FrameStackStorage(40).load_state_dict(forged(frames=frames["frames"][:-1]))
    with pytest.raises(InputError, match="stack shapes"):
        FrameStackStorage(40).load_state_dict(forged(stack_shapes=[[4, 6, 6], [2, 6, 6]]))
    with pytest.raises(InputError, match="'frames' entry"):
        FrameStackStorage(40).load_state_dict({key: value for key, value in state.items() if key != "frames"})
