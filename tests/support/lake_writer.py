"""A writer process for the lake's concurrency tests: commits `versions` versions of one batch of raw_images,
`rows` rows each (every row carries its version) in three files, and prints each version once committed."""

import sys

import pyarrow as pa
import pyarrow.parquet as pq

from dgx_assets.lake.files import filesystem_for
from dgx_assets.lake.store import Lake


def version_table(batch: str, version: int, rows: int) -> pa.Table:
    return pa.table({"path": [f"{batch}/{i}.png" for i in range(rows)], "batch": [batch] * rows, "version": [version] * rows})


def main(lake_root: str, batch: str, versions: int, rows: int) -> None:
    tables = Lake(lake_root).tables
    for version in range(1, versions + 1):
        table = version_table(batch, version, rows)

        def write(folder: str, table: pa.Table = table) -> list[str]:
            fs, path = filesystem_for(folder)
            fs.create_dir(path, recursive=True)
            thirds = [table.slice(start, rows // 3 + 1) for start in range(0, rows, rows // 3 + 1)]
            for number, part in enumerate(thirds):
                with fs.open_output_stream(f"{path}/part-{number}.parquet") as out:
                    pq.write_table(part, out)
            return [f"{folder}/part-{number}.parquet" for number in range(len(thirds))]

        tables.write_and_commit("raw_images", table.schema, write, batch)
        print(version, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
