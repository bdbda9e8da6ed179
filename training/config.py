"""The options every recipe shares (:class:`RunConfig`), a config as JSON, and ``quiet`` for scripts and tests."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import typing
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

import tyro

from agents.agent import MAX_EVALUATION_EPISODES
from agents.fast_paths import check_compile
from agents.options import Options
from envs.classic import torch_env_class
from envs.vector import check_device, check_env_id, check_env_kwargs, env_spec
from envs.wrappers import MAX_TOTAL_REWARD, parse_env_wrappers, wrapper_functions
from errors import InputError, loads_finite, require_positive
from training.machine import check_threads, check_worker_processes
from training.presets import preset_note

LoggerName = Literal["wandb", "csv", "tensorboard", "none"]
ConfigT = TypeVar("ConfigT")
MAX_THREADS = 1024  # torch would try to start as many as asked


@dataclass
class RunConfig(Options):
    """Options every recipe accepts."""

    env_id: str = "CartPole-v1"
    """Gymnasium environment id."""
    num_envs: int = 8
    """Number of environments stepped together by the collector."""
    env_kwargs: tuple[str, ...] = ()
    """Keyword arguments of the env's constructor as KEY=VALUE, values read as JSON where they parse (true, 3, 0.5,
    [1, 2]) and as text otherwise, e.g. --env-kwargs continuous=true; applied to the training and evaluation envs
    and saved with the agent."""
    env_wrappers: tuple[str, ...] = ()
    """Gymnasium wrappers around every training and evaluation env, innermost first: IMPORT.PATH or
    IMPORT.PATH={JSON keyword arguments}, e.g. gymnasium.wrappers.TimeAwareObservation or
    'gymnasium.wrappers.ClipReward={"max_reward": 1}'; saved with the agent, which applies them again."""
    allow_wrappers: tuple[str, ...] = ()
    """Wrapper import paths that a resumed run may import besides Gymnasium's and this toolkit's (a new run's own
    --env-wrappers are always allowed)."""
    max_episode_steps: int | None = None
    """Cut every episode at this many steps (Gymnasium's TimeLimit; default: the env's registered limit)."""
    max_total_reward: float | None = None
    """End an episode (as a truncation) once its return reaches this (training and evaluation envs)."""
    eval_env_id: str | None = None
    """Evaluate in this env instead of --env-id (same observation and action spaces; --env-wrappers apply)."""
    eval_env_kwargs: tuple[str, ...] = ()
    """Keyword arguments of the evaluation env as KEY=VALUE (as --env-kwargs): they replace those of --env-kwargs
    with the same key (with another --eval-env-id, --env-kwargs do not apply)."""
    env_backend: Literal["gymnasium", "torch"] = "gymnasium"
    """'gymnasium': any Gymnasium env, stepped on the CPU; 'torch': the batched torch classic-control envs
    (CartPole-v1, Pendulum-v1, MountainCar-v0, MountainCarContinuous-v0, Acrobot-v1), stepped on --device."""
    vectorization: Literal["sync", "async"] = "sync"
    """Gymnasium backend: step sub-envs in this process ('sync') or one process each ('async')."""
    seed: int = 0
    """Seed for Python, NumPy, torch, the envs and their action spaces."""
    total_frames: int = 100_000
    """Training budget in environment steps (summed over all envs)."""
    device: str = "cpu"
    """Device of the networks and the loss: 'cpu', 'cuda', 'cuda:1', ... (Gymnasium envs step on the CPU, torch
    envs on this device)."""
    output_dir: Path | None = None
    """Where the run writes its outputs; default runs/ALGORITHM-ENV-SEED-TIMESTAMP."""
    logger: LoggerName = "csv"
    """Metrics logger: Weights & Biases, CSV files, TensorBoard event files (OUTPUT_DIR/tensorboard), or none
    (evaluations.csv and summary.json are always written)."""
    wandb_project: str = "rlkit"
    """Weights & Biases project."""
    wandb_online: bool = False
    """Sync the W&B run to the server while training (default: offline, upload later with 'wandb sync')."""
    normalize_obs_warmup: int = 0
    """With --normalize-obs: before training, step a separate copy of the training envs this many steps (summed
    over envs) with uniformly random actions and fold their observations into the statistics (pytorchrl's
    pre_normalization_steps); these steps do not count against --total-frames."""
    eval_every: int = 10_000
    """Run a deterministic evaluation every this many frames (and at the end)."""
    eval_episodes: int = 20
    """Episodes per evaluation."""
    stop_at_return: float | None = None
    """Stop once the evaluation mean return reaches this; default: the registered reward threshold of the env the
    evaluations run in (475 for CartPole-v1, none for Pendulum-v1). Pass inf to never stop early."""
    video: bool = True
    """Record one deterministic episode of the final agent to video.mp4."""
    video_every_eval: bool = False
    """Also record one deterministic episode after every evaluation, to videos/eval-FRAMES.mp4; every video goes
    to the W&B or TensorBoard logger too."""
    progress: bool = True
    """Show a progress bar."""
    threads: int = 1
    """Torch CPU threads; 1 is fastest and steadiest for small networks on a few cores; 0 keeps torch's default.
    Left at the recipe's 1, a run on image observations takes torch's default (its CNN gains from every core)."""
    matmul_precision: Literal["highest", "high", "medium"] = "highest"
    """Arithmetic of float32 matrix products (torch.set_float32_matmul_precision; on the CPU convolutions too):
    'highest' float32; 'medium' lets them run in bfloat16 with float32 accumulation on CPUs with AVX512-BF16 or
    AMX (oneDNN) and in TF32 on CUDA GPUs; 'high' TF32 where the hardware has it. Faster updates of large networks
    for less exact products: check the learning curve before relying on it."""
    linear_kernels: Literal["auto", "torch", "onednn"] = "auto"
    """Kernels of large float32 linear layers on the CPU (agents.linear): 'onednn' runs products of 8.4 million
    multiply-adds or more (256-unit layers at batch 128 and up) through oneDNN, 'torch' through torch's default
    (MKL), 'auto' oneDNN on AMD CPUs from Zen 5 on, where MKL takes AVX2 kernels at about half oneDNN's speed,
    and on Zen 4, which runs AVX-512 in 256-bit halves, for products of 33.5 million multiply-adds or more only
    (the Nature CNN's linear layer in updates; 256-unit layers stay with MKL there). Both are float32
    arithmetic, summed in another order."""
    flush_denormal: bool = True
    """Flush denormal floats (below 1.2e-38) to zero in CPU arithmetic (torch.set_flush_denormal; torch's
    worker threads started after the run sets it inherit it). Adam's moments of a dead ReLU unit's weights decay
    into denormals and stay there, and a CPU computes on denormals many times slower: a DQN CartPole run took
    about 10% longer without it. --no-flush-denormal keeps IEEE gradual underflow."""
    compile: bool = False
    """Compile the loss (its forward and backward) and the collector's policy with torch.compile: the first
    updates wait for a one-off compilation (seconds to a minute), later ones run faster where Python overhead,
    not arithmetic, dominates (small networks). Needs a C++ compiler for the CPU; random draws are eager's."""
    checkpoint_every: int | None = None
    """Also save agent.ckpt and resume.ckpt (the whole training state, for --resume) every this many frames
    (default: agent.ckpt at the end; both on SIGINT/SIGTERM)."""
    collector_backend: Literal["single", "multiprocess", "ray"] = "single"
    """Where the envs step: in this process ('single'), in --num-workers processes (TorchRL's multi-process
    collector) or on --num-workers Ray actors ('ray'; ES: its population). --num-envs is split over the workers."""
    num_workers: int = 2
    """Collector workers for --collector-backend multiprocess or ray."""
    ray_address: str | None = None
    """Address of a running Ray cluster to join (e.g. 'ray://head:10001' or 'head:6379'); default: start a local
    one."""
    gradient_workers: int = 0
    """Spread learning over this many Ray actors (with --collector-backend ray), each collecting on its share of
    --num-envs and computing gradients on its share of each minibatch; this process applies them (PPO, A2C,
    RND-PPO, REINFORCE, VPG, DQN). 0: one process computes every gradient."""
    sync: bool = True
    """Gradient workers: average the N workers' gradients of a step and apply them once (--sync), or apply each
    worker's gradients as they arrive (--async, also --no-sync)."""
    max_staleness: int | None = None
    """--async: drop gradients computed on weights more than this many updates old; default: the number of
    gradient workers."""
    gradient_worker: tyro.conf.Suppress[int | None] = None
    """Set in a gradient worker's own copy of the configuration: its index."""
    overwrite: bool = False
    """Replace the run already in --output-dir (its outputs are removed first; other files there are kept).
    Without it a new run refuses a folder that holds one."""
    preset: str = "auto"
    """Hyperparameters for the env from the recipe's preset table (--list-presets prints it): 'auto' the env's
    own preset if there is one, 'none' the recipe's defaults, or a preset's name. Options given explicitly win."""
    preset_file: Path | None = None
    """Another preset file (TOML, or JSON as recipes.tune writes its best trial) whose presets come first, for
    --preset auto and by name; --list-presets shows them."""
    preset_applied: tyro.conf.Suppress[dict[str, Any] | None] = None
    """Which preset was applied and what it set (filled in when the run starts; saved in config.json)."""
    resume: Path | None = None
    """Continue the run saved in this run directory (its resume.ckpt, written with --checkpoint-every and on
    SIGINT/SIGTERM) or resume checkpoint, with its saved options, exactly where it stopped."""

    def validate(self) -> None:
        """Raise :class:`InputError` for out-of-range values."""
        for name, hint in typing.get_type_hints(type(self)).items():
            choices = typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else ()
            if choices and getattr(self, name) not in choices:
                raise InputError(
                    f"--{name.replace('_', '-')} must be one of {', '.join(map(str, choices))}; "
                    f"got {getattr(self, name)!r}."
                )
        if not 0 <= self.seed < 2**32:
            raise InputError(f"--seed must be in [0, 2**32), got {self.seed}.")
        if self.logger == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
            raise InputError(
                "--logger tensorboard needs the tensorboard package: pip install tensorboard, or choose --logger csv."
            )
        if not 0 <= self.threads <= MAX_THREADS:
            raise InputError(
                f"--threads must be 0 (torch's default) or a positive count up to {MAX_THREADS}, got {self.threads}."
            )
        check_threads(self.threads)
        require_positive(
            num_envs=self.num_envs,
            total_frames=self.total_frames,
            eval_every=self.eval_every,
            eval_episodes=self.eval_episodes,
        )
        if self.eval_episodes > MAX_EVALUATION_EPISODES:  # before training, not at the first evaluation
            raise InputError(
                f"--eval-episodes must be at most {MAX_EVALUATION_EPISODES:,}, got {self.eval_episodes:,}."
            )
        if self.num_envs > self.total_frames:  # a typo's hundred million envs would be built before failing
            raise InputError(
                f"--num-envs {self.num_envs} is more than --total-frames {self.total_frames}"
                f"{preset_note(self, 'num_envs', 'total_frames')}: each env takes at least one step, so some "
                "would never be used; lower --num-envs or raise --total-frames."
            )
        if self.checkpoint_every is not None:
            require_positive(checkpoint_every=self.checkpoint_every)
        if self.stop_at_return is not None and math.isnan(self.stop_at_return):
            raise InputError("--stop-at-return must be a number, got nan.")
        if self.stop_at_return == -math.inf:
            raise InputError(
                "--stop-at-return -inf would stop at the first evaluation; pass inf to never stop early."
            )
        if self.normalize_obs_warmup < 0:
            raise InputError(
                f"--normalize-obs-warmup must be 0 or positive, got {self.normalize_obs_warmup}."
            )
        if self.gradient_workers < 0:
            raise InputError(f"--gradient-workers must be 0 or positive, got {self.gradient_workers}.")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise InputError(f"--max-staleness must be 0 or positive, got {self.max_staleness}.")
        if self.gradient_worker is None:  # a worker's own copy runs a single-process collector by design
            self._refuse_unused_worker_options()
        if self.collector_backend != "single":
            if self.device != "cpu":
                raise InputError(
                    f"--device {self.device} with --collector-backend {self.collector_backend} is not supported: worker "
                    "collectors run on the CPU (their weights arrive through shared CPU memory or Ray); use --device "
                    f"cpu, or --collector-backend single to train on {self.device}."
                )
            require_positive(num_workers=self.num_workers)
            if self.collector_backend == "multiprocess":
                check_worker_processes(self.num_workers)
            if self.num_envs % self.num_workers and not self.gradient_workers:
                raise InputError(
                    f"--num-envs {self.num_envs} must split evenly over --num-workers {self.num_workers}."
                )
        check_device(self.device)
        if self.compile:
            check_compile(self.device)
        check_env_id(self.env_id)
        self.env_options  # noqa: B018 - parsing raises InputError for a malformed item
        self._validate_env_options()
        if self.env_backend == "torch":
            torch_env_class(self.env_id)  # raises if there is no torch implementation
            if self.vectorization == "async":
                raise InputError(
                    "--vectorization async runs Gymnasium envs in subprocesses; a torch env steps all its envs "
                    "as one batch of tensors: drop --vectorization async or use --env-backend gymnasium."
                )
            if self.wrapper_specs:
                raise InputError(
                    "--env-wrappers and --max-total-reward wrap Gymnasium envs; drop them or use --env-backend "
                    "gymnasium."
                )

    def _refuse_unused_worker_options(self) -> None:
        """Raise :class:`InputError` for Ray, worker and gradient-worker options that the run would not use."""
        if self.num_workers != RunConfig.num_workers and self.resume is None:  # a saved run keeps its options
            if self.collector_backend == "single":
                raise InputError(
                    f"--num-workers {self.num_workers} is for --collector-backend multiprocess or ray: add one of "
                    "them, or drop --num-workers."
                )
            if self.gradient_workers:
                raise InputError(
                    f"--num-workers {self.num_workers} does not apply with --gradient-workers: each gradient "
                    "worker collects on its share of --num-envs itself; drop --num-workers."
                )
        if self.ray_address is not None and self.collector_backend != "ray":
            raise InputError(
                f"--ray-address {self.ray_address} is for Ray workers: add --collector-backend ray (worker "
                "collectors, or --gradient-workers N), or drop --ray-address."
            )
        if not self.gradient_workers and (not self.sync or self.max_staleness is not None):
            raise InputError(
                f"{'--async' if not self.sync else '--max-staleness'} is for gradient workers: add "
                "--gradient-workers N --collector-backend ray, or drop it."
            )
        if self.sync and self.max_staleness is not None:
            raise InputError("--max-staleness is for --async gradient workers: add --async, or drop it.")

    def _validate_env_options(self) -> None:
        if self.env_options.get("render_mode") == "human":
            warnings.warn(
                "--env-kwargs render_mode=human draws every step of every training env in a window at the env's "
                "frame rate (CartPole-v1: 50 steps a second), and training runs at that pace; watch the evaluations "
                "with --eval-env-kwargs render_mode=human instead, or keep their videos (--video).",
                stacklevel=2,
            )
        if self.max_episode_steps is not None:
            require_positive(max_episode_steps=self.max_episode_steps)
            if "max_episode_steps" in self.env_options:
                raise InputError(
                    "Give max_episode_steps once: --max-episode-steps or --env-kwargs, not both."
                )
        if self.max_total_reward is not None and not math.isfinite(self.max_total_reward):
            raise InputError(f"--max-total-reward must be a finite number, got {self.max_total_reward}.")
        if self.eval_env_id is not None:
            check_env_id(self.eval_env_id)
        check_env_kwargs(self.env_id, self.env_options)
        eval_env_id, eval_env_kwargs = self.eval_env_options
        if eval_env_kwargs is not None:
            check_env_kwargs(eval_env_id or self.env_id, eval_env_kwargs, "--eval-env-kwargs")
        wrapper_functions(self.wrapper_specs, self.allowed_wrappers)  # imports each: a missing one fails now

    @property
    def learns_on_workers(self) -> bool:
        """Whether this process is the learner of a run on gradient workers (which collect for themselves)."""
        return self.gradient_workers > 0 and self.gradient_worker is None

    @property
    def env_options(self) -> dict[str, Any]:
        """``env_kwargs`` as a dict (see :func:`parse_env_kwargs`)."""
        return parse_env_kwargs(self.env_kwargs)

    @property
    def env_make_kwargs(self) -> dict[str, Any]:
        """The env constructor's keyword arguments: ``env_kwargs`` with ``max_episode_steps``."""
        extra = {} if self.max_episode_steps is None else {"max_episode_steps": self.max_episode_steps}
        return {**self.env_options, **extra}

    @property
    def wrapper_specs(self) -> list[dict[str, Any]]:
        """``env_wrappers`` parsed (:func:`envs.wrappers.parse_env_wrappers`), then :class:`MaxTotalReward`."""
        specs = parse_env_wrappers(self.env_wrappers)
        if self.max_total_reward is not None:
            specs.append({"path": MAX_TOTAL_REWARD, "kwargs": {"max_total_reward": self.max_total_reward}})
        return specs

    @property
    def allowed_wrappers(self) -> set[str]:
        """Wrapper paths this run may import besides the trusted ones: a new run's own, a resumed run's
        ``allow_wrappers`` (its wrappers were read from a file)."""
        own = (
            set()
            if self.resume is not None
            else {spec["path"] for spec in parse_env_wrappers(self.env_wrappers)}
        )
        return own | set(self.allow_wrappers)

    @property
    def eval_env_options(self) -> tuple[str | None, dict[str, Any] | None]:
        """The evaluation env's id and keyword arguments; ``(None, None)``: the training env's."""
        if self.eval_env_id is None and not self.eval_env_kwargs:
            return None, None
        same = self.eval_env_id in (None, self.env_id)
        cap = {} if self.max_episode_steps is None else {"max_episode_steps": self.max_episode_steps}
        base = self.env_make_kwargs if same else cap  # --max-episode-steps holds in another env too
        return self.eval_env_id, {**base, **parse_env_kwargs(self.eval_env_kwargs, "--eval-env-kwargs")}

    @property
    def target_return(self) -> float | None:
        """The evaluation return that ends training early, if any: ``--stop-at-return``, else the registered
        threshold of the env the evaluations run in (``--eval-env-id``'s when given), unless ``--max-total-reward``
        ends episodes below it."""
        if self.stop_at_return is not None:
            return None if math.isinf(self.stop_at_return) else self.stop_at_return
        threshold = env_spec(self.eval_env_id or self.env_id).reward_threshold
        if threshold is not None and self.max_total_reward is not None and self.max_total_reward < threshold:
            return None  # no episode's return can reach it
        return threshold


def parse_env_kwargs(items: tuple[str, ...] | list[str], option: str = "--env-kwargs") -> dict[str, Any]:
    """``("continuous=true", "gravity=-9.5", "map_name=8x8")`` -> ``{"continuous": True, "gravity": -9.5,
    "map_name": "8x8"}``: each value read as JSON where it parses, as text otherwise.

    Raises:
        InputError: an item without ``=``, a key that is not a Python identifier, a key given twice, or a number
            that is not finite (``NaN``, ``Infinity``, ``1e400``).
    """
    options: dict[str, Any] = {}
    for item in items:
        key, separator, text = str(item).partition("=")
        if not separator or not key.isidentifier():
            raise InputError(f"{option} takes KEY=VALUE items such as continuous=true, got {item!r}.")
        if key in options:
            raise InputError(f"{option} gives {key} twice.")
        try:
            options[key] = loads_finite(text, f"{option} {key}={text}")
        except InputError:
            raise
        except ValueError:
            options[key] = text
    return options


def config_to_dict(config: Any) -> dict[str, Any]:
    """A JSON-compatible copy of a (nested) config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(config), default=str))


def quiet(config: ConfigT, output_dir: str | Path, **run_options: Any) -> ConfigT:
    """Point a recipe's config at ``output_dir`` with no logger, video or progress bar (scripts, tests and
    benchmarks); ``run_options`` set further :class:`RunConfig` fields. Returns ``config``, changed in place."""
    options = {"output_dir": output_dir, "logger": "none", "video": False, "progress": False, **run_options}
    for name, value in options.items():
        setattr(config.run, name, value)
    return config
