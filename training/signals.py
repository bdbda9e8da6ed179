"""SIGINT and SIGTERM during training: the run finishes its batch, saves and stops; the caller's handlers are
restored however the run ends."""

from __future__ import annotations

import functools
import signal
import threading
import typing
from collections.abc import Callable
from typing import Any

from errors import InputError
from training.callbacks import Callback, check_callbacks

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
GRADIENT_WORKER_RECIPES = "PPO, A2C, RND-PPO, REINFORCE, VPG and DQN"


class SignalWatcher:
    """Turns SIGINT and SIGTERM into a request to stop (:attr:`interrupted_by`) while installed.

    The first signal is recorded and the previous handlers are put back, so a second one acts as usual (a
    second Ctrl-C stops at once). Python delivers signals to the main thread only: elsewhere nothing is installed.
    """

    def __init__(self):
        self.interrupted_by: str | None = None
        self._previous: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for number in HANDLED_SIGNALS:
                self._previous[number] = signal.signal(number, self._on_signal)

    def restore(self) -> None:
        """Put back the handlers found at :meth:`install` (no-op if already restored)."""
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def _on_signal(self, number: int, frame: Any) -> None:
        self.interrupted_by = signal.Signals(number).name
        self.restore()


def recipe_main(main: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """Decorate a recipe's ``main``: however it ends (a summary, an error), the SIGINT and SIGTERM handlers are
    those it started with, so a failed run never leaves its own handler behind in the caller (a notebook, a
    test session). A recipe whose config does not name the options its gradient workers split
    (``GRADIENT_SPLIT``) refuses ``--gradient-workers`` before any work."""

    @functools.wraps(main)
    def wrapper(*args: Any, **kwargs: Any) -> dict[str, Any]:
        check_main_arguments(main, args, kwargs)
        refuse_gradient_workers_unless_supported(args[0] if args else kwargs.get("config"))
        if "callbacks" in kwargs:  # before any work
            kwargs["callbacks"] = check_callbacks(kwargs["callbacks"])
        if threading.current_thread() is not threading.main_thread():
            return main(*args, **kwargs)
        handlers = {number: signal.getsignal(number) for number in HANDLED_SIGNALS}
        try:
            return main(*args, **kwargs)
        finally:
            for number, handler in handlers.items():
                signal.signal(number, handler)

    return wrapper


def check_main_arguments(main: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> None:
    """Raise :class:`InputError` for a recipe's ``main`` given another recipe's config, a config class instead of
    an instance, or callbacks in the place of PPO's (A2C's, ...) second argument, ``loss_addons``."""
    config = args[0] if args else kwargs.get("config")
    try:
        expected = typing.get_type_hints(main).get("config")
    except (NameError, TypeError):  # a user's recipe annotated with names its module cannot resolve
        expected = None
    if isinstance(expected, type) and not isinstance(config, expected):
        given = f"the class {config.__name__}" if isinstance(config, type) else type(config).__name__
        raise InputError(
            f"{main.__module__}.main takes a {expected.__name__} instance ({expected.__name__}()), got {given}."
        )
    second = args[1] if len(args) > 1 else ()
    if isinstance(second, Callback) or (
        isinstance(second, (list, tuple)) and any(isinstance(item, Callback) for item in second)
    ):
        raise InputError(
            f"Callbacks go by keyword: {main.__module__}.main(config, callbacks=[...]) (the second positional "
            "argument is loss_addons)."
        )


def refuse_gradient_workers_unless_supported(config: Any) -> None:
    """Raise :class:`InputError` for ``--gradient-workers`` on a recipe that does not run on them."""
    run = getattr(config, "run", None)
    if getattr(run, "gradient_workers", 0) and getattr(type(config), "GRADIENT_SPLIT", None) is None:
        raise InputError(
            f"This recipe does not spread its learning over gradient workers (those of {GRADIENT_WORKER_RECIPES} "
            "do): drop --gradient-workers, or use --collector-backend ray --num-workers N to collect on N workers."
        )
