"""Write PyTorch-format checkpoints from NumPy arrays, byte for byte as torch.save does, without torch.

The pickles name ``torch._utils._rebuild_tensor_v2`` and ``torch.FloatStorage``; pickle only writes a
global it can import, so stand-in modules of those names exist while a file is written (and only then).
``View`` records declare any offset, shape, strides and storage size, and the opcode helpers at the end
assemble pickles and archives no pickler would write: the hostile files of the reader's tests.
"""

from __future__ import annotations

import collections
import contextlib
import io
import pickle
import struct
import sys
import types
import zipfile

import numpy as np

LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
STORAGE_NAMES = {np.dtype("float32"): "FloatStorage", np.dtype("int64"): "LongStorage"}


class _Storage:
    def __init__(self, key: str, array: np.ndarray, declared: int | None = None) -> None:
        self.key, self.array = key, np.ascontiguousarray(array).reshape(-1)
        self.declared = self.array.size if declared is None else declared


class View:
    """A tensor record as a crafted file declares it: its storage's data and any offset, shape and strides
    (contiguous by default), and optionally a storage element count other than the data's."""

    def __init__(self, storage: np.ndarray, shape: tuple, offset=0, stride: tuple | None = None, declared=None) -> None:
        self.storage, self.shape, self.offset, self.stride, self.declared = storage, shape, offset, stride, declared


@contextlib.contextmanager
def _torch_names():
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args):  # never called: only its name is pickled
        raise AssertionError

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    for name in STORAGE_NAMES.values():
        setattr(torch, name, type(name, (), {"__module__": "torch"}))
    torch._utils = utils
    saved = {name: sys.modules.get(name) for name in ("torch", "torch._utils")}
    sys.modules.update({"torch": torch, "torch._utils": utils})
    try:
        yield torch, utils
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


class _Tensor:
    def __init__(self, storage: _Storage, shape: tuple, offset=0, stride: tuple | None = None) -> None:
        self.storage, self.shape, self.offset, self.stride = storage, shape, offset, stride


def state_pickle(tensors: dict[str, np.ndarray], extra: dict | None = None) -> tuple[bytes, list[_Storage]]:
    storages = []
    with _torch_names() as (torch, utils):

        class Pickler(pickle.Pickler):
            def persistent_id(self, obj):
                if isinstance(obj, _Storage):
                    kind = getattr(torch, STORAGE_NAMES[obj.array.dtype])
                    return ("storage", kind, obj.key, "cpu", obj.declared)
                return None

            def reducer_override(self, obj):
                if isinstance(obj, _Tensor):
                    stride, step = [], 1
                    for dim in reversed(obj.shape):
                        stride.insert(0, step)
                        step *= dim
                    return utils._rebuild_tensor_v2, (
                        obj.storage,
                        obj.offset,
                        tuple(obj.shape),
                        tuple(stride if obj.stride is None else obj.stride),
                        False,
                        collections.OrderedDict(),
                    )
                return NotImplemented

        state = collections.OrderedDict()
        for name, array in tensors.items():
            if isinstance(array, View):
                storage = _Storage(str(len(storages)), array.storage, array.declared)
                tensor = _Tensor(storage, tuple(array.shape), array.offset, array.stride)
            else:
                storage = _Storage(str(len(storages)), array)
                tensor = _Tensor(storage, tuple(array.shape))
            storages.append(storage)
            state[name] = tensor
        state.update(extra or {})
        buffer = io.BytesIO()
        Pickler(buffer, protocol=2).dump(state)
    return buffer.getvalue(), storages


def legacy_checkpoint(tensors: dict[str, np.ndarray], extra: dict | None = None) -> bytes:
    """torch.save(..., _use_new_zipfile_serialization=False)'s layout."""
    body, storages = state_pickle(tensors, extra)
    out = io.BytesIO()
    for header in (LEGACY_MAGIC, 1001, {"protocol_version": 1001, "little_endian": True}):
        pickle.dump(header, out, protocol=2)
    out.write(body)
    pickle.dump([s.key for s in storages], out, protocol=2)
    for storage in storages:
        out.write(struct.pack("<q", storage.array.size))
        out.write(storage.array.tobytes())
    return out.getvalue()


def zip_checkpoint(tensors: dict[str, np.ndarray], extra: dict | None = None) -> bytes:
    """torch.save's default (zip) layout."""
    body, storages = state_pickle(tensors, extra)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("archive/data.pkl", body)
        for storage in storages:
            archive.writestr(f"archive/data/{storage.key}", storage.array.tobytes())
    return out.getvalue()


class RunsCommand:
    """Unpickling this calls os.system(command): what a tampered checkpoint does to plain pickle.load."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        import os

        return os.system, (self.command,)


# --- pickles and archives assembled opcode by opcode -------------------------------------------------


def op_str(text: str) -> bytes:
    data = text.encode()
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def op_int(value: int) -> bytes:
    return pickle.BININT + struct.pack("<i", value)


def op_global(module: str, name: str) -> bytes:
    return pickle.GLOBAL + f"{module}\n{name}\n".encode()


def op_storage(key: str = "0", elements: int = 1, kind: str = "FloatStorage") -> bytes:
    """A storage's persistent id, as torch writes it: ("storage", torch.<kind>, key, "cpu", elements)."""
    fields = op_str("storage") + op_global("torch", kind) + op_str(key) + op_str("cpu") + op_int(elements)
    return pickle.MARK + fields + pickle.TUPLE


def pickled(*ops: bytes) -> bytes:
    return pickle.PROTO + b"\x02" + b"".join(ops) + pickle.STOP


def shared_tuple_tower(levels: int) -> bytes:
    """Pushes a tuple nested `levels` deep whose every level holds the level below twice (through the memo):
    2**levels leaves in 7 bytes a level. Hashing or printing it walks every leaf."""
    ops = [op_int(0), pickle.BINPUT + b"\x00", pickle.POP]
    for level in range(levels):
        below = bytes([level])
        ops += [pickle.BINGET + below, pickle.BINGET + below, pickle.TUPLE2, pickle.BINPUT + bytes([level + 1]), pickle.POP]
    return b"".join(ops) + pickle.BINGET + bytes([levels])


def archive(data_pkl: bytes, entries: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    """A torch-style zip: archive/data.pkl and archive/data/<key> for each entry."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as zip_file:
        zip_file.writestr("archive/data.pkl", data_pkl)
        for key, data in entries.items():
            zip_file.writestr(f"archive/data/{key}", data, compress_type=compression)
    return out.getvalue()


def patch_entry(data: bytes, name: str, compress_type: int | None = None, flag_bits: int = 0) -> bytes:
    """The archive with one entry's compression method replaced and flag bits set, in its local and central headers."""
    raw = bytearray(data)
    with zipfile.ZipFile(io.BytesIO(data)) as zip_file:
        local, central = zip_file.getinfo(name).header_offset, zip_file.start_dir
    while raw[central + 46 : central + 46 + len(name)] != name.encode():
        central = raw.index(b"PK\x01\x02", central + 4)
    for flags_at in (local + 6, central + 8):  # flags, then the compression method, in both headers
        flags, method = struct.unpack_from("<HH", raw, flags_at)
        struct.pack_into("<HH", raw, flags_at, flags | flag_bits, method if compress_type is None else compress_type)
    return bytes(raw)
