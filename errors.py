"""The exceptions raised for input the toolkit cannot handle and for training that went numerically wrong, and the
range checks every config declares its options with."""

from __future__ import annotations

import json
import math
import numbers
import re
from typing import Any

FLOAT32_MAX = 3.4028234663852886e38  # hyperparameters end up in float32 tensors
INT64_MAX = 2**63 - 1  # counts end up in int64 tensors and NumPy indices


def is_whole_number(value: Any) -> bool:
    """Whether ``value`` is a whole number, Python's or NumPy's (``np.int64`` from an array), and not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


class InputError(ValueError):
    """Bad user input: an unknown env id, an unsupported space, a budget out of range, a wrong checkpoint.

    The message says what was wrong and how to fix it. Recipes' command lines print it on one line and exit
    with status 2 instead of showing a traceback.
    """


class RenderError(InputError):
    """An env cannot render the frames a video (or a window) needs: it takes no ``render_mode`` argument, or not the
    one asked for. Where a video is optional (a run's videos, ``recipes.evaluate --video``) the caller warns and goes
    on without one."""


class NonFiniteError(RuntimeError):
    """NaN or Inf appeared in training: in observations, rewards or a logged loss.

    The message names where it first appeared and at which frame, and lists the checkpoints kept (written before
    it appeared, never after). Recipes' command lines print it on one line and exit with status 1.
    """


class Interrupted(Exception):
    """SIGINT or SIGTERM arrived before training started (in a warm-up that steps the envs): the run stopped there
    with nothing written. Recipes' command lines print it on one line and exit with status 128 + the signal's
    number, as a run stopped by a signal does."""

    def __init__(self, signal_name: str, where: str):
        super().__init__(f"stopped by {signal_name} {where}, before the run started; nothing was written.")
        self.signal_name = signal_name


class WriteError(OSError):
    """A file of a run could not be written (a full disk, a read-only folder). The message names the file and
    says whether its previous version is intact (writes are atomic: it always is). Recipes' command lines print
    it on one line and exit with status 1.
    """

    def __str__(self) -> str:
        return str(self.strerror)


def require_positive(**values: int) -> None:
    """Raise :class:`InputError` naming the first option whose value is below 1 or beyond the 64-bit integers
    that counts are kept in (torch's frame counters, NumPy's indices)."""
    for name, value in values.items():
        if value < 1:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}.")
        if value > INT64_MAX:
            raise InputError(
                f"--{name.replace('_', '-')} is {value}, beyond 64-bit integers (at most {INT64_MAX:,})."
            )


_BOUND = re.compile(r"^(>=|>|<=|<)\s*(\S+)$")
_INTERVAL = re.compile(r"^([\[(])\s*(\S+)\s*,\s*(\S+)\s*([\])])$")


def check_ranges(**checks: tuple[float | None, str]) -> None:
    """Raise :class:`InputError` naming the first option outside its range; ``None`` values (unset) pass.

    Each keyword is an option's field name, each value ``(value, range)`` with ``range`` a bound (``"> 0"``,
    ``">= 0"``) or an interval (``"(0, 1]"``, ``"[0, 1]"``).

    Examples:
        >>> check_ranges(lr=(3e-4, "> 0"), gamma=(0.99, "(0, 1]"))
        >>> check_ranges(gamma=(1.5, "(0, 1]"))
        Traceback (most recent call last):
        errors.InputError: --gamma must be in (0, 1], got 1.5.
    """
    for name, (value, valid_range) in checks.items():
        if value is not None and math.isfinite(value) and abs(value) > FLOAT32_MAX:
            raise InputError(
                f"--{name.replace('_', '-')} is {value}, beyond float32 arithmetic (at most {FLOAT32_MAX:.3g})."
            )
        if value is None or _within(value, valid_range):
            continue
        expected = valid_range if _BOUND.match(valid_range) else f"in {valid_range}"
        raise InputError(f"--{name.replace('_', '-')} must be {expected}, got {value}.")


def _within(value: float, valid_range: str) -> bool:
    bound = _BOUND.match(valid_range)
    if bound:
        operator, limit = bound.group(1), float(bound.group(2))
        return {">": value > limit, ">=": value >= limit, "<": value < limit, "<=": value <= limit}[operator]
    interval = _INTERVAL.match(valid_range)
    if interval is None:
        raise ValueError(
            f"Unknown range {valid_range!r}: use '> x', '>= x', '< x', '<= x' or an interval '(a, b]'."
        )
    opening, low, high, closing = interval.groups()
    above = value >= float(low) if opening == "[" else value > float(low)
    below = value <= float(high) if closing == "]" else value < float(high)
    return above and below


def loads_finite(text: str, where: str) -> Any:
    """``text`` read as JSON, refusing NaN and infinities (``NaN``, ``Infinity``, ``1e400``): no env or wrapper
    argument means them, and the run's config files, which are JSON, could not hold them.

    Raises:
        InputError: a non-finite number, the message naming ``where`` (the option and key it was given as).
        json.JSONDecodeError: ``text`` is not JSON (callers may read it as text instead; catch InputError, a
            ValueError too, first).
    """

    def finite(word: str) -> float:
        value = float(word)
        if not math.isfinite(value):
            raise InputError(f"{where}: {word} is not a finite number; give a finite one.")
        return value

    return json.loads(text, parse_float=finite, parse_constant=finite)
