"""Head fault tolerance: with ray_gcs_fault_tolerance rocksdb (Ray's embedded RocksDB store on the head's disk)
and redis (Redis on worker2, run by the gcs_redis role, reachable from the head only), a restart of the head's
unit, or a GCS killed with -9, restarts no worker and a detached actor created before answers after, with its
state. Switched from rocksdb to redis, the RocksDB store is gone; turned off again, Redis with its data is gone.

One test walks off -> rocksdb -> redis -> off: each switch restarts every node, so the two backends share the
deploys between them instead of each going back to off (a deploy fewer on a loaded CI machine).
Without fault tolerance a killed GCS restarts every node (tests/lab/test_reboot.py measures that).
"""

from __future__ import annotations

import json
import time

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): it restarts the head and kills its GCS.
E2E_LAB = 2

P = labkit.LAB_PREFIX
HEAD = f"{P}-head"
TOKEN_ENV = "set -a; . /etc/ray/ray.env; set +a"

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
    proc = labkit.sh(HEAD, f"{TOKEN_ENV}; cd /tmp && timeout 60 /opt/ray/venv/bin/python /tmp/ft_counter.py "
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


def test_with_gcs_fault_tolerance_a_head_restart_restarts_no_worker_and_keeps_a_detached_actor(cluster, lab, tmp_path):
    workers = [name for name in lab if name != HEAD]
    worker1_ip = lab[labkit.WORKER1]["lab_fabric_ip"]
    redis_ip = lab[labkit.WORKER2]["lab_fabric_ip"]
    # worker2 as Redis turned on and off again leaves it: redis-server installed, stopped, disabled, and unloaded by
    # systemd's reload. Turning it on again used to fail there ("Unit redis-server.service not loaded").
    labkit.sh(labkit.WORKER2, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null "
                              "&& systemctl disable --now redis-server && { systemctl reset-failed redis-server || true; } "
                              "&& systemctl daemon-reload", timeout=300)
    try:
        for kind, inventory in (("rocksdb", labkit.LAB_INVENTORY), ("redis", redis_inventory(tmp_path))):
            ft = ("-e", f"ray_gcs_fault_tolerance={kind}")
            rc, out, _ = labkit.run_playbook("site.yml", inventory, *ft)
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
                listening = labkit.sh(labkit.WORKER2, "ss -ltnH 'sport = :6390'").stdout
                assert [line.split()[3] for line in listening.splitlines() if line.strip()] == [f"{redis_ip}:6390"], listening
                assert labkit.probe_from(HEAD, redis_ip, 6390) == "open"
                assert labkit.probe_from(labkit.WORKER1, redis_ip, 6390) == "timeout"
                # A client without the head's certificate is refused in the handshake, even one that trusts Redis's CA.
                refused = redis_tls(labkit.WORKER2, redis_ip, "PING", "-CAfile /etc/redis/raymetal-gcs-tls/ca.crt")
                assert "+PONG" not in refused and "certificate required" in refused, refused
                # The head's client key shows in no diff and no -v output.
                key = (inventory / "credentials" / "gcs_redis_tls" / "client.key").read_text()
                body = "".join(line for line in key.splitlines() if not line.startswith("-----"))
                assert len(body) > 40 and body[:40] not in out
                # Nor in the journals of the head and the Redis host, where Ansible logs each module run's arguments
                # (the keys were there until node_files took secrets in a no_log option).
                for host, name in ((HEAD, "client.key"), (labkit.WORKER2, "server.key")):
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
            print(f"\nwith ray_gcs_fault_tolerance={kind}, head down -> detached actor answers again: "
                  + ", ".join(f"{how} {took} s" for how, took in figures.items()) + "; no worker restarted")

            # A rerun with fault tolerance on changes nothing and restarts nothing.
            before = labkit.invocation_ids(lab)
            rc, out, stats = labkit.run_playbook("site.yml", inventory, *ft)
            assert rc == 0, out[-3000:]
            assert all(s["changed"] == 0 for s in stats.values()), stats
            assert labkit.invocation_ids(lab) == before
    finally:
        labkit.sh(HEAD, "rm -f /tmp/ft_counter.py", check=False)
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
        assert rc == 0, out[-3000:]
    # Off again: the store is gone (a later switch on must not reload this state) and Ray runs without it.
    assert labkit.sh(HEAD, "test -e /var/lib/ray/gcs", check=False).returncode == 1
    assert "RAY_gcs_storage" not in labkit.sh(HEAD, "cat /etc/ray/ray.env").stdout
    assert "RAY_REDIS" not in labkit.sh(HEAD, "cat /etc/ray/ray.env").stdout
    gone = labkit.sh(labkit.WORKER2, "systemctl is-active redis-server; ls /etc/redis/raymetal-gcs.conf "
                                     "/var/lib/redis/appendonlydir", check=False).stdout
    assert gone.startswith(("inactive", "unknown")) and "raymetal-gcs.conf" not in gone, gone
    labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, interval=3, what="every node alive")
