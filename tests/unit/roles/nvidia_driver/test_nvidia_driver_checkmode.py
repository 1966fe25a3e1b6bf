"""Check-mode plans of the nvidia_driver role for Ubuntu, Debian and RHEL-family hosts.

Each case runs the real role (`ansible-playbook --check --diff`, connection local, on this machine) with the OS
facts of the described host fed in by a test-only module (tests/fixtures/nvidia/checkmode/library) and a recorded
PCI tree as sysfs. The repository file diffs, the plan and the "would install" line all come from the role's
vars/<os>.yml and templates. Nothing is written (check mode) and nothing is fetched: on a host without the
repository, the role skips the key download and package resolution in check mode and says so.

What this cannot show: that apt/dnf resolve these names against NVIDIA's real repository (no internet here), and
the dnf/rpm_key modules themselves (this machine is Debian). See roles/nvidia_driver/README.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[4]
FIXTURES = ROOT / "tests" / "fixtures" / "nvidia"
PLAYBOOK = FIXTURES / "checkmode" / "plan.yml"
ANSIBLE_PLAYBOOK = Path(sys.executable).parent / "ansible-playbook"

UBUNTU_2204 = {"distribution": "Ubuntu", "distribution_version": "22.04", "distribution_major_version": "22",
               "os_family": "Debian", "architecture": "x86_64", "kernel": "5.15.0-131-generic"}
UBUNTU_2404_ARM = {"distribution": "Ubuntu", "distribution_version": "24.04", "distribution_major_version": "24",
                   "os_family": "Debian", "architecture": "aarch64", "kernel": "6.8.0-51-generic-64k"}
DEBIAN_12 = {"distribution": "Debian", "distribution_version": "12.8", "distribution_major_version": "12",
             "os_family": "Debian", "architecture": "x86_64", "kernel": "6.1.0-28-amd64"}
DEBIAN_13 = {"distribution": "Debian", "distribution_version": "13.2", "distribution_major_version": "13",
             "os_family": "Debian", "architecture": "x86_64", "kernel": "6.12.57+deb13-amd64"}
ROCKY_9 = {"distribution": "Rocky", "distribution_version": "9.5", "distribution_major_version": "9",
           "os_family": "RedHat", "architecture": "x86_64", "kernel": "5.14.0-503.14.1.el9_5.x86_64"}
RHEL_8 = {"distribution": "RedHat", "distribution_version": "8.10", "distribution_major_version": "8",
          "os_family": "RedHat", "architecture": "x86_64", "kernel": "4.18.0-553.el8_10.x86_64"}


def plan(os_facts, tree, **role_vars):
    extra = {
        "test_os_facts": os_facts,
        "nvidia_driver_sysfs_root": str(FIXTURES / tree / "sys"),
        "ansible_python_interpreter": "/usr/bin/python3",
    }
    extra.update(role_vars)
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"), ANSIBLE_CACHE_PLUGIN="memory",
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    # memory fact cache: the project's jsonfile cache would carry one case's facts into the next
    proc = subprocess.run(
        [str(ANSIBLE_PLAYBOOK), "-i", "localhost,", "-c", "local", "--check", "--diff",
         "-e", json.dumps(extra), str(PLAYBOOK)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_ubuntu_2204_hgx_h100_on_infiniband():
    rc, out = plan(dict(UBUNTU_2204, fabric={"kind": "infiniband"}), "hgx-h100-8gpu")
    assert rc == 0, out
    # repository file (from the --diff of the template), pinned key
    assert "+URIs: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/" in out
    assert "+Signed-By: /etc/apt/keyrings/raymetal-nvidia-cuda.asc" in out
    assert "key_fingerprint: EB693B3035CD5710E231E123A4B469963BF863CC" in out
    # open modules (H100 is Hopper), fabric manager of the same branch (4 NVSwitches), headers for the kernel
    assert "- nvidia-open-570\n" in out
    assert "- nvidia-fabricmanager-570\n" in out
    assert "- linux-headers-5.15.0-131-generic\n" in out
    assert "cuda-drivers-570" not in out
    # nvidia_peermem persisted for the InfiniBand fabric
    assert "+nvidia_peermem" in out
    assert "/etc/modules-load.d/raymetal-nvidia-peermem.conf" in out
    assert "the repository is not configured yet, so packages cannot be resolved" in " ".join(out.split())
    assert "failed=0" in out


def test_ubuntu_2404_arm_a100_pcie_proprietary_on_roce():
    rc, out = plan(dict(UBUNTU_2404_ARM, fabric={"kind": "roce"}), "a100-pcie-2gpu",
                   nvidia_driver_open_kernel_modules=False, nvidia_driver_branch="580")
    assert rc == 0, out
    assert "+URIs: https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2404/sbsa/" in out
    assert "- cuda-drivers-580\n" in out
    assert "nvidia-open-580" not in out
    assert "fabricmanager: false" in out
    assert "- nvidia-fabricmanager-" not in out
    assert "+nvidia_peermem" in out


def test_debian_12_forced_install_without_gpu_from_a_site_mirror():
    rc, out = plan(DEBIAN_12, "aspeed-only", nvidia_driver_force_install=True,
                   nvidia_driver_repo_url="https://mirror.example.internal/cuda/debian12/x86_64")
    assert rc == 0, out
    assert "+URIs: https://mirror.example.internal/cuda/debian12/x86_64/" in out
    assert "key_url: https://mirror.example.internal/cuda/debian12/x86_64/3bf863cc.pub" in out
    assert "developer.download.nvidia.com" not in out
    assert "- nvidia-open-570\n" in out
    assert "- linux-headers-6.1.0-28-amd64\n" in out
    assert "- nvidia-fabricmanager-" not in out
    assert "peermem: false" in out
    flat = " ".join(out.split())
    assert "no NVIDIA GPU on the PCI bus, so the driver was not loaded and neither nvidia-smi nor the driver version could be verified" in flat


def test_debian_13_plans_its_own_repository_and_headers():
    # vars/Debian.yml, then vars/Debian-13.yml on top: the repository follows the major release.
    rc, out = plan(DEBIAN_13, "a100-pcie-2gpu")
    assert rc == 0, out
    assert "+URIs: https://developer.download.nvidia.com/compute/cuda/repos/debian13/x86_64/" in out
    assert "- nvidia-open-570\n" in out
    assert "- linux-headers-6.12.57+deb13-amd64\n" in out
    assert "failed=0" in out


def test_host_without_nvidia_gpu_skips_with_one_line():
    rc, out = plan(DEBIAN_12, "aspeed-only")
    assert rc == 0, out
    assert "localhost: no NVIDIA GPU on the PCI bus, nvidia_driver skipped" in out
    assert "Configure the repository" not in out
    assert "changed=0" in out


def test_rocky_9_a100_pcie():
    rc, out = plan(ROCKY_9, "a100-pcie-2gpu")
    assert rc == 0, out
    assert "+baseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/" in out
    assert "+gpgkey=https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64/D42D0685.pub" in out
    assert "+gpgcheck=1" in out
    assert "key_fingerprint: 610C7B14E068A878070DA4E99CD0A493D42D0685" in out
    assert "- '@nvidia-driver:570-open'" in out
    assert "- kernel-devel-5.14.0-503.14.1.el9_5.x86_64\n" in out
    assert "- nvidia-fabric-manager-" not in out
    assert "failed=0" in out


def test_rhel_8_hgx_h100_proprietary_with_fabric_manager():
    rc, out = plan(RHEL_8, "hgx-h100-8gpu", nvidia_driver_open_kernel_modules=False)
    assert rc == 0, out
    assert "+baseurl=https://developer.download.nvidia.com/compute/cuda/repos/rhel8/x86_64/" in out
    assert "- '@nvidia-driver:570-dkms'" in out
    assert "- nvidia-fabric-manager-570.*\n" in out
    assert "peermem: false" in out  # no fabric facts: kind defaults to none


@pytest.mark.parametrize("os_facts,tree,role_vars,needle", [
    (DEBIAN_12, "a100-pcie-2gpu", {"nvidia_driver_source": "distribution"},
     "nvidia_driver_branch is 570, but Debian 12 ships only branch 535"),
    # Debian 13 ships another branch than Debian 12 (vars/Debian-13.yml).
    (DEBIAN_13, "a100-pcie-2gpu", {"nvidia_driver_source": "distribution", "nvidia_driver_branch": "535"},
     "nvidia_driver_branch is 535, but Debian 13 ships only branch 550"),
    (DEBIAN_12, "hgx-h100-8gpu", {"nvidia_driver_source": "distribution", "nvidia_driver_branch": "535"},
     "has 4 NVSwitches and needs nvidia-fabricmanager-535"),
    (ROCKY_9, "a100-pcie-2gpu", {"nvidia_driver_source": "distribution"},
     "on Rocky 9.5 the driver can only come from cuda_repo"),
    (UBUNTU_2204, "a100-pcie-2gpu", {"nvidia_driver_repo_key_fingerprint": "3BF863CC"},
     "must be the key's full 40-hex-digit fingerprint"),
    (UBUNTU_2204, "a100-pcie-2gpu", {"nvidia_driver_branch": "latest"},
     "nvidia_driver_branch is 'latest'"),
])
def test_bad_settings_fail_with_a_clear_message(os_facts, tree, role_vars, needle):
    rc, out = plan(os_facts, tree, **role_vars)
    assert rc != 0
    assert needle in " ".join(out.split()), out
    assert "localhost" in out
