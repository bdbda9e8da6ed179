"""The training env and the collector that steps it: TorchRL's ``Collector`` in this process, or one over worker
processes or Ray actors (:mod:`training.distributed`), chosen by ``--collector-backend``."""

from __future__ import annotations

import functools
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import Composite
from torchrl.envs import EnvBase
from tqdm import tqdm

from agents.fast_paths import lean_policy
from agents.gsde import clips_actions
from agents.networks import find_normalizer
from agents.options import Options
from envs.vector import make_env
from envs.wrappers import wrapper_functions
from errors import InputError, Interrupted, check_ranges, require_positive
from training.config import RunConfig
from training.lean_collector import LeanCollector
from training.replay import device_memory
from training.seeding import threads_for_observations
from training.signals import SignalWatcher


def make_training_env(run: RunConfig, device: torch.device, num_envs: int | None = None):
    """The batched training env of ``run`` (``num_envs`` envs, default ``run.num_envs``; one for the learner of a
    run on gradient workers, which reads only its specs): Gymnasium envs on the CPU, or torch envs on ``device``."""
    construction = env_construction(run)
    try:
        env = make_env(
            run.env_id,
            num_envs or (1 if run.learns_on_workers else run.num_envs),
            device=device if run.env_backend == "torch" else "cpu",
            seed=run.seed,
            vectorization=run.vectorization,
            backend=run.env_backend,
            **construction,
        )
    except (InputError, KeyboardInterrupt):
        raise
    except Exception as error:
        given = [f"--env-kwargs {' '.join(run.env_kwargs)}" if run.env_kwargs else "",
                 f"--env-wrappers {' '.join(run.env_wrappers)}" if run.env_wrappers else ""]  # fmt: skip
        given = " and ".join(option for option in given if option)
        if not given:
            raise  # the env's own failure, with its own traceback
        if isinstance(error, MemoryError):  # the envs' number counts as much as their arguments
            given += f", {run.num_envs} envs (--num-envs)"
        reason = str(error).strip().splitlines()[0][:300] if str(error).strip() else "no detail"
        raise InputError(
            f"Building {run.env_id} with {given} failed ({type(error).__name__}: {reason}); check those values "
            "against the env's and the wrappers' own arguments."
        ) from error
    threads_for_observations(run, env.observation_spec["observation"])  # a CNN: all cores, unless chosen
    return env


def env_construction(run: RunConfig) -> dict[str, Any]:
    """``make_env``'s ``env_kwargs`` and ``wrappers`` for ``run``'s envs (--env-kwargs, --max-episode-steps,
    --env-wrappers, --max-total-reward), the same in this process and in every worker."""
    return {
        "env_kwargs": run.env_make_kwargs or None,
        "wrappers": wrapper_functions(run.wrapper_specs, run.allowed_wrappers),
    }


WARMUP_SEED_OFFSET = 2_000_000  # the warm-up envs' seeds, apart from the training and evaluation envs'
# steps per env collected at once during the warm-up, and at most this much of their observations as float32
# (images: a few dozen steps): bounds its memory
WARMUP_CHUNK_STEPS = 1_000
WARMUP_CHUNK_BYTES = 64 * 2**20


def warm_up_policy_normalizer(run: RunConfig, policy: Any, algorithm: str, device: torch.device) -> None:
    """``--normalize-obs-warmup``: :func:`warm_up_normalizer` on ``policy``'s observation normaliser."""
    normalizer = find_normalizer(policy)
    if normalizer is None:
        raise InputError(
            "--normalize-obs-warmup fills the statistics of --normalize-obs: add --normalize-obs (this "
            f"{algorithm} run normalises no observations)."
        )
    warm_up_normalizer(run, normalizer, device)


def warm_up_normalizer(
    run: RunConfig, normalizer: Any, device: torch.device, frames: int | None = None
) -> None:
    """Fold the observations of ``frames`` (default ``run.normalize_obs_warmup``, ``--normalize-obs-warmup``)
    uniformly random steps into ``normalizer`` (anything with ``update(observations)``: the policy's
    normaliser, RND's statistics): a separate copy of the training envs, seeded apart, steps them (``num_envs``
    at once, whole batches), so the training envs, their seeds and the frame budget are untouched."""
    # from a generator of its own: the run draws the same random numbers with or without a warm-up
    gpu = [torch.device(device).index or 0] if torch.device(device).type == "cuda" else []
    with torch.random.fork_rng(devices=gpu):
        torch.manual_seed(run.seed + WARMUP_SEED_OFFSET)
        _warm_up(run, normalizer, device, run.normalize_obs_warmup if frames is None else frames)


def _warm_up(run: RunConfig, normalizer: Any, device: torch.device, frames: int) -> None:
    env = make_env(
        run.env_id,
        run.num_envs,
        device=device if run.env_backend == "torch" else "cpu",
        seed=run.seed + WARMUP_SEED_OFFSET,
        vectorization=run.vectorization,
        backend=run.env_backend,
        **env_construction(run),
    )
    collector, signals = None, SignalWatcher()
    progress = tqdm(desc="observation warm-up", unit="frames", disable=not run.progress, leave=False)
    try:
        spec = env.observation_spec["observation"]
        leaves = spec.values(True, True) if isinstance(spec, Composite) else [spec]
        step_bytes = 4 * sum(leaf.shape.numel() for leaf in leaves)  # all envs' observations, as float32
        total_steps = -(-frames // run.num_envs)  # of each env
        batches = -(-total_steps // max(1, min(WARMUP_CHUNK_STEPS, WARMUP_CHUNK_BYTES // max(1, step_bytes))))
        batch_frames = -(-total_steps // batches) * run.num_envs  # whole batches, as even as they come
        # no policy: uniformly random actions; episodes go on from batch to batch
        collector = Collector(env, None, frames_per_batch=batch_frames, total_frames=batches * batch_frames)
        progress.reset(total=batches * batch_frames)
        signals.install()  # Ctrl-C or SIGTERM ends the warm-up after its batch, with a one-line message
        done = 0
        for batch in collector:
            normalizer.update(batch.get("observation").to(device))
            progress.update(batch.numel())
            done += batch.numel()
            if signals.interrupted_by is not None:
                where = f"in the observation warm-up ({done:,} of {batches * batch_frames:,} random steps)"
                raise Interrupted(signals.interrupted_by, where)
    finally:
        signals.restore()
        progress.close()
        if collector is not None:
            collector.shutdown()
        env.close()


def spec_bytes(spec: Any) -> int:
    """Bytes of one value of ``spec`` (every leaf of a ``Composite``), counted from its shape and dtype."""
    leaves = spec.values(True, True) if isinstance(spec, Composite) else [spec]
    return sum(leaf.shape.numel() * leaf.dtype.itemsize for leaf in leaves)


def batch_memory(env: EnvBase, frames_per_batch: int) -> int:
    """A lower bound on the bytes of one collected batch of ``frames_per_batch`` frames from ``env``: each frame
    holds at least its observation twice (the step's and the next one) and its action."""
    steps = -(-frames_per_batch // max(1, env.batch_size.numel()))  # of every env at once
    return steps * (2 * spec_bytes(env.full_observation_spec) + spec_bytes(env.full_action_spec))


def check_batch_memory(run: RunConfig, env: EnvBase, frames_per_batch: int, device: torch.device) -> None:
    """Raise :class:`InputError` when one collected batch of ``frames_per_batch`` frames from ``env`` cannot fit
    in the memory of ``device`` (a GPU's own, else this machine's physical memory, where the system says how
    much; :func:`batch_memory`), before the collector reserves it."""
    needed = batch_memory(env, frames_per_batch)
    memory, where = device_memory(device)
    if memory and needed > memory:
        raise InputError(
            f"Batches of {frames_per_batch:,} frames (--num-envs {run.num_envs} x --steps-per-env "
            f"{frames_per_batch // max(1, run.num_envs):,}) need at least {needed / 2**30:,.1f} GiB, more than "
            f"{where} {memory / 2**30:,.1f} GiB of memory: lower --steps-per-env or --num-envs."
        )


def make_collector(
    run: RunConfig,
    env: EnvBase,
    policy: nn.Module,
    device: torch.device,
    frames_per_batch: int,
    total_frames: int,
    critic: nn.Module | None = None,
    **options: Any,
):
    """The collector of ``run.collector_backend``: TorchRL's ``Collector`` stepping ``env`` here (a
    :class:`training.lean_collector.LeanCollector`: batches straight from the env's arrays where it can), or one over
    ``run.num_workers`` processes or Ray actors, each building its share of the envs (worker ``i`` seeded
    ``seed + WORKER_SEED_STRIDE * i``) and iterated like the single one (see
    :class:`training.distributed.WorkerCollector`). Workers' envs clip actions to the Box as ``env`` does when
    it is wrapped by :func:`agents.gsde.clip_env_actions` (an unsquashed policy).

    Args:
        run: the run's options (env id, backend, seed, workers).
        env: the training env (stepped by the single-process collector; its spec is what workers rebuild).
        policy: the policy that acts.
        device: device of the policy and of the batches.
        frames_per_batch: frames per batch, over all envs.
        total_frames: the collection budget.
        critic: a critic whose value of each observation the single-process collector writes too, when the
            policy is a :class:`agents.fast_paths.LeanActor` (see there); other collectors, and other policies,
            write none.
        options: further collector arguments (``init_random_frames``, ``trajs_per_batch``, ``traj_format``).
    """
    check_batch_memory(run, env, frames_per_batch, device)
    if run.gradient_worker is not None:
        total_frames = -1  # a gradient worker collects until the learner has had enough
    elif run.total_frames < frames_per_batch:
        warnings.warn(
            f"--total-frames {run.total_frames} is less than one batch: the run collects whole batches, here "
            f"{frames_per_batch} frames (--num-envs {run.num_envs} x --steps-per-env "
            f"{frames_per_batch // run.num_envs}). Lower --steps-per-env or --num-envs for a shorter run.",
            stacklevel=2,
        )
    if run.collector_backend == "single":
        return LeanCollector(
            env,
            lean_policy(policy, run.compile, critic),  # the same policy, sampled in one call
            frames_per_batch=frames_per_batch,
            total_frames=total_frames,
            env_device=env.device,
            policy_device=device,
            storing_device=device,
            track_traj_ids="trajs_per_batch" in options,  # episodes are stitched by trajectory id
            auto_register_policy_transforms=False,
            **options,
        )
    from training.distributed import WORKER_SEED_STRIDE, make_worker_collector, make_worker_env

    clip_actions = clips_actions(env)
    env_factories = [
        functools.partial(
            make_worker_env,
            os.getpid(),
            run.env_id,
            run.num_envs // run.num_workers,
            device=env.device,
            seed=run.seed + WORKER_SEED_STRIDE * index,
            vectorization=run.vectorization,
            backend=run.env_backend,
            clip_actions=clip_actions,
            **env_construction(run),
        )
        for index in range(run.num_workers)
    ]
    return make_worker_collector(
        run.collector_backend,
        env_factories,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total_frames,
        device=device,
        ray_address=run.ray_address,
        **options,
    )


def single_collector_only(run: RunConfig, feature: str) -> None:
    """Raise :class:`InputError` when ``feature`` (which keeps per-env state outside the env) meets workers."""
    if run.collector_backend != "single":
        kept = "a recurrent state" if feature == "--recurrent" else "exploration state"
        raise InputError(
            f"{feature} keeps {kept} beside the training env and runs with --collector-backend single "
            f"only; drop --collector-backend {run.collector_backend} or {feature}."
        )


@dataclass
class OffPolicyCollectorConfig(Options):
    """Collection of the off-policy actor-critic recipes (SAC, TD3, DDPG)."""

    steps_per_env: int = 8
    """Steps each env takes per collected batch (frames per batch = num_envs * steps_per_env)."""
    updates_per_frame: float = 1.0
    """Gradient steps (TD3: critic updates) per collected frame, the update-to-data ratio."""
    learning_starts: int = 10_000
    """Frames of uniformly random actions collected before the first update (rounded up to whole batches)."""

    def validate(self) -> None:
        """Raise :class:`InputError` for values outside their meaningful range."""
        require_positive(steps_per_env=self.steps_per_env)
        check_ranges(
            updates_per_frame=(self.updates_per_frame, "(0, inf)"),
            learning_starts=(self.learning_starts, ">= 0"),
        )

    def updates_per_batch(self, frames_per_batch: int) -> int:
        """Gradient steps after each batch of ``frames_per_batch`` frames.

        Raises:
            InputError: ``frames_per_batch * updates_per_frame`` is not a whole number of at least one (the run
                could not keep the ratio asked for).
        """
        updates = frames_per_batch * self.updates_per_frame
        if updates < 1 - 1e-9 or abs(updates - round(updates)) > 1e-6 * updates:
            raise InputError(
                f"--updates-per-frame {self.updates_per_frame} with {frames_per_batch} frames a batch (--num-envs x "
                f"--steps-per-env) is {updates:g} gradient steps a batch, and a batch takes a whole number of them "
                f"(at least 1): make --updates-per-frame a multiple of 1/{frames_per_batch}, or change "
                "--steps-per-env so that frames a batch x updates per frame is whole."
            )
        return round(updates)


def check_batch_fits_buffer(batch_size: int, buffer_size: int) -> None:
    """Raise :class:`InputError` when a gradient step would sample more transitions than the buffer holds (no
    update would ever run)."""
    if batch_size > buffer_size:
        raise InputError(
            f"--batch-size {batch_size} exceeds --buffer-size {buffer_size}: every gradient step samples batch-size "
            "transitions from the replay buffer, so no update would ever run; lower --batch-size or raise "
            "--buffer-size."
        )


def warn_if_never_updated(
    frames: int, learning_starts: int, stored: int, batch_size: int, n_steps: int = 1
) -> None:
    """Warn when an off-policy run ends without a gradient step: it updates once ``frames >= learning_starts``
    and the buffer holds ``batch_size`` transitions, and both only grow, so if they fail at the end they always
    did. With ``n_steps`` above 1 (n-step returns) an env's transition is stored only once its window of
    ``n_steps`` steps has passed (or its episode ended), which the warning names."""
    if frames < learning_starts or stored < batch_size:
        windows = (
            f", each stored once --n-steps {n_steps} further steps of its env have passed"
            if n_steps > 1
            else ""
        )
        warnings.warn(
            f"The run ended without a gradient step: it collected {frames} frames (updates start at "
            f"--learning-starts {learning_starts}) and stored {stored} transitions{windows} (a step samples "
            f"--batch-size {batch_size}); the agent is untrained. Raise --total-frames or lower --learning-starts "
            f"or --batch-size{' or --n-steps' if n_steps > 1 else ''}.",
            stacklevel=2,
        )


def warn_if_no_whole_episodes(frames: int, total_frames: int, episodes_per_update: int) -> None:
    """Warn when a run that learns from whole episodes (REINFORCE, VPG) ends without one batch of them: its budget
    ran out before ``episodes_per_update`` episodes ended, so it took no gradient step."""
    if frames == 0:
        warnings.warn(
            f"The run ended without a gradient step: its --total-frames {total_frames} ran out before "
            f"--episodes-per-update {episodes_per_update} episodes ended (it learns from whole episodes); the agent "
            "is untrained. Raise --total-frames, lower --episodes-per-update, or shorten the episodes with "
            "--max-episode-steps.",
            stacklevel=2,
        )


# the longest batch of the off-policy recipes' random warm-up (a fraction of a second of env steps)
WARMUP_FRAMES_PER_BATCH = 256


def make_off_policy_collector(
    run: RunConfig,
    env: EnvBase,
    policy: nn.Module,
    frames_per_batch: int,
    learning_starts: int,
    device: torch.device,
):
    """The collector of an off-policy recipe: uniformly random actions for the first ``learning_starts`` frames
    (rounded up to whole batches, where TorchRL's collector would round them with a warning in its own terms), then
    ``policy``; batches of ``frames_per_batch`` on ``device`` until ``run.total_frames`` (rounded up to whole
    batches). The single-process collector gathers the random frames in batches of up to
    :data:`WARMUP_FRAMES_PER_BATCH` (rounded to whole batches): the same frames, in fewer batches, none of which
    an update could fall inside (the recipes' updates wait for ``learning_starts``)."""
    num_batches = -(-run.total_frames // frames_per_batch)
    options = {}
    if run.collector_backend == "single" and run.gradient_worker is None:
        options["warmup_frames_per_batch"] = (
            max(1, WARMUP_FRAMES_PER_BATCH // frames_per_batch) * frames_per_batch
        )
    return make_collector(
        run,
        env,
        policy,
        device,
        frames_per_batch,
        num_batches * frames_per_batch,
        init_random_frames=-(-learning_starts // frames_per_batch) * frames_per_batch,
        **options,
    )
