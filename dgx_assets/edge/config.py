"""edge_model's settings: the conversion's (declared once, in convert.py), the parity gate's (parity.py), plus what
the build around it decides.

The Dagster launchpad shows them all; the plain-Python build takes this object."""

from typing import Optional

import dagster as dg
from pydantic import Field

from dgx_assets.edge.convert import ConversionSettings
from dgx_assets.edge.parity import GateSettings


class EdgeModelConfig(dg.Config, ConversionSettings, GateSettings):
    raw_height: Optional[int] = Field(None, description="Raw input height the device feeds; default: most common image size")
    raw_width: Optional[int] = Field(None, description="Raw input width the device feeds; default: most common image size")
    representative_split: str = Field("train", description="raw_images split the calibration images come from")
    max_test_images: int = Field(1000, description="Test images for parity (0: all)")
    latency_images: int = Field(
        40, description="Test images timed one by one on both models; the latency ratio compares their medians"
    )
    num_threads: Optional[int] = Field(None, description="TFLite CPU threads (None: the runtime's default)")
    triton_model_name: str = Field("defect_classifier", description="Folder name in the Triton model repository")
    triton_max_batch_size: int = Field(8, description="max_batch_size in config.pbtxt (0: no batching)")
