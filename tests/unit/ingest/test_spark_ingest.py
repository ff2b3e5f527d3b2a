"""The raw_images job without Spark: the driver's listing, and what each Python worker runs."""

import datetime as dt
import os

import pyarrow as pa
import pytest
from imagefactory import bad_files, valid_images
from support.hostile import GOOD, SECRET, hostile_batch

from dgx_assets.ingest import images, spark_ingest
from dgx_assets.ingest.spark_ingest import ListedFile

MODIFIED = dt.datetime(2026, 1, 2, 3, 4, 5, 678000, tzinfo=dt.UTC)


def write(batch, files: dict[str, bytes]):
    for name, data in files.items():
        (batch / name).parent.mkdir(parents=True, exist_ok=True)
        (batch / name).write_bytes(data)
        nanoseconds = (MODIFIED - dt.datetime(1970, 1, 1, tzinfo=dt.UTC)) // dt.timedelta(microseconds=1) * 1000
        os.utime(batch / name, ns=(nanoseconds, nanoseconds))


def ingest(batch, files, settings=None):
    """{<label>/<file>: row} from the worker's Arrow batches, checked against the table's schema."""
    settings = settings or images.IngestSettings()
    out = pa.Table.from_batches(spark_ingest.ingest_files(files, batch.as_uri(), settings), spark_ingest.RAW_IMAGES_SCHEMA)
    return {"/".join(row["path"].split("/")[-2:]): row for row in out.to_pylist()}


def test_the_listing_keeps_every_image_file_zero_bytes_included_and_skips_the_rest(tmp_path):
    batch = tmp_path / "b1"
    write(
        batch,
        {
            "ok/a.png": b"x",
            "ok/b.JPG": b"xy",
            "ok/empty.jpg": b"",
            "loose.tif": b"z",
            "ok/notes.txt": b"t",
            "ok/.hidden.png": b"h",
            "_tmp/c.png": b"c",
            "ok/d.png._COPYING_": b"d",
        },
    )
    listed = spark_ingest.list_batch(batch.as_uri())
    names = ("loose.tif", "ok/a.png", "ok/b.JPG", "ok/empty.jpg")
    assert [file.path for file in listed] == [f"file:{batch}/{name}" for name in names]
    assert [file.size for file in listed] == [1, 1, 2, 0]
    assert {file.modified_us for file in listed} == {int(MODIFIED.timestamp()) * 1_000_000 + 678_000}  # milliseconds, as Hadoop
    assert spark_ingest.list_batch((tmp_path / "missing").as_uri()) == []


def test_a_bad_file_among_good_ones_gets_its_reason_and_the_good_ones_their_bytes(tmp_path, monkeypatch):
    batch = tmp_path / "b1"
    good = {f"ok/{name}": data for name, data in valid_images().items()}
    write(batch, good | {"ok/truncated.png": bad_files()["truncated.png"][0], "ok/empty.jpg": b""})
    listed = spark_ingest.list_batch(batch.as_uri())
    rows = ingest(batch, listed)
    assert set(rows) == set(good) | {"ok/truncated.png", "ok/empty.jpg"}
    for name, data in good.items():
        row = rows[name]
        assert (row["status"], row["content"], row["label"]) == ("valid", data, "ok")
        assert row["sha256"] == images.sha256_hex(data) and row["size_bytes"] == len(data)
        assert row["modified_at"] == MODIFIED and row["split"] in images.SPLITS
    assert rows["ok/truncated.png"]["status"] == "corrupted" and rows["ok/truncated.png"]["content"] is None
    assert rows["ok/empty.jpg"]["status"] == "empty"
    monkeypatch.setattr(spark_ingest, "ROWS_PER_ARROW_BATCH", 3)  # several Arrow batches: the same rows
    again = ingest(batch, listed)

    def timeless(table):
        return {name: row | {"ingested_at": None} for name, row in table.items()}

    assert timeless(again) == timeless(rows)


class NoReads:
    """A filesystem that fails the test if anything is opened."""

    def open_input_file(self, path):
        raise AssertionError(f"{path} was read")


def test_a_file_over_the_byte_limit_is_recorded_from_the_listing_and_never_read(tmp_path):
    settings = images.IngestSettings(max_file_bytes=1000)
    listed = ListedFile(f"file:{tmp_path}/b1/ok/huge.png", 1001, 0)
    row = spark_ingest.file_row(NoReads(), listed, (tmp_path / "b1").as_uri(), settings)
    assert row["status"] == "too_large" and "1001 bytes is over the 1000-byte limit" in row["reason"]
    assert row["label"] == "ok" and row["size_bytes"] == 1001 and "content" not in row and "sha256" not in row


def test_a_file_gone_since_the_listing_gets_a_row_and_the_rest_go_on(tmp_path):
    batch = tmp_path / "b1"
    write(batch, {"ok/grey.png": valid_images()["grey.png"]})
    listed = [*spark_ingest.list_batch(batch.as_uri()), ListedFile(f"file:{batch}/ok/vanished.png", 100, 0)]
    rows = ingest(batch, listed)
    assert rows["ok/vanished.png"]["status"] == images.UNREADABLE
    assert "FileNotFoundError" in rows["ok/vanished.png"]["reason"]
    assert rows["ok/grey.png"]["status"] == "valid"


def test_a_file_directly_in_the_batch_is_a_production_image_kept_with_its_bytes(tmp_path):
    batch = tmp_path / "b1"
    data = valid_images()["grey.png"]
    write(batch, {"grey.png": data, "ok/grey.png": data})
    rows = ingest(batch, spark_ingest.list_batch(batch.as_uri()))
    production, labelled = rows["b1/grey.png"], rows["ok/grey.png"]
    assert (production["status"], production["label"], production["split"]) == ("valid", None, images.UNLABELLED)
    assert production["content"] == data and production["sha256"] == labelled["sha256"]
    # The same bytes in a label folder get the hash's split: a production image never takes one.
    assert labelled["split"] in images.SPLITS and labelled["label"] == "ok"


def test_a_batch_without_image_files_builds_nothing(tmp_path):
    write(tmp_path / "b1", {"ok/notes.txt": b"t"})
    assert spark_ingest.build_raw_images(None, (tmp_path / "b1").as_uri(), images.IngestSettings()) is None


@pytest.mark.timeout(60)  # before the fix the FIFO's open blocked forever
def test_links_and_special_files_get_their_own_rows_and_nothing_outside_the_zone_is_read(tmp_path):
    landing = tmp_path / "landing"
    with hostile_batch(landing, tmp_path / "outside") as expected:
        batch = landing / "hostile"
        listed = spark_ingest.list_batch(batch.as_uri())
        rows = ingest(batch, listed)
    assert {name.split("/")[-1]: row["status"] for name, row in rows.items()} == expected  # one row each, no more
    assert rows["functional/good.png"]["content"] == GOOD
    assert images.sha256_hex(SECRET) not in {row["sha256"] for row in rows.values()}
    for name, status in expected.items():
        row = rows[f"functional/{name}"]
        assert row["content"] is None or status == "valid"
        assert row["label"] == "functional"
    assert "symbolic link to " + str(tmp_path / "outside" / "secret.png") in rows["functional/out.png"]["reason"]
    assert "FIFO" in rows["functional/fifo.png"]["reason"] and "socket" in rows["functional/sock.png"]["reason"]


@pytest.mark.timeout(60)
def test_a_file_that_became_a_fifo_or_a_link_after_the_listing_is_never_opened(tmp_path):
    batch = tmp_path / "b1"
    write(batch, {"ok/was_file.png": GOOD, "ok/was_also_file.png": GOOD})
    listed = spark_ingest.list_batch(batch.as_uri())
    (batch / "ok" / "was_file.png").unlink()
    os.mkfifo(batch / "ok" / "was_file.png")
    (batch / "ok" / "was_also_file.png").unlink()
    (tmp_path / "secret.png").write_bytes(SECRET)
    (batch / "ok" / "was_also_file.png").symlink_to(tmp_path / "secret.png")
    rows = ingest(batch, listed)
    assert rows["ok/was_file.png"]["status"] == "special_file" and rows["ok/was_file.png"]["content"] is None
    assert rows["ok/was_also_file.png"]["status"] == "symlink" and rows["ok/was_also_file.png"]["sha256"] is None
    assert "regular file when it was listed" in rows["ok/was_also_file.png"]["reason"]
