# Sourced by the launch scripts: run `sao-repro`, or the same entry through python (with this checkout on
# PYTHONPATH) when the console script is not on PATH.
_SAO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
sao_repro() {
  if command -v sao-repro >/dev/null 2>&1; then
    sao-repro "$@"
  else
    PYTHONPATH="$_SAO_ROOT${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" \
      -c 'import sys; from sao_repro.cli import main; sys.exit(main(sys.argv[1:]))' "$@"
  fi
}
