#!/usr/bin/env bash
# Install everything the tests and the CPU rehearsal need into the active Python environment (CPU only, no GPU stack).
#   python3 -m venv .venv && source .venv/bin/activate && bash scripts/install_dev.sh
# One line per stage, and progress lines inside the long ones. A failed install is retried by running the same command
# again: what is already installed is kept, pip only adds what is missing.
# Which torch: TORCH (default torch==2.13.0) with TORCH_ARGS. Where pip sees only PyPI, torch 2.13.0 is a CUDA build
# (several GB with its nvidia-* packages); PyTorch's CPU wheel index has the CPU one:
#   TORCH_ARGS='--index-url https://download.pytorch.org/whl/cpu' bash scripts/install_dev.sh
# The script says which build it got.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH="${TORCH:-torch==2.13.0}"
CPU_INDEX="https://download.pytorch.org/whl/cpu"
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$SECONDS
stage() { echo "install [$1/5] $2 ($((SECONDS - t0)) s so far)"; }

# pip's own output, shortened to progress lines: a line per download, a count of the requirements resolved, the
# install itself. On a failure its whole output is shown, with how to retry.
progress() {
  awk '
    /^Collecting / { n++; if (!(n % 25)) { printf "    %d requirements resolved\n", n; fflush() } }
    /^ *Downloading / { sub(/^ *Downloading /, ""); sub(/^https?:\/\/[^ ]*\//, ""); printf "    downloading %s\n", $0; fflush() }
    /^Installing collected packages:/ { k = split($0, a, ","); printf "    installing %d package(s)\n", k; fflush() }
  '
}
pip_install() {
  local log
  log="$(mktemp)"
  # PYTHONWARNINGS: setuptools warns about every editable install, in a block of stars; nothing to act on here
  if ! PYTHONWARNINGS=ignore pip install --progress-bar off "$@" 2>&1 | tee "$log" | progress; then
    echo "install: pip install $* failed; its output:" >&2
    grep -v "^WARNING: Location" "$log" | tail -n 40 >&2
    echo "install: nothing already installed is lost; run the same command again to retry (make install, or bash scripts/install_dev.sh)." >&2
    rm -f "$log"
    exit 1
  fi
  rm -f "$log"
}

# Which torch build is installed (CPU or CUDA) and the size on disk of torch, triton and the CUDA packages.
torch_build() {
  PYTHONWARNINGS=ignore python - "$CPU_INDEX" <<'PY'
import importlib.metadata as md, sys
import torch
def size(dist):
    return sum((f.size or 0) for f in (dist.files or []))
dists = [d for d in md.distributions() if (d.metadata["Name"] or "").lower() in ("torch", "triton")
         or (d.metadata["Name"] or "").lower().startswith(("nvidia-", "cuda-"))]
gb = sum(size(d) for d in dists) / 1e9
if torch.version.cuda is None:
    print(f"    torch {torch.__version__}: the CPU build ({gb:.1f} GB on disk with triton, when installed)")
else:
    print(f"    torch {torch.__version__}: a CUDA {torch.version.cuda} build ({gb:.1f} GB on disk with {len(dists) - 1} "
          "CUDA and triton packages; it runs on a CPU too)")
    print(f"    for the CPU build: delete .venv, then make install TORCH_ARGS='--index-url {sys.argv[1]}'")
PY
}

stage 1 "pip"
pip_install -q --upgrade pip
stage 2 "$TORCH (first: nothing below may pull another torch)"
pip_install $TORCH ${TORCH_ARGS:-}
torch_build
stage 3 "sao-repro (pandas, scipy, ...) with its dev extra (nbdev, pytest, papermill, math-verify, Ray, ...)"
pip_install -e '.[dev]'
# What AReaL 1.0.4 imports on a CPU, pinned in one place: scripts/areal_cpu_requirements.txt (it says why,
# e.g. omegaconf==2.4.0.dev2, AReaL's own pin: the final 2.4.0 breaks its YAML scheduling specs). AReaL itself
# (scripts/areal_nodeps.txt) comes last and without its ~80 dependencies (vLLM, SGLang, agent SDKs and a CUDA torch): no later pip run
# then reports AReaL's unmet GPU-only requirements as errors. `pip check` still lists them; that is expected
# on a CPU.
REQS=scripts/areal_cpu_requirements.txt
NODEPS=scripts/areal_nodeps.txt
stage 4 "AReaL's CPU dependencies ($REQS: transformers, omegaconf, hydra, peft, numba, triton, loggers)"
pip_install -r "$REQS"
stage 5 "$(grep -v '^ *#' "$NODEPS" | tr '\n' ' ')(--no-deps, $NODEPS)"
pip_install --no-deps -r "$NODEPS"
python -c "import torch; assert torch.__version__.startswith('2.13'), f'torch was replaced: {torch.__version__}'"
echo "install done in $((SECONDS - t0)) s"
