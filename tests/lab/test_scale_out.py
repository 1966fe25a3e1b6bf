"""Scale out on the lab (playbooks/scale-out.yml): a fresh container joins the running cluster.

The test adds a third worker to the session's deployed lab (lab/lab.sh up with LAB_WORKERS=3: the
existing containers are left as they are), runs scale-out.yml as docs/operations.md says, and checks what
users are promised: the new worker is an ALIVE Ray node, no existing node restarted (same unit
invocations), a job that was running keeps running, and every node's firewall admits the new
worker's fabric address. It leaves the lab as it found it: three nodes, every firewall and the
monitoring targets without the extra worker (lab.sh up with two workers, then site.yml).
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it adds a fourth container and takes it away again.
E2E_LAB = 2

HEAD = labkit.HEAD
NEW = f"{labkit.LAB_PREFIX}-worker3"
# ray_wheelhouse_dir (the ray role's default): where a node with ray_wheelhouse_fanout copy keeps its wheelhouse.
WHEELHOUSE_DIR = "/var/cache/raymetal/wheelhouse"
TOKEN_ENV = "export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=/etc/ray/auth_token"


def lab_up(workers: int) -> dict[str, dict]:
    env = dict(os.environ, LAB_WORKERS=str(workers))
    proc = subprocess.run(["bash", str(labkit.ROOT / "lab" / "lab.sh"), "up"], cwd=labkit.ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return labkit.lab_hosts()


def ray_job(lab, args: str):
    ip = lab[HEAD]["lab_fabric_ip"]
    return labkit.sh(HEAD, f"{TOKEN_ENV}; cd /tmp && /opt/ray/venv/bin/ray job {args.replace('ADDRESS', f'http://{ip}:8265')}",
                     check=False)


def test_scale_out_joins_a_new_worker_without_restarting_anyone_and_every_firewall_admits_it(cluster, lab, tmp_path):
    job_id = f"raymetal-scale-out-{uuid.uuid4().hex[:8]}"
    submitted = ray_job(lab, f"submit --address ADDRESS --no-wait --submission-id {job_id} "
                             "-- python -c 'import time; time.sleep(900)'")
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    new_ip = None
    try:
        labkit.wait_until(lambda: labkit.job_status(lab, job_id) == "RUNNING", 120, what=f"job {job_id} RUNNING")
        units_before = labkit.invocation_ids(lab)
        grown = lab_up(3)
        assert set(grown) == set(lab) | {NEW}, grown
        new_ip = grown[NEW]["lab_fabric_ip"]
        # The new worker takes its own copy of the wheelhouse (ray_wheelhouse_fanout: copy, in its host_vars), the
        # others keep the head's mirror: the copy's only lab proof since make test leaves the molecule cluster
        # scenario (which deploys with it) to make molecule (tests/lab/test_cluster_scenario.py).
        inventory = labkit.inventory_copy(tmp_path, {NEW: {"ray_wheelhouse_fanout": "copy"}})

        started = time.monotonic()
        rc, out, stats = labkit.run_playbook("playbooks/scale-out.yml", inventory)
        took = time.monotonic() - started
        assert rc == 0, out
        print(f"\nscale-out.yml: {NEW} joined in {took:.1f} s")
        assert labkit.alive_ips(grown) == {h["lab_fabric_ip"] for h in grown.values()}
        # No existing node restarted, and the running job is still running.
        assert labkit.invocation_ids(lab) == units_before
        assert labkit.job_status(lab, job_id) == "RUNNING"
        # Its Ray came from its own copy of the wheelhouse; an existing worker still has none (the mirror serves it).
        copied = labkit.sh(NEW, f"ls {WHEELHOUSE_DIR}").stdout.split()
        assert any(f.startswith("ray-2.60.0-") and f.endswith(".whl") for f in copied), copied
        assert labkit.sh(labkit.WORKER1, f"test -e {WHEELHOUSE_DIR}", check=False).returncode == 1
        assert "TASK [ray : Ship the wheelhouse to the node]" in out
        # Every firewall admits the new worker; the new worker's admits every node.
        for name in lab:
            rules = labkit.sh(name, "nft list table inet raymetal").stdout
            assert new_ip in rules, (name, rules)
        rules = labkit.sh(NEW, "nft list table inet raymetal").stdout
        assert all(h["lab_fabric_ip"] in rules for h in lab.values()), rules
        # A rerun of scale-out.yml is a no-op everywhere.
        rc, again, stats = labkit.run_playbook("playbooks/scale-out.yml", inventory)
        assert rc == 0, again
        changed = {host: counts["changed"] for host, counts in stats.items() if counts["changed"]}
        assert changed == {}, (changed, again)
    finally:
        ray_job(lab, f"stop --address ADDRESS {job_id}")
        lab_up(2)
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        assert rc == 0, out
    # The removed worker's Ray node leaves the ALIVE set once the GCS misses its health checks (about 30 s); a quick
    # site.yml can end before that (run41 read it still ALIVE).
    labkit.wait_until(lambda: labkit.alive_ips(lab) == {h["lab_fabric_ip"] for h in lab.values()}, 120, interval=3,
                      what="every node of the lab ALIVE and the removed worker no longer")
    for name in lab:
        assert new_ip not in labkit.sh(name, "nft list table inet raymetal").stdout, name
