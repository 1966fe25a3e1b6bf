#!/usr/bin/env python3
"""Run the health loop's rounds on a real GPU host while the GPU works hard, and record what they read.

    python3 tools/gpu_load_check.py OUTDIR [SECONDS]

A busy, hot GPU must not look sick: the health loop (module_utils/raymetal_health.py) quarantines a node on what
nvidia-smi's health query and the kernel log say, and a false quarantine takes a healthy node out of a training
run. This starts a bf16 matrix-product load on every GPU (PyTorch, a child process per GPU) for SECONDS (default
60), runs one round of the loop's checks every 2 s before, during and after it (no fabric check), and writes:

  OUTDIR/rounds.json   every round: its time from the load's start, findings, action, and the health query's row
  OUTDIR/smi-NN.csv    the health query's raw output of round NN (tests/unit/plugins/module_utils/test_health_checks.py replays them)
  OUTDIR/load.json     what the load did (TFLOP/s per GPU) and the hottest readings seen (temperature, power)

and prints a one-line verdict: how many rounds found anything.
"""

import importlib.util
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# The health module and the PCI scan as tools/gpu_health_round.py loads them (one copy of each).
spec = importlib.util.spec_from_file_location("gpu_health_round", os.path.join(HERE, "gpu_health_round.py"))
gpu_health_round = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_health_round)
health = gpu_health_round.health
gpus_on_bus = gpu_health_round.gpus_on_bus

LOAD = r'''
import json, sys, time, torch
gpu, seconds = int(sys.argv[1]), float(sys.argv[2])
torch.cuda.set_device(gpu)
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
start, count = time.time(), 0
while time.time() - start < seconds:
    for _ in range(20):
        c = a @ b
    torch.cuda.synchronize()
    count += 20
elapsed = time.time() - start
print(json.dumps({"gpu": gpu, "products": count, "seconds": round(elapsed, 1),
                  "tflops": round(count * 2 * 8192 ** 3 / elapsed / 1e12, 1), "name": torch.cuda.get_device_name(gpu)}))
'''


TELEMETRY = ("temperature.gpu", "power.draw", "clocks.sm", "utilization.gpu", "clocks_event_reasons.active")


def main():
    out = sys.argv[1]
    seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 60.0
    os.makedirs(out, exist_ok=True)
    raw = {}

    def smi():
        text = subprocess.run(health.smi_health_command(), capture_output=True, text=True, check=False).stdout
        raw["last"] = text
        return health.parse_smi_health(text)

    read = {"smi": smi, "kmsg": lambda after: health.read_kmsg("/dev/kmsg", after),
            "driver_gpus": health.driver_gpus, "addresses": lambda interface: []}
    config = {"role": "worker", "gpus": gpus_on_bus(), "temp_dir": "/tmp", "min_free_bytes": 1 << 20,
              "readmit_passes": 4}
    count = max(1, len(config["gpus"]))
    state = {"record": None, "kmsg_seq": -1}
    rounds, loads = [], []
    t0 = time.monotonic()
    procs = None
    number = 0
    # 10 s idle, the load, 10 s after it.
    while time.monotonic() - t0 < seconds + 20:
        now = time.monotonic() - t0
        if procs is None and now >= 10:
            procs = [subprocess.Popen([sys.executable, "-c", LOAD, str(i), str(seconds)], stdout=subprocess.PIPE,
                                      text=True) for i in range(count)]
        state, findings, action = health.node_round(config, state, time.time(), read)
        with open(os.path.join(out, "smi-%02d.csv" % number), "w") as handle:
            handle.write(raw.get("last", ""))
        rows = health.parse_smi_health(raw.get("last", ""))
        # What the GPU was going through (not read by the checks): temperature, power, SM clock, use, throttling.
        telemetry = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(TELEMETRY), "--format=csv,noheader,nounits"],
                                   capture_output=True, text=True, check=False).stdout.strip().splitlines()
        rounds.append({"round": number, "t_s": round(now - 10, 1), "loaded": procs is not None and now < 10 + seconds,
                       "findings": findings, "action": action, "rows": rows,
                       "telemetry": [dict(zip(TELEMETRY, (v.strip() for v in line.split(",")))) for line in telemetry]})
        number += 1
        time.sleep(2)
    for proc in procs or []:
        text, _ = proc.communicate(timeout=120)
        loads.append(json.loads(text.strip().splitlines()[-1]) if text.strip() else {"error": proc.returncode})
    with open(os.path.join(out, "rounds.json"), "w") as handle:
        json.dump(rounds, handle, indent=1, sort_keys=True, default=str)

    def hottest(key):
        values = []
        for rnd in rounds:
            for row in rnd["telemetry"]:
                try:
                    values.append(float(row.get(key)))
                except (TypeError, ValueError):
                    pass
        return max(values) if values else None

    keys = TELEMETRY[:4]
    summary = {"gpus": config["gpus"], "load": loads, "rounds": len(rounds),
               "rounds_loaded": sum(1 for r in rounds if r["loaded"]),
               "rounds_with_findings": sum(1 for r in rounds if r["findings"]),
               "actions": sorted(set(str(r["action"]) for r in rounds)),
               "throttle_reasons": sorted(set(row.get("clocks_event_reasons.active") for rnd in rounds
                                              for row in rnd["telemetry"])),
               "max": dict((k, hottest(k)) for k in keys if hottest(k) is not None)}
    with open(os.path.join(out, "load.json"), "w") as handle:
        json.dump(summary, handle, indent=1, sort_keys=True)
    print(json.dumps(summary, sort_keys=True))


if __name__ == "__main__":
    main()
