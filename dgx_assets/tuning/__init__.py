"""hyperparameter_search: Ray Tune on a Ray cluster started on the run's Spark executors (the `ray` extra)."""
