#!/usr/bin/env bash
# The project's test command: every notebook's cells, then pytest. `make test` runs it inside .venv (after
# checking for Chromium); run directly, it uses the active environment, else ./.venv when that exists.
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
nbdev-test --n-workers 2
# two pytest workers, each test file kept on one worker (its module fixtures are built once); SAO_TEST_WORKERS=0 runs
# everything in this process (what a debugger or `-x` wants)
python -m pytest -q -n "${SAO_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
