#!/usr/bin/env bash
# Start the live monitor: a local page at http://127.0.0.1:8790/ following the runs under --logs.
#   scripts/start_monitor.sh --logs runs                 # loopback only (default)
#   ADMIN_API_KEY=$(openssl rand -hex 16) scripts/start_monitor.sh --logs runs --host 0.0.0.0
# All options: sao-repro monitor --help
set -euo pipefail
exec sao-repro monitor "$@"
