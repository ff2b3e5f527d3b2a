# The edge tests' data and fixtures live in edge_data.py, a module name of its own: test modules import
# helpers from it, and `from conftest import ...` would pick whichever conftest pytest loaded last.
from support.edge_data import (  # noqa: F401 (fixtures register by being here)
    edge_dataset,
    edge_model_dir,
    registered_version,
    test_inputs,
    train_raw_images,
    trained_classifier,
)
