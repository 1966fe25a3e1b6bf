#!/usr/bin/env bash
# Run one phase of `make test` and record how long it took:
#   tools/timed.sh NAME COMMAND [ARGS...]
# appends "NAME<TAB>start<TAB>end<TAB>exit status<TAB>CPU-seconds" (epoch
# seconds) to artifacts/phases.tsv, which tools/suite_report.py prints as a
# table at the end of `make test`. The CPU-seconds are the command's and its
# descendants' (user + system, as the shell's `times` reports its children):
# the controller's side of a phase. Containers are not descendants: their CPU
# is in artifacts/cost-*.tsv. The exit status is the command's.
set -uo pipefail
name=$1; shift
mkdir -p artifacts
start=$(date +%s)
"$@"
rc=$?
end=$(date +%s)
# `times` (run in this shell, not a subshell, which would count its own): the shell's user and system
# time, then its children's, e.g. "0m1.250s 0m0.310s".
times >artifacts/.times.$$
cpu=$(awk 'END { s = 0; for (i = 1; i <= NF; i++) { v = $i; sub(/s$/, "", v); split(v, p, "m"); s += p[1] * 60 + p[2] } printf "%.1f", s }' artifacts/.times.$$)
rm -f artifacts/.times.$$
printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$start" "$end" "$rc" "$cpu" >>artifacts/phases.tsv
exit "$rc"
