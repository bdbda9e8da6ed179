"""The base of the recipes' config dataclasses: it remembers which options the user set."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

OptionsT = TypeVar("OptionsT", bound="Options")


class Options:
    """Base class of a config dataclass (a recipe's config and its sections) that records the names of the fields
    the user set: given to the constructor (``OptimConfig(lr=1e-4)``) or assigned later (``config.optim.lr =
    1e-4``, ``quiet(config, ...)``).

    A preset (``training.presets``) leaves those options alone, even when the value equals the default: what a
    user sets in Python wins, as options given on the command line do. A recipe's own defaults are built with
    :func:`defaults`, which records nothing; :meth:`assign` sets a field without recording it (what a preset sets).
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        instance = super().__new__(cls)
        names = [field.name for field in dataclasses.fields(cls)][: len(args)] + list(kwargs)
        object.__setattr__(instance, "_assigned", set(names))
        return instance

    def __post_init__(self) -> None:
        object.__setattr__(self, "_constructed", True)

    def __setattr__(self, name: str, value: Any) -> None:
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


def defaults(factory: Callable[..., OptionsT], **values: Any) -> Callable[[], OptionsT]:
    """A ``default_factory`` for a recipe's section with values of its own: ``field(default_factory=
    defaults(RunConfig, env_id="Pendulum-v1"))``. The values are the recipe's defaults, not the user's choices."""

    def make() -> OptionsT:
        options = factory(**values)
        options.forget_assignments()
        return options

    return make
