#!/usr/bin/env bash
# The project's test command: every notebook's cells, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
nbdev-test --n-workers 2
python -m pytest -q "$@"
