"""What the Dagster UI shows before anything ran: descriptions that survive its Markdown rendering, and
automation that stays off until a person turns it on (the README says "turn on")."""

import re

import dagster as dg

from dgx_assets.definitions import defs as code_location

defs = code_location()

# A bare <word> is an HTML tag to a Markdown renderer and vanishes: placeholders belong in backticks.
BARE_TAG = re.compile(r"<[a-z_]+>")


def _outside_code(text: str) -> str:
    return re.sub(r"`[^`]*`", "", text)


def test_asset_and_check_descriptions_keep_their_placeholders_in_markdown():
    graph = defs.resolve_asset_graph()
    texts = {key.to_user_string(): graph.get(key).description or "" for key in graph.get_all_asset_keys()}
    texts |= {
        f"{key.asset_key.to_user_string()}:{key.name}": graph.get_check_spec(key).description or ""
        for key in graph.asset_check_keys
    }
    vanishing = {name: BARE_TAG.findall(_outside_code(text)) for name, text in texts.items()}
    assert not {name: tags for name, tags in vanishing.items() if tags}
    assert "`<lake>/trained_model/model.keras`" in texts["trained_model"]


def test_every_schedule_and_sensor_is_off_until_turned_on():
    schedules, sensors = list(defs.schedules or []), list(defs.sensors or [])
    assert {s.name for s in schedules} >= {"retrain_model_schedule"}
    assert {s.name for s in sensors} >= {"landing_zone_sensor", "image_features_automation"}
    assert all(s.default_status == dg.DefaultScheduleStatus.STOPPED for s in schedules)
    assert all(s.default_status == dg.DefaultSensorStatus.STOPPED for s in sensors)


def test_every_column_of_every_table_asset_has_a_description():
    from dgx_assets.defs.generation.assets import COLUMN_DESCRIPTIONS
    from dgx_assets.defs.ingest.assets import RAW_IMAGES_COLUMNS
    from dgx_assets.defs.ingest.features import IMAGE_FEATURES_COLUMNS
    from dgx_assets.generation import table
    from dgx_assets.ingest.spark_ingest import RAW_IMAGES_SCHEMA
    from dgx_assets.training.features import FEATURE_COLUMNS

    written = {  # what each table's files hold, and `batch`, the hive folder of the partitioned ones
        "raw_images": (set(RAW_IMAGES_SCHEMA.names) | {"batch"}, RAW_IMAGES_COLUMNS),
        "image_features": (set(FEATURE_COLUMNS), IMAGE_FEATURES_COLUMNS),
        "ernie_generated_images": (set(table.COLUMNS), COLUMN_DESCRIPTIONS),
    }
    undescribed = {name: sorted(columns - set(descriptions)) for name, (columns, descriptions) in written.items()}
    assert not {name: columns for name, columns in undescribed.items() if columns}
    assert all(text.strip() for _, descriptions in written.values() for text in descriptions.values())
