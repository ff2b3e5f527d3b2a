"""The Dagster layer, one folder per UI group: assets, checks, sensors, schedules, jobs and their resources.

Dagster finds everything here itself (dgx_assets/definitions.py loads the folder); the work the assets do lives
in the plain packages beside it (ingest, training, edge, generation, reporting, ...), which import nothing from here.
"""
