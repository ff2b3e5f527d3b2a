"""Inspectors' labels back into the lake: a Label Studio or CVAT export becomes a new labelled landing batch
(`dgx-assets import-labels`)."""
