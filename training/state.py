"""What a recipe trains, as one ``state_dict`` / ``load_state_dict`` object: :class:`TrainingState`.

A recipe hands :class:`training.run.Run` a :class:`TrainingState` naming what it trains and how: the env, the
collector, the modules (the loss module holds the networks and their targets), the optimizers, the replay buffer,
the target updater and any counters of its loop. Saved, it restores weights, target networks, optimizer moments,
learning-rate and clip-range schedules (functions of the restored counters), the replay buffer with its prioritized
sampler's priorities, observation-normaliser statistics, Python/NumPy/torch RNG states, the training envs
mid-episode (their physical state and their generators: see :mod:`envs.runtime_state`) and the collector's frame
count and pending observation, so that a resumed run collects and updates exactly as the uninterrupted one would
have. :mod:`training.resume` writes and reads it as ``resume.ckpt``.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.checkpoint import GlobalRNGState
from torchrl.collectors import Collector
from torchrl.data import PrioritizedSampler, ReplayBuffer
from torchrl.envs import EnvBase

from agents.normalization import invalid_statistics
from envs.runtime_state import env_runtime_state, load_env_runtime_state
from errors import InputError
from training.state_checks import (
    check_optimizer_state,
    check_priorities,
    check_storage_rows,
    check_stored_actions,
    checked_count,
)


@dataclasses.dataclass
class TrainingState:
    """What a recipe trains, as one ``state_dict`` / ``load_state_dict`` object for ``resume.ckpt``.

    Args:
        env: the training env (its sub-envs' mid-episode state is saved when it can be, see
            :mod:`envs.runtime_state`).
        collector: the single-process TorchRL collector stepping ``env``; None for the learner of a run on
            gradient workers (:mod:`training.gradient_workers`), whose envs and collectors are the workers' and start
            afresh on resume.
        modules: modules whose ``state_dict`` holds trained state (the loss module: networks, target networks,
            entropy coefficient; add-ons).
        optimizers: the optimizers, by name.
        replay_buffer: the replay buffer (storage, writer, sampler; a prioritized sampler's priorities).
        target_updater: TorchRL's hard target updater (its step counter); soft updaters have no state.
        extras: further objects with ``state_dict`` (n-step return windows, exploration noise).
        counters: the loop's own counters (e.g. gradient steps taken); updated in place on resume.
    """

    env: EnvBase
    collector: Any
    modules: dict[str, nn.Module]
    optimizers: dict[str, torch.optim.Optimizer]
    replay_buffer: ReplayBuffer | None = None
    target_updater: Any = None
    extras: dict[str, Any] = dataclasses.field(default_factory=dict)
    counters: dict[str, int] = dataclasses.field(default_factory=dict)

    def check_resumable(self) -> None:
        """Raise :class:`InputError` when this run's collector keeps state that cannot be saved."""
        if self.collector is not None and not isinstance(self.collector, Collector):
            raise InputError(
                "Resume state is kept for --collector-backend single only (worker processes and Ray actors hold "
                "their envs' state out of reach); drop --collector-backend or --resume."
            )
        if getattr(self.collector, "trajs_per_batch", None) is not None and not hasattr(
            self.collector, "held_episodes"
        ):
            raise InputError(
                "A collector that assembles episodes (trajs_per_batch) resumes only as training.lean_collector."
                "LeanCollector, which saves the episodes it holds; build it with training.make_collector."
            )

    def end_collection(self) -> None:
        """Make the collector yield no further batch (a resumed run that had already ended only finishes)."""
        end = getattr(self.collector, "end", None)
        if callable(end):  # training.LeanCollector
            end()
        elif isinstance(self.collector, Collector):
            self.collector.total_frames = self.collector._frames

    def state_dict(self) -> dict[str, Any]:
        state = {
            "modules": {name: module.state_dict() for name, module in self.modules.items()},
            "optimizers": {name: optimizer.state_dict() for name, optimizer in self.optimizers.items()},
            "replay_buffer": None if self.replay_buffer is None else _replay_buffer_state(self.replay_buffer),
            "target_updater": getattr(self.target_updater, "counter", None),
            "extras": {name: extra.state_dict() for name, extra in self.extras.items()},
            "counters": dict(self.counters),
            "rng": GlobalRNGState().state_dict(),
        }
        if self.collector is None:  # a gradient-worker run's learner: no envs of its own
            return state
        env_state, reason = env_runtime_state(self.env)
        collector = self.collector
        collector_state = {
            "frames": collector._frames,
            "iter": collector._iter,
            "carrier": collector._carrier.to_dict(),
        }
        if collector.track_traj_ids:
            collector_state["traj_pool"] = collector._traj_pool.state_dict()
        assembles = collector.trajs_per_batch is not None and hasattr(collector, "held_episodes")
        if assembles:  # the episodes held between batches (another collector is refused by check_resumable)
            collector_state["episodes"] = [episode.to_dict() for episode in collector.held_episodes()]
        return state | {"collector": collector_state, "env": env_state, "env_not_saved_because": reason}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for name, module in self.modules.items():
            _load_module_state(module, state["modules"][name])
            if (statistics := invalid_statistics(module)) is not None:
                raise InputError(
                    f"the {name} module's {statistics} holds NaN, Inf or a negative value, which no run gathers"
                )
        for name, optimizer in self.optimizers.items():
            # the options of each group are this run's (its config's); the file gives the learning rate, which
            # the run's schedules move, and the per-parameter state
            own = [
                {key: value for key, value in group.items() if key != "lr"}
                for group in optimizer.param_groups
            ]
            optimizer.load_state_dict(state["optimizers"][name])
            for group, options in zip(optimizer.param_groups, own, strict=True):
                group.update(options)
            check_optimizer_state(optimizer, name)
        if self.replay_buffer is not None:
            _load_replay_buffer_state(self.replay_buffer, state["replay_buffer"])
            if self.env is not None:
                check_stored_actions(self.replay_buffer, self.env.action_spec)
        if state["target_updater"] is not None:
            self.target_updater.counter = checked_count(
                state["target_updater"], "the target updater's step count"
            )
        for name, extra in self.extras.items():
            extra.load_state_dict(state["extras"][name])
        counters = state["counters"]
        if not isinstance(counters, dict) or not set(counters) <= set(self.counters):
            raise InputError(
                f"the saved counters {counters!r:.80} are not this recipe's {sorted(self.counters)}"
            )
        self.counters.update(
            {name: checked_count(value, f"the counter {name!r}") for name, value in counters.items()}
        )
        if self.collector is None:  # the workers' envs start new episodes
            self._end_episodes()
            self.restore_rng(state)
            return
        collector, collector_state = self.collector, state["collector"]
        collector._frames = checked_count(collector_state["frames"], "the collector's frame count")
        collector._iter = checked_count(collector_state["iter"], "the collector's batch count", minimum=-1)
        if "traj_pool" in collector_state:
            collector._traj_pool.load_state_dict(collector_state["traj_pool"])
        if state["env"] is None:
            warnings.warn(
                f"The training envs' state was not saved ({state['env_not_saved_because']}): the resumed run "
                "starts new episodes, so it continues the interrupted one closely but not exactly.",
                stacklevel=2,
            )
            self._end_episodes()
        else:
            load_env_runtime_state(self.env, state["env"])
            carrier = collector._carrier  # the pending observations, each put back on its tensor's device
            saved = TensorDict(collector_state["carrier"], batch_size=carrier.batch_size)
            for key, value in saved.items(True, True):
                current = carrier.get(key, None)
                carrier.set(key, value if current is None else value.to(current.device))
        if "episodes" in collector_state:  # finished ones not handed over yet, unfinished ones if envs resume
            collector.restore_held_episodes(collector_state["episodes"], unfinished=state["env"] is not None)
        self.restore_rng(state)

    def _end_episodes(self) -> None:
        """End the episodes the extras were in the middle of (n-step windows close as truncated), for envs that
        start new ones: no stored transition joins an interrupted episode to the next."""
        for extra in self.extras.values():
            if hasattr(extra, "end_episodes"):
                extra.end_episodes()

    @staticmethod
    def restore_rng(state: dict[str, Any]) -> None:
        """Put Python's, NumPy's and torch's global generators back where ``state`` found them."""
        GlobalRNGState().load_state_dict(state["rng"])


def _load_module_state(module: nn.Module, state: dict[str, Any]) -> None:
    """``module.load_state_dict``, first giving buffers that are still empty (statistics sized on the first
    batch, such as RND's running returns) the saved shape."""
    for name, buffer in list(module.named_buffers()):
        saved = state.get(name)
        if saved is not None and buffer.numel() == 0 and saved.shape != buffer.shape:
            owner_name, _, attribute = name.rpartition(".")
            owner = module.get_submodule(owner_name) if owner_name else module
            owner._buffers[attribute] = torch.empty(saved.shape, dtype=saved.dtype, device=buffer.device)
    module.load_state_dict(state)


def _replay_buffer_state(buffer: ReplayBuffer) -> dict[str, Any]:
    sampler = buffer._sampler
    if isinstance(sampler, PrioritizedSampler):
        leaves = torch.arange(sampler._max_capacity)
        sampler_state = {
            "sum_tree": torch.as_tensor(sampler._sum_tree[leaves]),
            "min_tree": torch.as_tensor(sampler._min_tree[leaves]),
            "max_priority": sampler._max_priority,
            "alpha": sampler._alpha,
            "beta": sampler._beta,
            "eps": sampler._eps,
        }
    else:
        sampler_state = sampler.state_dict()
    return {
        "storage": buffer._storage.state_dict(),
        "writer": buffer._writer.state_dict(),
        "sampler": sampler_state,
    }


def _load_replay_buffer_state(buffer: ReplayBuffer, state: dict[str, Any]) -> None:
    storage = buffer._storage
    capacity = storage.max_size
    check_storage_rows(state["storage"], capacity)  # before loading, which copies them
    storage.load_state_dict(state["storage"])
    if checked_count(storage._len, "the replay buffer's length") > capacity:
        raise InputError(f"the replay buffer's length {storage._len} is more than its capacity {capacity}")
    device = getattr(storage, "device", None)
    if storage._storage is not None and device not in (None, "auto"):  # loaded onto the CPU
        storage._storage = storage._storage.to(device)
    buffer._writer.load_state_dict(state["writer"])
    if checked_count(getattr(buffer._writer, "_cursor", 0), "the replay buffer's cursor") >= capacity:
        raise InputError(
            f"the replay buffer's cursor {buffer._writer._cursor} is past its capacity {capacity}"
        )
    sampler, sampler_state = buffer._sampler, state["sampler"]
    if isinstance(sampler, PrioritizedSampler):
        check_priorities(sampler, sampler_state)
        leaves = torch.arange(sampler._max_capacity)
        sampler._sum_tree[leaves] = sampler_state["sum_tree"]
        sampler._min_tree[leaves] = sampler_state["min_tree"]
        sampler._max_priority = sampler_state["max_priority"]
        sampler._beta = sampler_state["beta"]  # alpha and eps: this run's own (its config's), checked equal
    else:
        sampler.load_state_dict(sampler_state)
        sample_list = getattr(
            sampler, "_sample_list", None
        )  # SamplerWithoutReplacement's pending permutation
        if isinstance(sample_list, torch.Tensor) and device not in (None, "auto"):
            # on the storage's device, as it was drawn: the next permutations are drawn where it lives, and a
            # CUDA run resumed with it on the CPU would draw them from the CPU generator
            sampler._sample_list = sample_list.to(device)
