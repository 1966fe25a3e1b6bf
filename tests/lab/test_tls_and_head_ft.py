"""ray_tls and head fault tolerance on the lab (issue 35 and the head FT work), deployed together.

Each of the two switches restarts every node on and off, so they share their deploys: one run turns ray_tls and
ray_gcs_fault_tolerance=rocksdb on together, the next switches the store to redis (TLS still on), and one run turns
both off. The three tests run in this order on one lab and each asserts its own part; the module's fixture makes the
first deploy and, whatever failed, leaves the lab as the plain inventory has it.

- TLS: the cluster CA and each node's certificate made on the controller, installed on every node (the key
  root:ray 0640 and never in the output or a journal), every node restarted with Ray's TLS settings. While a packet
  capture runs on worker1's ib0 (an AF_PACKET socket in the node), a driver on the head sends a marker to a task
  pinned on worker1 and gets it back: the job runs, and neither the marker nor the token is in the capture. A driver
  without the TLS settings cannot reach the GCS.
- Head fault tolerance, rocksdb (Ray's embedded RocksDB store on the head's disk) and then redis (Redis on worker2,
  run by the gcs_redis role, reachable from the head only): a restart of the head's unit, or a GCS killed with -9,
  restarts no worker and a detached actor created before answers after, with its state. Switched from rocksdb to
  redis, the RocksDB store is gone. A rerun with each changes nothing and restarts nothing.
- Off: /etc/ray/tls gone everywhere, the store and Redis with its data gone, Ray runs without either, and the same
  capture now holds the marker and the token in clear (so the capture would have seen them: the first capture's
  silence is TLS's doing).

Without fault tolerance a killed GCS restarts every node (tests/lab/test_reboot.py measures that).
"""

from __future__ import annotations

import ipaddress
import json
import time
import uuid

import pytest
from cryptography import x509

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): three deploys that restart every node.
E2E_LAB = 2

HEAD, WORKER1, WORKER2 = labkit.HEAD, labkit.WORKER1, labkit.WORKER2
RAY_ENV = "set -a; . /etc/ray/ray.env; set +a"
TLS_ROCKSDB = ("-e", "ray_tls=true", "-e", "ray_gcs_fault_tolerance=rocksdb")
TLS_REDIS = ("-e", "ray_tls=true", "-e", "ray_gcs_fault_tolerance=redis")

# The test's scripts and capture on the nodes (not raymetal's; removed at the end).
WORK = "/var/tmp/raymetal-tls-test"

# Every frame on an interface until a stop file appears (at most 120 s), written raw (an AF_PACKET socket: no
# tcpdump in the image).
CAPTURE = '''
import os, socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
end = time.time() + 120
frames = 0
with open(sys.argv[3], "wb") as out:
    while time.time() < end and not os.path.exists(sys.argv[2]):
        try:
            out.write(s.recv(65535))
            frames += 1
        except socket.timeout:
            pass
print(frames)
'''

# A task pinned on a node echoes the marker back: the marker crosses the fabric both ways.
ECHO = '''
import sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)

@ray.remote(num_cpus=0)
def echo(x):
    return x + "-back"

node = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == sys.argv[2]][0]
strategy = NodeAffinitySchedulingStrategy(node, soft=False)
print("ECHO " + ray.get(echo.options(scheduling_strategy=strategy).remote(sys.argv[3]), timeout=60))
'''


def put_scripts(lab):
    labkit.sh(WORKER1, f"mkdir -p {WORK} && cat > {WORK}/capture.py <<'EOF'\n{CAPTURE}\nEOF")
    labkit.sh(HEAD, f"mkdir -p {WORK} && cat > {WORK}/echo.py <<'EOF'\n{ECHO}\nEOF")


def captured_echo(lab, env=RAY_ENV):
    """Run the echo job from the head while worker1 captures its ib0: (job output, marker seen, token seen, frames)."""
    marker = "raymetal-tls-marker-" + uuid.uuid4().hex
    labkit.sh(WORKER1, f"rm -f {WORK}/capture.bin {WORK}/capture.out {WORK}/stop; "
                       f"nohup python3 {WORK}/capture.py ib0 {WORK}/stop {WORK}/capture.bin > {WORK}/capture.out 2>&1 &")
    labkit.wait_until(lambda: labkit.sh(WORKER1, f"test -e {WORK}/capture.bin", check=False).returncode == 0, 30, 0.5,
                      "the capture to start")
    head_ip = lab[HEAD]["lab_fabric_ip"]
    job = labkit.sh(HEAD, f"{env}; cd {WORK} && timeout 90 /opt/ray/venv/bin/python echo.py {head_ip}:6379 "
                          f"{lab[WORKER1]['lab_fabric_ip']} {marker}", check=False, timeout=120)
    labkit.sh(WORKER1, f"touch {WORK}/stop")
    labkit.wait_until(lambda: labkit.sh(WORKER1, f"cat {WORK}/capture.out", check=False).stdout.strip(), 60, 1,
                      "the capture to end")
    frames = int(labkit.sh(WORKER1, f"cat {WORK}/capture.out").stdout.strip())
    seen = labkit.sh(WORKER1, f"grep -c -a {marker} {WORK}/capture.bin; "
                              f"grep -c -a \"$(cat /etc/ray/auth_token)\" {WORK}/capture.bin", check=False)
    marker_seen, token_seen = (int(n) for n in seen.stdout.split())
    return job.stdout + job.stderr, marker, marker_seen, token_seen, frames


# Creates (once) a detached counter on worker1 and adds 1 to it: prints the count, and where the actor runs.
COUNTER = '''
import json, sys
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

ray.init(address=sys.argv[1], namespace="raymetal-ft", logging_level="ERROR", log_to_driver=False)


@ray.remote(num_cpus=0, max_restarts=0)
class Counter:
    def __init__(self):
        self.count = 0

    def add(self):
        import os
        self.count += 1
        return self.count, ray.util.get_node_ip_address(), os.getpid()


if sys.argv[2:3] == ["create"]:
    node = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeManagerAddress"] == sys.argv[3]][0]
    Counter.options(name="counter", lifetime="detached",
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote()
counter = ray.get_actor("counter")
print("COUNTER " + json.dumps(ray.get(counter.add.remote(), timeout=30)))
'''


def counter(lab, *args, check=True):
    head_ip = lab[HEAD]["lab_fabric_ip"]
    proc = labkit.sh(HEAD, f"{RAY_ENV}; cd /tmp && timeout 60 /opt/ray/venv/bin/python /tmp/ft_counter.py "
                           f"{head_ip}:6379 {' '.join(args)}", check=check, timeout=90)
    if "COUNTER " not in proc.stdout:
        return None
    return json.loads(proc.stdout.split("COUNTER ", 1)[1])


def raylet_pids(lab, names):
    return {name: labkit.sh(name, "pgrep -x raylet").stdout.split() for name in names}


# The head's TLS client for Redis, as Ray's processes use it.
HEAD_CLIENT = ("-CAfile /etc/ray/redis-tls/ca.crt -cert /etc/ray/redis-tls/client.crt "
               "-key /etc/ray/redis-tls/client.key")


def redis_tls(name, ip, command, options):
    """One Redis command over TLS from a lab node (openssl s_client: redis-cli is not on the head)."""
    return labkit.sh(name, f"printf '{command}\\r\\n' | timeout 10 openssl s_client -quiet "
                           f"-connect {ip}:6390 {options} 2>&1 | grep -v '^depth=\\|^verify return'",
                     check=False).stdout


def redis_inventory(tmp_path):
    """The lab's inventory with Redis on worker2 (group ray_gcs_redis), away from the head."""
    inventory = labkit.inventory_copy(tmp_path)
    (inventory / "gcs_redis.yml").write_text(f"ray_gcs_redis:\n  hosts:\n    {labkit.WORKER2}:\n")
    return inventory


@pytest.fixture(scope="module")
def tls_rocksdb(cluster, lab):
    """The lab deployed with ray_tls and ray_gcs_fault_tolerance=rocksdb: (rc, output) of that run. At the end, if
    the off test did not get there, the plain inventory's deploy puts the lab back for the next module."""
    put_scripts(lab)
    state = {"off": False}
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, *TLS_ROCKSDB)
    yield rc, out, state
    if not state["off"]:
        labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    for name in (HEAD, WORKER1):
        labkit.sh(name, f"rm -rf {WORK} /tmp/ft_counter.py", check=False)


def test_ray_tls_encrypts_every_grpc_channel(tls_rocksdb, lab):
    rc, out, _ = tls_rocksdb
    assert rc == 0, out[-6000:]
    ca_dir = labkit.LAB_INVENTORY / "credentials" / "ray_tls"
    for name in lab:
        key = (ca_dir / f"{name}.key").read_text()
        assert key.splitlines()[1] not in out, f"{name}'s key is in the run's output"
        # Nor in the node's journal, where Ansible logs each module run's arguments (it was, until node_files
        # took secrets in a no_log option).
        logged = labkit.sh(name, f"journalctl -q --no-pager -b | grep -cF -- '{key.splitlines()[1]}'", check=False)
        assert logged.stdout.strip() == "0", f"{name}'s key is in its journal"
        listing = labkit.sh(name, "stat -c '%n %U:%G %a' /etc/ray/tls/ca.crt /etc/ray/tls/node.crt "
                                  "/etc/ray/tls/node.key").stdout.split("\n")
        assert [line.split()[1:] for line in listing if line] == [
            ["root:root", "644"], ["root:root", "644"], ["root:ray", "640"]], (name, listing)
        assert labkit.sh(name, "cat /etc/ray/tls/node.key").stdout == key
        cert = (ca_dir / f"{name}.crt").read_text()
        assert labkit.sh(name, "cat /etc/ray/tls/node.crt").stdout == cert
        assert "RAY_USE_TLS=1" in labkit.sh(name, "cat /etc/ray/ray.env").stdout.splitlines()
        # The node's certificate names its fabric address, and the cluster CA signed it.
        parsed = x509.load_pem_x509_certificate(cert.encode())
        sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert ipaddress.ip_address(lab[name]["lab_fabric_ip"]) in sans.get_values_for_type(x509.IPAddress), name
        assert parsed.issuer == x509.load_pem_x509_certificate((ca_dir / "ca.crt").read_bytes()).subject
    labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, 3, "every node ALIVE under TLS")

    output, marker, marker_seen, token_seen, frames = captured_echo(lab)
    assert f"ECHO {marker}-back" in output, output[-3000:]
    assert frames > 0 and marker_seen == 0 and token_seen == 0, (frames, marker_seen, token_seen)

    # A driver without the cluster's TLS settings (and so without a certificate of its CA) is refused.
    plain = ("set -a; . /etc/ray/ray.env; set +a; "
             "unset RAY_USE_TLS RAY_TLS_SERVER_CERT RAY_TLS_SERVER_KEY RAY_TLS_CA_CERT; "
             # Give up on the GCS after 10 s rather than Ray's 30.
             "export RAY_py_gcs_connect_timeout_s=10")
    refused = labkit.sh(HEAD, f"{plain}; cd {WORK} && timeout 60 /opt/ray/venv/bin/python echo.py "
                              f"{lab[HEAD]['lab_fabric_ip']}:6379 {lab[WORKER1]['lab_fabric_ip']} x",
                        check=False, timeout=90)
    assert refused.returncode != 0 and "ECHO" not in refused.stdout, refused.stdout[-2000:]

    # The rerun with the same settings changes nothing and restarts nothing.
    before = labkit.invocation_ids(lab)
    rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, *TLS_ROCKSDB)
    assert rc == 0 and all(s["changed"] == 0 for s in stats.values()), (stats, out[-3000:])
    assert labkit.invocation_ids(lab) == before


def test_with_gcs_fault_tolerance_a_head_restart_restarts_no_worker_and_keeps_a_detached_actor(tls_rocksdb, lab,
                                                                                              tmp_path):
    assert tls_rocksdb[0] == 0, tls_rocksdb[1][-3000:]
    workers = [name for name in lab if name != HEAD]
    worker1_ip = lab[WORKER1]["lab_fabric_ip"]
    redis_ip = lab[WORKER2]["lab_fabric_ip"]
    # worker2 as Redis turned on and off again leaves it: redis-server installed, stopped, disabled, and unloaded by
    # systemd's reload. Turning it on again used to fail there ("Unit redis-server.service not loaded").
    labkit.sh(WORKER2, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null "
                       "&& systemctl disable --now redis-server && { systemctl reset-failed redis-server || true; } "
                       "&& systemctl daemon-reload", timeout=300)
    # rocksdb is on since the module's first deploy (with ray_tls); redis is switched to from there.
    for kind, inventory, settings in (("rocksdb", labkit.LAB_INVENTORY, TLS_ROCKSDB),
                                      ("redis", redis_inventory(tmp_path), TLS_REDIS)):
        if kind == "redis":
            rc, out, _ = labkit.run_playbook("site.yml", inventory, *settings)
            assert rc == 0, out[-3000:]
        env = labkit.sh(HEAD, "cat /etc/ray/ray.env").stdout.splitlines()
        if kind == "rocksdb":
            assert "RAY_gcs_storage=rocksdb" in env and "RAY_gcs_storage_path=/var/lib/ray/gcs" in env, env
        else:
            assert f"RAY_REDIS_ADDRESS=rediss://{redis_ip}:6390" in env and "RAY_external_storage_namespace=raymetal-2.60.0" in env
            assert "RAY_REDIS_CLIENT_KEY=/etc/ray/redis-tls/client.key" in env and not [e for e in env if "PASSWORD" in e]
            assert "RAY_gcs_storage=rocksdb" not in env
            # Switched from rocksdb: its store is gone (a later switch back must not reload that state).
            assert labkit.sh(HEAD, "test -e /var/lib/ray/gcs", check=False).returncode == 1
            # Redis on worker2's fabric address, over TLS only, reachable from the head only.
            listening = labkit.sh(WORKER2, "ss -ltnH 'sport = :6390'").stdout
            assert [line.split()[3] for line in listening.splitlines() if line.strip()] == [f"{redis_ip}:6390"], listening
            assert labkit.probe_from(HEAD, redis_ip, 6390) == "open"
            assert labkit.probe_from(WORKER1, redis_ip, 6390) == "timeout"
            # A client without the head's certificate is refused in the handshake, even one that trusts Redis's CA.
            refused = redis_tls(WORKER2, redis_ip, "PING", "-CAfile /etc/redis/raymetal-gcs-tls/ca.crt")
            assert "+PONG" not in refused and "certificate required" in refused, refused
            # The head's client key shows in no diff and no -v output.
            key = (inventory / "credentials" / "gcs_redis_tls" / "client.key").read_text()
            body = "".join(line for line in key.splitlines() if not line.startswith("-----"))
            assert len(body) > 40 and body[:40] not in out
            # Nor in the journals of the head and the Redis host, where Ansible logs each module run's arguments
            # (the keys were there until node_files took secrets in a no_log option).
            for host, name in ((HEAD, "client.key"), (WORKER2, "server.key")):
                line = (inventory / "credentials" / "gcs_redis_tls" / name).read_text().splitlines()[1][:40]
                logged = labkit.sh(host, f"journalctl -q --no-pager -b | grep -cF -- '{line}'", check=False)
                assert logged.stdout.strip() == "0", f"{host}'s journal holds the Redis TLS {name}"
        for name in workers:
            assert "RAY_gcs_rpc_server_reconnect_timeout_s=300" in labkit.sh(name, "cat /etc/ray/ray.env").stdout
        labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, interval=3, what="every node alive")
        if kind == "rocksdb":
            # Ray writes its store there (RocksDB files and the session-name marker).
            assert labkit.sh(HEAD, "ls /var/lib/ray/gcs").stdout.split(), "the GCS store is empty"
        else:
            # The GCS keeps its tables there (asked with the head's client certificate).
            keys = redis_tls(HEAD, redis_ip, "DBSIZE", HEAD_CLIENT).strip().splitlines()[-1]
            assert keys.startswith(":") and int(keys[1:]) > 0, keys
            # No secret on any command line, for any user of any node (Ray passed a Redis password as an argument).
            token = (inventory / "credentials" / "ray_auth_token").read_text().strip()
            for name in lab:
                args = labkit.sh(name, "runuser -u nobody -- ps -eo args").stdout
                assert "--redis_enable_ssl=true" in args or name != HEAD, args[-2000:]
                assert "password" not in args.lower() and token not in args, (name, args[-2000:])

        labkit.sh(HEAD, f"cat > /tmp/ft_counter.py <<'EOF'\n{COUNTER}\nEOF")
        count, where, pid = counter(lab, "create", worker1_ip)
        assert (count, where) == (1, worker1_ip)
        raylets = raylet_pids(lab, workers)
        units = labkit.invocation_ids(lab, workers)
        figures = {}
        for how, command in (("systemctl restart ray-head", "systemctl restart --no-block ray-head"),
                             ("kill -9 gcs_server", "kill -9 $(pgrep -x gcs_server)")):
            start = time.monotonic()
            labkit.sh(HEAD, command)
            # Down first: the head's GCS port closes (a restart that never went down would prove nothing).
            labkit.wait_until(lambda: labkit.probe_from(HEAD, lab[HEAD]["lab_fabric_ip"], 6379) != "open", 60,
                              interval=0.5, what=f"{how}: the GCS port closed")
            answer = []
            labkit.wait_until(lambda: answer.append(counter(lab, check=False)) or answer[-1] is not None, 240,
                              interval=1, what=f"{how}: the detached actor answers again")
            figures[how] = round(time.monotonic() - start, 1)
            count += 1
            # The same actor process, with its state: nothing on the worker was restarted.
            assert answer[-1] == [count, worker1_ip, pid], (how, answer[-1])
            assert raylet_pids(lab, workers) == raylets, f"{how}: a worker's raylet restarted"
            assert labkit.invocation_ids(lab, workers) == units, f"{how}: a worker's unit restarted"
            labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 120, interval=2,
                              what=f"{how}: every node alive")
        print(f"\nwith ray_tls and ray_gcs_fault_tolerance={kind}, head down -> detached actor answers again: "
              + ", ".join(f"{how} {took} s" for how, took in figures.items()) + "; no worker restarted")

        # A rerun with fault tolerance on changes nothing and restarts nothing.
        before = labkit.invocation_ids(lab)
        rc, out, stats = labkit.run_playbook("site.yml", inventory, *settings)
        assert rc == 0, out[-3000:]
        assert all(s["changed"] == 0 for s in stats.values()), stats
        assert labkit.invocation_ids(lab) == before


def test_off_again_removes_tls_and_fault_tolerance_and_a_capture_sees_the_job_in_clear(tls_rocksdb, lab):
    labkit.sh(HEAD, "rm -f /tmp/ft_counter.py", check=False)
    rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out[-6000:]
    tls_rocksdb[2]["off"] = True
    for name in lab:
        assert labkit.sh(name, "test -e /etc/ray/tls", check=False).returncode == 1, name
        assert "RAY_USE_TLS" not in labkit.sh(name, "cat /etc/ray/ray.env").stdout
    # The store is gone (a later switch on must not reload this state) and Ray runs without it.
    assert labkit.sh(HEAD, "test -e /var/lib/ray/gcs", check=False).returncode == 1
    assert "RAY_gcs_storage" not in labkit.sh(HEAD, "cat /etc/ray/ray.env").stdout
    assert "RAY_REDIS" not in labkit.sh(HEAD, "cat /etc/ray/ray.env").stdout
    gone = labkit.sh(WORKER2, "systemctl is-active redis-server; ls /etc/redis/raymetal-gcs.conf "
                              "/var/lib/redis/appendonlydir", check=False).stdout
    assert gone.startswith(("inactive", "unknown")) and "raymetal-gcs.conf" not in gone, gone
    labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, 3, "every node ALIVE without TLS")
    # The same capture without TLS sees the marker and the token: it would have seen them above.
    output, marker, marker_seen, token_seen, frames = captured_echo(lab)
    assert f"ECHO {marker}-back" in output, output[-3000:]
    assert marker_seen > 0 and token_seen > 0, (frames, marker_seen, token_seen)
