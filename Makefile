# dgx_assets: `make demo` runs the whole pipeline locally, `make test` runs the test suite.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3

# The local Dagster instance is this folder's dagster.yaml; state lives under .dgx/.
export DAGSTER_HOME := $(CURDIR)
export SPARK_LOCAL_IP := 127.0.0.1
export PYSPARK_PYTHON := $(CURDIR)/$(PY)
export PYSPARK_DRIVER_PYTHON := $(CURDIR)/$(PY)
export MLFLOW_DISABLE_TELEMETRY := true
export GX_ANALYTICS_ENABLED := false
export DAGSTER_DISABLE_TELEMETRY := true
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: demo test test-unit label-studio lint dev mlflow-ui bench bench-quick bench-model e2e validate lock clean

# Creates the environment when missing or when the pins change; constraints.txt keeps installs reproducible.
# Every deployable's extra (pyproject.toml): the demo runs the code location beside a local serving process,
# and the tests cover the edge runtime too.
$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[core,serving,edge,demo,test]'
	touch $@

demo: $(VENV)/.installed
	mkdir -p .dgx
	$(VENV)/bin/dgx-assets demo

# Label Studio in a virtual environment of its own (Django and its pins do not fit beside ours): the review
# queue's round-trip test starts it on 127.0.0.1 and drives it with label-studio-sdk (about 2 minutes, once).
# Pinned like ours: its own requirements are open-ended, and a new sentry-sdk major stopped it from starting.
LABEL_STUDIO := .dgx/label-studio
$(LABEL_STUDIO)/.installed: label-studio-constraints.txt
	test -x $(LABEL_STUDIO)/bin/python || $(PYTHON) -m venv $(LABEL_STUDIO)
	$(LABEL_STUDIO)/bin/pip install --quiet -c label-studio-constraints.txt label-studio label-studio-sdk
	touch $@

label-studio: $(LABEL_STUDIO)/.installed

# Both tiers, tests/unit and tests/integration (real Spark, Dagster, MLflow, servers, subprocesses), in two
# pytest-xdist workers: the tests wait on JVMs, servers and subprocesses, so two share 2 cores well (15 min
# against 23 on this 2-core machine, README). Ends with a coverage summary of dgx_assets ([tool.coverage]).
test: $(VENV)/.installed $(LABEL_STUDIO)/.installed
	mkdir -p .dgx/coverage
	DGX_LABEL_STUDIO=$(CURDIR)/$(LABEL_STUDIO)/bin/label-studio $(PY) -m pytest -q -p no:cacheprovider -n 2 --cov --cov-report=term tests/unit tests/integration $(PYTEST_ARGS)

# The fast tier: no JVM, no servers, no subprocesses.
test-unit: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS)

# ruff and pyright with the settings in pyproject.toml ([tool.ruff], [tool.pyright]: dgx_assets in basic mode);
# .pre-commit-config.yaml runs ruff before a commit.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/pyright

# A real browser on the real UIs: Debian's chromium and its CJK fonts (installed here if missing; the report's
# Chinese prompts must draw as glyphs) driven by Playwright walks the asset graph, a held-back champion_model, the
# quality report over http, MLflow's training views and the GE data docs; screenshots in .dgx/screenshots/.
e2e: $(VENV)/.installed
	command -v chromium >/dev/null && dpkg -s fonts-noto-cjk >/dev/null 2>&1 || \
		(apt-get update -q && apt-get install -y -q chromium fonts-noto-cjk)
	$(PY) -m pip install --quiet -c constraints.txt playwright
	mkdir -p .dgx/screenshots
	$(PY) -m pytest -q -p no:cacheprovider tests/browser

# The Dagster UI and daemon on 127.0.0.1:3000 (sensor and schedule run while it is up), and the read-only server
# of the quality report and GE's data docs on 127.0.0.1:3001 (DGX_DOCS_URL), which Dagster's links open. Ctrl-C
# stops both: the docs server by its PID when dagster dev ends.
dev: $(VENV)/.installed
	mkdir -p .dgx
	$(VENV)/bin/dgx-assets docs-server & docs=$$!; trap 'kill $$docs' EXIT; \
	$(VENV)/bin/dagster dev -h 127.0.0.1 -p 3000 -w workspace.yaml

mlflow-ui: $(VENV)/.installed
	$(VENV)/bin/mlflow ui --host 127.0.0.1 --port 5000 --backend-store-uri sqlite:///$(CURDIR)/.dgx/mlflow.db

validate: $(VENV)/.installed
	$(VENV)/bin/dagster definitions validate -w workspace.yaml

bench: $(VENV)/.installed
	$(PY) -m bench.run_all

# Tiny inputs, every benchmark, after the tests of their plumbing: a smoke run (.ci/run runs it; its figures are
# not judged there). It fails when a benchmark breaks or prints no RESULT line.
bench-quick: $(VENV)/.installed
	$(PY) -m pytest -q -p no:cacheprovider bench
	$(PY) -m bench.run_all --quick

# Model quality: stratified 5-fold cross-validation over all 2,624 ELPV images (about 2 hours on 2 shared cores).
# RECIPE=dgx measures the DGX recipe (training.config.NAMED_RECIPES); figures in .dgx/bench/model_cv-$(RECIPE).json.
RECIPE ?= default
bench-model: $(VENV)/.installed
	$(PY) -m bench.model_cv --recipe $(RECIPE)

# Regenerates the lock from the current environment after a deliberate upgrade.
lock:
	$(PY) -m pip freeze --exclude-editable | grep -v '^dgx.assets' > constraints.txt
	$(LABEL_STUDIO)/bin/pip freeze > label-studio-constraints.txt

clean:
	rm -rf .dgx
