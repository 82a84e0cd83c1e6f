#!/usr/bin/env bash
# One named phase of `make test` / `.ci/run`: runs the command and appends its wall time to
# .phases.log, which `make test` prints at its end (the CI's per-phase times).
# Usage: bash scripts/phase.sh NAME COMMAND [ARGS...]
name=$1
shift
start=$(date +%s)
"$@"
rc=$?
printf '%-48s %5d s%s\n' "$name" $(($(date +%s) - start)) "$([ $rc -eq 0 ] || echo " (failed: $rc)")" \
  >> "$(dirname "$0")/../.phases.log"
exit $rc
