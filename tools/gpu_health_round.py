#!/usr/bin/env python3
"""Run the health loop's round (module_utils/raymetal_health.py) on a real GPU host and time it.

    python3 tools/gpu_health_round.py [ROUNDS]

Reads the host as the loop will (nvidia-smi's health query, /proc/driver/nvidia/gpus, /dev/kmsg after a
cursor, no fabric check), runs ROUNDS rounds (default 20) and prints one JSON object: the first round's
findings and action, and the CPU one round costs (this process and its children: nvidia-smi), so that the
loop's share of a core at one round every 15 s can be stated from a real GPU host.
"""

import importlib.util
import json
import os
import resource
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "raymetal_health", os.path.join(HERE, "..", "plugins", "module_utils", "raymetal_health.py"))
health = importlib.util.module_from_spec(spec)
spec.loader.exec_module(health)


def smi():
    out = subprocess.run(health.smi_health_command(), capture_output=True, text=True, check=False).stdout
    return health.parse_smi_health(out)


def gpus_on_bus():
    base = "/sys/bus/pci/devices"
    found = []
    for name in sorted(os.listdir(base)):
        try:
            vendor = open(os.path.join(base, name, "vendor")).read().strip()
            klass = open(os.path.join(base, name, "class")).read().strip()
        except OSError:
            continue
        if vendor == "0x10de" and klass.startswith("0x03"):
            found.append(name)
    return found


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    read = {"smi": smi, "kmsg": lambda after: health.read_kmsg("/dev/kmsg", after),
            "driver_gpus": health.driver_gpus, "addresses": lambda interface: []}
    config = {"role": "worker", "gpus": gpus_on_bus(), "temp_dir": "/tmp", "min_free_bytes": 1 << 20,
              "readmit_passes": 4}
    state, first = {"record": None, "kmsg_seq": -1}, None
    start = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic()
    for number in range(rounds):
        state, findings, action = health.node_round(config, state, time.time(), read)
        if number == 0:
            first = {"findings": findings, "action": action, "state": state}
    wall = time.monotonic() - wall
    end = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(e.ru_utime - s.ru_utime + e.ru_stime - s.ru_stime for s, e in zip(start, end))
    per_round = cpu / rounds
    print(json.dumps({"gpus": config["gpus"], "rounds": rounds, "first_round": first, "cpu_s_per_round": round(per_round, 4),
                      "wall_s_per_round": round(wall / rounds, 4),
                      "share_of_a_core_at_15s": "%.2f%%" % (100 * per_round / 15)}, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
