#!/usr/bin/env bash
# Store benchmarks as a user runs them: append throughput and recovery scan rate, JSON beside the tables.
# Usage: scripts/bench_store.sh [OUTDIR]   (needs the venv from the README's first command)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,3p' "$0" | sed 's/^# //'
  exit 0
fi
out=${1:-.}
.venv/bin/hasvc bench append --json "$out/bench-append.json"
.venv/bin/hasvc bench recover --json "$out/bench-recover.json"
