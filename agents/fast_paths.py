"""Shortcuts around per-call costs in TensorDict that do not change what any call returns.

``TensorDictModule`` passes every output tensor of its module through ``TensorDict.from_any``, which asks
``importlib.util.find_spec("pandas")`` (a search of ``sys.path`` on disk) before it gives a plain tensor back
unchanged. That lookup costs about 0.1 ms per output, several per policy call: a tenth of an off-policy recipe's
collection time on a MuJoCo task. :func:`install` makes ``from_any`` return tensors at once, the value it returns
for them anyway (a tensor is no dict, tuple, dataclass, array, DataFrame or HDF5 file); every other input takes
TensorDict's own path. Importing :mod:`agents` installs it.
"""

from __future__ import annotations

import functools

import torch
from tensordict import TensorDictBase, is_tensor_collection


def install() -> None:
    """Give ``TensorDict.from_any`` a fast path for tensors (once; later calls do nothing)."""
    original = TensorDictBase.from_any.__func__
    if getattr(original, "returns_tensors_at_once", False):
        return

    @functools.wraps(original)
    def from_any(cls, obj, **kwargs):
        if isinstance(obj, torch.Tensor) and not is_tensor_collection(obj):
            return obj
        return original(cls, obj, **kwargs)

    from_any.returns_tensors_at_once = True
    TensorDictBase.from_any = classmethod(from_any)
