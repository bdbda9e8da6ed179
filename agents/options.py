"""The base of the recipes' config dataclasses: it remembers which options the user set."""

from __future__ import annotations

import dataclasses
import difflib
import functools
import numbers
import os
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from errors import InputError, is_whole_number

OptionsT = TypeVar("OptionsT", bound="Options")


class Options:
    """Base class of a config dataclass (a recipe's config and its sections) that records the names of the fields
    the user set: given to the constructor (``OptimConfig(lr=1e-4)``) or assigned later (``config.optim.lr =
    1e-4``, ``quiet(config, ...)``).

    A preset (``training.presets``) leaves those options alone, even when the value equals the default: what a
    user sets in Python wins, as options given on the command line do. A recipe's own defaults are built with
    :func:`defaults`, which records nothing; :meth:`assign` sets a field without recording it (what a preset sets).
    A name that is not a field, or a value of another type than the field's, is refused where it is set
    (:func:`check_option`).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls)
        names = [field.name for field in dataclasses.fields(cls)][: len(args)] + list(kwargs)
        object.__setattr__(instance, "_assigned", set(names))
        return instance

    def __post_init__(self) -> None:
        for name in self.__dict__.get("_assigned", ()):  # given to the constructor
            check_option(type(self), name, getattr(self, name))
        object.__setattr__(self, "_constructed", True)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_constructed"):
            check_option(type(self), name, value)
        object.__setattr__(self, name, value)
        if self.__dict__.get("_constructed"):
            self.__dict__.setdefault("_assigned", set()).add(name)

    def assign(self, name: str, value: Any) -> None:
        """Set field ``name`` without counting it as set by the user."""
        object.__setattr__(self, name, value)

    @property
    def assigned(self) -> frozenset[str]:
        """The names of the fields the user set (other than through :meth:`assign`)."""
        return frozenset(self.__dict__.get("_assigned", ()))

    def forget_assignments(self) -> None:
        """Count every field as a default again (here and in the sections it holds)."""
        self.__dict__["_assigned"] = set()
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, Options):
                value.forget_assignments()


@functools.cache
def option_types(cls: type) -> dict[str, Any]:
    """The type of each field of the config dataclass ``cls``."""
    return typing.get_type_hints(cls)


def check_option(cls: type, name: str, value: Any) -> None:
    """Raise :class:`InputError` for a name that is not an option of ``cls`` (a typo would otherwise be set and
    ignored: ``config.optim.learning_rate = 1e-2`` trains at the default rate) or a value of another type than the
    option's (``num_epochs = 1.5``, ``total_frames = "2000"``, which would fail deep inside training or, as
    ``video = "False"``, be read the other way)."""
    hints = option_types(cls)
    if name not in hints:
        if name.startswith("_"):
            return
        close = difflib.get_close_matches(name, list(hints), n=3)
        hint = f" (did you mean {', '.join(close)}?)" if close else f"; its options: {', '.join(hints)}"
        raise InputError(f"{cls.__name__} has no option {name!r}{hint}.")
    if not fits(hints[name], value):
        raise InputError(
            f"{cls.__name__}.{name} takes {describe(hints[name])}, got {value!r:.60} ({type(value).__name__})."
        )


def fits(hint: Any, value: Any) -> bool:
    """Whether ``value`` is of the option type ``hint`` (a NumPy scalar counts as the Python number it holds; a
    list as a tuple)."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return fits(arguments[0], value)
    if origin in (typing.Union, types.UnionType):
        return any(fits(argument, value) for argument in arguments)
    if origin is typing.Literal:  # the type here; the choice is validate()'s, whose message names the flag
        return value in arguments or any(type(value) is type(choice) for choice in arguments)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, (bool, np.bool_))
    if hint is int:
        return is_whole_number(value)
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))
    if hint is str:
        return isinstance(value, str)
    if hint is Path:
        return isinstance(value, (str, os.PathLike))
    if origin is tuple:
        return isinstance(value, (tuple, list)) and all(fits(arguments[0], item) for item in value)
    if origin is dict:
        return isinstance(value, dict)
    if isinstance(hint, type) and issubclass(hint, Options):
        return isinstance(value, hint)
    return True


def describe(hint: Any) -> str:
    """An option type as a message names it."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        return describe(arguments[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe(argument) for argument in arguments)
    if origin is typing.Literal:
        return "one of " + ", ".join(map(repr, arguments))
    if origin is tuple:
        return f"a list, each item {describe(arguments[0])}"
    names = {bool: "True or False", int: "an integer", float: "a number", str: "text", Path: "a path"}
    return "None" if hint is type(None) else names.get(hint, getattr(hint, "__name__", str(hint)))


def defaults(factory: Callable[..., OptionsT], **values: Any) -> Callable[[], OptionsT]:
    """A ``default_factory`` for a recipe's section with values of its own: ``field(default_factory=
    defaults(RunConfig, env_id="Pendulum-v1"))``. The values are the recipe's defaults, not the user's choices."""

    def make() -> OptionsT:
        options = factory(**values)
        options.forget_assignments()
        return options

    return make
