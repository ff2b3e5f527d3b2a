"""The code location's definitions with a test's own resources, as the webserver would load them."""

import dagster as dg

from dgx_assets.definitions import defs as load_code_location


def code_location_with(resources: dict) -> dg.Definitions:
    """Every asset, check, job, schedule and sensor the defs folder holds, on `resources`, in one process."""
    loaded = load_code_location()
    return dg.Definitions(
        assets=loaded.assets,
        asset_checks=loaded.asset_checks,
        jobs=loaded.jobs,
        schedules=loaded.schedules,
        sensors=loaded.sensors,
        resources=resources,
        executor=dg.in_process_executor,
    )
