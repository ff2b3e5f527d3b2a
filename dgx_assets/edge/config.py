"""edge_model's settings, declared once: the Dagster launchpad shows them, and the plain-Python build takes them."""

from typing import Optional

import dagster as dg
from pydantic import Field


class EdgeModelConfig(dg.Config):
    quantization: str = Field("int8", description="int8 (full-integer, calibrated), float16 or dynamic (range)")
    raw_height: Optional[int] = Field(None, description="Raw input height the device feeds; default: most common image size")
    raw_width: Optional[int] = Field(None, description="Raw input width the device feeds; default: most common image size")
    resize_method: str = Field("bilinear_antialias", description="bilinear_antialias (as image_features), bilinear or nearest")
    input_scale: float = Field(1.0, description="Factor on raw pixels before the network; 1.0: trained_model rescales itself")
    representative_samples: int = Field(200, description="Calibration images for int8, from the representative split")
    representative_split: str = Field("train", description="raw_images split the calibration images come from")
    max_test_images: int = Field(1000, description="Test images for parity (0: all)")
    latency_images: int = Field(100, description="Images timed one by one, on both models")
    num_threads: Optional[int] = Field(None, description="TFLite CPU threads (None: the runtime's default)")
    triton_model_name: str = Field("defect_classifier", description="Folder name in the Triton model repository")
    triton_max_batch_size: int = Field(8, description="max_batch_size in config.pbtxt (0: no batching)")
