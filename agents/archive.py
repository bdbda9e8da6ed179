"""Reading a checkpoint archive as hostile input: it holds JSON and plain tensors only, every size it declares is the
size it really holds, and loading it never allocates or writes more than the file's own bytes justify.

The toolkit's checkpoints (``agent.ckpt``, ``resume.ckpt``) are TorchRL checkpoint archives: a zip, stored
uncompressed, of JSON files and raw tensor files whose shapes and dtypes a ``meta.json`` declares. Before anything
is loaded :func:`check_archive` checks every entry: its name (JSON or a raw tensor file, nothing TensorDict would
unpickle), that it is stored uncompressed (so what it extracts to is what the file holds: no zip bomb), that the
entries fit in the file, that each tensor file holds exactly the bytes its declared shape and dtype need (a short
file is an error, not zeros), that every JSON entry parses (deep nesting is an error, not a crash) and that the
manifest lists for extraction only files the archive holds, each once.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import torch
from tensordict import TensorDict

from agents.files import require_regular_file
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
    require_regular_file(path, f"{kind} checkpoint")
    if not zipfile.is_zipfile(path):
        raise InputError(f"{path} is not {article} {kind} checkpoint (not a checkpoint archive).")
    try:
        with zipfile.ZipFile(path) as archive:
            return _check_entries(path, archive)
    except (zipfile.BadZipFile, OSError, EOFError, NotImplementedError) as error:
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
    documents = {
        info.filename: read_json(path, archive, info.filename)
        for info in entries
        if info.filename.endswith(".json")
    }
    manifest = documents.get("manifest.json")
    if isinstance(manifest, dict) and "components" in manifest:
        _check_listed_files(path, manifest["components"], sizes)
    components = {}
    for name, document in documents.items():
        if name.endswith("/meta.json"):
            components[name.removesuffix("/state/meta.json")] = _check_tensors(path, name, document, sizes)
    for name, document in documents.items():
        if name.endswith("/state.json"):
            _check_state(path, name, document, components.get(name.removesuffix("/state.json"), {}))
    return components


def _check_listed_files(path: Path, components: Any, sizes: dict[str, int]) -> None:
    """TorchRL's loader extracts every file the manifest lists under each component: refuse a list that names a file
    the archive does not hold or names one twice (a 1 MB file listing its 1 MB tensor a thousand times would write a
    gigabyte), so that loading writes at most what the archive holds."""
    records = list(components.values()) if isinstance(components, dict) else [None]
    listed: set[str] = set()
    for record in records:
        root = record.get("path") if isinstance(record, dict) else None
        files = record.get("files") if isinstance(record, dict) else None
        if not (
            isinstance(root, str) and isinstance(files, list) and all(isinstance(name, str) for name in files)
        ):
            raise InputError(
                f"{path} has a damaged list of component files in its manifest: it is damaged or forged."
            )
        for name in files:
            # the member as TorchRL's loader forms it from the component's folder and the listed name
            member = (PurePosixPath(root.replace("\\", "/")) / name.replace("\\", "/")).as_posix()
            if member in listed or member not in sizes:
                problem = "twice" if member in listed else "which it does not hold"
                raise InputError(
                    f"{path} lists {member!r} {problem} in its manifest: the file is damaged or forged. "
                    "Refusing to extract it."
                )
            listed.add(member)


# what a state description may hold (TorchRL's state-dict schema), and what a NumPy value may be decoded as
_STATE_KINDS = {
    "tensor", "numpy", "dict", "ordered_dict", "torch_size", "tuple", "list", "set", "frozenset", "slice", "range",
    "torch_device", "torch_dtype", "path", "bytes", "bytearray", "complex", "numpy_scalar", "ellipsis", "value",
}  # fmt: skip
_NUMPY_KINDS = "biufc"


def _check_state(path: Path, name: str, state: Any, tensors: TensorShapes) -> None:
    """Refuse a state description that decodes to more than the archive holds: unknown kinds, NumPy values of
    other than plain numeric dtypes (a ``(10**8,)f8`` sub-array dtype would allocate gigabytes from one number),
    and tensors referenced more often than they are stored."""
    held = sum(math.prod(shape) * dtype.itemsize for shape, dtype in tensors.values())
    referenced = 0
    pending = [state]
    while pending:  # iterative: a deep description cannot exhaust the stack
        node = pending.pop()
        if isinstance(node, list):
            pending.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        kind = node.get("kind")
        if kind is not None and (not isinstance(kind, str) or kind not in _STATE_KINDS):
            raise InputError(f"{path} describes an unknown kind of value {kind!r} in {name!r}.")
        if kind in ("numpy", "numpy_scalar"):
            itemsize = _plain_dtype(path, name, node.get("dtype")).itemsize
        if kind in ("tensor", "numpy"):
            key = node.get("key")
            if not isinstance(key, str) or key not in tensors:
                raise InputError(f"{path} refers to a tensor {key!r} it does not hold in {name!r}.")
            shape, dtype = tensors[key]
            scale = max(1.0, itemsize / dtype.itemsize) if kind == "numpy" else 1.0
            referenced += int(math.prod(shape) * dtype.itemsize * scale)
        if kind != "value":  # a plain value's payload is data, never a description
            pending.extend(node.values())
    if referenced > 2 * held + 2**20:
        raise InputError(
            f"{path} refers to its tensors in {name!r} for {referenced} bytes but holds {held}: the file is damaged "
            "or forged. Refusing to load it."
        )


def _plain_dtype(path: Path, name: str, text: Any):
    import numpy as np

    try:
        dtype = np.dtype(text)
    except (TypeError, ValueError, SyntaxError):
        dtype = None
    if dtype is None or dtype.shape != () or dtype.kind not in _NUMPY_KINDS or dtype.itemsize > 16:
        raise InputError(
            f"{path} declares a NumPy dtype {text!r} in {name!r} that is not a plain number type."
        )
    return dtype


def read_json(path: Path, archive: zipfile.ZipFile, name: str) -> Any:
    """Parse the JSON entry ``name``; :class:`InputError` if it is not JSON or nests too deeply to parse."""
    try:
        return json.loads(archive.read(name))
    except RecursionError:
        raise InputError(f"{path} holds JSON nested too deeply in {name!r}; refusing to load it.") from None
    except ValueError as error:  # not JSON, not UTF-8, or an integer too long to convert
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
        dtype_name, shape = leaf.get("dtype"), leaf.get("shape")
        dtype = _DTYPES.get(dtype_name) if isinstance(dtype_name, str) else None
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


def component_of(path: Path, tensors: dict[str, TensorShapes], name: str) -> str:
    """The archive folder of the component called ``name`` (e.g. "policy") in the checked archive ``path``."""
    for folder in tensors:
        if folder.rsplit("-", 1)[-1] == name:
            return folder
    raise InputError(f"{path} holds no {name!r} tensors: the file is damaged or forged.")


def nbytes(shapes: TensorShapes) -> int:
    return sum(math.prod(shape) * dtype.itemsize for shape, dtype in shapes.values())


def first_line(error: BaseException) -> str:
    """An error's message on one line (TorchRL's and PyTorch's can span pages)."""
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else "no detail"


def holds_only_its_entries(path: Path) -> bool:
    """Whether every byte of the zip archive at ``path`` belongs to an entry or to the zip's own records (headers,
    central directory, end record, comments): no bytes before, between or after the entries. An archive that a
    holder of its folder padded out (a sparse file of gigabytes around a small valid archive) is not, and copying it
    would write all of it."""
    try:
        with zipfile.ZipFile(path) as archive:
            entries = archive.infolist()
            records = sum(
                # local header and central directory record, each with the name and extra field, plus a data
                # descriptor (at most 24 bytes) and the entry's comment
                30 + 46 + 2 * (len(info.orig_filename.encode()) + len(info.extra)) + 24 + len(info.comment)
                for info in entries
            )
            # the end record, its zip64 record and locator (56 + 20 bytes), and the archive's comment
            records += 22 + 76 + len(archive.comment)
            return path.stat().st_size <= records + sum(info.compress_size for info in entries)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError):
        return False


def read_manifest_metadata(path: Path, kind: str) -> dict[str, Any]:
    """The ``metadata`` of a checked archive's manifest (see :func:`check_archive`); :class:`InputError` for a
    manifest that is not a JSON object."""
    with zipfile.ZipFile(path) as archive:
        manifest = (
            read_json(path, archive, "manifest.json") if "manifest.json" in archive.namelist() else None
        )
    metadata = manifest.get("metadata") if isinstance(manifest, dict) else None
    if not isinstance(metadata, dict):
        raise InputError(
            f"{path} is not {'an' if kind[0] in 'aeiou' else 'a'} {kind} checkpoint saved by this toolkit."
        )
    return metadata
