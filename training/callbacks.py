"""Callbacks: a Python user's hooks into a training run, the way Stable-Baselines3's ``BaseCallback`` is used.

Every recipe's ``main`` takes them::

    from recipes import ppo
    from training import Callback

    class StopWhenSteady(Callback):
        def on_evaluation(self, run, evaluation):
            if evaluation["return_std"] < 1.0 and evaluation["return_mean"] > 400:
                return False  # stop the run (Stable-Baselines3's convention)

    ppo.main(ppo.PPOConfig(), callbacks=[StopWhenSteady()])

A hook that returns ``False`` stops the run after the batch it was called for (the run then ends as one that spent
its budget: final evaluation, checkpoint, plot and summary, whose ``stopped_by_callback`` names the callback);
``None`` or ``True`` lets it go on; any other value is an error. The built-in evaluations, early stop at the target
return and checkpoints work alongside. Each hook gets the :class:`training.run.Run`, whose ``frames``, ``elapsed``,
``agent``, ``output_dir`` and ``config`` describe the run so far.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from tensordict import TensorDictBase

from errors import InputError

Run = Any  # training.run.Run, which imports this module


class Callback:
    """Override the hooks you need; each does nothing by default."""

    def on_start(self, run: Run) -> None:
        """Once, after the run folder, the logger and (with ``--resume``) the restored state are ready."""

    def on_batch(self, run: Run, batch: TensorDictBase, metrics: dict[str, float]) -> bool | None:
        """After each collected batch and its update: the batch (``run.frames`` counts it) and the metrics logged
        for it (``train/...`` losses, ``time/fps``; ``train/episode_return`` and ``train/episode_return_recent``,
        the mean of the last 100 training episodes, when episodes ended in it). False stops the run."""

    def on_evaluation(self, run: Run, evaluation: dict[str, float]) -> bool | None:
        """After each deterministic evaluation: its row of evaluations.csv (``frames``, ``wall_time_s``,
        ``return_mean``, ``return_std``, ``length_mean``). False stops the run."""

    def on_checkpoint(self, run: Run, path: Path) -> bool | None:
        """After a checkpoint is written: ``agent.ckpt``, ``best_agent.ckpt`` or ``resume.ckpt``. False stops the
        run."""

    def on_end(self, run: Run, summary: dict[str, Any]) -> None:
        """Once, after summary.json is written, with the summary."""


def check_callbacks(callbacks: Iterable[Any]) -> tuple[Callback, ...]:
    """The callbacks as a tuple, each checked to be a :class:`Callback`.

    Raises:
        InputError: an item that is not a ``Callback`` (a function, a class instead of an instance, ...).
    """
    if isinstance(callbacks, Callback):
        callbacks = (callbacks,)
    callbacks = tuple(callbacks)
    for callback in callbacks:
        if not isinstance(callback, Callback):
            raise InputError(
                f"callbacks takes training.Callback instances; got {callback!r}. Subclass training.Callback and "
                "override on_batch, on_evaluation, on_checkpoint, on_start or on_end."
            )
    return callbacks


def stops_run(callback: Callback, hook: str, value: Any) -> bool:
    """Whether a hook's return value asks to stop the run: False (NumPy's too) does, None and True do not;
    :class:`InputError` for anything else (a 0, a string, a tensor), which would otherwise be read one way or
    the other by accident."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return value is not None and not value
    raise InputError(
        f"{callback_name(callback)}.{hook} returned {value!r:.60} ({type(value).__name__}); a hook returns False "
        "to stop the run and None or True to let it go on."
    )


def callback_name(callback: Callback) -> str:
    """How a callback is named in the summary: its class name."""
    return type(callback).__name__
