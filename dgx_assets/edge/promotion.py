"""Promote a registered model version to `champion`, only when every gate passed, and record why.

The decision is recorded either way: tags on the model version (and on its training run) say whether it
was promoted or held back, when, by which Dagster run, each gate's outcome, each criterion's figure against
its threshold, and what to fix; a held-back version keeps its `candidate` alias and the champion stays.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from dgx_assets.gates import Gate
from dgx_assets.tracking.registry import CANDIDATE_ALIAS, CHAMPION_ALIAS, current_alias_version

PROMOTION_TAG = "dgx.promotion"
GATE_TAG = "dgx.gate"
HELD_BACK = "held back"
_TAG_LIMIT = 5000  # MLflow's longest tag value


@dataclass(frozen=True)
class PromotionOutcome:
    promoted: bool
    model_name: str
    version: str
    alias: str
    previous_champion: str | None
    reasons: list[str] = field(default_factory=list)
    tags: dict[str, str] = field(default_factory=dict)
    aliases: list[str] = field(default_factory=list)  # the version's aliases after the decision

    @property
    def champion(self) -> str | None:
        """The version holding `alias` after the decision."""
        return self.version if self.promoted else self.previous_champion

    @property
    def status(self) -> str:
        """The decision in the words the UI, the report and MLflow use."""
        if self.promoted:
            return f"{self.model_name} v{self.version} promoted to {self.alias}"
        stays = f", stays {CANDIDATE_ALIAS}" if CANDIDATE_ALIAS in self.aliases else ""
        return f"{self.model_name} v{self.version} not promoted{stays}"

    def to_dict(self) -> dict:
        return asdict(self)


def decision_tags(gates: Sequence[Gate], reasons: list[str], promoted: bool, alias: str) -> dict[str, str]:
    """The tags a decision leaves on the model version: the decision, each gate, each criterion, the reason."""
    tags = {
        PROMOTION_TAG: alias if promoted else HELD_BACK,
        f"{PROMOTION_TAG}.decided_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        f"{PROMOTION_TAG}.reasons": "; ".join(reasons) if reasons else "all gates passed",
    }
    for gate in gates:
        tags[f"{GATE_TAG}.{gate.name}"] = "passed" if gate.passed else f"failed: {gate.detail or 'no detail'}"
        for criterion in gate.criteria:
            tags[f"{GATE_TAG}.{gate.name}.{criterion.name}"] = criterion.summary()
    return {key: value[:_TAG_LIMIT] for key, value in tags.items()}


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

    tags = decision_tags(gates, reasons, promoted, alias)
    if promoted and previous and previous != version:
        tags[f"{PROMOTION_TAG}.replaced_version"] = previous
    if dagster_run_id:
        tags[f"{PROMOTION_TAG}.dagster_run_id"] = dagster_run_id

    if promoted:
        client.set_registered_model_alias(model_name, alias, version)
    for key, value in tags.items():
        client.set_model_version_tag(model_name, version, key, value)
    if run_id:
        client.set_tag(run_id, PROMOTION_TAG, f"{alias} (version {version})" if promoted else HELD_BACK)
        client.set_tag(run_id, f"{PROMOTION_TAG}.reasons", tags[f"{PROMOTION_TAG}.reasons"])
    aliases = list(client.get_model_version(model_name, version).aliases)
    return PromotionOutcome(promoted, model_name, version, alias, previous, reasons, tags, aliases)
