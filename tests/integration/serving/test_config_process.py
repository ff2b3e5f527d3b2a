"""Serving configuration as a started serving process sees it: bad files stop it, a bad model shows on /status."""

from __future__ import annotations

import pytest
import requests

from dgx_assets.generation import launcher


def test_a_bad_config_stops_the_server_with_a_message(tmp_path, quick_model):
    path = tmp_path / "config.yml"
    path.write_text("op:\n  bad name!: {}\n")
    with pytest.raises(launcher.LaunchError, match=r"op: String should match pattern .* \(got .bad name!.\)"):
        launcher.start_local_servers(1, quick_model, config_file=str(path), log_dir=tmp_path, timeout_s=60)


def test_a_model_that_cannot_load_is_reported_on_status(tmp_path):
    bad_model = tmp_path / "model"
    bad_model.mkdir()
    for name in launcher.MODEL_FILES:
        (bad_model / name).write_text("{}")  # present but not a model
    server = launcher.start_server(bad_model, log_dir=tmp_path)
    try:
        with pytest.raises(launcher.LaunchError, match="could not load its model"):
            launcher.wait_ready([server], timeout_s=60)
        status = requests.get(server.url + "/status", timeout=5)
        assert status.status_code == 503 and status.json()["status"] == "failed"
        reply = requests.post(server.url + "/ernie_image/prediction", json={"key": ["prompt"], "value": ["cell"]}, timeout=5)
        assert reply.status_code == 503 and reply.json()["err_no"] == 9002
    finally:
        server.stop()
    assert server.process.poll() is not None
