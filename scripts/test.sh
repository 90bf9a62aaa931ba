#!/usr/bin/env bash
# The project's test command: every notebook's cells, then pytest. `make test` runs it inside .venv (after
# checking for Chromium); run directly, it uses the active environment, else ./.venv when that exists.
#   bash scripts/test.sh            everything: the notebooks' cells, then pytest (the fast tests first, then the
#                                   ones marked slow or browser)
#   bash scripts/test.sh --fast     `make test-fast`: pytest without the slow and browser tests, no notebooks
#   bash scripts/test.sh --rest     what --fast leaves: the notebooks' cells and the slow and browser tests
# Any other argument goes to pytest (e.g. -k NAME, --durations=0).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nbdev-test >/dev/null 2>&1; then
  if [ -x .venv/bin/nbdev-test ]; then
    export PATH="$PWD/.venv/bin:$PATH"
  else
    echo "scripts/test.sh: nbdev-test not found; run \`make test\` (installs .venv) or activate the environment" >&2
    exit 1
  fi
fi
fast=1 rest=1
case "${1:-}" in
  --fast) rest=0; shift ;;
  --rest) fast=0; shift ;;
esac
FAST='not slow and not browser'
# two pytest workers, each test file kept on one worker (its module fixtures are built once); SAO_TEST_WORKERS=0 runs
# everything in this process (what a debugger or `-x` wants)
pytest_() { python -m pytest -q -n "${SAO_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"; }
t0=$SECONDS rc=0
# a phase's failure is kept and the next phase still runs, so that one run shows every failure; pytest exits 5 when a
# selection is empty (e.g. -k matching only slow tests): that is not a failure here
keep() { local r=0; "$@" || r=$?; if [ "$r" -ne 0 ] && [ "$r" -ne 5 ]; then rc=$r; fi; }
if [ "$fast" = 1 ]; then
  keep pytest_ -m "$FAST" "$@"
  echo "test: the fast tests took $((SECONDS - t0)) s"
fi
if [ "$rest" = 1 ]; then
  keep nbdev-test --n-workers 2
  keep pytest_ -m "not ($FAST)" "$@"
  echo "test: all took $((SECONDS - t0)) s"
fi
exit "$rc"
