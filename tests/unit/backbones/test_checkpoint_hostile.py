"""Hostile checkpoints, crafted here: views that leave their storage, sizes that lie, pickles that burn CPU,
archives torch never writes. Each is refused with a CheckpointError naming the tensor or entry and the rule."""

from __future__ import annotations

import pickle
import time
import tracemalloc
import zipfile

import numpy as np
import pytest
from support import torch_files
from support.torch_files import View, archive, op_global, op_int, op_storage, op_str, pickled, shared_tuple_tower

from dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict

FLOATS = np.arange(4, dtype=np.float32)
WRITERS = [torch_files.legacy_checkpoint, torch_files.zip_checkpoint]


def read(tmp_path, data: bytes, **kwargs):
    path = tmp_path / "hostile.pth"
    path.write_bytes(data)
    return read_state_dict(path, **kwargs)


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize(
    "view, rule",
    [
        (View(FLOATS, (3,), stride=(-1,)), r"strides\[0\] must be an integer in 0"),  # read memory before the buffer
        (View(FLOATS[:1], (2**24,), stride=(0,)), r"stride 0 on dimension 0 of size 16777216"),  # 64 MB from 4 bytes
        (View(FLOATS, (), offset=-1), r"offset must be an integer in 0"),  # was: the last element, silently
        (View(FLOATS, (2,), offset=3), r"offset 3 .* reaches past its storage \(4 elements\)"),
        (View(FLOATS, (5,)), r"shape \(5,\) has 5 elements, more than its storage's 4"),
        (View(FLOATS, (-1,), stride=(1,)), r"shape\[0\] must be an integer in 0"),
        (View(FLOATS, (2**70,), stride=(1,)), r"shape\[0\] must be an integer in 0\.\.2\*\*48, got 1180591620717411303424"),
        (View(FLOATS, (2, 2), stride=(2, 1, 1)), r"shape \(2, 2\) and strides \(2, 1, 1\) differ in length"),
        (View(FLOATS, (2,), stride=(True,)), r"strides\[0\] must be an integer"),
    ],
)
def test_a_view_outside_its_storage_is_refused_before_any_byte_is_read(tmp_path, writer, view, rule):
    data = writer({"good": FLOATS, "bad.weight": view})
    with pytest.raises(CheckpointError, match=rf"tensor 'bad\.weight': {rule}"):
        read(tmp_path, data)


def test_a_storage_that_declares_more_than_the_limit_is_refused_before_it_is_read(tmp_path):
    with pytest.raises(CheckpointError, match=r"storage '0': the storages declare more than the 8-byte limit"):
        read(tmp_path, torch_files.zip_checkpoint({"w": FLOATS}), max_bytes=8)
    with pytest.raises(CheckpointError, match=r"storage '0': the storages declare more than"):
        read(tmp_path, torch_files.legacy_checkpoint({"w": View(FLOATS, (4,), declared=2**40)}))


def test_a_zip_entry_larger_than_its_storage_is_refused_without_inflating_it(tmp_path):
    body, _ = torch_files.state_pickle({"w": FLOATS})
    bomb = archive(body, {"0": bytes(64 * 1024**2)}, compression=zipfile.ZIP_DEFLATED)  # 64 MiB in ~64 KB
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"entry 'archive/data/0' declares 67108864 bytes, its storage record needs 16"):
            read(tmp_path, bomb)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 1024**2, f"{peak} bytes allocated: the entry was inflated"


def _corrupt_data_byte(data: bytes) -> bytes:
    at = data.index(FLOATS.tobytes())
    return data[:at] + b"\xff" + data[at + 1 :]


@pytest.mark.parametrize(
    "damage, words",
    [
        (_corrupt_data_byte, r"entry 'archive/data/0' is corrupt \(Bad CRC-32"),
        (lambda data: torch_files.patch_entry(data, "archive/data/0", compress_type=99), r"compression method 99"),
        (lambda data: torch_files.patch_entry(data, "archive/data/0", flag_bits=0x1), r"entry 'archive/data/0' is encrypted"),
        (lambda data: torch_files.patch_entry(data, "archive/data.pkl", compress_type=14), r"data.pkl' uses compression"),
    ],
)
def test_archive_damage_is_a_checkpoint_error_naming_the_entry(tmp_path, damage, words):
    with pytest.raises(CheckpointError, match=words):
        read(tmp_path, damage(torch_files.zip_checkpoint({"w": FLOATS})))


def _zip_of(*ops: bytes) -> bytes:
    return archive(pickled(*ops), {"0": FLOATS.tobytes()})


@pytest.mark.parametrize(
    "ops, words",
    [
        # A tower of 2**26 leaves as a dict key: hashing it took minutes.
        ((pickle.EMPTY_DICT, shared_tuple_tower(26), pickle.NONE, pickle.SETITEM), r"a dict key that is a tuple"),
        ((pickle.EMPTY_DICT, pickle.MARK, shared_tuple_tower(26), pickle.NONE, pickle.SETITEMS), r"a dict key that is a tuple"),
        # ... as a persistent id: printing it in the error message took as long.
        ((pickle.EMPTY_DICT, op_str("w"), shared_tuple_tower(26), pickle.BINPERSID, pickle.SETITEM), r"persistent record"),
        # ... smuggled through OrderedDict's constructor, whose keys the C unpickler never sees.
        (
            (
                op_global("collections", "OrderedDict"),
                pickle.EMPTY_LIST,
                pickle.MARK,
                shared_tuple_tower(26),
                pickle.NONE,
                pickle.TUPLE2,
                pickle.APPENDS,
                pickle.TUPLE1,
                pickle.REDUCE,
            ),
            r"an OrderedDict built from arguments",
        ),
    ],
)
def test_nested_tuples_where_torch_writes_strings_are_refused_at_once(tmp_path, ops, words):
    started = time.monotonic()
    with pytest.raises(CheckpointError, match=words):
        read(tmp_path, _zip_of(*ops))
    assert time.monotonic() - started < 2


def test_build_on_a_storage_is_refused(tmp_path):
    tensor_with_built_storage = (
        op_global("torch._utils", "_rebuild_tensor_v2"),
        pickle.MARK,
        op_storage("0", 4),
        pickle.BINPERSID,
        pickle.EMPTY_DICT,
        op_str("dtype"),
        op_int(5),
        pickle.SETITEM,
        pickle.BUILD,  # would set the storage's dtype to 5
        op_int(0),
        op_int(4),
        pickle.TUPLE1,
        op_int(1),
        pickle.TUPLE1,
        pickle.NEWFALSE,
        pickle.TUPLE,
        pickle.REDUCE,
    )
    with pytest.raises(CheckpointError, match=r"BUILD on a _StorageRef"):
        read(tmp_path, _zip_of(pickle.EMPTY_DICT, op_str("w"), *tensor_with_built_storage, pickle.SETITEM))


@pytest.mark.parametrize(
    "ops, words",
    [
        ((pickle.EMPTY_SET,), r"opcode b'\\x8f', which torch never writes"),
        ((pickle.MARK, op_global("torch", "FloatStorage"), pickle.INST + b"x\ny\n"), r"opcode b'i'"),
        ((op_global("torch", "FloatStorage"), pickle.EMPTY_TUPLE, pickle.REDUCE), r"a call of a _StorageType"),
    ],
)
def test_opcodes_and_calls_torch_never_writes_are_refused(tmp_path, ops, words):
    with pytest.raises(CheckpointError, match=words):
        read(tmp_path, _zip_of(*ops))
