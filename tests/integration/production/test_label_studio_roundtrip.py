"""The review queue through a real Label Studio and back: the queue written from raw_images' bytes and served by
the docs server, a Label Studio on 127.0.0.1 given its config and tasks through label-studio-sdk, the tasks
annotated through the API, its JSON, JSON_MIN and CSV exports read by import-labels' reader and matched to the
lake's images by its importer, and one of them taken back by `dgx-assets import-labels` as a new labelled landing
batch that the landing sensor's listing sees complete.

Label Studio is not a dependency of the project (it pins its own Django and friends): it runs from its own venv,
DGX_LABEL_STUDIO (`make test` installs it into .dgx/label-studio/ and sets it), and so does the sdk, in
label_studio_client.py beside this file. A missing install fails the test: a skip would hide the round trip.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from pathlib import Path

import pytest
import requests
from dagster_dev import free_port
from support.docs_server import docs_server
from support.review_queue import CLASSES, build_queue_lake
from support.waiting import wait_for

from dgx_assets import cli
from dgx_assets.ingest.landing import scan_landing
from dgx_assets.labels.exports import read_export
from dgx_assets.labels.importer import index_lake, plan
from dgx_assets.lake.store import Lake
from dgx_assets.production import review

LABEL_STUDIO = Path(os.environ.get("DGX_LABEL_STUDIO", Path(__file__).parents[3] / ".dgx/label-studio/bin/label-studio"))
CLIENT = Path(__file__).with_name("label_studio_client.py")
INSTALL = "make label-studio"
START_S = 300  # a fresh data folder runs Label Studio's migrations first: ~70 s on 2 busy cores
THRESHOLD = 0.4


@pytest.fixture
def label_studio(tmp_path):
    """(URL, API token) of a Label Studio on 127.0.0.1 with a fresh data folder and one admin user; stopped by
    its process id."""
    if not LABEL_STUDIO.is_file():
        pytest.fail(f"no Label Studio at {LABEL_STUDIO} (DGX_LABEL_STUDIO): install it with `{INSTALL}`")
    port, token = free_port(), secrets.token_hex(20)
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),  # nothing of it lands in the real home
        "LABEL_STUDIO_USERNAME": "reviewer@example.com",
        "LABEL_STUDIO_PASSWORD": secrets.token_urlsafe(16),
        "LABEL_STUDIO_USER_TOKEN": token,
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",  # the token above, sent as `Authorization: Token ...`
        "LABEL_STUDIO_LATEST_VERSION_CHECK": "false",
        "LABEL_STUDIO_COLLECT_ANALYTICS": "false",
        "SENTRY_DSN": "",  # its default reports errors to Label Studio's own Sentry project
        "FRONTEND_SENTRY_DSN": "",
    }
    url, log_path = f"http://127.0.0.1:{port}", tmp_path / "label-studio.log"
    command = [str(LABEL_STUDIO), "start", "--no-browser", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--data-dir", str(tmp_path / "label-studio"), "--enable-legacy-api-token"]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def healthy() -> bool:
        assert process.poll() is None, log_path.read_text()[-3000:]
        try:
            return requests.get(f"{url}/health", timeout=2).status_code == 200
        except requests.ConnectionError:
            return False

    try:
        wait_for(healthy, timeout_s=START_S, interval_s=1, what=f"Label Studio on {url}")
        yield url, token
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def annotate_and_export(url: str, token: str, queue: Path, labels: dict, skipped: str, tmp_path: Path) -> dict:
    """label_studio_client.py's report: a project of the queue, each task annotated (`skipped` skipped), exported."""
    out = tmp_path / "exports"
    out.mkdir()
    steps = {"url": url, "token": token, "queue": str(queue), "labels": labels, "cancel": [skipped], "out": str(out)}
    (tmp_path / "plan.json").write_text(json.dumps(steps))
    done = subprocess.run(
        [str(LABEL_STUDIO.with_name("python")), str(CLIENT), str(tmp_path / "plan.json")],
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_label_studio_takes_the_queue_and_its_exports_come_back_as_a_labelled_batch(label_studio, tmp_path, capsys):
    ls_url, token = label_studio
    queue_lake = build_queue_lake(tmp_path / "lake", "lot#1 é", [0.9, 0.42, 0.3, 0.05, 0.55, 0.39])
    lake = Lake(str(queue_lake.root))
    queued = review.least_certain(queue_lake.scores, THRESHOLD, 4)
    labels = {row["sha256"]: CLASSES[n % 2] for n, row in enumerate(queued)}
    skipped = queued[-1]["sha256"]
    with docs_server(free_port(), {"DGX_LAKE_ROOT": str(queue_lake.root)}, tmp_path / "docs-server.log") as (docs, _):
        options = {"docs_url": docs, "model_version": "dgx-defect 7", "threshold": THRESHOLD, "saliency": queue_lake.saliency}
        folder = Path(lake.fs_path(review.write_queue(lake, queue_lake.batch, queued, CLASSES, **options)))
        report = annotate_and_export(ls_url, token, folder, labels, skipped, tmp_path)
        assert report["sdk_problems"] == [] and report["imported"] == len(queued)
        tasks = json.loads((folder / review.TASKS_FILE).read_text())
        assert [task["data"] for task in report["stored"]] == [task["data"] for task in tasks]  # kept as given
        scores = [task["predictions"][0] for task in report["stored"]]
        assert scores == sorted(scores) and scores[0] == pytest.approx(0.01)  # least sure first
        for task in report["stored"]:  # what Label Studio's page loads, from the docs server
            image = requests.get(task["data"]["image"], timeout=5)
            assert image.status_code == 200 and image.content == queue_lake.images[task["data"]["sha256"]]
            assert image.headers["Content-Type"] in ("image/png", "image/jpeg")
            assert requests.get(task["data"]["saliency"], timeout=5).headers["Content-Type"] == "image/png"

    expected = {sha256: label for sha256, label in labels.items() if sha256 != skipped}
    index = index_lake(lake)
    for kind, path in report["exports"].items():
        export = read_export(Path(path))
        assert export.problems == [], kind
        assert {(record.sha256, record.label) for record in export.records} == set(expected.items()), kind
        planned, problems = plan(export.records, index)  # what `dgx-assets import-labels` would import
        assert problems == [] and {item.image.sha256: item.label for item in planned} == expected, kind

    # The command a reviewer runs (the report prints it): the export becomes `<NAME>-labels-<time>/<label>/<file>`,
    # the lake's own bytes of each image, complete when it appears.
    landing = tmp_path / "landing"
    landing.mkdir()
    command = ["import-labels", report["exports"]["JSON"], "--batch", "line-review"]
    assert cli.main(command + ["--lake", str(queue_lake.root), "--landing", str(landing)]) == 0, capsys.readouterr().err
    (batch,) = os.listdir(landing)
    landed = {path.relative_to(landing / batch): path.read_bytes() for path in (landing / batch).rglob("*") if path.is_file()}
    assert {(path.parent.name, hashlib.sha256(data).hexdigest()) for path, data in landed.items()} == {
        (label, sha256) for sha256, label in expected.items()
    }
    state = scan_landing(str(landing))[batch]
    assert batch.startswith("line-review-labels-") and state.complete and state.files == len(expected)
