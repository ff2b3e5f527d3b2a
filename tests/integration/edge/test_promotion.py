"""Promotion to `champion` against a real MLflow sqlite store."""

from __future__ import annotations

import pytest

from dgx_assets.edge.promotion import Gate, current_alias_version, promote_if_gates_pass


def client_for(registered):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=registered.tracking_uri)


def test_promotion_moves_champion_and_records_the_decision(registered_version):
    client = client_for(registered_version)
    name = registered_version.model_name
    first = promote_if_gates_pass(
        registered_version.tracking_uri,
        name,
        registered_version.version,
        [Gate("trained_model", True), Gate("edge_parity", True)],
        run_id=registered_version.run_id,
        dagster_run_id="dagster-run-1",
    )
    assert first.promoted and first.previous_champion is None

    source = client.get_run(registered_version.run_id).info.artifact_uri + "/model"
    second_version = client.create_model_version(name, source, run_id=registered_version.run_id).version
    second = promote_if_gates_pass(
        registered_version.tracking_uri, name, second_version, [Gate("trained_model", True), Gate("edge_parity", True)]
    )
    assert second.promoted and second.previous_champion == registered_version.version
    assert current_alias_version(client, name) == str(second_version)
    tags = client.get_model_version(name, second_version).tags
    assert tags["dgx.promotion"] == "champion"
    assert tags["dgx.promotion.replaced_version"] == registered_version.version
    assert tags["dgx.gate.edge_parity"] == "passed"
    first_tags = client.get_model_version(name, registered_version.version).tags
    assert first_tags["dgx.promotion.dagster_run_id"] == "dagster-run-1"
    assert client.get_run(registered_version.run_id).data.tags["dgx.promotion"].startswith("champion")


def test_a_failed_trained_model_gate_or_no_gate_at_all_blocks_promotion(registered_version):
    client = client_for(registered_version)
    for gates in (
        [Gate("trained_model", False, "accuracy 0.61 does not beat baseline 0.60 + 0.05"), Gate("edge_parity", True)],
        [],
    ):
        outcome = promote_if_gates_pass(
            registered_version.tracking_uri, registered_version.model_name, registered_version.version, gates
        )
        assert not outcome.promoted and outcome.reasons
    assert current_alias_version(client, registered_version.model_name) is None
    assert str(client.get_model_version_by_alias(registered_version.model_name, "candidate").version) == "1"


def test_an_unknown_version_is_a_clear_error(registered_version):
    with pytest.raises(ValueError, match="has no version 42"):
        promote_if_gates_pass(registered_version.tracking_uri, registered_version.model_name, 42, [Gate("edge_parity", True)])
