# birder-repro: every target creates .venv first when it is missing.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
ARGS    ?=

.PHONY: help install run test test-all tables bench emulated-setup clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test]'
	touch $(STAMP)

install: $(STAMP)  ## create .venv and install the package with its test tools

run: $(STAMP)  ## the default experiment: ResNet-20, synthetic CIFAR-100, Birder, 2 nodes x 1 process (ARGS= adds overrides)
	$(BIN)/birder-repro experiment=quickstart $(ARGS)

test: $(STAMP)  ## the fast test suite (the one CI runs)
	$(BIN)/python -m pytest -q $(ARGS)

test-all: $(STAMP)  ## every test, slow ones included
	$(BIN)/python -m pytest -q -m 'not gpu' $(ARGS)

tables: $(STAMP)  ## build tables/ from every run record under runs/
	$(BIN)/python -m birder_repro.report $(ARGS)

bench: $(STAMP)  ## compression / decompression time of the hooks against a copy of the same buffer
	$(BIN)/python -m birder_repro.bench $(ARGS)

emulated-setup:  ## install iproute2 (ip, tc) for cluster=emulated where it is missing (needs root)
	@command -v ip >/dev/null && command -v tc >/dev/null && echo "iproute2 is installed" || \
	  (apt-get update -q && apt-get install -y -q iproute2)

clean:  ## remove the virtual environment and caches (runs/ stays)
	rm -rf $(VENV) .pytest_cache build *.egg-info
