"""The `reporting` group: quality_report and its verdict check."""
