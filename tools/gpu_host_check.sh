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
#      the complete NCCL_DEBUG=INFO log in nccl.log);
#   4. what the health checks read (ECC, retired pages, remapped rows, the
#      kernel log's NVIDIA lines, DCGM where present) and one query's CPU cost;
#   5. Ray's cgroup v2 resource isolation with raymetal's flags, in a cgroup of
#      its own, and the tree Ray built there (skipped where mkdir fails);
#   6. a real Xid: a CUDA kernel writing to an illegal address (an
#      application's fault), and the kernel log lines the driver wrote.
# Everything goes to OUTDIR/, and OUTDIR.tgz holds it all. It changes nothing on
# the host but for the Ray sessions it starts and stops (in temporary dirs), the
# cgroup /sys/fs/cgroup/raymetal-check it creates and removes, and the GPU
# context step 6 faults on purpose (the driver recovers; the GPU stays healthy).
#
# Needs: python3 with ray (2.60), cupy and ansible-core importable, nvidia-smi.
# tests/unit/repository/test_gpu_host_recording.py reads such a recording
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

# The kernel log's NVIDIA records as /dev/kmsg gives them (prio,seq,usec,flags;text), one a line.
nvidia_kmsg() {
  "$py" - <<'EOF'
import os
fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
while True:
    try:
        rec = os.read(fd, 8192).decode("utf-8", "replace")
    except BlockingIOError:
        break
    except OSError as exc:  # EPIPE: a record overwritten while reading; go on
        if exc.errno == 32:
            continue
        raise
    text = rec.split(";", 1)[-1]
    if "NVRM" in text or "nvidia" in text.lower() or "Xid" in text:
        print(rec.rstrip("\n").splitlines()[0])
EOF
}

step "4. what a health check reads (issue 36): ECC, retired pages, remapped rows, the kernel log, DCGM"
# The fields the health loop queries; a name the driver does not know makes nvidia-smi fail, so
# the list is also checked against --help-query-gpu by the unit test that reads this recording.
health_fields=index,pci.bus_id,uuid,ecc.mode.current,ecc.errors.uncorrected.volatile.total,ecc.errors.uncorrected.aggregate.total,retired_pages.pending,remapped_rows.pending,remapped_rows.failure,remapped_rows.uncorrectable
nvidia-smi --help-query-gpu > "$out/smi-help-query-gpu.txt" 2>&1
nvidia-smi --query-gpu="$health_fields" --format=csv,noheader,nounits > "$out/smi-health.csv" 2> "$out/smi-health.stderr"
echo "rc=$?" >> "$out/smi-health.stderr"
nvidia-smi -q -d ECC,PAGE_RETIREMENT,ROW_REMAPPER > "$out/smi-q-health.txt" 2>&1
cat "$out/smi-health.csv" "$out/smi-health.stderr"
# The CPU one query costs (the loop runs it every ~15 s): children's user+sys over 5 runs.
"$py" - "$health_fields" > "$out/smi-cost.json" <<'EOF'
import json, resource, subprocess, sys, time
fields = sys.argv[1]
runs = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    subprocess.run(["nvidia-smi", "--query-gpu=" + fields, "--format=csv,noheader,nounits"],
                   capture_output=True, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    runs.append({"wall_s": round(time.monotonic() - t0, 4),
                 "cpu_s": round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 4)})
print(json.dumps({"query": fields, "runs": runs}, indent=1))
EOF
cat "$out/smi-cost.json"
# How the driver shows each GPU without nvidia-smi, and which kernel driver holds each NVIDIA function.
for f in /proc/driver/nvidia/gpus/*/information; do echo "== $f"; cat "$f"; done > "$out/proc-driver-gpus.txt" 2>&1
for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && echo "$(basename "$d") $(basename "$(readlink "$d/driver" 2>/dev/null)" 2>/dev/null)"
done > "$out/pci-drivers.txt"
cat "$out/proc-driver-gpus.txt" "$out/pci-drivers.txt"
# The kernel log as a health loop reads it: /dev/kmsg records (prio,seq,usec,flags;text), NVIDIA's lines only.
{ echo "dmesg_restrict=$(cat /proc/sys/kernel/dmesg_restrict 2>/dev/null)"; command -v journalctl || echo "no journalctl";
  command -v dmesg || echo "no dmesg"; } > "$out/kmsg-access.txt"
nvidia_kmsg > "$out/kmsg-nvrm.txt" 2>> "$out/kmsg-access.txt"
wc -l "$out/kmsg-nvrm.txt"; cat "$out/kmsg-access.txt"
{ command -v dcgmi && timeout 20 dcgmi discovery -l; command -v nv-hostengine; } > "$out/dcgm.txt" 2>&1 || echo "no dcgmi" >> "$out/dcgm.txt"
cat "$out/dcgm.txt"

step "5. Ray's cgroup v2 resource isolation on this kernel, with raymetal's decision"
{
  echo "fstype=$(stat -fc %T /sys/fs/cgroup)"; echo "pid1=$(cat /proc/1/comm)"; echo "self=$(cat /proc/self/cgroup)"
  echo "controllers=$(cat /sys/fs/cgroup/cgroup.controllers 2>/dev/null)"
  echo "subtree_control=$(cat /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null)"
} > "$out/cgroup.txt" 2>&1
cat "$out/cgroup.txt"
"$py" - "$repo" > "$out/isolation.json" <<'EOF'
import json, sys
sys.path[:0] = [sys.argv[1] + "/roles/ray/files", sys.argv[1] + "/plugins/filter"]
import ray_node_probe, ray_isolation
facts = ray_node_probe.isolation_facts()
print(json.dumps({"facts": facts, "plan": ray_isolation.ray_isolation_plan(facts)}, indent=1, sort_keys=True))
EOF
cat "$out/isolation.json"
iso=/sys/fs/cgroup/raymetal-check
if mkdir "$iso" 2>> "$out/cgroup.txt"; then
  echo "+cpu +memory" > /sys/fs/cgroup/cgroup.subtree_control 2>> "$out/cgroup.txt"
  work=$(mktemp -d /tmp/raymetal-iso.XXXXXX)
  # As systemd starts the unit: the starting shell inside the delegated cgroup, then `ray start`.
  ( echo $BASHPID > "$iso/cgroup.procs" && exec timeout 120 "$py" -m ray.scripts.scripts start --head \
      --node-ip-address=127.0.0.1 --port=6380 --num-cpus=8 --num-gpus=0 --include-dashboard=false \
      --temp-dir="$work" --disable-usage-stats --enable-resource-isolation --cgroup-path="$iso" \
      --system-reserved-cpu=2 --system-reserved-memory=2147483648 ) > "$out/isolation-start.log" 2>&1
  echo "ray start rc=$?" >> "$out/isolation-start.log"; tail -5 "$out/isolation-start.log"
  timeout 120 "$py" - 127.0.0.1:6380 "$iso" > "$out/isolation-run.json" 2>> "$out/isolation-start.log" <<'EOF'
import json, os, sys
import ray

def tree(root):
    rows = {}
    for base, dirs, _ in os.walk(root):
        rel = os.path.relpath(base, root)
        row = {}
        for name in ("cgroup.subtree_control", "cpu.weight", "memory.min", "memory.max"):
            try:
                row[name] = open(os.path.join(base, name)).read().strip()
            except OSError:
                pass
        procs = []
        try:
            for pid in open(os.path.join(base, "cgroup.procs")).read().split():
                try:
                    procs.append(open("/proc/%s/comm" % pid).read().strip())
                except OSError:
                    procs.append("?")
        except OSError:
            pass
        row["procs"] = sorted(procs)
        rows[rel] = row
    return rows

ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=1)
def where():
    return open("/proc/self/cgroup").read().strip()

task_cgroup = ray.get(where.remote(), timeout=60)
print(json.dumps({"task_cgroup": task_cgroup, "tree": tree(sys.argv[2])}, indent=1, sort_keys=True))
ray.shutdown()
EOF
  cat "$out/isolation-run.json"
  timeout 60 "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1
  sleep 2
  find "$iso" -type d > "$out/isolation-after-stop.txt" 2>&1
  cat "$out/isolation-after-stop.txt"
  find "$iso" -depth -type d -exec rmdir {} \; 2>/dev/null
  rm -rf "$work"
fi

step "6. a real Xid from the driver: an illegal address in a CUDA kernel (an application's fault, not the GPU's)"
timeout 120 "$py" - > "$out/xid-fault.txt" 2>&1 <<'EOF'
import cupy
kernel = cupy.RawKernel(r'extern "C" __global__ void wild(float *p) { p[(size_t)1 << 40] = 1.0f; }', "wild")
try:
    kernel((1,), (1,), (cupy.zeros(1, dtype=cupy.float32),))
    cupy.cuda.runtime.deviceSynchronize()
    print("no fault raised")
except Exception as exc:  # noqa: BLE001  (the fault is the point)
    print("raised: %s: %s" % (type(exc).__name__, exc))
EOF
cat "$out/xid-fault.txt"
sleep 2
nvidia_kmsg > "$out/kmsg-after-fault.txt"
diff "$out/kmsg-nvrm.txt" "$out/kmsg-after-fault.txt" | grep '^>' | cut -c3- > "$out/kmsg-xid.txt"
cat "$out/kmsg-xid.txt"
nvidia-smi --query-gpu="$health_fields" --format=csv,noheader,nounits > "$out/smi-health-after-fault.csv" 2>&1
cat "$out/smi-health-after-fault.csv"
# The modules again, now that the kernel log holds the Xid: node_checks must read it from /dev/kmsg.
mkdir -p "$out/after-fault"
timeout 300 "$py" -m ansible.cli.playbook -i localhost, -c local \
  -e ansible_python_interpreter="$(command -v "$py")" -e gpu_check_out="$out/after-fault" \
  "$repo/tools/gpu_host_check.yml" > "$out/after-fault/playbook.log" 2>&1
"$py" -c 'import json,sys; n=json.load(open(sys.argv[1]))["node_checks"]["ansible_facts"]["node_checks"]; print(json.dumps({k: n.get(k) for k in ("kernel_log", "xid", "gpu_health", "driver_gpus", "findings")}, indent=1))' "$out/after-fault/modules.json"

tar -C "$(dirname "$out")" -czf "$out.tgz" "$(basename "$out")"
step "recorded in $out.tgz"
