"""The inspection loop's work: scoring, drift, saliency, review queues (plain Python, no Dagster)."""
