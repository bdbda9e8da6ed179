"""A gradient worker's configuration and the checks of ``--gradient-workers`` against a run's other options: the
JSON configuration each worker builds its recipe from (its share of the envs and of the options the recipe's
``GRADIENT_SPLIT`` names, seeded apart), where the recipe is imported from, and the refusals of option
combinations the workers cannot run (see :mod:`training.gradient_workers`)."""

from __future__ import annotations

import copy
import sys
from collections.abc import Sequence
from typing import Any

from errors import InputError
from training.distributed import WORKER_SEED_STRIDE


def recipe_location(config: Any) -> tuple[str, str]:
    """The importable module of a recipe's config class and the class's name (``recipes.ppo``, ``PPOConfig``),
    also when the recipe runs as ``python -m recipes.ppo``."""
    config_type = type(config)
    module = config_type.__module__
    if module == "__main__":
        spec = getattr(sys.modules["__main__"], "__spec__", None)
        if spec is None:
            raise InputError(
                "Gradient workers import the recipe by module name: run it as python -m recipes.NAME or call "
                "recipes.NAME.main from Python."
            )
        module = spec.name
    return module, config_type.__name__


def worker_config(
    config: dict[str, Any],
    index: int,
    num_workers: int,
    split: Sequence[str],
    generation: int = 0,
    start_frames: int = 0,
) -> dict[str, Any]:
    """The JSON form of a worker's configuration: ``num_envs`` and the options named in ``split`` (dotted paths,
    e.g. ``"optim.minibatch_size"``) divided by ``num_workers``, envs seeded apart (worker ``index``, its
    ``generation``-th replacement, and the frames a resumed run starts from, so that its workers play new
    episodes), a single-process collector, and no outputs of its own."""
    config = copy.deepcopy(config)
    run = config["run"]
    slot = index + num_workers * generation
    run.update(
        gradient_worker=index,
        collector_backend="single",
        num_envs=run["num_envs"] // num_workers,
        seed=(run["seed"] + WORKER_SEED_STRIDE * (slot + 1) + start_frames) % 2**32,
        logger="none",
        progress=False,
        video=False,
        output_dir=None,
        resume=None,
        checkpoint_every=None,
        overwrite=False,
    )
    for path in split:
        section, _, name = path.rpartition(".")
        options = config[section] if section else config
        options[name] //= num_workers
    return config


def check_gradient_workers(config: Any) -> None:
    """Raise :class:`InputError` when ``--gradient-workers`` does not fit the run's other options (the recipe's
    config names the options its workers share out in ``GRADIENT_SPLIT``)."""
    run = config.run
    split = type(config).GRADIENT_SPLIT
    workers = run.gradient_workers
    if workers == 0 or run.gradient_worker is not None:
        return
    if run.collector_backend != "ray":
        raise InputError(
            f"--gradient-workers {workers} runs its workers on Ray: add --collector-backend ray (and --ray-address "
            "to join a running cluster)."
        )
    values = {"num_envs": run.num_envs}
    for path in split:
        section, _, name = path.rpartition(".")
        values[name] = getattr(getattr(config, section) if section else config, name)
    for name, value in values.items():
        if value % workers:
            raise InputError(
                f"--{name.replace('_', '-')} {value} must split evenly over --gradient-workers {workers} (each "
                "worker takes its share)."
            )


def refuse_loss_addons(loss_addons: Sequence[Any], run: Any) -> None:
    """Raise :class:`InputError` for loss add-ons on a run with gradient workers (they are Python objects the
    workers cannot rebuild from the configuration)."""
    if loss_addons and run.gradient_workers:
        raise InputError(
            "Loss add-ons are Python objects that gradient workers cannot rebuild: drop --gradient-workers, or "
            "the add-ons."
        )


__all__ = ["check_gradient_workers", "recipe_location", "refuse_loss_addons", "worker_config"]
