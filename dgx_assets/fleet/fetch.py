"""`edge-fetch`: a registered version's edge model out of MLflow into a folder, checked against its digest.

edge_model records the sha256 of the model.tflite it logs (``record_edge_model_digest``) on trained_model's
run and on its registered version. The fetch downloads into a hidden folder beside ``--out``, verifies the
digest there, and only then moves the files in, so a corrupt or replaced artifact leaves ``--out`` untouched.
A version built before digests were recorded gets its digest recorded by its first fetch (and is trusted
that once), so every later fetch of it is verified.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from dgx_assets.station.runtime import (
    CONTRACT_FILE,
    MLFLOW_ARTIFACT_DIR,
    MODEL_FILE,
    SOURCE_FILE,
    EdgeRuntimeError,
    read_contract,
)

DIGEST_TAG = "dgx.edge_model.sha256"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


def record_edge_model_digest(
    tracking_uri: str, run_id: str, model_file: Path, model_name: str | None, version: str | None
) -> str:
    """Tag the run, and the registered version built from it, with the sha256 edge-fetch will verify."""
    from mlflow import MlflowClient

    client, digest = MlflowClient(tracking_uri=tracking_uri), file_sha256(model_file)
    client.set_tag(run_id, DIGEST_TAG, digest)
    if model_name and version:
        client.set_model_version_tag(model_name, str(version), DIGEST_TAG, digest)
    return digest


def _prepare_out(out: Path) -> Path:
    """The folder --out names, checked before anything is downloaded; its parent is created if missing."""
    if out.exists() and not out.is_dir():
        raise EdgeRuntimeError(f"--out {out} is a file, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise _out_error(out, "cannot create its folder", error) from None
    return out


def _out_error(out: Path, what: str, error: OSError) -> EdgeRuntimeError:
    return EdgeRuntimeError(f"--out {out}: {what} ({type(error).__name__}: {error.strerror or error})")


def fetch_edge_model(
    tracking_uri: str, model_name: str, out_dir: str | os.PathLike, version: str | None = None, alias: str | None = None
) -> dict[str, str]:
    """Download the edge model of a registered version (by number, or the version an alias points at) from
    its MLflow run into ``out_dir``, verified against its recorded sha256, with ``source.json`` saying where
    it came from."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    if (version is None) == (alias is None):
        raise EdgeRuntimeError("give exactly one of --version or --alias")
    client = MlflowClient(tracking_uri)
    try:
        if version is not None:
            found = client.get_model_version(model_name, version)
        else:
            assert alias is not None  # exactly one of the two, checked above
            found = client.get_model_version_by_alias(model_name, alias)
    except MlflowException as error:
        raise EdgeRuntimeError(
            f"no version {version or alias!r} of registered model {model_name!r} at {tracking_uri}: {error.message}"
        ) from error
    out = _prepare_out(Path(out_dir))
    try:
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.fetch-") as staging:
            source = _download_and_verify(client, found, Path(staging), tracking_uri)
            out.mkdir(exist_ok=True)
            for name in (MODEL_FILE, CONTRACT_FILE, SOURCE_FILE):  # source.json last: it says the folder is whole
                os.replace(Path(staging) / name, out / name)
    except OSError as error:
        raise _out_error(out, "cannot write the model there", error) from None
    return source


def _download_and_verify(client, found, staging: Path, tracking_uri: str) -> dict[str, str]:
    from mlflow.artifacts import download_artifacts
    from mlflow.exceptions import MlflowException

    label = f"{found.name} v{found.version} (run {found.run_id})"
    try:
        download_artifacts(
            run_id=found.run_id, artifact_path=MLFLOW_ARTIFACT_DIR, dst_path=str(staging), tracking_uri=tracking_uri
        )
    except (MlflowException, OSError) as error:
        raise EdgeRuntimeError(f"{label} has no edge model: materialize edge_model for it ({error})") from error
    downloaded = staging / MLFLOW_ARTIFACT_DIR
    for name in (MODEL_FILE, CONTRACT_FILE):
        if not (downloaded / name).is_file():
            raise EdgeRuntimeError(f"{label} has no {MLFLOW_ARTIFACT_DIR}/{name}")
    digest, recorded = file_sha256(downloaded / MODEL_FILE), found.tags.get(DIGEST_TAG)
    if recorded and digest != recorded:
        raise EdgeRuntimeError(
            f"{label}: {MODEL_FILE} has sha256 {digest}, but {recorded} was recorded when it was built: the artifact is "
            "corrupt or was replaced, so nothing was written; rebuild edge_model for this version"
        )
    check = "verified"
    if not recorded:  # built before digests were recorded: this first fetch records what every later one checks
        try:
            client.set_model_version_tag(found.name, str(found.version), DIGEST_TAG, digest)
            check = "recorded by this fetch"
        except MlflowException as error:
            check = f"unverified: none recorded, and recording it failed ({error.error_code})"
    read_contract(downloaded / CONTRACT_FILE)
    source = {
        "model_name": found.name,
        "version": str(found.version),
        "run_id": found.run_id,
        "tracking_uri": tracking_uri,
        "sha256": digest,
        "sha256_check": check,
    }
    for name in (MODEL_FILE, CONTRACT_FILE):
        os.replace(downloaded / name, staging / name)
    (staging / SOURCE_FILE).write_text(json.dumps(source, indent=2))
    return source
