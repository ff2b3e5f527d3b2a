import dagster as dg

# One partition per top-level batch folder of the landing zone; the new-data sensor adds them.
image_batches = dg.DynamicPartitionsDefinition(name="image_batches")
