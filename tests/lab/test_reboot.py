"""A node that reboots (a container restart, the lab's stand-in) comes back into the cluster by itself.

The lab's image renames the fabric NIC to ib0 at every boot (a real NIC keeps its name), the Ray unit is
enabled, the firewall unit reloads the rules, and the worker waits for the head and rejoins.
"""

from __future__ import annotations

import subprocess
import time

from tests.lab import labkit

P = labkit.LAB_PREFIX
HEAD = f"{P}-head"


def test_a_rebooted_worker_rejoins_with_its_fabric_nic_and_firewall(cluster, lab):
    name = f"{P}-worker2"
    ip = lab[name]["lab_fabric_ip"]
    assert ip in labkit.alive_ips(lab)
    start = time.monotonic()
    subprocess.run(["docker", "restart", "-t", "30", name], check=True, capture_output=True)
    labkit.wait_until(lambda: labkit.sh(name, "ip -4 -o addr show ib0", check=False).stdout.count(ip) == 1, 60,
                      what=f"{name}: ib0 carries {ip} after the reboot")
    labkit.wait_until(lambda: ip in labkit.alive_ips(lab), 240, interval=3, what=f"{name} alive again")
    print(f"\n{name}: container restart -> alive Ray node again in {time.monotonic() - start:.1f} s")
    assert labkit.sh(name, "systemctl is-active ray-worker").stdout.strip() == "active"
    # The firewall came back with it: the raylet is still closed to the management network.
    assert labkit.probe_from_controller(lab[name]["ansible_host"], 6380) == "timeout"
    assert len(labkit.alive_ips(lab)) == len(lab)
