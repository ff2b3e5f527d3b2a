"""Write PyTorch-format checkpoints from NumPy arrays, byte for byte as torch.save does, without torch.

The pickles name ``torch._utils._rebuild_tensor_v2`` and ``torch.FloatStorage``; pickle only writes a
global it can import, so stand-in modules of those names exist while a file is written (and only then).
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
    def __init__(self, key: str, array: np.ndarray) -> None:
        self.key, self.array = key, np.ascontiguousarray(array).reshape(-1)


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
    def __init__(self, storage: _Storage, shape: tuple) -> None:
        self.storage, self.shape = storage, shape


def _state_pickle(tensors: dict[str, np.ndarray], extra: dict | None = None) -> tuple[bytes, list[_Storage]]:
    storages = []
    with _torch_names() as (torch, utils):

        class Pickler(pickle.Pickler):
            def persistent_id(self, obj):
                if isinstance(obj, _Storage):
                    kind = getattr(torch, STORAGE_NAMES[obj.array.dtype])
                    return ("storage", kind, obj.key, "cpu", obj.array.size)
                return None

            def reducer_override(self, obj):
                if isinstance(obj, _Tensor):
                    stride, step = [], 1
                    for dim in reversed(obj.shape):
                        stride.insert(0, step)
                        step *= dim
                    return utils._rebuild_tensor_v2, (
                        obj.storage,
                        0,
                        tuple(obj.shape),
                        tuple(stride),
                        False,
                        collections.OrderedDict(),
                    )
                return NotImplemented

        state = collections.OrderedDict()
        for name, array in tensors.items():
            storage = _Storage(str(len(storages)), array)
            storages.append(storage)
            state[name] = _Tensor(storage, tuple(array.shape))
        state.update(extra or {})
        buffer = io.BytesIO()
        Pickler(buffer, protocol=2).dump(state)
    return buffer.getvalue(), storages


def legacy_checkpoint(tensors: dict[str, np.ndarray], extra: dict | None = None) -> bytes:
    """torch.save(..., _use_new_zipfile_serialization=False)'s layout."""
    body, storages = _state_pickle(tensors, extra)
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
    body, storages = _state_pickle(tensors, extra)
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
