#!/usr/bin/env bash
# Run one phase of `make test` and record how long it took:
#   tools/timed.sh NAME COMMAND [ARGS...]
# appends "NAME<TAB>start<TAB>end<TAB>exit status" (epoch seconds) to
# artifacts/phases.tsv, which tools/suite_report.py prints as a table at the
# end of `make test`. The exit status is the command's.
set -uo pipefail
name=$1; shift
mkdir -p artifacts
start=$(date +%s)
"$@"
rc=$?
printf '%s\t%s\t%s\t%s\n' "$name" "$start" "$(date +%s)" "$rc" >>artifacts/phases.tsv
exit "$rc"
