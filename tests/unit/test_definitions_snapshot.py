"""The code location's surface (asset keys, groups, kinds, checks, jobs, schedules, sensors) against a committed
snapshot: moving a module must not move an asset to another group or drop a check.

After a deliberate change, regenerate the snapshot with
`UPDATE_SNAPSHOT=1 .venv/bin/python -m pytest tests/unit/test_definitions_snapshot.py` and review its diff.
"""

import json
import os
from pathlib import Path

import dagster as dg

SNAPSHOT = Path(__file__).parent / "snapshots" / "definitions.json"


def describe(defs: dg.Definitions) -> dict:
    graph = defs.resolve_asset_graph()
    assets = {}
    for key in sorted(graph.get_all_asset_keys(), key=lambda k: k.to_user_string()):
        node = graph.get(key)
        assets[key.to_user_string()] = {
            "group": node.group_name,
            "kinds": sorted(node.kinds),
            "partitioned": node.partitions_def is not None,
            "deps": sorted(parent.to_user_string() for parent in node.parent_keys),
        }
    checks = sorted(f"{check_key.asset_key.to_user_string()}:{check_key.name}" for check_key in graph.asset_check_keys)
    repository = defs.get_repository_def()
    return {
        "assets": assets,
        "checks": checks,
        "jobs": sorted(job.name for job in repository.get_all_jobs() if not job.name.startswith("__")),
        "schedules": sorted(f"{schedule.name} -> {schedule.job_name}" for schedule in repository.schedule_defs),
        "sensors": sorted(sensor.name for sensor in repository.sensor_defs),
    }


def test_definitions_match_the_snapshot():
    from dgx_assets.definitions import defs as code_location

    defs = code_location()

    surface = describe(defs)
    if os.environ.get("UPDATE_SNAPSHOT"):
        SNAPSHOT.write_text(json.dumps(surface, indent=2) + "\n")
    assert surface == json.loads(SNAPSHOT.read_text())
