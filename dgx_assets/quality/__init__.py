"""Data quality shared by every domain: Great Expectations suites run as Dagster asset checks."""
