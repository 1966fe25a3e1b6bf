#!/usr/bin/env bash
# Where the machine's CPU goes while `make test` runs, over time (tools/suite_report.py prints it).
#
#   tools/cpu_timeline.sh OUT [SECONDS]    (every SECONDS, default 15, until killed)
#
# Each sample appends to OUT one line for the whole machine
#   <epoch> machine <busy jiffies: user, nice, system, irq, softirq, steal>
# one for what tools/background.sh runs, where its cgroup is there
#   <epoch> background <its cgroup's CPU, nanoseconds>
# and one line per running container
#   <epoch> <container ID> <its io.raymetal.lab label, or - (molecule's)> <its cgroup's CPU, nanoseconds>
# The report takes the differences between samples: the cores each lab's containers, the other containers
# (molecule's nodes), lint and unit, and everything else outside containers (ansible, pytest, Docker) used.
set -uo pipefail
out=$1 every=${2:-15}
usage() { # container ID -> its cgroup's CPU in nanoseconds (cgroup v1 or v2), or nothing
  local v
  if [[ -r /sys/fs/cgroup/cpuacct/docker/$1/cpuacct.usage ]]; then
    cat "/sys/fs/cgroup/cpuacct/docker/$1/cpuacct.usage"
  elif [[ -r /sys/fs/cgroup/system.slice/docker-$1.scope/cpu.stat ]]; then
    v=$(awk '$1 == "usage_usec" { print $2 }' "/sys/fs/cgroup/system.slice/docker-$1.scope/cpu.stat")
    [[ -z $v ]] || echo $((v * 1000))
  fi
}
trap 'exit 0' TERM INT
while :; do
  now=$(date +%s)
  {
    echo "$now machine $(awk '/^cpu /{ print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat)"
    # What tools/background.sh runs (lint, unit), in nanoseconds.
    if [[ -r /sys/fs/cgroup/cpuacct/raymetal-background/cpuacct.usage ]]; then
      echo "$now background $(cat /sys/fs/cgroup/cpuacct/raymetal-background/cpuacct.usage)"
    elif [[ -r /sys/fs/cgroup/raymetal-background/cpu.stat ]]; then
      echo "$now background $(awk '$1 == "usage_usec" { print $2 * 1000 }' /sys/fs/cgroup/raymetal-background/cpu.stat)"
    fi
    docker ps --no-trunc --format '{{.ID}} {{.Label "io.raymetal.lab"}}' 2>/dev/null | while read -r id lab; do
      ns=$(usage "$id")
      [[ -z $ns ]] || echo "$now $id ${lab:--} $ns"
    done
  } >>"$out"
  sleep "$every" &
  wait $!
done
