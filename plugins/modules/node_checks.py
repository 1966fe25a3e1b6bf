#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""Check one node's fitness for distributed GPU work from sysfs, without traffic."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: node_checks
short_description: Check a node's RDMA ports, PCIe links, GPUDirect RDMA and GPU count from sysfs
version_added: "0.2.0"
description:
  - Reads sysfs under O(sysfs_root) and sends no traffic.
  - "InfiniBand and RoCE ports (C(class/infiniband/*/ports/*)): state, physical state, rate, link
    layer, the error counters in C(counters/), and the firmware of each HCA (C(fw_ver))."
  - "PCIe links (C(bus/pci/devices/*)) of every NVIDIA GPU (vendor C(0x10de), class C(0x03xxxx)) and
    every HCA (a PCI function behind an RDMA device): current against maximum link speed and width.
    A GPU at a lower speed than its maximum is normal when it is idle (power management), so only
    its width counts; an HCA below its maximum speed or width is reported."
  - Whether C(nvidia_peermem) is loaded (C(module/nvidia_peermem)), the NVIDIA driver version
    (C(module/nvidia/version)), the kernel release and the versions of O(packages).
  - "GPU health, where NVIDIA GPUs are on the PCI bus: uncorrectable ECC errors, pending page retirement and
    pending or failed row remapping (one C(nvidia-smi --query-gpu) run), GPUs the driver no longer holds
    (O(nvidia_proc)), and the driver's Xid lines in the kernel log (O(kernel_log)). A GPU fault is a C(fail) of
    class C(hardware); an Xid a program causes (an illegal address in its kernel) is no finding. The same
    functions (C(module_utils/raymetal_health.py)) serve the node's health loop."
  - "Counter growth: the error counters of every port are kept in O(state_file); the next run reports
    how much each grew (a flapping link shows as C(link_downed) growth). Counters that went down
    (reboot, reset) start a new baseline. Updating that record is not reported as a change, and check
    mode leaves it alone."
  - "Returns the C(node_checks) fact with the figures and RV(ansible_facts.node_checks.findings): one
    entry per problem on this node (C(fail) or C(warn)) with a readable message. Comparisons across
    nodes (rates, firmware, versions) are made by the C(acceptance_verdicts) filter."
options:
  sysfs_root:
    description: Root of the sysfs tree to read. Change it only for tests.
    type: path
    default: /sys
  state_file:
    description:
      - File where the port error counters of this run are kept for the next one.
      - Empty disables the record (no growth is reported).
    type: path
    default: /var/lib/raymetal/node_checks.json
  expected_gpus:
    description: Number of GPUs this node must have; C(-1) does not check.
    type: int
    default: -1
  ignore_ports:
    description: RDMA ports left out of every check, as C(device:port) (C(mlx5_9:1)), e.g. uncabled ones.
    type: list
    elements: str
    default: []
  require_peermem:
    description: Fail when a node with NVIDIA GPUs and active InfiniBand or RoCE ports lacks C(nvidia_peermem).
    type: bool
    default: true
  packages:
    description: OS packages whose installed version is reported (C(dpkg-query) or C(rpm)); missing ones are null.
    type: list
    elements: str
    default: [rdma-core]
  interface:
    description:
      - Fabric interface whose link rate is reported in RV(ansible_facts.node_checks.link), the reference for
        traffic thresholds. Empty leaves it out.
    type: str
    default: ""
  nvidia_smi:
    description:
      - C(nvidia-smi) to query for GPU health (uncorrectable ECC errors, pending page retirement, pending or failed
        row remapping) when NVIDIA GPUs are on the PCI bus. Empty finds it on the C(PATH); when there is none the
        query is left out.
    type: str
    default: ""
  kernel_log:
    description:
      - The kernel log to read the NVIDIA driver's Xid and "fallen off the bus" lines from (C(/dev/kmsg)). A
        hardware Xid (79, 48, 95...) is a C(fail), an Xid a program causes (13, 31, 43, 45) is no finding, an
        unknown one a C(warn). Empty leaves the kernel log out; an unreadable one is reported in
        RV(ansible_facts.node_checks.kernel_log), not failed.
    type: path
    default: /dev/kmsg
  nvidia_proc:
    description: Where the NVIDIA driver lists the GPUs it holds; a GPU on the PCI bus missing there is a C(fail).
    type: path
    default: /proc/driver/nvidia/gpus
  python:
    description:
      - Python of the Ray venv; its version and those of C(ray), NCCL (C(nvidia-nccl-cu13) or C(nvidia-nccl-cu12)),
        CuPy (C(cupy-cuda13x) or C(cupy-cuda12x)) and the CUDA runtime (C(nvidia-cuda-runtime),
        C(nvidia-cuda-runtime-cu13) or C(nvidia-cuda-runtime-cu12)) installed there are reported (null when absent).
      - A path that does not exist is a C(fail) finding. Empty leaves these versions out.
      - The interpreter gets 120 seconds (coreutils C(timeout)); one that does not answer in that time (a hung
        filesystem under the venv) is a C(fail) finding that says so, instead of holding the run.
    type: path
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - raymetal.cluster.attributes
  - raymetal.cluster.attributes.facts
notes:
  - Standard library only on the node; reads sysfs, C(/proc/driver/nvidia) and the kernel log, and runs only
    C(dpkg-query) or C(rpm) and, where GPUs are on the PCI bus, one C(nvidia-smi) query.
author:
  - raymetal contributors (@raymetal)
"""

EXAMPLES = r"""
- name: Check the node, expecting 8 GPUs
  raymetal.cluster.node_checks:
    expected_gpus: 8

- name: Leave an uncabled storage port out
  raymetal.cluster.node_checks:
    ignore_ports: [mlx5_9:1]

- name: Show the problems
  ansible.builtin.debug:
    msg: "{{ ansible_facts['node_checks']['findings'] | map(attribute='message') | list }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts added to the host.
  returned: success
  type: complex
  contains:
    node_checks:
      description: What was read and what is wrong on this node.
      returned: success
      type: complex
      contains:
        ports:
          description: Every RDMA port found (ignored ones left out).
          type: list
          elements: dict
          sample:
            - {name: mlx5_0, port: 1, state: ACTIVE, phys_state: LinkUp, rate: "400 Gb/sec (4X NDR)",
               rate_gbps: 400.0, link_layer: InfiniBand, netdev: ib0, fw_ver: "28.39.1002",
               counters: {link_downed: 0, symbol_error: 0}, growth: {link_downed: 0, symbol_error: 0}}
          contains:
            name: {description: RDMA device name., type: str, sample: mlx5_0}
            port: {description: Port number., type: int, sample: 1}
            state: {description: "Logical state (C(ACTIVE), C(DOWN), C(INIT)...).", type: str, sample: ACTIVE}
            phys_state: {description: "Physical state (C(LinkUp), C(Polling), C(Disabled)...).", type: str, sample: LinkUp}
            rate: {description: Rate as the kernel reports it., type: str, sample: "400 Gb/sec (4X NDR)"}
            rate_gbps: {description: "Rate in Gb/s, or null.", type: float, sample: 400.0}
            link_layer: {description: C(InfiniBand) or C(Ethernet)., type: str, sample: InfiniBand}
            netdev: {description: "Network interface of the port, or null.", type: str, sample: ib0}
            fw_ver: {description: "Firmware of the HCA, or null.", type: str, sample: "28.39.1002"}
            counters: {description: Error counters now., type: dict, sample: {link_downed: 0}}
            growth:
              description: Growth of each counter since the last run; null on the first run or after a reset.
              type: dict
              sample: {link_downed: 3}
        pcie:
          description: PCIe link of every NVIDIA GPU and every HCA.
          type: list
          elements: dict
          sample:
            - {address: "0000:18:00.0", kind: gpu, vendor: "0x10de", device: "0x2330", name: null,
               speed_gts: 32.0, max_speed_gts: 32.0, width: 16, max_width: 16}
          contains:
            address: {description: PCI address., type: str, sample: "0000:18:00.0"}
            kind: {description: C(gpu) or C(hca)., type: str, sample: gpu}
            vendor: {description: PCI vendor ID., type: str, sample: "0x10de"}
            device: {description: PCI device ID., type: str, sample: "0x2330"}
            name: {description: "RDMA device name for an HCA, null for a GPU.", type: str, sample: mlx5_0}
            speed_gts: {description: "Current link speed in GT/s, or null.", type: float, sample: 32.0}
            max_speed_gts: {description: "Maximum link speed in GT/s, or null.", type: float, sample: 32.0}
            width: {description: "Current link width (lanes), or null.", type: int, sample: 16}
            max_width: {description: "Maximum link width, or null.", type: int, sample: 16}
        gpu_count:
          description: NVIDIA GPUs on the PCI bus.
          type: int
          sample: 8
        nvidia_peermem:
          description: Whether the nvidia_peermem kernel module is loaded.
          type: bool
          sample: true
        hca_firmware:
          description: Firmware version of each HCA.
          type: dict
          sample: {mlx5_0: "28.39.1002"}
        versions:
          description: Kernel, NVIDIA driver and package versions (null when absent).
          type: dict
          sample: {kernel: "6.1.0-28-amd64", nvidia_driver: "570.133.20", rdma-core: "44.0-2", python: "3.11.2",
                   ray: "2.60.0", nccl: "2.32.3", cupy: null, cuda: null}
        link:
          description:
            - The fabric interface (option O(interface)) and its rate in Gb/s, null when unknown. For an interface
              bound to an RDMA port (IPoIB, RoCE) the port's rate, else the interface's C(speed).
          type: dict
          sample: {interface: ib0, gbps: 400.0, source: "mlx5_0:1"}
        gpu_health:
          description:
            - One entry per GPU from C(nvidia-smi --query-gpu) (fields of C(HEALTH_QUERY) in
              C(module_utils/raymetal_health.py); C([N/A]) is null, Yes/No are booleans); null when no GPU is on the
              PCI bus or there is no C(nvidia-smi).
          type: list
          elements: dict
          sample:
            - {index: 0, pci.bus_id: "00000000:00:06.0", ecc.mode.current: Enabled,
               ecc.errors.uncorrected.volatile.total: 0, retired_pages.pending: null, remapped_rows.pending: false}
        xid:
          description: The driver's Xid lines in the kernel log, each with its class (C(hardware), C(application), C(unknown)).
          type: list
          elements: dict
          sample:
            - {seq: 360, pci: "0000:00:06", xid: 31, class: application, process: python3,
               meaning: "GPU memory page fault (a program's illegal address)"}
        kernel_log:
          description: C(read), C(off), or why the kernel log could not be read.
          type: str
          sample: read
        driver_gpus:
          description: PCI addresses of the GPUs the NVIDIA driver holds; null when it is not loaded.
          type: list
          elements: str
          sample: ["0000:00:06.0"]
        baseline:
          description: C(new) when no earlier counters were on record, C(compared) otherwise, C(off) without a state file.
          type: str
          sample: compared
        findings:
          description: Problems on this node, worst first.
          type: list
          elements: dict
          sample:
            - {severity: fail, check: port_state, subject: "mlx5_3:1", message: "mlx5_3:1 (ib3) is DOWN, physical state Polling"}
          contains:
            severity: {description: C(fail) or C(warn)., type: str, sample: fail}
            check: {description: Which check found it., type: str, sample: port_state}
            class:
              description:
                - C(hardware) for a GPU fault that needs an operator (the health loop does not re-admit the node by
                  itself); absent for the other findings.
              type: str
              sample: hardware
            subject: {description: "The port, PCI device or module concerned.", type: str, sample: "mlx5_3:1"}
            message: {description: One readable sentence with the figure., type: str, sample: "mlx5_3:1 (ib3) is DOWN"}
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule

try:  # as a collection (raymetal.cluster)
    from ansible_collections.raymetal.cluster.plugins.module_utils.raymetal_sysfs import (
        list_dir, natural_key, read_int, read_text)
except ImportError:  # as a playbook project (ansible.cfg: module_utils = plugins/module_utils)
    from ansible.module_utils.raymetal_sysfs import list_dir, natural_key, read_int, read_text
try:
    from ansible_collections.raymetal.cluster.plugins.module_utils import raymetal_health as health
except ImportError:
    from ansible.module_utils import raymetal_health as health

NVIDIA_VENDOR = 0x10DE
GPU_BASE_CLASS = 0x03

# Counters of ports/N/counters that count errors (the data and packet counters are left out).
ERROR_COUNTERS = (
    "symbol_error", "link_error_recovery", "link_downed", "port_rcv_errors",
    "port_rcv_remote_physical_errors", "port_rcv_switch_relay_errors", "port_xmit_discards",
    "port_xmit_constraint_errors", "port_rcv_constraint_errors", "local_link_integrity_errors",
    "excessive_buffer_overrun_errors", "VL15_dropped",
)
# Growth of these means the link went down or retrained: a flapping link, a failure.
FLAP_COUNTERS = ("link_downed", "link_error_recovery")

C_LOCALE = {"LANG": "C", "LC_ALL": "C", "LC_MESSAGES": "C"}


def strip_number(text):
    """'4: ACTIVE' -> 'ACTIVE', '5: LinkUp' -> 'LinkUp'; None -> 'UNKNOWN'."""
    if not text:
        return "UNKNOWN"
    return text.split(":", 1)[-1].strip()


def parse_rate(text):
    """'400 Gb/sec (4X NDR)' -> 400.0; '2.5 Gb/sec (1X SDR)' -> 2.5; else None."""
    match = re.match(r"\s*([0-9.]+)\s*Gb/sec", text or "")
    return float(match.group(1)) if match else None


def parse_link_speed(text):
    """'32.0 GT/s PCIe' -> 32.0; '8 GT/s' -> 8.0; 'Unknown' -> None."""
    match = re.match(r"\s*([0-9.]+)\s*GT/s", text or "")
    return float(match.group(1)) if match else None


def _pci_address(path):
    """The PCI address (0000:18:00.0) a sysfs device link resolves to, or None."""
    try:
        real = os.path.realpath(path)
    except OSError:
        return None
    name = os.path.basename(real)
    return name if re.match(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$", name) else None


def read_ports(sysfs_root, ignore=()):
    """Every RDMA port with its state, rate, counters and HCA firmware."""
    ports = []
    base = os.path.join(sysfs_root, "class", "infiniband")
    for device in list_dir(base):
        dev_path = os.path.join(base, device)
        fw_ver = read_text(os.path.join(dev_path, "fw_ver"))
        nets = list_dir(os.path.join(dev_path, "device", "net"))
        for port_name in [p for p in list_dir(os.path.join(dev_path, "ports")) if p.isdigit()]:
            port = int(port_name)
            if "%s:%d" % (device, port) in ignore:
                continue
            port_path = os.path.join(dev_path, "ports", port_name)
            counters = {}
            for counter in ERROR_COUNTERS:
                value = read_int(os.path.join(port_path, "counters", counter))
                if value is not None:
                    counters[counter] = value
            rate = read_text(os.path.join(port_path, "rate"))
            ports.append({
                "name": device,
                "port": port,
                "state": strip_number(read_text(os.path.join(port_path, "state"))).upper(),
                "phys_state": strip_number(read_text(os.path.join(port_path, "phys_state"))),
                "rate": rate,
                "rate_gbps": parse_rate(rate),
                "link_layer": read_text(os.path.join(port_path, "link_layer")) or "InfiniBand",
                "netdev": nets[port - 1] if len(nets) >= port else (nets[0] if nets else None),
                "fw_ver": fw_ver,
                "counters": counters,
                "growth": None,
                "_pci": _pci_address(os.path.join(dev_path, "device")),
            })
    return ports


def read_pcie(sysfs_root, hca_by_address):
    """PCIe link of every NVIDIA GPU and every PCI function behind an RDMA device."""
    links = []
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    for address in list_dir(base):
        path = os.path.join(base, address)
        vendor = read_int(os.path.join(path, "vendor"), 16)
        pci_class = read_int(os.path.join(path, "class"), 16)
        if vendor is None or pci_class is None:
            continue
        if vendor == NVIDIA_VENDOR and pci_class >> 16 == GPU_BASE_CLASS:
            kind = "gpu"
        elif address in hca_by_address:
            kind = "hca"
        else:
            continue
        device = read_int(os.path.join(path, "device"), 16)
        links.append({
            "address": address,
            "kind": kind,
            "vendor": "0x%04x" % vendor,
            "device": "0x%04x" % device if device is not None else None,
            "name": hca_by_address.get(address),
            "speed_gts": parse_link_speed(read_text(os.path.join(path, "current_link_speed"))),
            "max_speed_gts": parse_link_speed(read_text(os.path.join(path, "max_link_speed"))),
            "width": read_int(os.path.join(path, "current_link_width")),
            "max_width": read_int(os.path.join(path, "max_link_width")),
        })
    return links


def counter_growth(ports, previous):
    """Fill each port's growth from the previous record; return the new record.

    A counter that went down (reboot, reset) makes that port start a new baseline (growth None).
    """
    record = {}
    for port in ports:
        key = "%s:%d" % (port["name"], port["port"])
        record[key] = dict(port["counters"])
        before = previous.get(key) if isinstance(previous, dict) else None
        if not isinstance(before, dict):
            continue
        growth = {}
        for counter, now in port["counters"].items():
            then = before.get(counter)
            if not isinstance(then, int):
                continue
            if now < then:
                growth = None
                break
            growth[counter] = now - then
        port["growth"] = growth
    return record


def _port_label(port):
    label = "%s:%d" % (port["name"], port["port"])
    return "%s (%s)" % (label, port["netdev"]) if port["netdev"] else label


def _gbps(value):
    return "%g Gb/s" % value if value is not None else "unknown rate"


def _width(link):
    return "x%s of x%s" % (link["width"], link["max_width"])


def evaluate(facts, expected_gpus=-1, require_peermem=True):
    """Findings on one node, worst first (see RETURN)."""
    found = []
    ports = facts["ports"]
    for port in ports:
        subject = "%s:%d" % (port["name"], port["port"])
        if port["state"] != "ACTIVE" or port["phys_state"] != "LinkUp":
            found.append(health.finding("fail", "port_state", subject, "%s is %s, physical state %s" % (
                _port_label(port), port["state"], port["phys_state"])))
        growth = port["growth"] or {}
        flaps = ["%s +%d" % (c, growth[c]) for c in FLAP_COUNTERS if growth.get(c)]
        others = ["%s +%d" % (c, n) for c, n in sorted(growth.items()) if n and c not in FLAP_COUNTERS]
        if flaps:
            found.append(health.finding("fail", "port_flapping", subject, "%s is flapping since the last check: %s" % (
                _port_label(port), ", ".join(flaps + others))))
        elif others:
            found.append(health.finding("warn", "port_errors", subject, "%s error counters grew since the last check: %s" % (
                _port_label(port), ", ".join(others))))
    # Rates within the node, per link layer: a port that trained below its siblings.
    for layer in sorted(set(p["link_layer"] for p in ports)):
        active = [p for p in ports if p["link_layer"] == layer and p["state"] == "ACTIVE" and p["rate_gbps"]]
        best = max([p["rate_gbps"] for p in active] or [0])
        for port in active:
            if port["rate_gbps"] < best:
                found.append(health.finding("fail", "port_rate", "%s:%d" % (port["name"], port["port"]),
                                            "%s rate %s, other %s ports %s" % (
                                                _port_label(port), _gbps(port["rate_gbps"]), layer, _gbps(best))))
    firmware = {}
    for name, fw_ver in facts["hca_firmware"].items():
        firmware.setdefault(fw_ver, []).append(name)
    if len(firmware) > 1:
        parts = ["%s %s" % (",".join(sorted(names, key=natural_key)), fw) for fw, names in sorted(firmware.items())]
        found.append(health.finding("warn", "hca_firmware", "hca", "mixed HCA firmware: %s" % "; ".join(parts)))
    for link in facts["pcie"]:
        what = "GPU %s" % link["address"] if link["kind"] == "gpu" else "HCA %s (%s)" % (link["name"], link["address"])
        if link["width"] is not None and link["max_width"] is not None and link["width"] < link["max_width"]:
            found.append(health.finding("fail", "pcie_width", link["address"], "%s PCIe link %s" % (what, _width(link))))
        if (link["kind"] == "hca" and link["speed_gts"] is not None and link["max_speed_gts"] is not None
                and link["speed_gts"] < link["max_speed_gts"]):
            found.append(health.finding("fail", "pcie_speed", link["address"], "%s PCIe link at %g GT/s of %g GT/s" % (
                what, link["speed_gts"], link["max_speed_gts"])))
    rdma_active = [p for p in ports if p["state"] == "ACTIVE"]
    if require_peermem and facts["gpu_count"] and rdma_active and not facts["nvidia_peermem"]:
        found.append(health.finding("fail", "nvidia_peermem", "nvidia_peermem",
                                    "nvidia_peermem is not loaded: %d GPU(s) and %d active RDMA port(s), so GPUDirect RDMA "
                                    "is off (fix: modprobe nvidia_peermem; the nvidia_driver role loads it on RDMA fabrics)"
                                    % (facts["gpu_count"], len(rdma_active))))
    found.extend(health.gpu_health_findings(facts.get("gpu_health") or []))
    found.extend(health.xid_findings(facts.get("xid") or []))
    gpus_on_bus = [link["address"] for link in facts["pcie"] if link["kind"] == "gpu"]
    found.extend(health.lost_gpu_findings(gpus_on_bus, facts.get("driver_gpus")))
    if expected_gpus >= 0 and facts["gpu_count"] != expected_gpus:
        found.append(health.finding("fail", "gpu_count", "gpus", "%d GPU(s) on the PCI bus, %d expected" % (
            facts["gpu_count"], expected_gpus)))
    found.sort(key=lambda f: f["severity"] != "fail")
    return found


def package_versions(module, names):
    """Installed version of each package, None when absent or no package tool."""
    versions = dict((name, None) for name in names)
    dpkg = module.get_bin_path("dpkg-query")
    rpm = module.get_bin_path("rpm")
    for name in names:
        if dpkg:
            cmd = [dpkg, "-W", "-f=${db:Status-Abbrev}|${Version}", name]
        elif rpm:
            cmd = [rpm, "-q", "--qf", "ii |%{VERSION}-%{RELEASE}", name]
        else:
            break
        rc, out, dummy = module.run_command(cmd, environ_update=C_LOCALE)
        status, dummy, version = out.partition("|")
        if rc == 0 and status.startswith("ii") and version.strip():
            versions[name] = version.strip()
    return versions


# The distributions that bring NCCL, CuPy and the CUDA runtime into Ray's venv, for CUDA 13 (driver
# 580 and later; the CUDA 13 runtime wheel has no suffix) and CUDA 12; the first one installed is reported.
# A CUDA 13 stack (cupy-cuda13x, nvidia-nccl-cu13) reported nothing before: seen on a real H100 host.
NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu13", "nvidia-nccl-cu12")
CUPY_DISTRIBUTIONS = ("cupy-cuda13x", "cupy-cuda12x")
CUDA_RUNTIME_DISTRIBUTIONS = ("nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12")

# Run by the Ray venv's Python: the versions of what Ray jobs use (stdlib only).
VERSIONS_PROGRAM = r"""
import json, platform
from importlib import metadata
def version(*names):
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return None
print(json.dumps({"python": platform.python_version(), "ray": version("ray"),
                  "nccl": version(*%r), "cupy": version(*%r), "cuda": version(*%r)}))
""" % (NCCL_DISTRIBUTIONS, CUPY_DISTRIBUTIONS, CUDA_RUNTIME_DISTRIBUTIONS)
SOFTWARE = ("python", "ray", "nccl", "cupy", "cuda")
# Seconds the venv's Python gets to report (importlib.metadata reads the venv's dist-info: a hung filesystem under
# it would otherwise hold acceptance, or the deploy's gate, for every node).
VERSIONS_TIMEOUT = 120


def venv_versions(module, python):
    """Versions seen by the venv's Python; (versions, problem or None)."""
    empty = dict((name, None) for name in SOFTWARE)
    if not os.path.exists(python):
        return empty, "Ray's Python %s does not exist (fix: deploy first, or set the venv path)" % python
    timeout = module.get_bin_path("timeout")
    # coreutils' timeout: SIGTERM at the limit, SIGKILL 5 s later; exit status 124 (or 137) when it had to.
    limit = [timeout, "--kill-after=5", str(VERSIONS_TIMEOUT)] if timeout else []
    rc, out, err = module.run_command(limit + [python, "-c", VERSIONS_PROGRAM], environ_update=C_LOCALE)
    try:
        data = json.loads(out) if rc == 0 else None
    except ValueError:
        data = None
    if limit and rc in (124, 137):
        return empty, ("%s did not report versions within %d s (a hung filesystem under the venv?): it was stopped"
                       % (python, VERSIONS_TIMEOUT))
    if not isinstance(data, dict):
        return empty, "%s could not report versions (rc=%s): %s" % (python, rc, (err or out).strip()[-300:])
    return dict((name, data.get(name)) for name in SOFTWARE), None


def collect(sysfs_root, ignore_ports=()):
    """Everything read from sysfs (no findings, no growth)."""
    ports = read_ports(sysfs_root, set(ignore_ports))
    hca_by_address = {}
    firmware = {}
    for port in ports:
        if port["_pci"]:
            hca_by_address.setdefault(port["_pci"], port["name"])
        if port["fw_ver"]:
            firmware[port["name"]] = port["fw_ver"]
    pcie = read_pcie(sysfs_root, hca_by_address)
    for port in ports:
        del port["_pci"]
    return {
        "ports": ports,
        "pcie": pcie,
        "gpu_count": len([link for link in pcie if link["kind"] == "gpu"]),
        "nvidia_peermem": os.path.isdir(os.path.join(sysfs_root, "module", "nvidia_peermem")),
        "hca_firmware": firmware,
        "versions": {"nvidia_driver": read_text(os.path.join(sysfs_root, "module", "nvidia", "version"))},
    }


def link_rate(sysfs_root, interface, ports):
    """{interface, gbps, source}: the RDMA port's rate for IPoIB/RoCE interfaces, else sysfs speed (Mb/s)."""
    for port in ports:
        if port["netdev"] == interface and port["rate_gbps"]:
            return {"interface": interface, "gbps": port["rate_gbps"], "source": "%s:%d" % (port["name"], port["port"])}
    speed = read_int(os.path.join(sysfs_root, "class", "net", interface, "speed"))
    if speed is not None and speed > 0:
        return {"interface": interface, "gbps": speed / 1000.0, "source": "speed"}
    return {"interface": interface, "gbps": None, "source": None}


def load_state(path):
    """The previous counters, {} when there is no record; raises ValueError on a corrupt one."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return {}
    data = json.loads(text) if text.strip() else {}
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return data.get("counters", {})


def save_state(path, record):
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, mode=0o755, exist_ok=True)
    tmp = "%s.tmp.%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump({"counters": record}, handle, sort_keys=True)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def read_gpu_health(module, facts):
    """Add gpu_health, driver_gpus, xid and kernel_log to facts; return why the GPU query failed, if it did."""
    params = module.params
    facts["gpu_health"], facts["xid"], problem = None, [], None
    facts["driver_gpus"] = health.driver_gpus(params["nvidia_proc"]) if facts["gpu_count"] else None
    smi = params["nvidia_smi"] or (module.get_bin_path("nvidia-smi") if facts["gpu_count"] else None)
    if facts["gpu_count"] and smi:
        command = health.smi_health_command(smi)
        rc, out, err = module.run_command(command, environ_update=C_LOCALE)
        if rc != 0:
            problem = "'%s' failed with rc=%d: %s" % (" ".join(command), rc, (err or out).strip()[-300:])
        else:
            try:
                facts["gpu_health"] = health.parse_smi_health(out)
            except ValueError as exc:
                problem = str(exc)
    if not params["kernel_log"]:
        facts["kernel_log"] = "off"
        return problem
    try:
        facts["xid"] = health.xid_events(health.read_kmsg(params["kernel_log"]))
        facts["kernel_log"] = "read"
    except OSError as exc:
        facts["kernel_log"] = "unreadable: %s" % exc
    return problem


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            state_file=dict(type="path", default="/var/lib/raymetal/node_checks.json"),
            expected_gpus=dict(type="int", default=-1),
            ignore_ports=dict(type="list", elements="str", default=[]),
            require_peermem=dict(type="bool", default=True),
            packages=dict(type="list", elements="str", default=["rdma-core"]),
            interface=dict(type="str", default=""),
            python=dict(type="path", default=""),
            nvidia_smi=dict(type="str", default=""),
            kernel_log=dict(type="path", default="/dev/kmsg"),
            nvidia_proc=dict(type="path", default="/proc/driver/nvidia/gpus"),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    params = module.params
    root = params["sysfs_root"]
    if not os.path.isdir(os.path.join(root, "bus")) and not os.path.isdir(os.path.join(root, "class")):
        module.fail_json(msg="sysfs_root %s has neither bus/ nor class/: it is not a sysfs tree" % root)
    facts = collect(root, params["ignore_ports"])
    facts["versions"]["kernel"] = os.uname().release
    facts["link"] = link_rate(root, params["interface"], facts["ports"]) if params["interface"] else None
    facts["versions"].update(package_versions(module, params["packages"]))
    state_file = params["state_file"]
    if state_file:
        try:
            previous = load_state(state_file)
        except (OSError, ValueError) as exc:
            module.warn("ignoring the unreadable counter record %s (%s); starting a new baseline" % (state_file, exc))
            previous = {}
        record = counter_growth(facts["ports"], previous)
        facts["baseline"] = "compared" if previous else "new"
        if not module.check_mode:
            try:
                save_state(state_file, record)
            except OSError as exc:
                module.fail_json(msg="cannot write the counter record %s: %s (fix: set state_file to a writable path "
                                     "or run with become)" % (state_file, exc))
    else:
        facts["baseline"] = "off"
    gpu_problem = read_gpu_health(module, facts)
    software_problem = None
    if params["python"]:
        software, software_problem = venv_versions(module, params["python"])
        facts["versions"].update(software)
    facts["findings"] = evaluate(facts, params["expected_gpus"], params["require_peermem"])
    if software_problem:
        facts["findings"].insert(0, health.finding("fail", "software", params["python"], software_problem))
    if gpu_problem:
        facts["findings"].append(health.finding("warn", "gpu_health", "nvidia-smi", gpu_problem))
    # The counter record is this module's own bookkeeping, not a change to the node's configuration.
    module.exit_json(changed=False, ansible_facts={"node_checks": facts})


if __name__ == "__main__":
    main()
