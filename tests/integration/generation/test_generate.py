"""The executor side of ernie_generated_images: real Spark jobs against real serving processes."""

from __future__ import annotations

import base64
import csv
import io
from pathlib import Path

import pandas as pd
import pytest
from PIL import Image
from support.generation import build_generated_frame
from support.serving_engines import faulty_args

from dgx_assets.generation import rows as prompt_rows
from dgx_assets.generation.client import ErnieClient
from dgx_assets.generation.client_settings import ClientSettings
from dgx_assets.generation.generate import GenerationJob
from dgx_assets.generation.png import classify_image, safe_file_name
from dgx_assets.generation.prompts import read_prompts, write_demo_prompts

FAST = dict(backoff_s=0.05, backoff_max_s=0.2, breaker_cooldown_s=30.0, status_ttl_s=60.0)
TRICKY = [
    {
        "id": "quotes",
        "prompt": "He said \"defective\", C:\\cells\\a.png\nsecond line, 'mono'",
        "width": "96",
        "height": "64",
        "seed": "1",
    },
    {"id": "chinese", "prompt": "有缺陷的单晶硅电池片，“裂纹”与暗区", "width": "64", "height": "64", "seed": "2"},
    {"id": "long", "prompt": "defective poly cell " * 120, "width": "", "height": "", "seed": ""},
    {"id": "../../etc/passwd", "prompt": "functional poly cell", "width": "32", "height": "48", "seed": "4"},
    {"id": "blank", "prompt": "   ", "width": "64", "height": "64", "seed": "5"},
    {"id": "bad-width", "prompt": "cell", "width": "wide", "height": "64", "seed": "6"},
    {"id": "", "prompt": "mono cell without an id", "width": "32", "height": "32", "seed": "7"},
]


def write_prompts_csv(path: Path, rows: list[dict]) -> str:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=["id", "prompt", "width", "height", "seed", "label"])
        writer.writeheader()
        writer.writerows(rows)
    return str(path)


def make_job(tmp_path: Path, endpoints, protocol="openai", **options) -> GenerationJob:
    settings = ClientSettings(endpoints=tuple(endpoints), protocol=protocol, concurrency=3, **FAST)
    png = (tmp_path / "out" / "png").as_uri()
    return GenerationJob(settings, lake_root=tmp_path.as_uri(), png_uri=png, default_width=64, default_height=48, **options)


@pytest.mark.parametrize("protocol", ["openai", "pipeline"])
def test_spark_job_generates_every_prompt_through_both_protocols(spark, fleet, tmp_path, protocol):
    prompts = read_prompts(spark, write_prompts_csv(tmp_path / "prompts.csv", TRICKY))
    job = make_job(tmp_path, [fleet["a"].url, fleet["b"].url], protocol)
    rows = {row["id"]: row for row in (r.asDict() for r in build_generated_frame(prompts, job).collect())}

    assert len(rows) == len(TRICKY)  # every prompt has its row, none dropped
    by_status = {id_: row["status"] for id_, row in rows.items()}
    assert by_status["blank"] == "invalid_prompt" and "empty" in rows["blank"]["error"]
    assert by_status["bad-width"] == "invalid_prompt" and "'wide' is not an integer" in rows["bad-width"]["error"]
    generated = [row for row in rows.values() if row["status"] != "invalid_prompt"]
    assert all(row["status"] == "valid" for row in generated), [(r["id"], r["error"]) for r in generated]

    for row in generated:
        image = Image.open(io.BytesIO(row["content"]))
        image.load()
        assert image.size == (row["width"], row["height"])
        on_disk = Path(row["png_path"].removeprefix("file://"))
        assert on_disk.parent == tmp_path / "out" / "png" and on_disk.read_bytes() == row["content"]
    assert rows["long"]["width"] == 64 and rows["long"]["height"] == 48  # defaults for blank sizes

    # Quotes, backslashes, newlines and Chinese survive the CSV, Spark, JSON and the server.
    for prompt_id in ("quotes", "chinese"):
        source = next(p["prompt"] for p in TRICKY if p["id"] == prompt_id)
        assert rows[prompt_id]["prompt"] == source and rows[prompt_id]["used_prompt"] == source
        assert rows[prompt_id]["truncated"] is False
    # The over-long prompt is truncated by the server and flagged in its row.
    assert rows["long"]["truncated"] is True and len(rows["long"]["used_prompt"]) < len(rows["long"]["prompt"])

    # A hostile id gives a harmless file name; a missing id gets one made from the request.
    assert "/" not in rows["../../etc/passwd"]["file_name"] and not rows["../../etc/passwd"]["file_name"].startswith(".")
    assert rows["../../etc/passwd"]["file_name"].startswith("etc_passwd-")
    nameless = next(row for id_, row in rows.items() if id_.startswith("row-"))
    assert nameless["status"] == "valid"
    assert {row["endpoint"] for row in generated} == {fleet["a"].url, fleet["b"].url}
    assert all(row["attempts"] == 1 for row in generated)
    assert sorted(p.name for p in (tmp_path / "out" / "png").iterdir()) == sorted(r["file_name"] for r in generated)


def test_truncated_pngs_are_classified_corrupted_and_regenerated(start_fleet, tmp_path):
    faulty = start_fleet(truncates_twice=faulty_args("truncate", count=2), garbage_once=faulty_args("garbage", count=1))
    job = make_job(tmp_path, [faulty["truncates_twice"].url])
    for endpoint, first_status in ((faulty["truncates_twice"].url, "corrupted"), (faulty["garbage_once"].url, "decode_error")):
        client = ErnieClient(ClientSettings(endpoints=(endpoint,), concurrency=1, **FAST))
        rows = [
            prompt_rows.start_row(
                {
                    "id": f"p{i}",
                    "prompt": "defective cell",
                    "width": "32",
                    "height": "32",
                    "seed": str(i),
                    "request_key": f"k{i}",
                },
                job,
                None,
            )
            for i in range(3)
        ]
        seen = []
        original = client.generate_many

        def spy(requests, original=original, seen=seen):
            replies = original(requests)
            seen.append([classify_image(r.payload_b64, 32, 32)[0] for r in replies])
            return replies

        client.generate_many = spy
        prompt_rows.generate_rows(client, rows, max_attempts=3)
        assert first_status in seen[0]  # the fault really happened ...
        assert all(row["status"] == "valid" for row in rows)  # ... and every image was regenerated
        assert max(row["attempts"] for row in rows) == 2


def test_a_server_that_always_truncates_ends_in_corrupted_rows(fleet, tmp_path):
    job = make_job(tmp_path, [fleet["truncating"].url], max_attempts=2)
    client = ErnieClient(job.client)
    rows = [
        prompt_rows.start_row(
            {"id": "x", "prompt": "cell", "width": "32", "height": "32", "seed": "1", "request_key": "k"}, job, None
        )
    ]
    prompt_rows.generate_rows(client, rows, job.max_attempts)
    assert rows[0]["status"] == "corrupted" and rows[0]["attempts"] == 2 and rows[0]["content"] is None
    assert "damaged PNG" in rows[0]["error"]


def test_classify_image():
    buffer = io.BytesIO()
    Image.new("L", (40, 30), 128).save(buffer, format="PNG")
    png = buffer.getvalue()
    b64 = base64.b64encode
    assert classify_image(b64(png).decode(), 40, 30)[0] == "valid"
    assert classify_image(b64(png[: len(png) // 2]).decode(), 40, 30)[0] == "corrupted"
    assert classify_image(b64(png).decode(), 64, 64) == ("corrupted", None, "image is 40x30, asked for 64x64")
    assert classify_image(b64(b"hello, not an image").decode(), 40, 30)[0] == "decode_error"
    assert classify_image("%%% not base64", 40, 30)[0] == "decode_error"
    assert classify_image(None, 40, 30)[0] == "decode_error"
    jpeg = io.BytesIO()
    Image.new("RGB", (40, 30)).save(jpeg, format="JPEG")
    status, content, _ = classify_image(b64(jpeg.getvalue()).decode(), 40, 30)
    assert status == "valid" and content[:8] == b"\x89PNG\r\n\x1a\n"  # stored as PNG whatever came back


@pytest.mark.parametrize("prompt_id", ["../../etc/passwd", "/abs/path", "..", "", None, "a\x00b", "C:\\x\\y", "名字", "x" * 500])
def test_safe_file_names(prompt_id):
    name = safe_file_name(prompt_id, "key")
    assert "/" not in name and "\\" not in name and "\x00" not in name and not name.startswith(".")
    assert name.endswith(".png") and len(name) <= 80
    assert safe_file_name("a/b", "key") != safe_file_name("a_b", "key")


def test_unchanged_valid_rows_are_kept_and_failed_ones_regenerated(spark, fleet, dead_url, tmp_path):
    rows = [
        {"id": f"p{i}", "prompt": f"defective cell {i}", "width": "32", "height": "32", "seed": str(i), "label": "defective"}
        for i in range(4)
    ]
    prompts = spark.createDataFrame(pd.DataFrame(rows))

    def run(endpoints, previous, name):
        job = make_job(tmp_path / name, endpoints)
        frame = build_generated_frame(prompts, job, previous)
        frame.write.parquet(str(tmp_path / name / "table"))
        return spark.read.parquet(str(tmp_path / name / "table"))

    down = run([dead_url], None, "first")
    assert {r.status for r in down.collect()} == {"failed"}
    assert all("gave up" in r.error for r in down.collect())

    healed = run([fleet["a"].url], down, "second")
    assert {r.status for r in healed.collect()} == {"valid"}

    # One prompt changes; the other three are reused as they were, without calling the service.
    changed = prompts.withColumn("prompt", prompt_of_p0_changed(prompts))
    job = make_job(tmp_path / "third", [dead_url])  # nothing is up: reused rows must not need it
    again = {r.id: r for r in build_generated_frame(changed, job, healed).collect()}
    before = {r.id: r for r in healed.collect()}
    for prompt_id in ("p1", "p2", "p3"):
        assert again[prompt_id].status == "valid" and again[prompt_id].content == before[prompt_id].content
        assert again[prompt_id].generated_at == before[prompt_id].generated_at
        assert (tmp_path / "third" / "out" / "png" / again[prompt_id].file_name).exists()
    assert again["p0"].status == "failed"  # the changed prompt was sent (and the service is down)


def prompt_of_p0_changed(prompts):
    from pyspark.sql import functions as F

    return F.when(F.col("id") == "p0", F.lit("a different prompt")).otherwise(F.col("prompt"))


def test_demo_prompts_round_trip_through_spark(spark, tmp_path):
    uri = write_demo_prompts(str(tmp_path / "prompts" / "prompts.csv"))
    frame = read_prompts(spark, uri).toPandas()
    assert len(frame) >= 10 and frame["id"].is_unique
    assert any("有缺陷" in p for p in frame["prompt"]) and any('"cracked"' in p for p in frame["prompt"])
    assert set(frame["label"]) == {"defective", "functional"}
    assert {"mono", "poly"} <= {w for p in frame["prompt"] for w in ("mono", "poly") if w in p}


def test_prompts_table_without_a_prompt_column_is_a_clear_error(spark, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("id,text\n1,hello\n")
    with pytest.raises(ValueError, match="lacks column"):
        read_prompts(spark, str(path))
