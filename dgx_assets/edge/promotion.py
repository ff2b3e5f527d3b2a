"""Promote a registered model version to `champion`, only when every gate passed, and record why.

The decision is recorded either way: tags on the model version (and on its training run) say whether it
was promoted, when, by which Dagster run, and the outcome of each gate; a blocked version keeps its
`candidate` alias and the current champion stays where it is.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from dgx_assets.tracking.registry import CHAMPION_ALIAS, current_alias_version

PROMOTION_TAG = "dgx.promotion"


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class PromotionOutcome:
    promoted: bool
    model_name: str
    version: str
    alias: str
    previous_champion: str | None
    reasons: list[str] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def promote_if_gates_pass(
    tracking_uri: str,
    model_name: str,
    version: str | int,
    gates: Sequence[Gate],
    *,
    run_id: str | None = None,
    dagster_run_id: str | None = None,
    alias: str = CHAMPION_ALIAS,
) -> PromotionOutcome:
    """Set `alias` on `model_name` version `version` when all `gates` passed; tag the decision either way."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking_uri)
    version = str(version)
    try:
        client.get_model_version(model_name, version)
    except MlflowException as error:
        raise ValueError(f"registered model {model_name!r} has no version {version} in {tracking_uri}: {error}") from error

    # No gates evaluated is not a pass: promotion fails closed.
    reasons = [f"{gate.name}: {gate.detail or 'failed'}" for gate in gates if not gate.passed]
    if not gates:
        reasons.append("no gate was evaluated")
    promoted = not reasons
    previous = current_alias_version(client, model_name, alias)

    tags = {
        PROMOTION_TAG: alias if promoted else "blocked",
        f"{PROMOTION_TAG}.decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        f"{PROMOTION_TAG}.reasons": "; ".join(reasons) if reasons else "all gates passed",
    }
    if promoted and previous and previous != version:
        tags[f"{PROMOTION_TAG}.replaced_version"] = previous
    if dagster_run_id:
        tags[f"{PROMOTION_TAG}.dagster_run_id"] = dagster_run_id
    for gate in gates:
        tags[f"dgx.gate.{gate.name}"] = "passed" if gate.passed else f"failed: {gate.detail}"[:5000]

    if promoted:
        client.set_registered_model_alias(model_name, alias, version)
    for key, value in tags.items():
        client.set_model_version_tag(model_name, version, key, value)
    if run_id:
        client.set_tag(run_id, PROMOTION_TAG, f"{alias} (version {version})" if promoted else "blocked")
        client.set_tag(run_id, f"{PROMOTION_TAG}.reasons", tags[f"{PROMOTION_TAG}.reasons"])
    return PromotionOutcome(promoted, model_name, version, alias, previous, reasons, tags)
