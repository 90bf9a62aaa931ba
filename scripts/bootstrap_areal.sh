#!/usr/bin/env bash
# Install AReaL 1.0.4 from PyPI with an inference backend into the current Python environment, then check it.
#   BACKEND=vllm scripts/bootstrap_areal.sh      # or BACKEND=sglang (AReaL's [sglang] extra)
#   INSTALL=0 scripts/bootstrap_areal.sh         # only report what is installed; change nothing
set -euo pipefail
BACKEND="${BACKEND:-vllm}"
INSTALL="${INSTALL:-1}"
PY="${PYTHON:-python3}"
AREAL_VERSION=1.0.4

case "$BACKEND" in
  vllm) PKGS=("areal==${AREAL_VERSION}" "vllm") ;;
  sglang) PKGS=("areal[sglang]==${AREAL_VERSION}") ;;
  *) echo "bootstrap_areal.sh: BACKEND must be vllm or sglang, got '$BACKEND'" >&2; exit 2 ;;
esac

if [ "$INSTALL" = "1" ]; then
  echo "+ $PY -m pip install ${PKGS[*]} -e .[cluster]"
  "$PY" -m pip install "${PKGS[@]}"
  "$PY" -m pip install -e ".[cluster]"
fi

status=0
check() {  # check MODULE [REQUIRED_VERSION]
  local v
  if v="$("$PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1" 2>/dev/null)"; then
    if [ -n "${2:-}" ] && [ "$v" != "$2" ]; then
      echo "MISMATCH $1 $v (need $2)"; status=1
    else
      echo "ok       $1 $v"
    fi
  else
    echo "MISSING  $1${2:+ (need $2)}"; status=1
  fi
}
check areal "$AREAL_VERSION"
check "$BACKEND"
check torch
check ray
if "$PY" -c "import sao_repro" 2>/dev/null; then echo "ok       sao_repro (this package)"; else echo "MISSING  sao_repro: pip install -e .[cluster]"; status=1; fi
if command -v nvidia-smi >/dev/null 2>&1; then echo "ok       nvidia-smi"; else echo "MISSING  nvidia-smi (needed on GPU nodes)"; status=1; fi
[ "$status" -eq 0 ] && echo "bootstrap: AReaL $AREAL_VERSION with $BACKEND is ready" || echo "bootstrap: not ready (see above)"
exit "$status"
