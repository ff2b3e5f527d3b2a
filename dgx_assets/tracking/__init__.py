"""MLflow plumbing shared by every model-making asset: the store, lineage, hardware, the registry's aliases."""
