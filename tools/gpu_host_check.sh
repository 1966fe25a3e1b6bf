#!/usr/bin/env bash
# Run raymetal's GPU-facing code on one real GPU host and record what it read.
#
#   tools/gpu_host_check.sh OUTDIR
#
# What the lab cannot give (a GPU, its driver, NCCL on a device) is unit-tested
# against recorded fixtures; this script makes those recordings on a real host
# and runs the real code there, so a fixture and a test can be checked against
# the machine they claim to describe:
#   1. the host as the modules read it: nvidia-smi (the CSV query the module
#      runs, `-q`, `topo -m`), every PCI function's ids and link attributes from
#      sysfs, the loaded kernel modules, the NVIDIA driver version;
#   2. nvidia_gpu_facts (query_smi), node_checks and fabric_facts through
#      ansible-playbook on localhost (tools/gpu_host_check.yml), and the Ray
#      labels raymetal derives from them (modules.json, labels.yaml);
#   3. a one-node Ray cluster started as raymetal's unit starts it (token auth,
#      --num-gpus and --labels-file from step 2), a task placed by the
#      gpu-model label that computes on the GPU with CuPy (ray_gpu.json), and
#      the acceptance role's NCCL all-reduce script through Ray (ray_nccl.json,
#      the complete NCCL_DEBUG=INFO log in nccl.log).
# Everything goes to OUTDIR/, and OUTDIR.tgz holds it all. It changes nothing on
# the host but for the Ray session it starts and stops (in a temporary dir).
#
# Needs: python3 with ray (2.60), cupy and ansible-core importable, nvidia-smi.
# tests/unit/test_gpu_host_recording.py reads such a recording
# (tests/fixtures/nvidia/recorded-*/) with the same modules and filters.
set -uo pipefail

out=${1:?usage: tools/gpu_host_check.sh OUTDIR}
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
mkdir -p "$out"
out=$(cd "$out" && pwd)
export LC_ALL=C.UTF-8 ANSIBLE_CONFIG="$repo/ansible.cfg" ANSIBLE_NOCOLOR=1 RAY_USAGE_STATS_ENABLED=0

step() { printf '\n=== %s\n' "$*"; }

step "1. the host"
{
  uname -r
  cat /sys/module/nvidia/version 2>/dev/null || echo "no /sys/module/nvidia/version"
} > "$out/kernel.txt"
nvidia-smi --query-gpu=index,pci.bus_id,name,driver_version,memory.total --format=csv,noheader,nounits > "$out/smi.csv"
nvidia-smi -q > "$out/smi-q.txt"
nvidia-smi topo -m > "$out/smi-topo.txt" 2>&1 || true
cat /proc/modules > "$out/proc-modules.txt"
cat "$out/kernel.txt" "$out/smi.csv"
# The sysfs files the modules read, for every PCI function (ids, class, PCIe link).
"$py" - "$out/sys" <<'EOF'
import os, shutil, sys
dest = sys.argv[1]
keep = ("vendor", "device", "class", "subsystem_vendor", "subsystem_device", "numa_node",
        "current_link_speed", "current_link_width", "max_link_speed", "max_link_width")
base = "/sys/bus/pci/devices"
for addr in sorted(os.listdir(base)):
    target = os.path.join(dest, "bus", "pci", "devices", addr)
    os.makedirs(target, exist_ok=True)
    for name in keep:
        try:
            with open(os.path.join(base, addr, name), encoding="ascii", errors="replace") as fh:
                value = fh.read()
        except OSError:
            continue
        with open(os.path.join(target, name), "w", encoding="ascii") as fh:
            fh.write(value)
for name in ("nvidia", "nvidia_peermem", "nvidia_uvm"):
    version = os.path.join("/sys/module", name, "version")
    if os.path.exists(os.path.join("/sys/module", name)):
        os.makedirs(os.path.join(dest, "module", name), exist_ok=True)
        if os.path.exists(version):
            shutil.copyfile(version, os.path.join(dest, "module", name, "version"))
print("recorded", len(os.listdir(base)), "PCI functions")
EOF

step "2. raymetal's modules on this host (ansible-playbook, local)"
timeout 300 "$py" -m ansible.cli.playbook -i localhost, -c local \
  -e ansible_python_interpreter="$(command -v "$py")" -e gpu_check_out="$out" \
  "$repo/tools/gpu_host_check.yml" 2>&1 | tee "$out/playbook.log"
cat "$out/labels.yaml" 2>/dev/null

step "3. Ray on this host, with raymetal's flags"
work=$(mktemp -d /tmp/raymetal-gpu-check.XXXXXX)
export RAY_AUTH_MODE=token RAY_AUTH_TOKEN
RAY_AUTH_TOKEN=$("$py" -c 'import secrets; print(secrets.token_hex(32))')
ip=$("$py" -c 'import json,sys; r=json.load(open(sys.argv[1]))["fabric_facts"]; print((r.get("ansible_facts") or {}).get("fabric", {}).get("address") or "127.0.0.1")' "$out/modules.json" 2>/dev/null || echo 127.0.0.1)
gpus=$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1]))["nvidia_gpu_facts"]["ansible_facts"]["nvidia_gpu"]["count"])' "$out/modules.json" 2>/dev/null || echo 0)
timeout 120 "$py" -m ray.scripts.scripts start --head --node-ip-address="$ip" --port=6379 \
  --num-gpus="$gpus" --num-cpus=4 --labels-file="$out/labels.yaml" --include-dashboard=false \
  --temp-dir="$work" --disable-usage-stats 2>&1 | tail -5
timeout 180 "$py" - "$ip:6379" "$out/labels.yaml" > "$out/ray_gpu.json" <<'EOF'
import json, sys
import ray
import yaml
labels = yaml.safe_load(open(sys.argv[2]))
model = labels.get("raymetal.io/gpu-model")
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_gpus=1, label_selector={"raymetal.io/gpu-model": model})
def on_gpu():
    import os
    import cupy
    a = cupy.arange(1 << 20, dtype=cupy.float64)
    props = cupy.cuda.runtime.getDeviceProperties(0)
    return {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "device_name": props["name"].decode(), "sum_ok": float(a.sum()) == (1 << 20) * ((1 << 20) - 1) / 2,
            "node_labels": getattr(ray.get_runtime_context(), "get_node_labels", dict)()}

nodes = [{"alive": n["Alive"], "resources": n["Resources"], "labels": n.get("Labels")} for n in ray.nodes()]
try:
    task = ray.get(on_gpu.remote(), timeout=120)
except Exception as exc:  # noqa: BLE001  (recorded as the task's result)
    task = {"error": "%s: %s" % (type(exc).__name__, (str(exc).strip().splitlines() or [""])[-1])}
print(json.dumps({"model_label": model, "nodes": nodes, "task": task}, indent=1, sort_keys=True))
ray.shutdown()
EOF
cat "$out/ray_gpu.json"
timeout 300 "$py" "$repo/roles/acceptance/files/ray_nccl.py" --address="$ip:6379" --mib=256 --iters=20 \
  --timeout=240 > "$out/ray_nccl.json" 2> "$out/ray_nccl.stderr"
tail -c 3000 "$out/ray_nccl.json"; tail -5 "$out/ray_nccl.stderr"
cp /tmp/raymetal-nccl-*/nccl.log "$out/nccl.log" 2>/dev/null || echo "no NCCL log left in /tmp"
timeout 60 "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1
rm -rf "$work"

tar -C "$(dirname "$out")" -czf "$out.tgz" "$(basename "$out")"
step "recorded in $out.tgz"
