#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: raymetal contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_gpu_facts
short_description: Find NVIDIA GPUs and NVSwitches on the PCI bus, optionally check them against nvidia-smi
description:
  - Walks C(<sysfs_root>/bus/pci/devices/*) and reads each device's C(vendor), C(class) and C(device) files.
    No driver and no C(nvidia-smi) are needed, so it also works before the driver is installed.
  - A GPU is a device with vendor C(0x10de) and class C(0x0300xx) (VGA controller, consumer and workstation cards)
    or C(0x0302xx) (3D controller, data-centre cards). Audio and USB functions of the same card are not GPUs.
  - An NVSwitch is an NVIDIA device of class C(0x0680xx) (other bridge), as HGX/DGX baseboards expose them
    (A100 NVSwitch C(0x1af1), H100 NVSwitch C(0x22a3)). Blackwell HGX baseboards do not show their NVSwitches
    on the host PCI bus, so they are not counted there.
  - With O(query_smi=true) it also runs C(nvidia-smi --query-gpu=... --format=csv,noheader,nounits), returns the
    driver facts and lists every disagreement with the PCI bus and with O(expected_branch) in RV(problems).
  - Stdlib only on the managed node.
version_added: "0.1.0"
author:
  - raymetal contributors (@raymetal)
options:
  sysfs_root:
    description: Root of the sysfs tree to read; tests point it at a recorded tree.
    type: path
    default: /sys
  query_smi:
    description: Also run nvidia-smi and compare what it sees with the PCI bus.
    type: bool
    default: false
  expected_branch:
    description:
      - Driver branch the loaded driver must belong to (the first field of the version, C(570) in C(570.133.20)).
      - Only used with O(query_smi=true). Empty means do not check.
    type: str
    default: ""
  nvidia_smi_path:
    description: nvidia-smi executable; looked up on PATH when empty.
    type: str
    default: ""
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
  - raymetal.cluster.attributes
  - raymetal.cluster.attributes.facts
notes:
  - Supports check mode; it only reads.
"""

EXAMPLES = r"""
- name: Find NVIDIA GPUs on the PCI bus
  raymetal.cluster.nvidia_gpu_facts:

- name: Use the GPU count
  ansible.builtin.debug:
    msg: "{{ ansible_facts['nvidia_gpu']['count'] }} GPUs, NVSwitches: {{ ansible_facts['nvidia_gpu']['has_nvswitch'] }}"

- name: Check the loaded driver against the PCI bus and the pinned branch
  raymetal.cluster.nvidia_gpu_facts:
    query_smi: true
    expected_branch: "570"
  register: __gpu

- name: Fail on any disagreement
  ansible.builtin.assert:
    that: __gpu.problems | length == 0
    fail_msg: "{{ inventory_hostname }}: {{ __gpu.problems | join('; ') }}"
"""

RETURN = r"""
ansible_facts:
  description: Facts gathered.
  returned: always
  type: dict
  contains:
    nvidia_gpu:
      description: NVIDIA devices found on the PCI bus.
      returned: always
      type: dict
      contains:
        count:
          description: Number of NVIDIA GPUs (VGA or 3D controller class).
          type: int
          sample: 8
        devices:
          description: One entry per GPU, sorted by PCI address.
          type: list
          elements: dict
          sample:
            - {pci_address: "0000:18:00.0", device_id: "0x2330", class: "0x030200"}
        nvswitch_count:
          description: Number of NVSwitches (NVIDIA bridge-class devices).
          type: int
          sample: 4
        has_nvswitch:
          description: Whether at least one NVSwitch is present, so fabric manager is needed.
          type: bool
          sample: true
        nvswitches:
          description: One entry per NVSwitch, sorted by PCI address.
          type: list
          elements: dict
          sample:
            - {pci_address: "0000:05:00.0", device_id: "0x22a3", class: "0x068000"}
        open_kernel_modules_supported:
          description:
            - Whether every GPU found is Turing or newer (device ID 0x1e00 or above), which the open kernel
              modules need. True when no GPU was found. A heuristic on device IDs, not a lookup table.
          type: bool
          sample: true
    nvidia_driver:
      description: What nvidia-smi reports. Only with O(query_smi=true).
      returned: when query_smi is true
      type: dict
      contains:
        driver_version:
          description: Loaded driver version (the same on every GPU).
          type: str
          sample: "570.133.20"
        branch:
          description: First field of RV(ansible_facts.nvidia_driver.driver_version).
          type: str
          sample: "570"
        count:
          description: Number of GPUs nvidia-smi lists.
          type: int
          sample: 8
        names:
          description: GPU names, in nvidia-smi order.
          type: list
          elements: str
          sample: ["NVIDIA H100 80GB HBM3"]
        memory_total_mib:
          description: Total memory of each GPU in MiB, in nvidia-smi order (null where not reported).
          type: list
          elements: int
          sample: [81559]
        gpus:
          description: One entry per GPU line.
          type: list
          elements: dict
          sample:
            - {index: 0, pci_address: "0000:18:00.0", name: "NVIDIA H100 80GB HBM3", driver_version: "570.133.20", memory_total_mib: 81559}
        fabric_cliques:
          description:
            - The NVLink fabric state of each GPU (the Fabric section of C(nvidia-smi -q)); a GPU of a multi-node
              NVLink domain reports state C(Completed), its clique ID and the domain's cluster UUID, others null.
              Empty when nvidia-smi has no such section.
          type: list
          elements: dict
          sample:
            - {pci_address: "0000:18:00.0", state: Completed, status: Success, clique_id: "32766", cluster_uuid: "4b1f..."}
problems:
  description: Disagreements between nvidia-smi, the PCI bus and O(expected_branch); empty when all agree.
  returned: always
  type: list
  elements: str
  sample: ["GPU 0000:9a:00.0 is on the PCI bus but nvidia-smi does not list it"]
"""

import csv
import os

from ansible.module_utils.basic import AnsibleModule

try:  # as a collection (raymetal.cluster)
    from ansible_collections.raymetal.cluster.plugins.module_utils.raymetal_command import C_LOCALE, run_c_locale
    from ansible_collections.raymetal.cluster.plugins.module_utils.raymetal_sysfs import read_int
except ImportError:  # as a playbook project (ansible.cfg: module_utils = plugins/module_utils)
    from ansible.module_utils.raymetal_command import C_LOCALE, run_c_locale
    from ansible.module_utils.raymetal_sysfs import read_int

NVIDIA_VENDOR = 0x10DE
GPU_CLASSES = (0x0300, 0x0302)  # VGA compatible controller, 3D controller
NVSWITCH_CLASS = 0x0680  # Bridge: other bridge device
FIRST_TURING_DEVICE_ID = 0x1E00  # TU102 is 0x1e02; GV100 (Volta) tops out below 0x1e00
SMI_FIELDS = "index,pci.bus_id,name,driver_version,memory.total"


class SmiError(Exception):
    """nvidia-smi output that cannot be understood."""


def scan_pci(sysfs_root):
    """Return (gpus, nvswitches) found under sysfs_root/bus/pci/devices."""
    base = os.path.join(sysfs_root, "bus", "pci", "devices")
    if not os.path.isdir(os.path.join(sysfs_root, "bus")):
        raise OSError("%s is not a sysfs tree (no bus/ directory)" % sysfs_root)
    if not os.path.isdir(base):
        return [], []  # a machine without a PCI bus (some VMs and boards) has no PCI GPU
    gpus, switches = [], []
    for address in sorted(os.listdir(base)):
        device_dir = os.path.join(base, address)
        vendor = read_int(os.path.join(device_dir, "vendor"), 16)
        pci_class = read_int(os.path.join(device_dir, "class"), 16)
        device = read_int(os.path.join(device_dir, "device"), 16)
        if None in (vendor, pci_class, device):
            continue  # not a PCI function with readable ids (or a stray entry)
        if vendor != NVIDIA_VENDOR:
            continue
        entry = {
            "pci_address": address.lower(),
            "device_id": "0x%04x" % device,
            "class": "0x%06x" % pci_class,
        }
        base_class = pci_class >> 8
        if base_class in GPU_CLASSES:
            gpus.append(entry)
        elif base_class == NVSWITCH_CLASS:
            switches.append(entry)
    return gpus, switches


def gpu_facts(sysfs_root):
    gpus, switches = scan_pci(sysfs_root)
    return {
        "count": len(gpus),
        "devices": gpus,
        "nvswitch_count": len(switches),
        "has_nvswitch": bool(switches),
        "nvswitches": switches,
        "open_kernel_modules_supported": all(int(g["device_id"], 16) >= FIRST_TURING_DEVICE_ID for g in gpus),
    }


def normalize_pci_address(bus_id):
    """'00000000:1A:00.0' (nvidia-smi) -> '0000:1a:00.0' (sysfs)."""
    text = bus_id.strip().lower()
    try:
        domain, bus, rest = text.split(":")
        slot, function = rest.split(".")
        return "%04x:%02x:%02x.%x" % (int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16))
    except ValueError:
        raise SmiError("PCI bus id %r is not DOMAIN:BUS:SLOT.FUNCTION" % bus_id)


def _memory(text):
    try:
        return int(float(text))
    except ValueError:
        return None  # "[N/A]" or "[Not Supported]"


def parse_smi_csv(text):
    """Parse `nvidia-smi --query-gpu=SMI_FIELDS --format=csv,noheader,nounits` output."""
    gpus = []
    for row in csv.reader(text.splitlines(), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) != 5:
            raise SmiError("expected 5 fields (%s) per line, got %d in %r" % (SMI_FIELDS, len(row), ", ".join(row)))
        index, bus_id, name, version, memory = (field.strip() for field in row)
        try:
            index = int(index)
        except ValueError:
            raise SmiError("GPU index %r is not a number in line %r" % (index, ", ".join(row)))
        gpus.append({
            "index": index,
            "pci_address": normalize_pci_address(bus_id),
            "name": name,
            "driver_version": version,
            "memory_total_mib": _memory(memory),
        })
    if not gpus:
        raise SmiError("nvidia-smi listed no GPU (output was %r)" % text.strip())
    versions = sorted(set(g["driver_version"] for g in gpus))
    if len(versions) != 1:
        raise SmiError("GPUs report different driver versions: %s" % ", ".join(versions))
    return {
        "driver_version": versions[0],
        "branch": versions[0].split(".")[0],
        "count": len(gpus),
        "names": [g["name"] for g in gpus],
        "memory_total_mib": [g["memory_total_mib"] for g in gpus],
        "gpus": gpus,
    }


def parse_smi_fabric(text):
    """The NVLink fabric state of each GPU from `nvidia-smi -q`: the "Fabric" section of every GPU.

    A GPU in a multi-node NVLink domain (GB200 NVL72 and the like) reports State Completed, its clique
    ID and the domain's cluster UUID; others (H100 HGX, PCIe cards) report N/A. Returns one dict per
    GPU section, in order: {pci_address, state, status, clique_id, cluster_uuid} (None where N/A).
    """
    found = []
    gpu = None
    section = None
    for line in text.splitlines():
        if line.startswith("GPU "):
            gpu = {"pci_address": normalize_pci_address(line[4:].strip()), "state": None, "status": None,
                   "clique_id": None, "cluster_uuid": None}
            found.append(gpu)
            section = None
            continue
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if gpu is None or not stripped:
            continue
        if indent == 4:
            section = stripped if ":" not in stripped else None
            continue
        if section == "Fabric" and indent == 8 and ":" in stripped:
            key, dummy, value = (part.strip() for part in stripped.partition(":"))
            value = None if value in ("", "N/A") else value
            field = {"State": "state", "Status": "status", "CliqueId": "clique_id", "ClusterUUID": "cluster_uuid"}.get(key)
            if field:
                gpu[field] = value
    return found


def compare(pci, smi, expected_branch):
    """Every disagreement between the PCI bus, nvidia-smi and the pinned branch, as sentences."""
    problems = []
    on_pci = set(d["pci_address"] for d in pci["devices"])
    in_smi = set(g["pci_address"] for g in smi["gpus"])
    if len(on_pci) != len(in_smi):
        problems.append("expected %d GPUs (found on the PCI bus), nvidia-smi lists %d" % (len(on_pci), len(in_smi)))
    for address in sorted(on_pci - in_smi):
        problems.append("GPU %s is on the PCI bus but nvidia-smi does not list it" % address)
    for address in sorted(in_smi - on_pci):
        problems.append("nvidia-smi lists GPU %s which is not an NVIDIA GPU on the PCI bus" % address)
    if expected_branch and smi["branch"] != str(expected_branch):
        problems.append("expected driver branch %s, loaded driver is %s" % (expected_branch, smi["driver_version"]))
    return problems


def run_smi(module):
    path = module.params["nvidia_smi_path"] or module.get_bin_path("nvidia-smi", required=True)
    return run_c_locale(module, [path, "--query-gpu=" + SMI_FIELDS, "--format=csv,noheader,nounits"])


def build_module():
    return AnsibleModule(
        argument_spec=dict(
            sysfs_root=dict(type="path", default="/sys"),
            query_smi=dict(type="bool", default=False),
            expected_branch=dict(type="str", default=""),
            nvidia_smi_path=dict(type="str", default=""),
        ),
        supports_check_mode=True,
    )


def main():
    module = build_module()
    try:
        pci = gpu_facts(module.params["sysfs_root"])
    except OSError as exc:
        module.fail_json(msg="cannot read the PCI bus: %s" % exc)
    facts = {"nvidia_gpu": pci}
    problems = []
    if module.params["query_smi"]:
        out = run_smi(module)
        try:
            smi = parse_smi_csv(out)
        except SmiError as exc:
            module.fail_json(msg="cannot parse nvidia-smi output: %s" % exc, stdout=out)
        # NVLink cliques (multi-node NVLink domains) for the ray.io/gpu-domain label. Best effort: a driver
        # whose nvidia-smi has no Fabric section gives none, which is also what non-MNNVL GPUs report.
        rc, query, dummy = module.run_command([module.params["nvidia_smi_path"] or module.get_bin_path("nvidia-smi"),
                                               "-q"], environ_update=C_LOCALE)
        try:
            smi["fabric_cliques"] = parse_smi_fabric(query) if rc == 0 else []
        except SmiError:
            smi["fabric_cliques"] = []
        facts["nvidia_driver"] = smi
        problems = compare(pci, smi, module.params["expected_branch"])
    module.exit_json(changed=False, ansible_facts=facts, problems=problems)


if __name__ == "__main__":
    main()
