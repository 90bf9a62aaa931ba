#!/usr/bin/env bash
# Install everything the tests and the CPU rehearsal need into the active Python environment (CPU only, no GPU stack).
#   python3 -m venv .venv && source .venv/bin/activate && bash scripts/install_dev.sh
# One line per stage; 156 s on a fresh clone here with pip's cache warm, about 3 minutes the first time.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="${TORCH:-torch==2.13.0}"
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$SECONDS
stage() { echo "install [$1/5] $2 ($((SECONDS - t0)) s so far)"; }

stage 1 "pip"
pip install -q --upgrade pip
stage 2 "$TORCH (the CPU build first: nothing below may pull another torch)"
pip install -q $TORCH ${TORCH_ARGS:-}
stage 3 "sao-repro (pandas, scipy, ...) with its dev extra (nbdev, pytest, papermill, math-verify, Ray, ...)"
pip install -q -e '.[dev]'
# What AReaL 1.0.4 imports on a CPU, pinned in one place: scripts/areal_cpu_requirements.txt (it says why,
# e.g. omegaconf==2.4.0.dev2, AReaL's own pin: the final 2.4.0 breaks its YAML scheduling specs). AReaL itself
# comes last and without its ~80 dependencies (vLLM, SGLang, agent SDKs and a CUDA torch): no later pip run
# then reports AReaL's unmet GPU-only requirements as errors. `pip check` still lists them; that is expected
# on a CPU.
REQS=scripts/areal_cpu_requirements.txt
stage 4 "AReaL's CPU dependencies ($REQS: transformers, omegaconf, hydra, peft, numba, triton, loggers)"
deps="$(mktemp)"
trap 'rm -f "$deps"' EXIT
grep -v -- '--no-deps' "$REQS" > "$deps"
pip install -q -r "$deps"
nodeps="$(grep -- '--no-deps' "$REQS" | grep -v '^ *#' | sed 's/ *#.*//')"
stage 5 "$nodeps (--no-deps)"
pip install -q --no-deps $nodeps
python -c "import torch; assert torch.__version__.startswith('2.13'), f'torch was replaced: {torch.__version__}'"
echo "install done in $((SECONDS - t0)) s"
