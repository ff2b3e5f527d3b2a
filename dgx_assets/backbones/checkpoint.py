"""Read PyTorch ``.pth`` checkpoints into NumPy arrays without torch, and without running their code.

A ``.pth`` file is a pickle, and unpickling calls whatever global the pickle names: a checkpoint that
names ``os.system`` runs a command on plain ``pickle.load`` / ``torch.load``. The reader here accepts
only what a tensor state dict needs (an ordered dict, the tensor rebuild functions, the typed storage
classes) and refuses every other global with :class:`CheckpointError`, before anything runs.

Both of torch's formats are read:

* legacy (torch < 1.6, ``_use_new_zipfile_serialization=False``): a magic number, a protocol version and
  system info, then the state-dict pickle whose storages are persistent ids, then the list of storage
  keys, then each storage's raw bytes after an 8-byte element count;
* zip (torch >= 1.6): ``<archive>/data.pkl`` plus one ``<archive>/data/<key>`` entry per storage.
"""

from __future__ import annotations

import collections
import io
import os
import pickle
import struct
import zipfile
from typing import Any, BinaryIO

import numpy as np

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL = 1001

# torch storage class name -> element dtype (little-endian, as torch writes on every platform we serve)
_STORAGE_DTYPES = {
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "HalfStorage": np.dtype("<f2"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}


class CheckpointError(ValueError):
    """The checkpoint is unsafe, truncated or not a tensor state dict; the message says which."""


class _StorageType:
    """Stands in for torch.<Type>Storage: all a storage record needs is its element type."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]


class _StorageRef:
    """A storage named by the pickle; its bytes are filled in once the file has been read past it."""

    def __init__(self, key: str, dtype: np.dtype, elements: int) -> None:
        self.key, self.dtype, self.elements = key, dtype, elements
        self.array: np.ndarray | None = None


class _TensorRef:
    def __init__(self, storage: _StorageRef, offset: int, shape: tuple, stride: tuple) -> None:
        self.storage, self.offset, self.shape, self.stride = storage, offset, tuple(shape), tuple(stride)

    def materialize(self, name: str) -> np.ndarray:
        data = self.storage.array
        if data is None:
            raise CheckpointError(f"tensor {name!r}: storage {self.storage.key!r} has no data in the file")
        if not self.shape:
            return np.array(data[self.offset], copy=True)
        itemsize = data.dtype.itemsize
        last = self.offset + sum((n - 1) * s for n, s in zip(self.shape, self.stride)) if all(self.shape) else 0
        if self.offset < 0 or last >= len(data):
            raise CheckpointError(f"tensor {name!r} reaches past its storage ({len(data)} elements): corrupt file")
        view = np.lib.stride_tricks.as_strided(
            data[self.offset :], shape=self.shape, strides=[s * itemsize for s in self.stride], writeable=False
        )
        return np.array(view, copy=True)


def _rebuild_tensor(storage, storage_offset, size, stride, *_ignored) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise CheckpointError("a tensor record names something that is not a storage")
    return _TensorRef(storage, int(storage_offset), tuple(size), tuple(stride))


class _RestrictedUnpickler(pickle.Unpickler):
    """Unpickler that resolves only the globals a tensor state dict uses."""

    def __init__(self, file: BinaryIO, storages: dict[str, _StorageRef]) -> None:
        super().__init__(file)
        self._storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise CheckpointError(
            f"refusing checkpoint: it names the global {module}.{name}, which a tensor state dict never needs "
            "(unpickling it could run code); only tensors, storages and ordered dicts are read"
        )

    def persistent_load(self, pid: Any) -> _StorageRef:
        if not (isinstance(pid, tuple) and len(pid) >= 5 and pid[0] == "storage"):
            raise CheckpointError(f"refusing checkpoint: unknown persistent record {str(pid)[:80]!r}")
        storage_type, key, _location, elements = pid[1], str(pid[2]), pid[3], pid[4]
        if not isinstance(storage_type, _StorageType):
            raise CheckpointError("refusing checkpoint: a storage record without a known storage type")
        if key not in self._storages:
            self._storages[key] = _StorageRef(key, storage_type.dtype, int(elements))
        return self._storages[key]


def read_state_dict(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The tensors of a PyTorch state dict file as NumPy arrays, keyed as in the file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {os.fspath(path)!r}: {error}") from error
    try:
        if zipfile.is_zipfile(io.BytesIO(raw)):
            state, storages = _read_zip(raw)
        else:
            state, storages = _read_legacy(raw)
    except CheckpointError as error:
        raise CheckpointError(f"{os.fspath(path)}: {error}") from None
    except (pickle.UnpicklingError, EOFError, struct.error, ValueError, KeyError, IndexError, TypeError) as error:
        raise CheckpointError(
            f"{os.fspath(path)} is not a complete PyTorch checkpoint (truncated or corrupt: {type(error).__name__}: {error})"
        ) from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{os.fspath(path)} holds a {type(state).__name__}, not a state dict of tensors")
    if "state_dict" in state and isinstance(state["state_dict"], dict):  # training checkpoints wrap it
        state = state["state_dict"]
    tensors = {}
    for name, value in state.items():
        if isinstance(value, _TensorRef):
            tensors[str(name)] = value.materialize(str(name))
    if not tensors:
        raise CheckpointError(f"{os.fspath(path)} holds no tensors")
    return tensors


def _read_legacy(raw: bytes) -> tuple[Any, dict[str, _StorageRef]]:
    stream = io.BytesIO(raw)
    header = _RestrictedUnpickler(stream, {})
    try:
        magic = header.load()
    except (CheckpointError, pickle.UnpicklingError, EOFError, ValueError, KeyError, IndexError, TypeError):
        magic = None
    if magic != _LEGACY_MAGIC:
        raise CheckpointError("not a PyTorch checkpoint (neither a zip archive nor the legacy magic number)")
    if header.load() != _LEGACY_PROTOCOL:
        raise CheckpointError("unsupported PyTorch checkpoint protocol version")
    header.load()  # system info: endianness and type sizes
    storages: dict[str, _StorageRef] = {}
    state = _RestrictedUnpickler(stream, storages).load()
    keys = _RestrictedUnpickler(stream, storages).load()
    if not isinstance(keys, list):
        raise CheckpointError("the storage key list is missing")
    for key in keys:
        ref = storages.get(str(key))
        if ref is None:
            raise CheckpointError(f"storage {key!r} is listed but no tensor uses it")
        (count,) = struct.unpack("<q", _exactly(stream, 8))
        if count != ref.elements:
            raise CheckpointError(f"storage {key!r} has {count} elements, its record says {ref.elements}")
        ref.array = np.frombuffer(_exactly(stream, count * ref.dtype.itemsize), dtype=ref.dtype)
    return state, storages


def _read_zip(raw: bytes) -> tuple[Any, dict[str, _StorageRef]]:
    with zipfile.ZipFile(io.BytesIO(raw)) as archive:
        names = archive.namelist()
        pickles = [name for name in names if name.endswith("/data.pkl") or name == "data.pkl"]
        if len(pickles) != 1:
            raise CheckpointError("zip checkpoint without exactly one data.pkl")
        prefix = pickles[0][: -len("data.pkl")]
        storages: dict[str, _StorageRef] = {}
        state = _RestrictedUnpickler(io.BytesIO(archive.read(pickles[0])), storages).load()
        for key, ref in storages.items():
            data = archive.read(f"{prefix}data/{key}")
            if len(data) != ref.elements * ref.dtype.itemsize:
                raise CheckpointError(f"storage {key!r} has {len(data)} bytes, its record says {ref.elements} elements")
            ref.array = np.frombuffer(data, dtype=ref.dtype)
    return state, storages


def _exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise CheckpointError(f"file ends {size - len(data)} bytes early (truncated download or copy)")
    return data
