"""Where the default configuration lands on all of ELPV (binary: defective when the expert probability
>= 0.5), with raw_images' hash split. Slow (~5 min on 2 CPU cores): runs only with DGX_RUN_SLOW=1.

    DGX_RUN_SLOW=1 .venv/bin/python -m pytest tests/training/test_elpv_default_config.py -s -q
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.environ.get("DGX_RUN_SLOW") != "1", reason="full-ELPV training: set DGX_RUN_SLOW=1"),
]


def test_default_config_on_elpv(tmp_path):
    import pandas as pd
    import pyarrow as pa
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from elpv_dataset.utils import load_dataset
    from PIL import Image

    from dgx_assets.ingest.images import split_for
    from dgx_assets.training.config import FeatureConfig, TrainConfig
    from dgx_assets.training.dataset import FeatureFiles
    from dgx_assets.training.features import compute_features
    from dgx_assets.training.train import train_classifier

    images, probabilities, _ = load_dataset()
    rows = []
    for index, (image, probability) in enumerate(zip(images, probabilities)):
        buffer = io.BytesIO()
        Image.fromarray(image).save(buffer, format="PNG")
        data = buffer.getvalue()
        sha = hashlib.sha256(data).hexdigest()
        rows.append(
            {
                "path": f"elpv/{index}.png",
                "batch": f"elpv-{index % 4}",
                "sha256": sha,
                "width": 300,
                "height": 300,
                "label": "defective" if probability >= 0.5 else "functional",
                "split": split_for(sha),
                "content": data,
            }
        )
    raw = pd.DataFrame(rows)

    started = time.monotonic()
    paths = []
    for batch, part in raw.groupby("batch"):
        path = tmp_path / f"batch={batch}" / "part-0.parquet"
        path.parent.mkdir()
        pq.write_table(pa.Table.from_pandas(compute_features(part, FeatureConfig()), preserve_index=False), path)
        paths.append(str(path))
    feature_seconds = time.monotonic() - started

    result = train_classifier(FeatureFiles(pafs.LocalFileSystem(), tuple(paths)), TrainConfig(), str(tmp_path / "ckpt"))
    metrics = result.test.metrics
    print(
        json.dumps(
            {
                "feature_seconds": round(feature_seconds, 1),
                "training_seconds": round(result.seconds, 1),
                "epochs": len(result.epochs),
                "best_epoch": result.best_epoch,
                "split_counts": result.split_counts,
                "test": metrics,
            },
            indent=1,
        )
    )
    assert metrics["accuracy"] >= metrics["majority_baseline_accuracy"] + 0.08
    assert metrics["roc_auc"] >= 0.8
