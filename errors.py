"""The exceptions raised for input the toolkit cannot handle and for training that went numerically wrong."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: an unknown env id, an unsupported space, a budget out of range, a wrong checkpoint.

    The message says what was wrong and how to fix it. Recipes' command lines print it on one line and exit
    with status 2 instead of showing a traceback.
    """


class NonFiniteError(RuntimeError):
    """NaN or Inf appeared in training: in observations, rewards or a logged loss.

    The message names where it first appeared and at which frame, and lists the checkpoints kept (written before
    it appeared, never after). Recipes' command lines print it on one line and exit with status 1.
    """
