#!/usr/bin/env bash
# GPU preflight for one node, before a launch. Reads
#   nvidia-smi --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits
#   nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits
# and classifies each GPU: free | busy (a process runs on it) | ghost (used memory above the threshold, no
# process: memory a crashed job left behind). Exit 0 if every GPU is free; 1 if a GPU is busy or holds ghost
# memory (it is named, with a CUDA_VISIBLE_DEVICES that leaves it out) or there is no GPU; 2 if nvidia-smi is
# missing or fails. The only implementation of these rules: `sao-repro preflight` and `sao-repro launch` run
# this script and read its output. Pure bash + awk, so it runs on a bare node.
#   scripts/preflight_gpus.sh [--threshold-mib 1024] [--gpus-csv FILE --apps-csv FILE]
# --gpus-csv / --apps-csv: judge recorded outputs of the two queries instead of running nvidia-smi.
# NVIDIA_SMI=/path/to/nvidia-smi picks the executable (default: nvidia-smi on PATH).
set -uo pipefail

THRESHOLD_MIB="${THRESHOLD_MIB:-1024}"
SMI="${NVIDIA_SMI:-nvidia-smi}"
while [ $# -gt 0 ]; do
  case "$1" in
    --threshold-mib) THRESHOLD_MIB="${2:?--threshold-mib needs a value}"; shift 2 ;;
    --threshold-mib=*) THRESHOLD_MIB="${1#*=}"; shift ;;
    --gpus-csv) GPUS_CSV="${2:?--gpus-csv needs a file}"; shift 2 ;;
    --apps-csv) APPS_CSV="${2:?--apps-csv needs a file}"; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "preflight_gpus.sh: unknown option $1 (use --threshold-mib N, --gpus-csv FILE, --apps-csv FILE)" >&2; exit 2 ;;
  esac
done

if [ -n "${GPUS_CSV:-}${APPS_CSV:-}" ]; then
  if [ ! -r "${GPUS_CSV:-}" ] || [ ! -r "${APPS_CSV:-}" ]; then
    echo "preflight: FAIL: --gpus-csv and --apps-csv need two readable files (got '${GPUS_CSV:-}' and '${APPS_CSV:-}')" >&2
    exit 2
  fi
  gpus="$(cat "$GPUS_CSV")"
  apps="$(cat "$APPS_CSV")"
elif ! command -v "$SMI" >/dev/null 2>&1; then
  echo "preflight: FAIL: $SMI not found on PATH; install the NVIDIA driver tools or run on a GPU node" >&2
  exit 2
elif ! gpus="$("$SMI" --query-gpu=index,uuid,memory.used,memory.total --format=csv,noheader,nounits 2>&1)"; then
  echo "preflight: FAIL: $SMI --query-gpu failed: $gpus" >&2
  exit 2
elif ! apps="$("$SMI" --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits 2>&1)"; then
  echo "preflight: FAIL: $SMI --query-compute-apps failed: $apps" >&2
  exit 2
fi

report="$(awk -v thr="$THRESHOLD_MIB" -v apps="$apps" '
  function trim(s) { gsub(/^[ \t]+|[ \t\r]+$/, "", s); return s }
  BEGIN {
    n_apps = split(apps, al, "\n")
    for (i = 1; i <= n_apps; i++) {
      if (trim(al[i]) == "") continue
      split(al[i], f, ",")
      u = trim(f[1]); p = trim(f[2])
      if (p !~ /^[0-9]+$/) continue                       # a header line or "[N/A]"
      if (u in pids) pids[u] = pids[u] " " p
      else pids[u] = p
    }
    n = 0
  }
  trim($0) != "" {
    split($0, f, ",")
    idx = trim(f[1]); u = trim(f[2]); used = trim(f[3]); total = trim(f[4])
    if (idx !~ /^[0-9]+$/) next                            # a header line
    gsub(/[^0-9.]/, "", used); gsub(/[^0-9.]/, "", total)  # tolerate " MiB" units
    used += 0; total += 0
    n++; I[n] = idx; U[n] = used; T[n] = total
    if (u in pids) { S[n] = "busy"; P[n] = pids[u] } else if (used > thr + 0) { S[n] = "ghost" } else { S[n] = "free" }
  }
  END {
    if (n == 0) { print "preflight: FAIL: nvidia-smi lists no GPU on this node"; exit 1 }
    bad = 0; ok = ""
    for (i = 1; i <= n; i++) {
      line = sprintf("GPU %s: %s (%.0f / %.0f MiB used", I[i], S[i], U[i], T[i])
      if (S[i] == "busy") line = line ", pids " P[i]
      print line ")"
      if (S[i] == "free") ok = (ok == "") ? I[i] : ok "," I[i]; else bad++
    }
    if (bad == 0) { printf "preflight: OK: %d GPU(s) free\n", n; exit 0 }
    for (i = 1; i <= n; i++) {
      if (S[i] == "ghost")
        printf "preflight: FAIL: GPU %s holds ghost memory: %.0f MiB used (> %g) with no process on it; reset it (nvidia-smi --gpu-reset) or reboot the node\n", I[i], U[i], thr
      else if (S[i] == "busy")
        printf "preflight: FAIL: GPU %s is busy: process(es) %s run on it\n", I[i], P[i]
    }
    if (ok != "") print "preflight: suggestion: CUDA_VISIBLE_DEVICES=" ok
    else print "preflight: no free GPU left on this node"
    exit 1
  }' <<< "$gpus")"
rc=$?
if [ "$rc" -eq 0 ]; then echo "$report"; else echo "$report" >&2; fi
exit "$rc"
