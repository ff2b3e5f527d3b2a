"""`dgx-assets seed-demo` (and `make demo` on an empty landing zone): the ELPV solar-cell images (the `demo`
extra) copied into the landing zone as a camera line would deliver them."""

from __future__ import annotations

import hashlib
import posixpath
from pathlib import Path

from dgx_assets.lake.files import filesystem_for

DEFECT_THRESHOLD = 0.5  # ELPV gives expert defect probabilities 0, 1/3, 2/3, 1


def elpv_records(limit: int | None = None) -> list[dict]:
    """The ELPV images as files on disk with their label and cell type, in the package's order."""
    try:
        import elpv_dataset
    except ImportError as error:
        raise RuntimeError("seed-demo needs the ELPV images: pip install -e '.[demo]' (elpv-dataset)") from error
    data_dir = Path(elpv_dataset.__file__).parent / "data"
    records = []
    with open(data_dir / "labels.csv") as labels:
        for line in labels:
            parts = line.split()
            if len(parts) != 3:
                continue
            path, probability, cell_type = parts[0], float(parts[1]), parts[2]
            records.append(
                {
                    "file": data_dir / path,
                    "label": "defective" if probability >= DEFECT_THRESHOLD else "functional",
                    "cell_type": cell_type,
                    "probability": probability,
                }
            )
    return records[:limit] if limit else records


PRODUCTION_BATCH = "production-01"  # the demo's production batch: images without a label folder


def seed_landing(
    landing_uri: str, batches: int = 3, limit: int | None = None, package_order: bool = False, production_share: float = 0.0
) -> dict[str, int]:
    """Copy ELPV images (their original PNG bytes) into `<landing>/<batch>/<label>/<type>_<name>`.

    The batches are a stable random deal, as a production line delivers a steady mix of cells. ELPV's own file
    order groups cells by type and defect rate, so `package_order` batches differ for real: the report flags
    their drift and label shift. A `production_share` of the images (the end of the deal) lands as the line sends
    them, without their labels: directly in PRODUCTION_BATCH, to be scored by the champion, never trained on."""
    if not 0 <= production_share < 1:
        raise ValueError(f"production_share must be in [0, 1), got {production_share}")
    fs, root = filesystem_for(landing_uri)
    records = elpv_records(limit)
    if not package_order:
        records.sort(key=lambda record: hashlib.sha256(record["file"].name.encode()).hexdigest())
    labelled = len(records) - round(production_share * len(records))
    counts: dict[str, int] = {}
    for index, record in enumerate(records):
        if index < labelled:
            batch = f"elpv-{index * batches // labelled + 1:02d}"
            folder = posixpath.join(root, batch, record["label"])
        else:
            batch, folder = PRODUCTION_BATCH, posixpath.join(root, PRODUCTION_BATCH)
        fs.create_dir(folder, recursive=True)
        target = posixpath.join(folder, f"{record['cell_type']}_{record['file'].name}")
        # Write aside and rename, as a well-behaved uploader does, so a sensor never sees half a file.
        with fs.open_output_stream(target + "._COPYING_") as out:
            out.write(record["file"].read_bytes())
        fs.move(target + "._COPYING_", target)
        counts[batch] = counts.get(batch, 0) + 1
    return counts
