#!/usr/bin/env bash
# Launch one cluster run: GPU preflight, Ray (if none is running), reward workers (reward.backend: ray),
# AReaL training (python -m sao_repro.areal.train), then reward workers down and Ray stopped gracefully.
#   scripts/launch_experiment.sh configs/phase2_hard_sao.yaml [key=value ...] [--dry-run]
# On a laptop CPU, the same steps with the preflight skipped and `sao-repro rehearse` as the training step:
#   CPU_REHEARSAL=1 scripts/launch_experiment.sh configs/phase2_hard_sao.yaml
# All options: sao-repro launch --help
set -euo pipefail
. "$(dirname "$0")/_sao.sh"
[ $# -ge 1 ] || { echo "usage: $0 CONFIG [key=value ...] [--dry-run]" >&2; exit 2; }
sao_repro launch "$@"
