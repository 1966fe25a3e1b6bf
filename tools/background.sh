#!/usr/bin/env bash
# Run a command behind everything else on the machine: `make test` runs lint and the unit tests this way, beside
# the labs, which are its longest path.
#
#   tools/background.sh COMMAND [ARGS...]
#
# nice alone does not do it. The labs' nodes are containers, each in a cgroup of its own under Docker's, and the
# kernel's autogroups (kernel.sched_autogroup_enabled, on here) give each session a weight of its own: a nice-19
# lint competed with the labs' nodes as an equal (seen on 2026-11-30: ansible-lint at nice 19 took 55 % of a core
# while the heads' pip, at nice 0 in their containers, had 39 % each during the labs' first deploys). So the
# command runs in a CPU cgroup of its own, raymetal-background, with a weight of 128 against the 1024 of Docker's
# containers and of each session: on a busy machine it gets about a sixteenth, on an idle one all of it. Where
# that cgroup cannot be made (no root, no writable cpu controller) the command runs at nice 19 only.
set -uo pipefail
group=raymetal-background
v1=/sys/fs/cgroup/cpu
if [[ -w $v1/cgroup.procs ]] && mkdir -p "$v1/$group" 2>/dev/null && echo 128 >"$v1/$group/cpu.shares" 2>/dev/null; then
  echo $$ >"$v1/$group/cgroup.procs" 2>/dev/null || true
elif [[ -w /sys/fs/cgroup/cgroup.procs ]] && grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null \
  && mkdir -p "/sys/fs/cgroup/$group" 2>/dev/null && echo 12 >"/sys/fs/cgroup/$group/cpu.weight" 2>/dev/null; then
  # cgroup v2: weight 12 against the default 100.
  echo $$ >"/sys/fs/cgroup/$group/cgroup.procs" 2>/dev/null || true
fi
# Its CPU, apart, for the report's timeline (tools/cpu_timeline.sh): cgroup v1 counts it in the cpuacct hierarchy.
if [[ -w /sys/fs/cgroup/cpuacct/cgroup.procs ]] && mkdir -p "/sys/fs/cgroup/cpuacct/$group" 2>/dev/null; then
  echo $$ >"/sys/fs/cgroup/cpuacct/$group/cgroup.procs" 2>/dev/null || true
fi
exec nice -n 19 "$@"
