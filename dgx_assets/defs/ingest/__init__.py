"""The `ingest` group: raw_images and image_features: what the landing sensor's ingest_batch job runs for a new batch."""
