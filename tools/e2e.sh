#!/usr/bin/env bash
# The lab end-to-end tests on E2E_LABS labs side by side (default 2).
#
#   tools/e2e.sh [pytest args...]
#
# Lab 1 is the built-in lab (LAB_PREFIX=raymetal, inventory/lab, subnets
# 10.231.10/20, Debian 12); lab N > 1 is LAB_PREFIX=raymetal-labN with subnets
# 10.231.(10+20(N-1)) and +10, state and inventory in lab/.labs/; lab 2 runs
# Debian 13 (E2E_LAB2_RELEASE, default trixie), so the tests that prefer it
# run on Debian 13. Each lab gets
# its own pytest run over the test modules that prefer it (E2E_LAB in the
# module, see tests/lab/conftest.py), so the tests that change a lab's state
# never meet another lab's. Each run's output goes to artifacts/e2e-labN.log and
# is printed whole when all have ended; the exit status is the first non-zero.
# The built-in lab stays up afterwards (as `make e2e` always left it); the
# others are removed.
set -uo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
LABS=${E2E_LABS:-2}
[[ $LABS =~ ^[1-4]$ ]] || { echo "E2E_LABS must be 1 to 4, got '$LABS'" >&2; exit 2; }
mkdir -p artifacts

lab_env() { # lab number -> the environment lab.sh and the tests share
  local n=$1
  if ((n == 1)); then
    echo "LAB_PREFIX=raymetal"
  else
    echo "LAB_PREFIX=raymetal-lab$n LAB_MGMT_SUBNET=10.231.$((10 + 20 * (n - 1))).0/24" \
      "LAB_FABRIC_SUBNET=10.231.$((20 + 20 * (n - 1))).0/24" \
      "LAB_RELEASE=$( ((n == 2)) && echo "${E2E_LAB2_RELEASE:-trixie}" || echo bookworm)"
  fi
}

run_lab() {
  local n=$1; shift
  local -a vars
  read -r -a vars <<<"$(lab_env "$n")"
  echo "=== lab $n/$LABS: ${vars[*]}"
  tools/timed.sh "lab $n: up" env "${vars[@]}" bash lab/lab.sh up || return 1
  local rc=0
  tools/timed.sh "lab $n: end-to-end tests" env "${vars[@]}" RAYMETAL_E2E_LAB="$n/$LABS" RAYMETAL_TEST_COST="$ROOT/artifacts/cost-lab$n.tsv" .venv/bin/pytest -q \
    --durations=20 -p no:cacheprovider --junitxml="artifacts/junit-lab$n.xml" tests/lab "$@" || rc=$?
  # 5: no test prefers this lab (more labs than the modules ask for).
  ((rc != 5)) || { echo "no test module runs on lab $n"; rc=0; }
  return "$rc"
}

# Every E2E_HEARTBEAT seconds (default 600; 0: never) one line per lab and one for molecule on stdout: the
# lab tests' output stays in artifacts/ until they end, and a run that CI stops at its time limit would
# otherwise say nothing of how far it got or what was slow.
heartbeat() {
  local every=${E2E_HEARTBEAT:-600} n log cost done failed last molecule nap=
  ((every > 0)) || return 0
  # Killed at the end: its sleep goes with it, and never holds make's output open (CI reads it to its end).
  trap 'kill "$nap" 2>/dev/null; exit 0' TERM
  while :; do
    sleep "$every" >/dev/null 2>&1 &
    nap=$!
    wait "$nap"
    for ((n = 1; n <= LABS; n++)); do
      log=artifacts/e2e-lab$n.log cost=artifacts/cost-lab$n.tsv
      # pytest -q's progress characters, one per finished test (lines of nothing else).
      done=$(grep -hE '^[.FEsx]+( +\[ *[0-9]+%\])?$' "$log" 2>/dev/null | tr -cd '.FEsx')
      failed=$(tr -cd 'FE' <<<"$done")
      last=$(tail -n 1 "$cost" 2>/dev/null | cut -f1,2 | tr '\t' ' ')
      echo "=== $(($(date +%s) - start)) s: lab $n: ${#done} tests done, ${#failed} failed or errored; last: ${last:-none} s"
    done
    molecule=$(grep -h '^=== molecule test' artifacts/molecule.log 2>/dev/null | tail -n 1)
    [[ -z $molecule ]] || echo "=== $(($(date +%s) - start)) s: molecule: ${molecule#=== }"
  done
}

declare -A pids
start=$(date +%s)
heartbeat & beat=$!
for ((n = 1; n <= LABS; n++)); do
  log=artifacts/e2e-lab$n.log
  # Later labs start a little later: their `lab up` and first deploy do not all
  # compete for the controller's CPU at once.
  ( sleep $((20 * (n - 1))); run_lab "$n" "$@" ) >"$log" 2>&1 &
  pids[$n]=$!
done
rc=0
declare -A rcs
for ((n = 1; n <= LABS; n++)); do
  wait "${pids[$n]}"; rcs[$n]=$?
  ((rc != 0)) || rc=${rcs[$n]}
done
kill "$beat" 2>/dev/null; wait "$beat" 2>/dev/null
for ((n = 1; n <= LABS; n++)); do
  echo "=== lab end-to-end tests, lab $n/$LABS (artifacts/e2e-lab$n.log): exit ${rcs[$n]}"
  cat "artifacts/e2e-lab$n.log"
done
for ((n = 2; n <= LABS; n++)); do
  # shellcheck disable=SC2046  # one word per variable
  env $(lab_env "$n") bash lab/lab.sh down >/dev/null 2>&1 || true
done
echo "=== lab end-to-end tests: $LABS labs side by side in $(($(date +%s) - start)) s, exit $rc"
exit "$rc"
