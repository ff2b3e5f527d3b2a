"""Read PyTorch ``.pth`` checkpoints into NumPy arrays without torch, and without running their code.

A ``.pth`` file is a pickle, and unpickling calls whatever global the pickle names: a checkpoint that
names ``os.system`` runs a command on plain ``pickle.load`` / ``torch.load``. The reader here accepts
only what a tensor state dict needs (an ordered dict, the tensor rebuild functions, the typed storage
classes, and the opcodes torch writes) and refuses everything else with :class:`CheckpointError`.

A user may point the pipeline at a file of their own, so nothing the file declares is trusted: every view
(offset, shape, strides) is checked against its storage before a byte is touched, sizes are checked before
anything is read or decompressed, dict keys and persistent ids must be the small flat tuples and strings
torch writes, and every failure is a ``CheckpointError`` naming the tensor or entry and the rule it breaks.

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
# EfficientNet-Lite0's weights are 19 MB: 1 GiB of tensors leaves room for any backbone of this pipeline's
# kind, and caps what a file that lies about its sizes can make the reader allocate.
DEFAULT_MAX_BYTES = 1024**3
MAX_PICKLE_BYTES = 16 * 1024**2  # the state-dict pickle itself (47 KB for EfficientNet-Lite0)
_MAX_INT = 2**48  # any offset, dimension, stride or element count beyond this is not a real tensor
_MAX_DIMS = 32
_CHUNK = 1024**2

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
# The opcodes of pickle protocols 2-4 that torch.save writes for a state dict; any other is refused.
_OPCODES = {
    getattr(pickle, name)[0]
    for name in (
        "PROTO FRAME STOP MARK POP NONE NEWTRUE NEWFALSE BININT BININT1 BININT2 LONG1 BINFLOAT BINUNICODE "
        "SHORT_BINUNICODE BINUNICODE8 EMPTY_DICT EMPTY_LIST EMPTY_TUPLE TUPLE TUPLE1 TUPLE2 TUPLE3 APPEND APPENDS "
        "SETITEM SETITEMS GLOBAL STACK_GLOBAL REDUCE BUILD BINPERSID BINPUT LONG_BINPUT MEMOIZE BINGET LONG_BINGET"
    ).split()
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

    @property
    def nbytes(self) -> int:
        return self.elements * self.dtype.itemsize


def _bounded_int(value: Any, what: str) -> int:
    if type(value) is not int or not 0 <= value <= _MAX_INT:  # bool is not int here
        raise CheckpointError(f"{what} must be an integer in 0..2**48, got {_short(value)}")
    return value


def _int_tuple(value: Any, what: str) -> tuple[int, ...]:
    if type(value) not in (tuple, list) or len(value) > _MAX_DIMS:
        raise CheckpointError(f"{what} must be a tuple of at most {_MAX_DIMS} integers, got {_short(value)}")
    return tuple(_bounded_int(item, f"{what}[{i}]") for i, item in enumerate(value))


def _short(value: Any) -> str:
    """A bounded description of a value from the file (never str() of a nested structure: that can take hours)."""
    if type(value) in (int, float, bool, type(None)):
        text = repr(value)
    elif type(value) is str:
        text = repr(value[:40])
    else:
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:57] + "..."


class _TensorRef:
    """A tensor record as the pickle declares it; nothing in it is trusted until check() has passed."""

    def __init__(self, storage: _StorageRef, offset: Any, shape: Any, stride: Any) -> None:
        self.storage, self._declared = storage, (offset, shape, stride)
        self.offset, self.shape, self.stride = 0, (), ()

    def check(self, name: str) -> int:
        """The tensor's size in bytes, once its view is known to lie inside its storage."""
        offset, shape, stride = self._declared
        where = f"tensor {name!r}"
        self.offset = _bounded_int(offset, f"{where}: offset")
        self.shape, self.stride = _int_tuple(shape, f"{where}: shape"), _int_tuple(stride, f"{where}: strides")
        rule = self._broken_rule()
        if rule:
            raise CheckpointError(f"{where}: {rule}")
        return int(np.prod(self.shape, dtype=np.int64)) * self.storage.dtype.itemsize

    def _broken_rule(self) -> str | None:
        shape, stride, elements = self.shape, self.stride, self.storage.elements
        if len(shape) != len(stride):
            return f"shape {shape} and strides {stride} differ in length"
        for dim, (size, step) in enumerate(zip(shape, stride)):
            if step == 0 and size > 1:
                return f"stride 0 on dimension {dim} of size {size} (only a dimension of size 1 may have stride 0)"
        numel = int(np.prod(shape, dtype=object))
        if numel > elements:
            return f"shape {shape} has {numel} elements, more than its storage's {elements}"
        last = self.offset + sum((n - 1) * s for n, s in zip(shape, stride)) if numel else self.offset - 1
        if last >= elements or self.offset > elements:
            return f"offset {self.offset} with shape {shape} and strides {stride} reaches past its storage ({elements} elements)"
        return None

    def materialize(self) -> np.ndarray:
        data = self.storage.array
        if data is None:
            raise CheckpointError(f"storage {self.storage.key!r} has no data in the file")
        if not self.shape:
            return np.array(data[self.offset], copy=True)
        itemsize = data.dtype.itemsize
        view = np.lib.stride_tricks.as_strided(
            data[self.offset :], shape=self.shape, strides=[s * itemsize for s in self.stride], writeable=False
        )
        return np.array(view, copy=True)


def _rebuild_tensor(storage=None, storage_offset=None, size=None, stride=None, *_ignored) -> _TensorRef:
    if not isinstance(storage, _StorageRef):
        raise CheckpointError("a tensor record names something that is not a storage")
    return _TensorRef(storage, storage_offset, size, stride)


def _ordered_dict(*args: Any) -> collections.OrderedDict:
    if args:  # torch pickles an empty OrderedDict and fills it with SETITEMS, whose keys are checked
        raise CheckpointError("an OrderedDict built from arguments (its keys would be hashed unchecked)")
    return collections.OrderedDict()


def _check_key(key: Any) -> None:
    """Dict keys are strings or ints, or flat tuples of them: a nested tuple as a key costs exponential time to hash."""
    if type(key) in (str, int) or (type(key) is tuple and len(key) <= 8 and all(type(k) in (str, int) for k in key)):
        return
    raise CheckpointError(f"refusing checkpoint: a dict key that is {_short(key)}, not a string, int or flat tuple of them")


class _Opcodes(dict):
    def __missing__(self, code: int):
        raise CheckpointError(f"refusing checkpoint: pickle opcode {bytes([code])!r}, which torch never writes for a state dict")


# The pure-Python unpickler (the C one's opcode table cannot be narrowed): every opcode outside _OPCODES
# is refused, and dict keys, BUILD and REDUCE are checked before they run.
class _RestrictedUnpickler(pickle._Unpickler):
    """Unpickler that resolves only the globals and opcodes a tensor state dict uses."""

    dispatch = _Opcodes({code: load for code, load in pickle._Unpickler.dispatch.items() if code in _OPCODES})
    stack: list[Any]  # pickle._Unpickler's working stack, which typeshed leaves out

    def __init__(self, file: BinaryIO | io.RawIOBase, storages: dict[str, _StorageRef]) -> None:
        super().__init__(file)
        self._storages = storages

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return _ordered_dict
        if module == "torch._utils" and name in ("_rebuild_tensor", "_rebuild_tensor_v2"):
            return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise CheckpointError(
            f"refusing checkpoint: it names the global {module[:80]}.{name[:80]}, which a tensor state dict never "
            "needs (unpickling it could run code); only tensors, storages and ordered dicts are read"
        )

    def persistent_load(self, pid: Any) -> _StorageRef:
        # ("storage", type, key, location, elements[, view]): flat, checked before anything hashes or prints it.
        if type(pid) is not tuple or len(pid) not in (5, 6) or pid[0] != "storage":
            raise CheckpointError(f"refusing checkpoint: a persistent record that is {_short(pid)}, not a storage")
        storage_type, key, location, elements = pid[1:5]
        if not isinstance(storage_type, _StorageType):
            raise CheckpointError("refusing checkpoint: a storage record without a known storage type")
        if type(key) is not str or type(location) is not str or len(key) > 256 or len(location) > 256:
            raise CheckpointError("refusing checkpoint: a storage record whose key or location is not a short string")
        if len(pid) == 6 and pid[5] is not None:
            raise CheckpointError(f"storage {key!r}: storage views (torch < 0.4) are not supported")
        elements = _bounded_int(elements, f"storage {key!r}: element count")
        ref = self._storages.setdefault(key, _StorageRef(key, storage_type.dtype, elements))
        if (ref.dtype, ref.elements) != (storage_type.dtype, elements):
            raise CheckpointError(f"storage {key!r} is declared twice with different types or sizes")
        return ref

    def load_setitem(self) -> None:
        _check_key(self.stack[-2])
        super().load_setitem()  # pyright: ignore[reportAttributeAccessIssue]

    def load_setitems(self) -> None:
        for key in self.stack[::2]:  # after MARK, the stack holds only key, value, key, value...
            _check_key(key)
        super().load_setitems()  # pyright: ignore[reportAttributeAccessIssue]

    def load_reduce(self) -> None:
        func, args = self.stack[-2], self.stack[-1]
        if (func is not _rebuild_tensor and func is not _ordered_dict) or type(args) is not tuple:
            raise CheckpointError(f"refusing checkpoint: a call of {_short(func)}, which is not a tensor or dict constructor")
        super().load_reduce()  # pyright: ignore[reportAttributeAccessIssue]

    def load_build(self) -> None:
        # torch sets an OrderedDict's `_metadata` attribute this way; storages and tensors take no state.
        inst, state = self.stack[-2], self.stack[-1]
        if type(inst) is not collections.OrderedDict or type(state) is not dict:
            raise CheckpointError(f"refusing checkpoint: BUILD on {_short(inst)} (only an OrderedDict's attributes are set)")
        for key in state:
            if type(key) is not str or not key.isidentifier():
                raise CheckpointError("refusing checkpoint: BUILD with an attribute name that is not an identifier")
        super().load_build()  # pyright: ignore[reportAttributeAccessIssue]

    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.REDUCE[0]] = load_reduce
    dispatch[pickle.BUILD[0]] = load_build


def read_state_dict(path: str | os.PathLike, max_bytes: int = DEFAULT_MAX_BYTES) -> dict[str, np.ndarray]:
    """The tensors of a PyTorch state dict file as NumPy arrays, keyed as in the file.

    ``max_bytes`` caps the storages read and the tensors made from them, whatever the file declares."""
    where = os.fspath(path)
    try:
        with open(path, "rb") as handle:
            if zipfile.is_zipfile(handle):
                state = _read_zip(handle, max_bytes)
            else:
                handle.seek(0)
                state = _read_legacy(handle, max_bytes)
            tensors = _tensors(state, max_bytes)
    except CheckpointError as error:
        raise CheckpointError(f"{where}: {error}") from None
    except OSError as error:
        raise CheckpointError(f"cannot read checkpoint {where!r}: {error}") from error
    except (pickle.UnpicklingError, EOFError, struct.error, zipfile.BadZipFile) as error:
        raise CheckpointError(f"{where} is not a complete PyTorch checkpoint (truncated or corrupt: {_error(error)})") from None
    except (ValueError, KeyError, IndexError, TypeError, AttributeError, OverflowError, RecursionError, MemoryError) as error:
        raise CheckpointError(f"{where} is not a tensor state dict the reader accepts ({_error(error)})") from None
    return tensors


def _error(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}"
    return text if len(text) <= 200 else text[:197] + "..."


def _tensors(state: Any, max_bytes: int) -> dict[str, np.ndarray]:
    if not isinstance(state, dict):
        raise CheckpointError(f"it holds a {type(state).__name__}, not a state dict of tensors")
    if isinstance(state.get("state_dict"), dict):  # training checkpoints wrap it
        state = state["state_dict"]
    refs = {str(name): value for name, value in state.items() if isinstance(value, _TensorRef)}
    if not refs:
        raise CheckpointError("it holds no tensors")
    total = 0
    for name, ref in refs.items():  # every view is checked before any is copied
        total += ref.check(name)
        if total > max_bytes:
            raise CheckpointError(f"tensor {name!r}: the tensors come to more than the {max_bytes}-byte limit")
    tensors = {}
    for name, ref in refs.items():
        try:
            tensors[name] = ref.materialize()
        except CheckpointError as error:
            raise CheckpointError(f"tensor {name!r}: {error}") from None
    return tensors


def _storages_fit(storages: dict[str, _StorageRef], max_bytes: int) -> None:
    total = 0
    for key, ref in storages.items():
        total += ref.nbytes
        if total > max_bytes:
            raise CheckpointError(f"storage {key!r}: the storages declare more than the {max_bytes}-byte limit")


def _read_legacy(stream: BinaryIO, max_bytes: int) -> Any:
    size = os.fstat(stream.fileno()).st_size
    header = _RestrictedUnpickler(stream, {})
    try:
        magic = header.load()
    except (CheckpointError, pickle.UnpicklingError, EOFError, ValueError, KeyError, IndexError, TypeError):
        magic = None
    if type(magic) is not int or magic != _LEGACY_MAGIC:
        raise CheckpointError("not a PyTorch checkpoint (neither a zip archive nor the legacy magic number)")
    if header.load() != _LEGACY_PROTOCOL:
        raise CheckpointError("unsupported PyTorch checkpoint protocol version")
    header.load()  # system info: endianness and type sizes
    storages: dict[str, _StorageRef] = {}
    state = _RestrictedUnpickler(_Limited(stream, MAX_PICKLE_BYTES), storages).load()
    keys = _RestrictedUnpickler(_Limited(stream, MAX_PICKLE_BYTES), storages).load()
    if type(keys) is not list or not all(type(key) is str for key in keys):
        raise CheckpointError("the storage key list is missing or holds something other than strings")
    _storages_fit(storages, max_bytes)
    for key in keys:
        ref = storages.get(key)
        if ref is None:
            raise CheckpointError(f"storage {key!r} is listed but no tensor uses it")
        (count,) = struct.unpack("<q", _exactly(stream, 8))
        if count != ref.elements:
            raise CheckpointError(f"storage {key!r} has {count} elements, its record says {ref.elements}")
        if ref.nbytes > size - stream.tell():
            raise CheckpointError(f"storage {key!r}: file ends {ref.nbytes - (size - stream.tell())} bytes early (truncated)")
        ref.array = np.frombuffer(_exactly(stream, ref.nbytes), dtype=ref.dtype)
    return state


def _read_zip(handle: BinaryIO, max_bytes: int) -> Any:
    with zipfile.ZipFile(handle) as archive:
        pickles = [info for info in archive.infolist() if info.filename == "data.pkl" or info.filename.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise CheckpointError("zip checkpoint without exactly one data.pkl")
        prefix = pickles[0].filename[: -len("data.pkl")]
        body = _zip_entry(archive, pickles[0], None, MAX_PICKLE_BYTES)
        storages: dict[str, _StorageRef] = {}
        state = _RestrictedUnpickler(io.BytesIO(body), storages).load()
        _storages_fit(storages, max_bytes)
        for key, ref in storages.items():
            try:
                info = archive.getinfo(f"{prefix}data/{key}")
            except KeyError:
                raise CheckpointError(f"storage {key!r} has no entry {prefix}data/{key} in the archive") from None
            ref.array = np.frombuffer(_zip_entry(archive, info, ref.nbytes, ref.nbytes), dtype=ref.dtype)
    return state


def _zip_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, expected: int | None, cap: int) -> bytes:
    """An entry's bytes, read in bounded chunks: its declared size is checked first and its actual size as it inflates."""
    name = info.filename
    if info.flag_bits & 0x1:
        raise CheckpointError(f"entry {name!r} is encrypted")
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise CheckpointError(f"entry {name!r} uses compression method {info.compress_type} (torch writes stored entries)")
    if expected is not None and info.file_size != expected:
        raise CheckpointError(f"entry {name!r} declares {info.file_size} bytes, its storage record needs {expected}")
    if info.file_size > cap:
        raise CheckpointError(f"entry {name!r} declares {info.file_size} bytes, over the {cap}-byte limit")
    data = bytearray()
    try:
        with archive.open(info) as entry:
            while chunk := entry.read(min(_CHUNK, cap + 1 - len(data))):
                data += chunk
                if len(data) > cap:
                    raise CheckpointError(f"entry {name!r} inflates past {cap} bytes")
    except zipfile.BadZipFile as error:
        raise CheckpointError(f"entry {name!r} is corrupt ({error})") from None
    if len(data) != info.file_size:
        raise CheckpointError(f"entry {name!r} has {len(data)} bytes, its header says {info.file_size}")
    return bytes(data)


class _Limited(io.RawIOBase):
    """At most `limit` bytes of a stream, for a pickle inside a larger file."""

    def __init__(self, stream: BinaryIO, limit: int) -> None:
        self._stream, self._left = stream, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._left <= 0:
            raise CheckpointError(f"a pickle longer than {MAX_PICKLE_BYTES} bytes")
        data = self._stream.read(min(len(buffer), self._left))
        self._left -= len(data)
        buffer[: len(data)] = data
        return len(data)


def _exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise CheckpointError(f"file ends {size - len(data)} bytes early (truncated download or copy)")
    return data
