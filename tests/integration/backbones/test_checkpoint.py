"""The restricted .pth reader: real tensors out of both torch formats, refusal of anything that runs code."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from support import torch_files

from dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict
from dgx_assets.backbones.efficientnet_lite import LITE0, LITE2, VARIANTS, checkpoint_blocks, packaged_weights

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


@pytest.mark.parametrize(
    "variant, tensors, parameters",
    [(LITE0, 296, 4.69e6), (LITE2, 386, 6.15e6)],  # parameters: batch-norm statistics included
    ids=[LITE0.name, LITE2.name],
)
def test_reads_the_packaged_efficientnet_lite_checkpoints(variant, tensors, parameters):
    weights = packaged_weights(variant)
    state = read_state_dict(weights.path)
    assert len(state) == tensors
    assert state["_conv_stem.weight"].shape == (32, 3, 3, 3)  # the stem, fixed at 32 in every variant
    assert state["_fc.weight"].shape == (1000, 1280)  # the head, fixed at 1,280
    assert sum(v.size for k, v in state.items() if not k.endswith("num_batches_tracked")) == pytest.approx(parameters, rel=1e-3)
    assert (weights.package, weights.package_version) == (variant.package, "0.1.0") and len(weights.sha256) == 64


@pytest.mark.parametrize("variant", VARIANTS.values(), ids=list(VARIANTS))
def test_the_variants_stage_table_is_its_checkpoints(variant):
    """Each block's kernel, expansion and filters as the tensors' shapes have them, against the stages the
    scaling rules give (strides leave no trace in weights); Lite2: 21 blocks in stages of 1, 3, 3, 4, 4, 5, 1."""
    state = read_state_dict(packaged_weights(variant).path)
    found = []
    for index in range(checkpoint_blocks(state)):
        depthwise = state[f"_blocks.{index}._depthwise_conv.weight"]  # (expanded, 1, k, k)
        expand = state.get(f"_blocks.{index}._expand_conv.weight")  # (expanded, in, 1, 1); absent at ratio 1
        filters_in = depthwise.shape[0] if expand is None else expand.shape[1]
        filters_out = state[f"_blocks.{index}._project_conv.weight"].shape[0]
        found.append((depthwise.shape[2], depthwise.shape[0] // filters_in, filters_in, filters_out))
    expected = [
        (stage.kernel, stage.expand, stage.filters_in if repeat == 0 else stage.filters_out, stage.filters_out)
        for stage in variant.stages
        for repeat in range(stage.repeats)
    ]
    assert found == expected and len(found) == variant.blocks
    assert state["_conv_head.weight"].shape[1] == variant.stages[-1].filters_out


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
    view = torch_files.View(np.zeros(4, np.float32), (2,), stride=(-(2**40),))
    path.write_bytes(torch_files.zip_checkpoint({"w": view}))  # pyright: ignore[reportArgumentType]  # a crafted record
    script = (
        "import sys\nfrom dgx_assets.backbones.checkpoint import CheckpointError, read_state_dict\n"
        "try:\n    read_state_dict(sys.argv[1])\nexcept CheckpointError as error:\n    print(error)\n"
    )
    child = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"exit {child.returncode}: {child.stderr[-2000:]}"
    assert "tensor 'w': strides[0] must be an integer in 0..2**48" in child.stdout
