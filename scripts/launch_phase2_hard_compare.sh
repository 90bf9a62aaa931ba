#!/usr/bin/env bash
# The five-setting MATH-hard comparison on the cluster, one setting after the other. Runs whose folder
# already records a finish event are skipped; a summary table closes the output (also in runs/compare_summary.json).
#   scripts/launch_phase2_hard_compare.sh [key=value ...] [--dry-run]     e.g. seed=2
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
. "$ROOT/scripts/_sao.sh"
mkdir -p "$ROOT/runs"
sao_repro launch --skip-finished --summary-json "$ROOT/runs/compare_summary.json" \
  "$ROOT/configs/phase2_hard_sao.yaml" \
  "$ROOT/configs/phase2_hard_grpo.yaml" \
  "$ROOT/configs/phase2_hard_grpo_dis.yaml" \
  "$ROOT/configs/phase2_hard_running_mean.yaml" \
  "$ROOT/configs/phase2_hard_single_dis.yaml" \
  "$@"
