"""Where the search leaves its best recipe and how trained_model takes it: <lake>/hyperparameter_search/best_config.json.

trained_model reads it only when its config says so (``use_searched_hyperparameters``), and then the file
must exist: a run that asked for the searched recipe never silently trains with the default one.
"""

from __future__ import annotations

import json
from typing import Any

SEARCH_ASSET = "hyperparameter_search"
BEST_CONFIG_FILE = "best_config.json"
# The TrainConfig fields a search decides; trained_model takes exactly these from the file.
SEARCHED_FIELDS = ("learning_rate", "dropout", "batch_size")


def best_config_uri(lake: Any) -> str:
    return f"{lake.asset_uri(SEARCH_ASSET)}/{BEST_CONFIG_FILE}"


def write_best_config(lake: Any, best: dict[str, Any], provenance: dict[str, Any]) -> str:
    """Write the file aside and swap it in (a reader never sees half of it)."""
    record = {"hyperparameters": {key: best[key] for key in SEARCHED_FIELDS}, **provenance}
    staging, final = lake.staging_uri(SEARCH_ASSET), lake.asset_uri(SEARCH_ASSET)
    lake.write_bytes(f"{staging}/{BEST_CONFIG_FILE}", json.dumps(record, indent=2).encode())
    lake.swap_in(staging, final)
    return f"{final}/{BEST_CONFIG_FILE}"


def apply_best_config(lake: Any, train_config: Any) -> tuple[Any, dict[str, Any]]:
    """``train_config`` with the searched fields replaced, and the file's record (for the run's lineage)."""
    uri = best_config_uri(lake)
    if not lake.exists(uri):
        raise ValueError(
            f"use_searched_hyperparameters is set but {uri} does not exist: materialize "
            "hyperparameter_search first (the `ray` extra), or unset use_searched_hyperparameters"
        )
    record = json.loads(lake.read_bytes(uri))
    values = record.get("hyperparameters", {})
    missing = [key for key in SEARCHED_FIELDS if key not in values]
    if missing:
        raise ValueError(f"{uri} lacks {missing}: re-materialize hyperparameter_search")
    # validated like a launchpad value: the file is data, and a bad figure names its setting
    searched = type(train_config).model_validate({**train_config.model_dump(), **{key: values[key] for key in SEARCHED_FIELDS}})
    return searched, record
