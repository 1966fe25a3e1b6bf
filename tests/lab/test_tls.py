"""ray_tls on the lab (issue 35): Ray's gRPC channels under mutual TLS, and off again.

The lab is deployed with ray_tls on: the cluster CA and each node's certificate made on the controller, installed
on every node (the key root:ray 0640 and never in the output), every node restarted with Ray's TLS settings. Then,
while a packet capture runs on worker1's ib0 (an AF_PACKET socket in the node), a driver on the head sends a marker
string to a task pinned on worker1 and gets it back: the job runs, and neither the marker nor the cluster token is
in the capture. A driver without the TLS settings cannot reach the GCS. A rerun changes nothing. Deployed again
without ray_tls: /etc/ray/tls is gone everywhere, Ray runs without TLS, and the same capture now holds the marker and
the token in clear (so the capture would have seen them: the first capture's silence is TLS's doing).
"""

from __future__ import annotations

import ipaddress
import uuid

from cryptography import x509

from tests.lab import labkit

# On the second lab of `make e2e` (tools/e2e.sh): two deploys that restart every node.
E2E_LAB = 2

HEAD, WORKER1 = labkit.HEAD, labkit.WORKER1
RAY_ENV = "set -a; . /etc/ray/ray.env; set +a"
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


def test_ray_tls_encrypts_every_grpc_channel_and_off_removes_it(cluster, lab):
    put_scripts(lab)
    try:
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "ray_tls=true")
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

        before = labkit.invocation_ids(lab)
        rc, out, stats = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", "ray_tls=true")
        assert rc == 0 and all(s["changed"] == 0 for s in stats.values()), (stats, out[-3000:])
        assert labkit.invocation_ids(lab) == before
    finally:
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out[-6000:]
    for name in lab:
        assert labkit.sh(name, "test -e /etc/ray/tls", check=False).returncode == 1, name
        assert "RAY_USE_TLS" not in labkit.sh(name, "cat /etc/ray/ray.env").stdout
    labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, 3, "every node ALIVE without TLS")
    # The same capture without TLS sees the marker and the token: it would have seen them above.
    output, marker, marker_seen, token_seen, frames = captured_echo(lab)
    assert f"ECHO {marker}-back" in output, output[-3000:]
    assert marker_seen > 0 and token_seen > 0, (frames, marker_seen, token_seen)
    labkit.sh(HEAD, f"rm -rf {WORK}", check=False)
    labkit.sh(WORKER1, f"rm -rf {WORK}", check=False)
