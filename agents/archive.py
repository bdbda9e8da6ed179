"""Reading a checkpoint archive as hostile input: it holds JSON and plain tensors only, every size it declares is the
size it really holds, and loading it never allocates or writes more than the file's own bytes justify.

The toolkit's checkpoints (``agent.ckpt``, ``resume.ckpt``) are TorchRL checkpoint archives: a zip, stored
uncompressed, of JSON files and raw tensor files whose shapes and dtypes a ``meta.json`` declares. Before anything
is loaded :func:`check_archive` checks every entry: its name (JSON or a raw tensor file, nothing TensorDict would
unpickle), that it is stored uncompressed (so what it extracts to is what the file holds: no zip bomb), that the
entries fit in the file, that each tensor file holds exactly the bytes its declared shape and dtype need (a short
file is an error, not zeros), and that every JSON entry parses (deep nesting is an error, not a crash).
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from errors import InputError

# An archive holds JSON and raw tensor files only. TensorDict's loader would unpickle an "other.pickle" sidecar and
# import the classes that meta.json names, so anything else is refused before loading.
_ARCHIVE_ENTRY = re.compile(
    r"manifest\.json|components/[\w.-]+/state\.json|components/[\w.-]+/state/(meta\.json|\w+\.memmap)"
)
_TENSOR_LEAF_KEYS = {"device", "shape", "dtype", "is_nested"}
_DTYPES = {
    str(dtype): dtype
    for dtype in (
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.bool,
    )
}
TensorShapes = dict[str, tuple[tuple[int, ...], torch.dtype]]


def check_archive(path: Path, kind: str = "agent") -> dict[str, TensorShapes]:
    """Check ``path`` as described in the module docstring; return each component's tensors (``meta.json`` key ->
    shape and dtype), e.g. ``{"components/0000-policy": {"tensor_00000000": ((64, 4), torch.float32)}}``.

    Args:
        path: the archive.
        kind: what it should be, for messages: "agent" or "resume".

    Raises:
        InputError: for anything else, naming what is wrong.
    """
    article = "an" if kind[0] in "aeiou" else "a"
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path} is not {article} {kind} checkpoint (not a checkpoint archive).")
    try:
        with zipfile.ZipFile(path) as archive:
            return _check_entries(path, archive)
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        raise InputError(f"{path} is not a readable {kind} checkpoint ({error}).") from None


def _check_entries(path: Path, archive: zipfile.ZipFile) -> dict[str, TensorShapes]:
    entries = archive.infolist()
    for info in entries:
        if not _ARCHIVE_ENTRY.fullmatch(info.filename):
            raise InputError(f"{path} holds an unexpected file {info.filename!r}; refusing to load it.")
        if info.compress_type != zipfile.ZIP_STORED or info.file_size != info.compress_size:
            raise InputError(
                f"{path} holds a compressed entry {info.filename!r} ({info.compress_size} bytes declaring "
                f"{info.file_size}); this toolkit's checkpoints are stored uncompressed. Refusing to extract it."
            )
    if sum(info.compress_size for info in entries) > path.stat().st_size:
        raise InputError(f"{path} declares more bytes than the file holds: it is truncated or forged.")
    sizes = {info.filename: info.file_size for info in entries}
    components = {}
    for info in entries:
        if info.filename.endswith(".json"):
            document = read_json(path, archive, info.filename)
            if info.filename.endswith("/meta.json"):
                folder = info.filename.removesuffix("/state/meta.json")
                components[folder] = _check_tensors(path, info.filename, document, sizes)
    return components


def read_json(path: Path, archive: zipfile.ZipFile, name: str) -> Any:
    """Parse the JSON entry ``name``; :class:`InputError` if it is not JSON or nests too deeply to parse."""
    try:
        return json.loads(archive.read(name))
    except RecursionError:
        raise InputError(f"{path} holds JSON nested too deeply in {name!r}; refusing to load it.") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(f"{path} holds damaged JSON in {name!r} ({error}).") from None


def _check_tensors(path: Path, name: str, meta: Any, sizes: dict[str, int]) -> TensorShapes:
    if not isinstance(meta, dict) or meta.get("_type") != str(TensorDict):
        raise InputError(f"{path} describes something other than plain tensors in {name!r}.")
    folder = name.removesuffix("meta.json")
    tensors: TensorShapes = {}
    for key, leaf in meta.items():
        if key in ("shape", "device", "_type"):
            continue
        if not isinstance(leaf, dict) or not set(leaf) <= _TENSOR_LEAF_KEYS or leaf.get("is_nested"):
            raise InputError(f"{path} describes something other than plain tensors in {name!r}.")
        shape, dtype = leaf.get("shape"), _DTYPES.get(leaf.get("dtype"))
        if (
            dtype is None
            or not isinstance(shape, list)
            or not all(isinstance(size, int) and not isinstance(size, bool) and size >= 0 for size in shape)
        ):
            raise InputError(
                f"{path} declares tensor {key!r} with an unsupported shape or dtype in {name!r}."
            )
        needed = math.prod(shape) * dtype.itemsize
        held = sizes.get(f"{folder}{key}.memmap", 0)
        if held != needed:
            raise InputError(
                f"{path} declares tensor {key!r} of shape {tuple(shape)} and {dtype} ({needed} bytes) but holds "
                f"{held} bytes for it: the file is damaged or forged."
            )
        tensors[key] = (tuple(shape), dtype)
    return tensors


def state_shapes(path: Path, component: str, tensors: TensorShapes) -> TensorShapes:
    """The state-dict names of a component's tensors (from its ``state.json``) with their shapes and dtypes."""
    with zipfile.ZipFile(path) as archive:
        state = read_json(path, archive, f"{component}/state.json")
    items = state.get("items") if isinstance(state, dict) else None
    named: TensorShapes = {}
    for item in items if isinstance(items, list) else []:
        if not (isinstance(item, list) and len(item) == 2 and all(isinstance(part, dict) for part in item)):
            raise InputError(f"{path} has a damaged state description in {component}/state.json.")
        name, value = item
        if value.get("kind") == "tensor" and value.get("key") in tensors:
            named[str(name.get("value"))] = tensors[value["key"]]
    return named


def component_of(tensors: dict[str, TensorShapes], name: str) -> str:
    """The archive folder of the component called ``name`` (e.g. "policy")."""
    for folder in tensors:
        if folder.rsplit("-", 1)[-1] == name:
            return folder
    raise InputError(f"The checkpoint holds no {name!r} tensors.")


def nbytes(shapes: TensorShapes) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in shapes.values())
