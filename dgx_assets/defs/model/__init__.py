"""The `model` group: trained_model, challenger_model and hyperparameter_search, and the retraining job and schedule."""
