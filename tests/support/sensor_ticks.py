"""Drive the landing sensor by hand, as the daemon would: land files, tick, register the partitions it asks for."""

import dagster as dg
from imagefactory import valid_images

from dgx_assets.defs.ingest.sensors import landing_zone_sensor
from dgx_assets.defs.resources import LakeResource


def land(landing, batch, names=("a.png", "b.png"), label="functional"):
    folder = landing / batch / label
    folder.mkdir(parents=True, exist_ok=True)
    images = list(valid_images().values())
    for index, name in enumerate(names):
        (folder / name).write_bytes(images[index % len(images)])


def tick(instance, lake_root, cursor):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"lake": LakeResource(root=str(lake_root))})
    result = landing_zone_sensor(context)
    for request in result.dynamic_partitions_requests:  # what the daemon does with them
        instance.add_dynamic_partitions(request.partitions_def_name, list(request.partition_keys))
    return result
