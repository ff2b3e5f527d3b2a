"""The `production` group: the inspection loop. defect_predictions (each batch scored by the `champion` version),
its drift check, and review_queue (the images the champion is least sure of, as Label Studio tasks)."""
