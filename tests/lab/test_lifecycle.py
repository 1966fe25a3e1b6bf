"""Lifecycle playbooks on the lab: stop then start, a refused upgrade, teardown then redeploy.

The tests share the session's deployed lab (the `cluster` fixture) and leave it
deployed. They run in file order: the last one tears the cluster down and
deploys it again on the same hosts.
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it stops, tears down and redeploys the whole cluster.
E2E_LAB = 2

PREFIX = labkit.LAB_PREFIX
HEAD = f"{PREFIX}-head"
REBOOTED = f"{PREFIX}-worker2"
# What lab/lab.sh records on each new node before anything is deployed.
LAB_STATE = labkit.LAB_STATE
LISTED_DIRS = "/etc /opt /var/cache /var/lib /usr/local"
# Files that systemd and the OS change on a running node by themselves.
OS_NOISE = (
    "/var/lib/systemd/",
    "/var/lib/private/",
    "/var/cache/private/",
    "/etc/.pwd.lock",
    # apt's and dpkg's own state and caches, changed by any package install
    # (distribution packages raymetal installed, such as iperf3, stay: the
    # teardown playbook says so; their files are listed apart, below).
    "/var/lib/dpkg/",
    "/var/cache/apt/",
    "/var/cache/debconf/",
    "/var/lib/apt/extended_states",
    "/var/lib/apt/lists/auxfiles",
    "/var/lib/apt/lists/lock",
    "/var/lib/apt/lists/partial",
    # apt's daily timers (apt-daily.timer, apt-daily-upgrade.timer) take this
    # lock whenever they fire, on their own schedule (seen on Debian 13 when
    # one fired during the test).
    "/var/lib/apt/daily_lock",
    # What the distribution's nginx makes at its first start (the package's
    # postinst starts it; the wheelhouse mirror then stops it and runs its own unit).
    "/var/lib/nginx/",
    # The lab image's bytecode cache of Ansible's module payloads (lab/files/raymetal_lab_bytecode.py): the lab's,
    # filled by every module run; its directory is in the fresh listing.
    "/var/cache/raymetal-lab-bytecode/",
)
# A directory of the FHS that the ray role's scripts live under and teardown
# leaves (Debian 13's image has it already; on Debian 12 the role makes it).
FHS_DIRS = {"/usr/local/libexec"}
MISSING_VERSION = "2.99.0"


def unit_state(lab, name, *props):
    out = labkit.sh(name, f"systemctl show {labkit.unit_of(lab, name)} " + " ".join(f"-p {p}" for p in props)).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def running_ray(lab):
    """Per node: the unit's InvocationID and main PID, and the raylet's PID."""
    return {
        name: (
            unit_state(lab, name, "InvocationID", "MainPID"),
            labkit.sh(name, "pgrep -x raylet || true").stdout.split(),
        )
        for name in lab
    }


def listing(name):
    out = labkit.sh(name, f"find {LISTED_DIRS} -xdev 2>/dev/null | LC_ALL=C sort", check=False).stdout
    return set(out.splitlines())


def noise(path):
    return path.startswith(OS_NOISE) or path in FHS_DIRS


def package_owned(name, paths):
    """The paths that belong to an installed distribution package: its own files (dpkg -S) and those
    its maintainer scripts write (named in its postinst or debconf script, such as /etc/default/iperf3)."""
    if not paths:
        return set()
    quoted = " ".join(f"'{p}'" for p in paths)
    out = labkit.sh(name, f"dpkg -S {quoted} 2>/dev/null", check=False).stdout
    owned = {line.split(": ", 1)[1] for line in out.splitlines() if ": " in line} & set(paths)
    # The runlevel links that update-rc.d (in the package's postinst) makes for an init script the
    # package ships: /etc/rc2.d/S01redis-server for /etc/init.d/redis-server.
    for path in set(paths) - owned:
        match = re.fullmatch(r"/etc/rc[0-6S]\.d/[SK][0-9]{2}(.+)", path)
        if match and labkit.sh(name, f"dpkg -S '/etc/init.d/{match.group(1)}'", check=False).returncode == 0:
            owned.add(path)
    for path in set(paths) - owned:
        scripts = labkit.sh(name, f"grep -l -F -e '{path}' /var/lib/dpkg/info/*.postinst /var/lib/dpkg/info/*.config",
                            check=False).stdout
        if scripts.strip():
            owned.add(path)
    return owned


def wait_booted(name):
    labkit.wait_until(
        lambda: labkit.sh(name, "systemctl is-system-running", check=False).stdout.strip() in ("running", "degraded"),
        120,
        interval=1,
        what=f"{name} booted",
    )


def rename_fabric_nic(name, fabric_ip):
    """After a container restart the fabric NIC is eth1 again; name it ib0 as `lab up` does."""
    labkit.sh(
        name,
        f"ip link show ib0 >/dev/null 2>&1 || {{ nic=$(ip -4 -o addr | awk '$4 ~ /^{fabric_ip}\\// {{print $2}}'); "
        "ip link set $nic down && ip link set $nic name ib0 && ip link set ib0 up; }",
    )


def test_upgrade_to_a_version_missing_from_the_wheelhouse_leaves_the_cluster_running(cluster, lab):
    before = running_ray(lab)
    files_before = {n: labkit.sh(n, "md5sum /etc/ray/ray.env /etc/systemd/system/ray-*.service").stdout for n in lab}
    rc, out, _ = labkit.run_playbook(
        "playbooks/upgrade.yml", labkit.LAB_INVENTORY, "-e", f"ray_version={MISSING_VERSION}", "-e", "upgrade_confirm=yes"
    )
    assert rc != 0, out
    assert "Traceback" not in out, out
    assert "No matching distribution" not in out, out
    # One message names the variable, the version and the wheelhouse (read across the callback's line breaks).
    flat = " ".join(out.split())
    assert f"can install for ray[default,train]=={MISSING_VERSION} (it holds ray " in flat, out
    assert "set ray_version to one it holds" in flat, out
    # Nothing stopped, nothing restarted, nothing rewritten.
    assert running_ray(lab) == before
    assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
    for name in lab:
        assert labkit.sh(name, "md5sum /etc/ray/ray.env /etc/systemd/system/ray-*.service").stdout == files_before[name]
        assert unit_state(lab, name, "ActiveState")["ActiveState"] == "active", name


def test_stop_keeps_the_cluster_down_across_a_reboot_and_site_starts_it_again(cluster, lab):
    rc, out, _ = labkit.run_playbook("playbooks/stop.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out
    assert "ray stop" not in out
    for name in lab:
        state = unit_state(lab, name, "ActiveState", "UnitFileState")
        assert state == {"ActiveState": "inactive", "UnitFileState": "disabled"}, (name, state)
        assert labkit.sh(name, "pgrep -x raylet || true").stdout.strip() == "", name

    # The lab's stand-in for a reboot. The unit must not even have been started
    # (an empty InvocationID: no run since boot).
    subprocess.run(["docker", "restart", "-t", "5", REBOOTED], check=True, capture_output=True, timeout=120)
    wait_booted(REBOOTED)
    time.sleep(3)
    state = unit_state(lab, REBOOTED, "ActiveState", "InvocationID", "UnitFileState")
    assert state["ActiveState"] == "inactive" and state["InvocationID"] == "", state
    assert labkit.sh(REBOOTED, "pgrep -x raylet || true").stdout.strip() == ""
    rename_fabric_nic(REBOOTED, lab[REBOOTED]["lab_fabric_ip"])

    started = time.monotonic()
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    seconds = time.monotonic() - started
    print(f"\nstop.yml then site.yml: every node back in {seconds:.1f} s")
    assert rc == 0, out
    assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
    for name in lab:
        state = unit_state(lab, name, "ActiveState", "UnitFileState")
        assert state == {"ActiveState": "active", "UnitFileState": "enabled"}, (name, state)


def test_teardown_leaves_the_nodes_as_before_the_first_deploy_and_a_redeploy_works(cluster, lab):
    fresh = {}
    for name in lab:
        path = LAB_STATE / f"{name}.fresh-files"
        if not path.exists():
            pytest.fail(f"{path} is missing: lab/lab.sh records it when it creates a node; run `make lab-down lab-up`")
        fresh[name] = set(path.read_text().splitlines())

    rc, out, _ = labkit.run_playbook(
        "playbooks/teardown.yml", labkit.LAB_INVENTORY, "-e", "teardown_confirm=yes", "-e", "teardown_firewall=true",
        # A lab where test_storage.py ran kind s3 holds the store's data, which teardown keeps unless asked.
        "-e", "teardown_storage_data=true"
    )
    left, lost, packaged, leftovers = {}, {}, {}, {}
    if rc == 0:
        for name in lab:
            now = listing(name)
            candidates = sorted(p for p in now - fresh[name] if not noise(p))
            packaged[name] = package_owned(name, candidates)
            left[name] = [p for p in candidates if p not in packaged[name]]
            lost[name] = sorted(p for p in fresh[name] - now if not noise(p))
            print(f"\n{name}: {len(left[name])} paths left by raymetal after teardown, {len(lost[name])} removed "
                  f"that were there before, {len(packaged[name])} files of distribution packages kept")
            for path in left[name]:
                print(f"  left: {path}")
            for path in lost[name]:
                print(f"  lost: {path}")
            leftovers[name] = (
                labkit.sh(name, "getent passwd ray; getent group ray", check=False).stdout,
                labkit.sh(name, "pgrep -x raylet || true").stdout.strip(),
                "raymetal" in labkit.sh(name, "nft list tables").stdout,
            )

    # Deploy again on the same hosts, whatever the teardown left, so that the
    # tests after this one find the cluster deployed; then judge both.
    # Every node's pip through the head's wheelhouse mirror (ray_venv_fanout off: no node unpacks the head's
    # venv), as every node installed before ray_venv_fanout and as any node whose venv would differ from the
    # head's still does: judged below from the mirror's log.
    started, since = time.monotonic(), time.time()
    rc2, out2, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "ray_venv_fanout=false")
    print(f"\nredeploy after teardown: {time.monotonic() - started:.1f} s")
    assert rc == 0, out
    assert left == {name: [] for name in lab}
    assert lost == {name: [] for name in lab}
    assert leftovers == {name: ("", "", False) for name in lab}
    rc, out = rc2, out2
    assert rc == 0, out
    assert labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}
    wheels = labkit.sh(labkit.HEAD, "ls /var/cache/raymetal/wheelhouse").stdout.split()
    log = labkit.mirror_access_log(since)
    for name in lab:
        if name == labkit.HEAD:
            continue
        # Ray's wheel for this node's Python and NCCL's, in one pip run (one keep-alive connection), and no pack.
        tag = labkit.sh(name, "python3 -c 'import sys; print(\"cp%d%d\" % sys.version_info[:2])'").stdout.strip()
        ray_wheel = [w for w in wheels if re.match(rf"ray-2\.60\.0-{tag}-{tag}-.*\.whl$", w)]
        nccl_wheel = [w for w in wheels if w.startswith("nvidia_nccl_cu12-")]
        assert len(ray_wheel) == 1 and len(nccl_wheel) == 1, (name, tag, wheels)
        runs = labkit.mirror_pip_runs(lab[name]["lab_fabric_ip"], log)
        assert [run for run in runs if ray_wheel[0] in run and nccl_wheel[0] in run], (name, runs)
        packs = [path for ip, _, path, _, _ in log if ip == lab[name]["lab_fabric_ip"] and path.startswith("/venvs/")]
        assert packs == [], (name, packs)
