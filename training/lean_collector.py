"""TorchRL's single-process ``Collector``, with a direct rollout for the case most runs are: the same batches,
without a TensorDict per step.

TorchRL's rollout builds, for every step, the policy's output TensorDict, the env's ``"next"`` TensorDict and the
root of the following step, then stacks the steps into the batch. With one Gymnasium vector env and one of
:mod:`agents.fast_paths`' lean policies, that plumbing costs more than the env step and the network together
(about 0.1 ms a step on CartPole, where Gymnasium's own step costs 0.01 ms). :class:`LeanCollector` writes each
step's policy outputs and env outputs straight into a batch of its own instead, through NumPy views, and keeps the
env's and the collector's state as TorchRL's rollout leaves them, so that the two rollouts can take turns on one
collector and a resumed run restores the same state either way. Frame counting, post-processing and the saved
state are the parent's; every other configuration runs the parent's rollout.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np
import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn.probabilistic import InteractionType
from torchrl.collectors import Collector
from torchrl.envs.utils import set_exploration_type

from agents.fast_paths import NUMPY_DTYPES, LeanActor, LeanDeterministicPolicy, LeanQPolicy
from envs.specs import EPISODE_LENGTH_KEY, EPISODE_RETURN_KEY
from envs.vector import GymnasiumVectorEnv
from errors import InputError

_ROOT_KEYS = {
    "observation",
    EPISODE_RETURN_KEY,
    EPISODE_LENGTH_KEY,
    "done",
    "terminated",
    "truncated",
    "action",
}
_ROOT_FLAGS = {"done", "terminated", "truncated"}
_NEXT_KEYS = {
    ("next", key)
    for key in (
        "observation",
        "reward",
        "done",
        "terminated",
        "truncated",
        EPISODE_RETURN_KEY,
        EPISODE_LENGTH_KEY,
    )
}


class LeanCollector(Collector):
    """A ``Collector`` whose rollout writes each step straight into the batch where it can.

    The direct rollout runs when the env is a :class:`envs.vector.GymnasiumVectorEnv` with one observation tensor
    and no action mask, the policy a :class:`agents.fast_paths.LeanActor`, :class:`agents.fast_paths.LeanQPolicy`
    or :class:`agents.fast_paths.LeanDeterministicPolicy` sampling (``ExplorationType.RANDOM``; uniformly random actions during ``init_random_frames``), the env, the
    policy and the batches on the CPU, and none of a replay buffer, trajectory ids, an interruptor, resets at each
    batch, compacted observations, split trajectories, a compiled policy or ``return_same_td`` in play. Then every
    batch holds the values TorchRL's rollout would give (tests compare them), each in tensors of its own (so the
    iterator does not copy it), and the env's state and the collector's carrier end as TorchRL's rollout leaves
    them. Otherwise everything is the parent's. Takes the parent's arguments; ``lean`` says whether the direct
    rollout runs (setting it to False hands the next batches to the parent's rollout).

    ``warmup_frames_per_batch`` (a multiple of ``frames_per_batch``; None: off) lets the direct rollout collect the
    uniformly random frames of ``init_random_frames``, where the policy plays no part, in batches of up to that
    many frames: the same steps and draws as TorchRL's batches of ``frames_per_batch`` laid end to end, in fewer
    batches (at one frame a batch, the per-batch work of storing and accounting costs more than the env step). The
    random frames end where TorchRL's random batches end, and every batch after them is TorchRL's (tests compare).
    """

    def __init__(self, *args, warmup_frames_per_batch: int | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._leaves = self._lean_leaves()
        self.lean = self._leaves is not None
        # the carrier the last direct rollout left, with each entry's tensor and version (see _kept_state)
        self._kept_carrier: tuple[TensorDictBase, list[tuple[str, torch.Tensor, int]]] | None = None
        self.warmup_frames_per_batch = warmup_frames_per_batch
        # with trajs_per_batch: the held episodes a resumed run puts back, handed to the assembly first
        self._restored_episodes: list[TensorDictBase] = []
        # the action spec whose draw env.rand_action() makes, when "action" is the env's only action entry
        actions = self.env.full_action_spec
        self._action_spec = actions["action"] if self.lean and list(actions.keys()) == ["action"] else None

    def end(self) -> None:
        """Collect nothing more: the iterator ends at its next step, without the episodes a resumed run put back
        (a run that had already ended when it was resumed)."""
        self.total_frames = self._frames
        self._restored_episodes.clear()

    def _lean_leaves(self) -> list[tuple[NestedKey, torch.Size, np.dtype]] | None:
        """The key, shape and (NumPy) dtype of each entry of a batch, when the direct rollout can produce it; else
        None."""
        env, policy = self.env, self._wrapped_policy
        cpu = torch.device("cpu")
        if not (
            type(env) is GymnasiumVectorEnv
            and not env.has_action_mask
            and list(env._observation_entries) == [None]
            and isinstance(policy, (LeanActor, LeanQPolicy, LeanDeterministicPolicy))
            and self.exploration_type == InteractionType.RANDOM
            and self._use_buffers
            and self.replay_buffer is None
            and not self.track_traj_ids
            and not self.reset_at_each_iter
            and not self.split_trajs
            and not self.return_same_td
            and self.interruptor is None
            and not self._compact_next_keys
            and not getattr(self, "compiled_policy", False)
            and not getattr(self, "cudagraphed_policy", False)
            and all(device in (None, cpu) for device in (env.device, self.policy_device, self.storing_device))
        ):
            return None
        template = self._final_rollout
        policy_keys = {key for key, _ in _policy_entries(policy, env)}
        if not all(isinstance(key, str) for key in policy_keys) or set(template.keys(True, True)) != (
            _ROOT_KEYS | _NEXT_KEYS | policy_keys
        ):
            return None
        leaves = [(key, template.get(key)) for key in template.keys(True, True)]
        if not all(value.dtype in NUMPY_DTYPES for _, value in leaves):
            return None
        return [(key, value.shape, NUMPY_DTYPES[value.dtype]) for key, value in leaves]

    def held_episodes(self) -> list[TensorDictBase]:
        """With ``trajs_per_batch``: the episodes the collector holds between two of its batches, each as one
        flat TensorDict; first those complete but not yet handed over (in the order they will be), then the
        unfinished ones. Empty without ``trajs_per_batch``."""
        if self.trajs_per_batch is None:
            return []
        unfinished, complete = getattr(self, "_traj_assembly", ({}, []))
        joined = [torch.cat(chunks) if len(chunks) > 1 else chunks[0] for chunks in unfinished.values()]
        return [*self._restored_episodes, *complete, *joined]  # restored ones are ingested before any other

    def restore_held_episodes(
        self, episodes: Sequence[TensorDictBase | Mapping], *, unfinished: bool = True
    ) -> None:
        """Put back the episodes :meth:`held_episodes` returned (read from a checkpoint: TensorDicts or their
        ``to_dict()`` form), so that the batches that follow are those the interrupted run would have made;
        ``unfinished=False`` keeps only the finished ones (for envs that start new episodes). Call it after the
        carrier is restored: an unfinished episode must be one a sub-env is still in.

        Raises:
            InputError: more episodes than a collector can hold between batches; an episode's entries are not
                those of this collector's batches (keys, dtypes, shapes), its discrete actions are outside the
                action space, or its steps do not form one episode (one trajectory id, done exactly where
                terminated or truncated, and only at the last step; an unfinished one in a sub-env's episode).
        """
        if self.trajs_per_batch is None:
            if episodes:
                raise InputError("the checkpoint holds episodes for a collector that assembles none")
            return
        # at most: one batch's episodes, those queued before it, one running in each env
        most = self.frames_per_batch + self.trajs_per_batch + self.env.batch_size.numel()
        if len(episodes) > most:
            raise InputError(
                f"the checkpoint holds {len(episodes):,} episodes, more than a collector holds ({most:,})"
            )
        template = self._final_rollout
        leaves = {key: template.get(key) for key in template.keys(True, True)}
        action_specs = self.env.full_action_spec
        discrete = {  # per-env specs of the integer and boolean actions: an index out of range fails later
            key: action_specs[key][(0,) * len(self.env.batch_size)]
            for key in action_specs.keys(True, True)
            if key in leaves and not leaves[key].is_floating_point()
        }
        running = set(self._carrier.get(("collector", "traj_ids")).reshape(-1).tolist())
        restored, unfinished_ids = [], set()
        for index, episode in enumerate(episodes):
            where = f"held episode {index}"
            if isinstance(episode, Mapping):
                episode = TensorDict(episode).auto_batch_size_(batch_dims=1)
            if (
                set(episode.keys(True, True)) != set(leaves)
                or episode.batch_dims != 1
                or not episode.batch_size[0]
            ):
                raise InputError(f"{where} does not have this run's batch entries")
            for key, value in leaves.items():
                saved = episode.get(key)
                if saved.dtype != value.dtype or saved.shape[1:] != value.shape[template.batch_dims :]:
                    raise InputError(f"{where}: {key} is {saved.dtype} {tuple(saved.shape)}")
            for key, spec in discrete.items():
                if not spec.is_in(episode.get(key)):
                    raise InputError(f"{where}: {key} holds values outside the action space")
            steps = episode.batch_size[0]
            flags = {
                name: episode.get(("next", name)).reshape(steps, -1).any(-1)
                for name in ("done", "terminated", "truncated")
                if ("next", name) in leaves
            }
            ends = flags["done"]
            if {"terminated", "truncated"} <= flags.keys() and (
                ends != flags["terminated"] | flags["truncated"]
            ).any():
                raise InputError(f"{where} is not one episode (done is not terminated or truncated)")
            traj_ids = episode.get(("collector", "traj_ids"))
            if ends[:-1].any() or (traj_ids != traj_ids[0]).any():
                raise InputError(f"{where} is not one episode")
            if unfinished and not ends[-1]:
                traj_id = traj_ids[0].item()
                if traj_id in unfinished_ids or traj_id not in running:
                    raise InputError(f"{where} is not one of the episodes the envs are in")
                unfinished_ids.add(traj_id)
            if unfinished or ends[-1]:
                restored.append(episode if template.device is None else episode.to(template.device))
        self._restored_episodes = restored

    def iterator(self) -> Iterator[TensorDictBase]:
        while self._restored_episodes:  # one at a time: the assembly queues them in this order
            yield self._restored_episodes.pop(0)
        if not self.lean:
            yield from super().iterator()
            return
        while self._frames < self.total_frames:  # the parent's loop, less the copy of a reused batch
            self._iter += 1
            batch = self.rollout()
            if batch is self._final_rollout:  # the parent's rollout (lean turned off): its batch is reused
                batch = batch.clone()
            self._increment_frames(batch.numel())
            if self.postproc is not None:
                batch = self.postproc(batch)
            if self.post_collect_hook is not None:
                self.post_collect_hook(batch)
            yield batch

    def _steps(self, random_actions: bool) -> int:
        """Steps of each env in the next batch: ``frames_per_batch``'s, or during the random frames as many of
        those as ``warmup_frames_per_batch`` allows, up to where TorchRL's random batches end and within
        ``total_frames``."""
        batch_frames, warmup = self.requested_frames_per_batch, self.warmup_frames_per_batch
        if not random_actions or not warmup:
            return self.frames_per_batch
        # TorchRL's random batches end at the first whole batch past init_random_frames
        random_end = -(-self.init_random_frames // batch_frames) * batch_frames
        frames = min(warmup, random_end - self._frames)
        if 0 < self.total_frames < float("inf"):
            frames = min(frames, self.total_frames - self._frames)
        return max(1, frames // batch_frames) * self.frames_per_batch

    @torch.no_grad()
    def rollout(self) -> TensorDictBase:
        if not self.lean:
            return super().rollout()
        if self.pre_collect_hook is not None:
            self.pre_collect_hook()
        env, policy = self.env, self._wrapped_policy
        random_actions = self._should_use_random_frames()
        steps = self._steps(random_actions)
        time_dim = env.batch_dims  # where a batch's steps run: after the env's batch dims
        # a batch of its own: entries the steps leave unwritten are zero, as in TorchRL's zero-filled batch (the
        # root's done flags; the policy's outputs while actions are random, which happens only before any policy step)
        # NumPy arrays, each the memory of one of the batch's tensors, so that writing one fills the batch (cheaper
        # than allocating tensors and viewing them, a cost paid per entry and batch, so per frame at one a batch)
        arrays = {
            key: (np.zeros if random_actions or key in _ROOT_FLAGS else np.empty)(
                shape[:time_dim] + (steps,) + shape[time_dim + 1 :], dtype=dtype
            )
            for key, shape, dtype in self._leaves
        }
        tensors = {key: torch.from_numpy(array) for key, array in arrays.items()}
        carrier = self._carrier
        observation = carrier.get("observation").numpy()
        episode_return = carrier.get(EPISODE_RETURN_KEY).numpy().copy()
        episode_length = carrier.get(EPISODE_LENGTH_KEY).numpy().copy()
        batch_shape = env.batch_size
        actions = tensors["action"]
        step = None
        with set_exploration_type(self.exploration_type):  # as the parent's rollout calls the policy
            for t in range(steps):
                arrays["observation"][:, t] = observation
                arrays[EPISODE_RETURN_KEY][:, t] = episode_return
                arrays[EPISODE_LENGTH_KEY][:, t] = episode_length
                if random_actions:
                    # the draw TorchRL's rollout makes (env.rand_action(), less its TensorDict)
                    action = (
                        env.rand_action().get("action")
                        if self._action_spec is None
                        else self._action_spec.rand(torch.Size([]))
                    )
                    arrays["action"][:, t] = action.numpy()
                else:
                    for key, value in policy.act(torch.from_numpy(observation), batch_shape):
                        arrays[key][:, t] = value.numpy()
                step = env.step_arrays(actions[:, t])
                reward = step.reward.astype(np.float32)[:, None]
                episode_return += reward
                episode_length += 1
                arrays["next", "observation"][:, t] = step.final[None]
                arrays["next", "reward"][:, t] = reward
                arrays["next", "done"][:, t, 0] = step.done
                arrays["next", "terminated"][:, t, 0] = step.terminated
                arrays["next", "truncated"][:, t, 0] = step.truncated
                arrays["next", EPISODE_RETURN_KEY][:, t] = episode_return
                arrays["next", EPISODE_LENGTH_KEY][:, t] = episode_length
                episode_return[step.done] = 0.0
                episode_length[step.done] = 0
                observation = step.current[None]
        # the state TorchRL's rollout leaves: the env's current observation and episode statistics, its root
        kept = self._kept_state()
        if kept is None:
            env._observation = env._observation_tensor(step.current)
            env._episode_return = torch.from_numpy(episode_return)
            env._episode_length = torch.from_numpy(episode_length)
            self._carrier = env._root()
            if self._carrier_has_no_device:
                self._carrier.clear_device_()
        else:  # the same values, written into the tensors that hold them
            for tensor, array in zip(kept, (step.current[None], episode_return, episode_length), strict=True):
                tensor.copy_(torch.from_numpy(array))
        self._keep_carrier()
        batch_size, device, names = (
            env.batch_size + (steps,),
            self._final_rollout.device,
            self._final_rollout.names,
        )
        next_entries = TensorDict._new_unsafe(
            {key[1]: value for key, value in tensors.items() if isinstance(key, tuple)},
            batch_size=batch_size,
            device=device,
            names=names,
        )
        root = {key: value for key, value in tensors.items() if not isinstance(key, tuple)}
        batch = TensorDict._new_unsafe(
            {**root, "next": next_entries}, batch_size=batch_size, device=device, names=names
        )
        return self._maybe_set_truncated(batch)

    def _kept_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The carrier's observation, episode return and episode length tensors, when the carrier is the one the
        last direct rollout left, unchanged since (the same entries, none changed in place) and those tensors are
        still the env's state; else None. A reset, a restored checkpoint or the parent's rollout each replace or
        change one of them, and the next rollout builds the carrier anew."""
        kept = self._kept_carrier
        if kept is None or kept[0] is not self._carrier:
            return None
        carrier, entries = kept
        values = carrier._tensordict
        if len(values) != len(entries) or any(
            values.get(key) is not tensor or tensor._version != version for key, tensor, version in entries
        ):
            return None
        env = self.env
        state = (values["observation"], values[EPISODE_RETURN_KEY], values[EPISODE_LENGTH_KEY])
        held = (env._observation, env._episode_return, env._episode_length)
        return state if all(ours is env_s for ours, env_s in zip(state, held, strict=True)) else None

    def _keep_carrier(self) -> None:
        """Remember the carrier's entries and their versions, for :meth:`_kept_state`."""
        carrier = self._carrier
        values = carrier._tensordict
        entries = [
            (key, value, value._version) for key, value in values.items() if type(value) is torch.Tensor
        ]
        self._kept_carrier = (carrier, entries) if len(entries) == len(values) else None


def _policy_entries(
    policy: LeanActor | LeanQPolicy | LeanDeterministicPolicy, env: GymnasiumVectorEnv
) -> list[tuple[NestedKey, torch.Tensor]]:
    """What ``policy`` writes for one step of ``env`` (from its fake observation; the policy's random draws are
    put back afterwards)."""
    state = torch.random.get_rng_state()
    try:
        return policy.act(env.fake_tensordict().get("observation"), env.batch_size)
    finally:
        torch.random.set_rng_state(state)
