"""The exception raised for input the toolkit cannot handle."""

from __future__ import annotations


class InputError(ValueError):
    """Bad user input: an unknown env id, an unsupported space, a budget out of range, a wrong checkpoint.

    The message says what was wrong and how to fix it. Recipes' command lines print it on one line and exit
    with status 2 instead of showing a traceback.
    """
