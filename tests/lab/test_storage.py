"""Shared storage on the lab (issue 40, kind mount): the lab's stand-in for a site's NFS.

The lab host's kernel has no NFS client (../shared/testbed.md), so lab/lab.sh bind-mounts one host directory into
every node at /srv/lab-shared and inventory/lab sets raymetal_shared_storage to mount it at /mnt/ray-shared with
the same systemd mount unit a site's filesystem gets (fstype none, options bind). The deployed lab (the session's
cluster fixture) is checked for: the unit mounted and enabled on every node, Ray's unit ordered after it and given
its path, a file written by a Ray task on one worker read back by a task on the other (through Ray's hardened
unit: ProtectSystem=strict with the path writable); acceptance failing every node on a directory local to each; the
role switched off on one worker unmounting and removing only its own unit, the data staying, and back on; and a
Ray Train run (tests/lab/train_resume.py, two workers on two nodes) that checkpoints to RAYMETAL_STORAGE_PATH,
loses a worker node (docker restart -t 0: killed, then booted again) and resumes from its last checkpoint.

Kind s3 (an S3 store raymetal runs, SeaweedFS from the lab's wheelhouse) is deployed once on the same lab and
checked for: the store on the head as its own user, on the fabric only on its S3 port and admitted to the members
alone, its secret key in no environment file and no command line; a file a Ray task writes on one worker through
pyarrow at RAYMETAL_STORAGE_PATH read back on the other nodes; acceptance's storage probe PASS on every node through
the store, with its figures; status.yml naming the store's endpoint; a Ray Train run that checkpoints there, loses a
worker node as above and resumes from its last checkpoint, read back from the store; then the lab's own kind again: the store stopped, its unit and
keys gone from every node, its data kept.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import uuid
from pathlib import Path

from tests.lab import labkit

HEAD, WORKER1, WORKER2 = labkit.HEAD, labkit.WORKER1, labkit.WORKER2
PATH = "/mnt/ray-shared"
UNIT = "mnt-ray\\x2dshared.mount"
RAY_ENV = "set -a; . /etc/ray/ray.env; set +a"

# A task pinned on each given node: the first writes a file through the shared storage, the others read it back
# (the job's write and read functions: a path, or for kind s3 an object through pyarrow).
JOB = '''
import os, sys, ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
ips, text = sys.argv[2].split(","), sys.argv[3]
nodes = dict((n["NodeManagerAddress"], n["NodeID"]) for n in ray.nodes() if n["Alive"])
%s
def on(ip):
    return NodeAffinitySchedulingStrategy(nodes[ip], soft=False)

path = ray.get(write.options(scheduling_strategy=on(ips[0])).remote(text), timeout=60)
print("READ " + " ".join(ray.get([read.options(scheduling_strategy=on(ip)).remote(path) for ip in ips[1:]], timeout=60)))
'''

WRITE_READ = JOB % '''
@ray.remote(num_cpus=0)
def write(text):
    path = os.path.join(os.environ["RAYMETAL_STORAGE_PATH"], "labtest-" + text)
    with open(path, "w") as out:
        out.write(text)
    return path

@ray.remote(num_cpus=0)
def read(path):
    with open(path) as handle:
        return handle.read()
'''

# Kind s3: an object through pyarrow at RAYMETAL_STORAGE_PATH (s3://<bucket>); no endpoint or key in the job, only
# what Ray's environment gives.
WRITE_READ_S3 = JOB % '''
@ray.remote(num_cpus=0)
def write(text):
    import pyarrow.fs
    fs, path = pyarrow.fs.FileSystem.from_uri(os.environ["RAYMETAL_STORAGE_PATH"] + "/labtest-" + text)
    with fs.open_output_stream(path) as out:
        out.write(text.encode())
    return path

@ray.remote(num_cpus=0)
def read(path):
    import pyarrow.fs
    fs, _ = pyarrow.fs.FileSystem.from_uri(os.environ["RAYMETAL_STORAGE_PATH"])
    with fs.open_input_stream(path) as handle:
        return handle.read().decode()
'''


def write_then_read(lab, writer, readers, job=WRITE_READ):
    """A Ray job from the head: a task on ``writer`` writes a new file through the shared storage, tasks on each of
    ``readers`` read it back; returns (the marker, the job's output)."""
    marker = uuid.uuid4().hex
    ips = ",".join(lab[name]["lab_fabric_ip"] for name in [writer] + readers)
    labkit.sh(HEAD, f"mkdir -p /var/tmp/raymetal-storage-test && cat > /var/tmp/raymetal-storage-test/job.py <<'EOF'\n"
                    f"{job}\nEOF")
    job = labkit.sh(HEAD, f"{RAY_ENV}; cd /var/tmp/raymetal-storage-test && timeout 120 /opt/ray/venv/bin/python job.py "
                          f"{lab[HEAD]['lab_fabric_ip']}:6379 {ips} {marker}", check=False, timeout=150)
    return marker, job.stdout + job.stderr


def test_every_node_mounts_the_storage_and_ray_writes_and_reads_it_across_nodes(cluster, lab):
    assert cluster["storage_path"] == PATH, cluster
    for name in lab:
        unit = labkit.sh(name, f"systemctl show -p ActiveState -p UnitFileState '{UNIT}'").stdout
        assert "ActiveState=active" in unit and "UnitFileState=enabled" in unit, (name, unit)
        written = labkit.sh(name, f"systemctl cat '{UNIT}'").stdout.splitlines()
        assert written[1] == "# raymetal shared storage", written
        assert {"What=/srv/lab-shared", f"Where={PATH}", "Type=none", "Options=bind"} <= set(written), written
        assert labkit.sh(name, f"findmnt -n -o TARGET --mountpoint {PATH}").stdout.strip() == PATH, name
        assert f"RAYMETAL_STORAGE_PATH={PATH}" in labkit.sh(name, "cat /etc/ray/ray.env").stdout.splitlines(), name
        # Ray's unit comes after the mount (at boot it never writes under an empty mount point) and wants it.
        ray_unit = labkit.unit_of(lab, name)
        wants = labkit.sh(name, f"systemctl list-dependencies --plain {ray_unit}").stdout.split()
        after = labkit.sh(name, f"systemctl list-dependencies --after --plain {ray_unit}").stdout.split()
        assert UNIT in wants and UNIT in after, (name, wants, after)
        # And what a boot starts has no ordering cycle: systemd would break it by dropping a job, any one (a mount
        # unit ordered after the network once dropped the lab's unit that names the fabric NIC, so Ray never started
        # after a reboot). A container loses that boot message (no /dev/kmsg before journald): systemd-analyze sees it.
        verify = labkit.sh(name, "systemd-analyze verify multi-user.target 2>&1", check=False).stdout
        assert "ordering cycle" not in verify, (name, [line for line in verify.splitlines() if "cycle" in line])
    marker, output = write_then_read(lab, WORKER1, [WORKER2, HEAD])
    assert f"READ {marker} {marker}" in output, output[-3000:]
    # One filesystem: the file a task on worker1 wrote is on the lab's shared directory, owned by Ray's user.
    listing = labkit.sh(WORKER2, f"stat -c '%U %a %s' {PATH}/labtest-{marker}").stdout.split()
    assert listing == ["ray", "640", "32"], listing
    labkit.sh(HEAD, f"rm -f {PATH}/labtest-{marker}; rm -rf /var/tmp/raymetal-storage-test")


def test_acceptance_fails_every_node_when_the_path_is_local_to_each(cluster, lab):
    local = "/var/tmp/raymetal-not-shared"
    try:
        rc, out, _ = labkit.run_playbook(
            "playbooks/acceptance.yml", labkit.LAB_INVENTORY, "-e", f"acceptance_storage_path={local}",
            "-e", "acceptance_traffic=false", "-e", "acceptance_ray_object=false",
            "-e", "acceptance_nccl_allreduce=false")
        assert rc != 0, out[-4000:]
        reports = sorted((labkit.LAB_INVENTORY / "acceptance").glob("acceptance-*.json"))
        report = json.loads(reports[-1].read_text())
        for name in lab:
            node = report["nodes"][name]
            assert node["verdict"] == "FAIL", report["lines"]
            assert node["storage"]["path"] == local and "not one filesystem" in node["storage"]["error"], node
            # It wrote (the figure is there) but saw nobody else's file.
            assert node["storage"]["write_mb_per_s"] > 0, node
        assert "not one filesystem" in out
    finally:
        for name in lab:
            labkit.sh(name, f"rm -rf {local}", check=False)


def test_a_node_whose_storage_hangs_is_named_and_the_others_still_pass(cluster, lab):
    # A hung mount (a hard NFS mount whose server is gone) makes the probe's process stop making progress; the
    # lab has no NFS client, so worker2's runuser stops itself before it runs the write step, as a process stuck
    # in the mount would. Each step runs in the background for acceptance_storage_timeout.
    runuser = "/usr/sbin/runuser"
    labkit.sh(WORKER2, f"cp -p {runuser} {runuser}.real && printf '#!/bin/sh\\ncase \"$*\" in "
                       f"*\" write --host \"*) kill -STOP $$;; esac\\nexec {runuser}.real \"$@\"\\n' > {runuser}")
    try:
        rc, out, _ = labkit.run_playbook(
            # 30 s: the healthy nodes' steps finish within it even with the whole suite on the machine's two cores.
            "playbooks/acceptance.yml", labkit.LAB_INVENTORY, "-e", "acceptance_storage_timeout=30",
            "-e", "acceptance_traffic=false", "-e", "acceptance_ray_object=false",
            "-e", "acceptance_nccl_allreduce=false")
        assert rc != 0, out[-4000:]
        assert "Traceback" not in out
        reports = sorted((labkit.LAB_INVENTORY / "acceptance").glob("acceptance-*.json"))
        report = json.loads(reports[-1].read_text())
        hung = report["nodes"][WORKER2]
        assert hung["verdict"] == "FAIL", report["lines"]
        assert "did not finish in 30 s" in hung["storage"]["error"], hung
        # The others read each other's files, not the one worker2 never wrote, and pass.
        for name in (HEAD, WORKER1):
            node = report["nodes"][name]
            assert node["verdict"] == "PASS", report["lines"]
            assert node["storage"]["error"] is None and node["storage"]["peer"] != WORKER2, node
            assert node["storage"]["read_mb_per_s"] > 0, node
        # The stuck probe was killed, not left behind.
        left = labkit.sh(WORKER2, "ps -eo stat=,args= | grep -E '^T' | grep -v grep", check=False).stdout.strip()
        assert left == "", left
    finally:
        labkit.sh(WORKER2, f"test ! -e {runuser}.real || mv -f {runuser}.real {runuser}; "
                           "pkill -KILL -f 'write --host' || true", check=False)


def test_switched_off_it_unmounts_only_raymetal_s_unit_keeps_the_data_and_mounts_again(cluster, lab, tmp_path):
    play = tmp_path / "storage.yml"
    play.write_text(f"""---
- name: The shared_storage role alone on {WORKER2}
  hosts: {WORKER2}
  gather_facts: false
  become: true
  roles:
    - raymetal.cluster.shared_storage
""")
    kept = f"{PATH}/labtest-kept-{uuid.uuid4().hex}"
    labkit.sh(HEAD, f"echo kept > {kept}")
    # A mount unit of the site's own, without raymetal's marker: switching off leaves it alone.
    labkit.sh(WORKER2, "mkdir -p /srv/site-own && printf '[Mount]\\nWhat=/srv/lab-shared\\nWhere=/srv/site-own\\n"
                       "Type=none\\nOptions=bind\\n' > /etc/systemd/system/srv-site\\\\x2down.mount && "
                       "systemctl daemon-reload && systemctl start 'srv-site\\x2down.mount'")
    try:
        rc, out, stats = labkit.run_playbook(str(play), labkit.LAB_INVENTORY,
                                             "-e", json.dumps({"raymetal_shared_storage": {"kind": "none"}}))
        assert rc == 0 and stats[WORKER2]["changed"] > 0, out[-4000:]
        assert labkit.sh(WORKER2, f"findmnt --mountpoint {PATH}", check=False).returncode == 1
        assert labkit.sh(WORKER2, f"test -e '/etc/systemd/system/{UNIT}'", check=False).returncode == 1
        assert labkit.sh(WORKER2, "findmnt -n -o TARGET --mountpoint /srv/site-own").stdout.strip() == "/srv/site-own"
        # The data stays where it lives: the head still reads it through its own mount.
        assert labkit.sh(HEAD, f"cat {kept}").stdout.strip() == "kept"

        rc, out, stats = labkit.run_playbook(str(play), labkit.LAB_INVENTORY)
        assert rc == 0, out[-4000:]
        assert labkit.sh(WORKER2, f"cat {kept}").stdout.strip() == "kept"
        rc, out, stats = labkit.run_playbook(str(play), labkit.LAB_INVENTORY)
        assert rc == 0 and stats[WORKER2]["changed"] == 0, (stats, out[-4000:])
        # Ray on worker2, started before the remount, writes through the new mount (its namespace sees it rw).
        marker, output = write_then_read(lab, WORKER2, [WORKER1])
        assert f"READ {marker}" in output, output[-3000:]
        labkit.sh(HEAD, f"rm -f {PATH}/labtest-{marker}; rm -rf /var/tmp/raymetal-storage-test")
    finally:
        labkit.sh(WORKER2, "systemctl stop 'srv-site\\x2down.mount'; rm -f '/etc/systemd/system/srv-site\\x2down.mount'; "
                           "rmdir /srv/site-own; systemctl daemon-reload", check=False)
        labkit.sh(HEAD, f"rm -f {kept}", check=False)
        labkit.run_playbook(str(play), labkit.LAB_INVENTORY)


def train_through_a_node_death(lab, name, work):
    """tests/lab/train_resume.py on the head as a user's driver (16 steps of 2 s, one rank on each of two nodes, Ray
    Train's FailureConfig), the worker node of a rank killed (docker restart -t 0: SIGKILL, then a boot) once rank 0
    has checkpointed step 3, and the run waited for. Returns the victim, the victim's clock before the kill, the
    last step rank 0 had checkpointed then, the step every rank resumed from, the final metrics, the final
    checkpoint's path and the whole output."""
    script = (Path(__file__).parent / "train_resume.py").read_text()
    labkit.sh(HEAD, f"mkdir -p {work} && cat > {work}/train_resume.py <<'EOF'\n{script}\nEOF")
    # The driver on the head, as a user's job would run (Ray's venv, its environment, the token).
    labkit.sh(HEAD, f"{RAY_ENV}; export RAY_ADDRESS={lab[HEAD]['lab_fabric_ip']}:6379; cd {work} && "
                    f"nohup timeout 600 /opt/ray/venv/bin/python train_resume.py {name} 16 2 > train.out 2>&1 &")

    def output():
        return labkit.sh(HEAD, f"cat {work}/train.out", check=False).stdout

    labkit.wait_until(lambda: re.search(r"^.*STEP 3$", output(), re.M), 240, 2, "the run's checkpoint of step 3")
    first = output()
    ranks = dict(re.findall(r"RANK (\d) START 0 NODE ([0-9.]+)", first))
    assert len(set(ranks.values())) == 2, first[-3000:]
    by_ip = dict((lab[n]["lab_fabric_ip"], n) for n in lab)
    victim = next(by_ip[ip] for ip in sorted(ranks.values()) if by_ip[ip] != HEAD)
    done_before = max(int(n) for n in re.findall(r"STEP (\d+)$", first, re.M))
    # The node dies (no stop, no drain: SIGKILL to the container) and boots again.
    since = labkit.sh(victim, "date '+%Y-%m-%d %H:%M:%S'").stdout.strip()
    subprocess.run(["docker", "restart", "-t", "0", victim], check=True, capture_output=True, timeout=120)
    labkit.wait_until(lambda: labkit.sh(HEAD, "pgrep -f 'train_resum[e].py'", check=False).returncode == 1, 420, 3,
                      "the run to end")
    text = output()
    assert "RESULT " in text, text[-5000:]
    resumed = [int(s) for s in re.findall(r"RANK \d START (\d+) NODE", text) if int(s) > 0]
    # Restarted by Ray Train's failure handling, every rank starts from the last checkpoint's next step, not from
    # 0: at most the step rank 0 was reporting when the node died is done again (its report can return before
    # the controller has registered that checkpoint).
    assert resumed and len(set(resumed)) == 1 and resumed[0] >= done_before, (done_before, text[-5000:])
    metrics = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    checkpoint = text.split("CHECKPOINT ", 1)[1].splitlines()[0]
    return victim, since, done_before, resumed[0], metrics, checkpoint, text


def test_a_ray_train_run_resumes_from_its_checkpoint_after_a_worker_node_dies(cluster, lab, health_faults):
    name = "labtest-" + uuid.uuid4().hex[:8]
    work = "/var/tmp/raymetal-storage-test"
    try:
        victim, since, done_before, resumed, metrics, checkpoint, _ = train_through_a_node_death(lab, name, work)
        steps = [json.loads(labkit.sh(HEAD, f"cat {path}").stdout)["step"] for path in labkit.sh(
            HEAD, f"ls -d {PATH}/train/{name}/checkpoint_*/state.json").stdout.split()]
        assert resumed - 1 in steps, (resumed, sorted(steps))
        assert metrics == {"step": 15, "start": resumed}, metrics
        # The checkpoints are on the shared storage, where every node reads them.
        assert checkpoint.startswith(f"{PATH}/train/{name}/checkpoint_"), checkpoint
        assert json.loads(labkit.sh(WORKER2 if victim != WORKER2 else WORKER1,
                                    f"cat {checkpoint}/state.json").stdout) == {"step": 15}
        # Its boot mounted the storage again, and Ray came back.
        labkit.wait_until(lambda: lab[victim]["lab_fabric_ip"] in labkit.alive_ips(lab), 240, 3, f"{victim} ALIVE again")
        boot = labkit.sh(victim, f"journalctl --no-pager -o cat --since '{since}'").stdout
        assert "Mounted mnt-ray\\x2dshared.mount" in boot, boot[-3000:]
        print(f"\ntraining run: rank 0 had checkpointed step {done_before} when {victim} was killed; "
              f"resumed at step {resumed}")
    finally:
        labkit.sh(HEAD, f"pkill -f 'train_resum[e].py'; rm -rf {PATH}/train/{name} {work}", check=False)
        # The killed node is back in the cluster before the next test.
        labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, 3, "every node ALIVE again")


S3_UNIT = "raymetal-s3.service"
S3_CREDENTIALS = "/etc/ray/storage-s3-credentials"
S3_DATA = "/var/lib/raymetal-s3"


# s3_reads: the credentials file that holds the key it is given.
OTHER_KEY_FILE = "/tmp/other-key.ini"


def s3_reads(node, marker, other_key, credentials_files):
    """As user ray on ``node``, with Ray's environment: the object labtest-MARKER read through pyarrow once with each
    of ``credentials_files`` as AWS_SHARED_CREDENTIALS_FILE (OTHER_KEY_FILE holds ``other_key``); the last line of
    each read, in order (READ and the bytes, or the error)."""
    script = ("set -a; . /etc/ray/ray.env; set +a; printf '[default]\\naws_access_key_id = raymetal\\n"
              f"aws_secret_access_key = {other_key}\\n' > {OTHER_KEY_FILE}; for f in {' '.join(credentials_files)}; do "
              "AWS_SHARED_CREDENTIALS_FILE=$f timeout 60 /opt/ray/venv/bin/python -c \"import pyarrow.fs as pf; "
              f"f, p = pf.FileSystem.from_uri('s3://ray/labtest-{marker}'); print('READ', f.open_input_stream(p).read())\" "
              f"2>&1 | tail -1; done; rm -f {OTHER_KEY_FILE}")
    return labkit.sh(node, script, user="ray", timeout=150).stdout


def test_kind_s3_runs_a_store_that_every_ray_process_reaches_and_switched_off_it_stops(cluster, lab, health_faults):
    secret_file = labkit.LAB_INVENTORY / "credentials" / "s3_secret_key"
    s3 = json.dumps({"raymetal_shared_storage": {"kind": "s3", "size_gb": 10}})
    head_ip = lab[HEAD]["lab_fabric_ip"]
    work = "/var/tmp/raymetal-storage-test"
    try:
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", s3)
        assert rc == 0, out
        assert f"the S3 store at http://{head_ip}:8333, bucket s3://ray" in out, out[-3000:]
        secret = secret_file.read_text().strip()
        assert len(secret) == 40, "the secret key is made on the controller"
        # The store runs on the head as its own user, from Ray's venv; the fabric sees only its S3 API (and its
        # gRPC port, which the firewall drops for everyone); the members alone reach the S3 port.
        assert labkit.sh(HEAD, f"systemctl is-active {S3_UNIT}").stdout.strip() == "active"
        procs = labkit.sh(HEAD, "ps -eo user:20,args | grep '[w]eed server'").stdout
        assert procs.startswith("raymetal-s3 ") and "/opt/ray/venv/bin/weed server" in procs, procs
        labkit.wait_until(lambda: f"{head_ip}:8333" in labkit.sh(HEAD, "ss -ltnH").stdout, 60, 2, "the S3 port")
        # Its ports are 8333 to 8341: the master, volume server and filer on loopback only; its metrics (8341) on
        # the fabric for the monitoring host alone.
        labkit.wait_until(lambda: f"{head_ip}:8341" in labkit.sh(HEAD, "ss -ltnH").stdout, 60, 2, "the metrics port")
        listening = [line.split()[3] for line in labkit.sh(HEAD, "ss -ltnH").stdout.splitlines()]
        ours = {a for a in listening if 8333 <= int(a.rsplit(":", 1)[1]) <= 8341}
        assert {a for a in ours if not a.startswith("127.0.0.1:")} == {
            f"{head_ip}:8333", f"{head_ip}:8334", f"{head_ip}:8341"}, ours
        assert len(ours) == 11, ours
        rules = labkit.sh(HEAD, "nft list table inet raymetal").stdout
        assert re.search(r"tcp dport 8333 iifname \"ib0\" ip saddr @cluster_v4 accept", rules), rules
        assert re.search(r"tcp dport 8334 drop", rules), rules
        assert re.search(r"tcp dport 8341 ip saddr @prometheus_v4 accept", rules), rules
        # Prometheus scrapes the store (job s3_store, on its host) and reads its size limit (size_gb volumes of
        # 1 GiB); the store's alerts are loaded.
        def prom(query):
            url = f"http://{head_ip}:9090/api/v1/query?" + urllib.parse.urlencode({"query": query})
            result = json.loads(labkit.sh(HEAD, f"curl -sf -m 10 '{url}'").stdout)["data"]["result"]
            return {r["metric"].get("host"): r["value"][1] for r in result}

        labkit.wait_until(lambda: prom('up{job="s3_store"}') == {HEAD: "1"}, 120, 3, "Prometheus scraping the store")
        assert prom('SeaweedFS_volumeServer_max_volumes{job="s3_store"}') == {HEAD: "10"}
        loaded = labkit.sh(HEAD, f"curl -sf -m 10 http://{head_ip}:9090/api/v1/rules").stdout
        for alert in ("RaymetalS3StoreDown", "RaymetalS3StoreFilling", "RaymetalS3StoreDiskFilling"):
            assert f'"name":"{alert}"' in loaded, alert
        for name in lab:
            mode = labkit.sh(name, f"stat -c '%U:%G %a' {S3_CREDENTIALS}").stdout.strip()
            assert mode == "root:ray 640", (name, mode)
            env = labkit.sh(name, "cat /etc/ray/ray.env").stdout
            assert f"AWS_ENDPOINT_URL=http://{head_ip}:8333" in env.splitlines(), (name, env)
            assert "RAYMETAL_STORAGE_PATH=s3://ray" in env.splitlines(), (name, env)
            # The key is in the credentials file alone: not in Ray's environment, nor on any command line.
            assert secret not in env, name
            assert secret not in labkit.sh(name, "ps -eo args").stdout, name
        # A task on worker1 writes through pyarrow at RAYMETAL_STORAGE_PATH; worker2 and the head read it back.
        marker, job = write_then_read(lab, WORKER1, [WORKER2, HEAD], job=WRITE_READ_S3)
        assert f"READ {marker} {marker}" in job, job[-3000:]
        # Acceptance writes and reads back through the store on every node, as Ray Train reaches it (pyarrow with
        # Ray's environment), and reports each node's figures (16 MiB each, no floor: this proves the path, not the
        # speed of two shared cores).
        rc, out, _ = labkit.run_playbook(
            "playbooks/acceptance.yml", labkit.LAB_INVENTORY, "-e", s3, "-e", "acceptance_traffic=false",
            "-e", "acceptance_storage_mib=16", "-e", "acceptance_storage_min_mb_per_s=0.1",
            "-e", "acceptance_ray_object=false", "-e", "acceptance_nccl_allreduce=false")
        report = json.loads(sorted((labkit.LAB_INVENTORY / "acceptance").glob("acceptance-*.json"))[-1].read_text())
        for name in lab:
            storage = report["nodes"][name]["storage"]
            assert storage["path"] == "s3://ray" and storage["error"] is None, (name, storage, report["lines"])
            assert storage["write_mb_per_s"] > 0 and storage["read_mb_per_s"] > 0, (name, storage)
        assert rc == 0, out[-4000:]
        # status.yml names the store's endpoint and bucket (from the inventory and the nodes' fabric addresses).
        rc, out, _ = labkit.run_playbook("playbooks/status.yml", labkit.LAB_INVENTORY, "-e", s3)
        assert rc == 0 and f"the S3 store at http://{head_ip}:8333, bucket s3://ray (it answers)" in " ".join(
            out.split()), out[-3000:]
        # A store that does not answer is named, and status.yml fails on it (exit 2) with what to do.
        labkit.sh(HEAD, f"systemctl stop {S3_UNIT}")
        try:
            rc, out, _ = labkit.run_playbook("playbooks/status.yml", labkit.LAB_INVENTORY, "-e", s3)
            flat = " ".join(out.split())
            assert rc == 2 and "(IT DOES NOT ANSWER: " in flat, out[-3000:]
            assert (f"The S3 store at http://{head_ip}:8333 ({HEAD}, raymetal_shared_storage kind s3) does not answer"
                    in flat), out[-3000:]
        finally:
            labkit.sh(HEAD, f"systemctl start {S3_UNIT}")
        labkit.wait_until(lambda: f"{head_ip}:8333" in labkit.sh(HEAD, "ss -ltnH").stdout, 60, 2, "the S3 port again")
        # Without the key, or with another, the store refuses (it is not open to whoever reaches its port).
        refused = s3_reads(WORKER2, marker, "not-the-key", [OTHER_KEY_FILE, "/nonexistent"])
        lines = refused.strip().splitlines()
        assert len(lines) == 2 and all(re.search(r"AWS Error (ACCESS_DENIED|SIGNATURE_DOES_NOT_MATCH)", line)
                                       for line in lines), refused
        # Rotation, as for the token: the key deleted on the controller, the next run makes a new one, restarts the
        # store with it and rewrites every node's key file. What was written before reads back with the new key; the
        # old key is refused.
        old_secret = secret
        secret_file.unlink()
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY, "-e", s3)
        assert rc == 0, out[-3000:]
        secret = secret_file.read_text().strip()
        assert len(secret) == 40 and secret != old_secret
        assert old_secret not in out and secret not in out, "a key in the run's output"
        for name in lab:
            creds = labkit.sh(name, f"cat {S3_CREDENTIALS}").stdout
            assert secret in creds and old_secret not in creds, name
        lines = s3_reads(WORKER1, marker, old_secret, [S3_CREDENTIALS, OTHER_KEY_FILE]).strip().splitlines()
        assert len(lines) == 2 and lines[0] == f"READ b'{marker}'", lines
        assert re.search(r"AWS Error (ACCESS_DENIED|SIGNATURE_DOES_NOT_MATCH)", lines[1]), lines
        # Ray Train checkpoints to the store; a worker node of the run dies (docker restart -t 0) and the run resumes
        # from its last checkpoint, read back from the store.
        name = "labtest-" + uuid.uuid4().hex[:8]
        victim, _, done_before, resumed, metrics, checkpoint, _ = train_through_a_node_death(lab, name, work)
        assert metrics == {"step": 15, "start": resumed}, metrics
        assert re.match(rf"^(s3://)?ray/train/{name}/checkpoint_", checkpoint), checkpoint
        # The checkpoint it resumed from and the last one are objects in the store, read by the other worker.
        reader = WORKER2 if victim != WORKER2 else WORKER1
        listing = labkit.sh(reader, f"{RAY_ENV}; timeout 60 /opt/ray/venv/bin/python -c \"import json, pyarrow.fs as pf; "
                                    f"f, p = pf.FileSystem.from_uri('s3://ray/train/{name}'); "
                                    "print('STEPS', sorted(json.loads(f.open_input_stream(i.path + '/state.json').read())"
                                    "['step'] for i in f.get_file_info(pf.FileSelector(p)) "
                                    "if i.type == pf.FileType.Directory and i.base_name.startswith('checkpoint_')))\"", user="ray", timeout=90).stdout
        steps = json.loads(listing.split("STEPS ", 1)[1].splitlines()[0])
        assert resumed - 1 in steps and 15 in steps, (resumed, steps)
        labkit.wait_until(lambda: len(labkit.alive_ips(lab)) == len(lab), 240, 3, "every node ALIVE again")
        print(f"\nkind s3: rank 0 had checkpointed step {done_before} when {victim} was killed; resumed at step {resumed}")
        # The objects are in the store's data directory on the head, which nobody but the store reads.
        assert labkit.sh(HEAD, f"stat -c '%U %a' {S3_DATA}").stdout.strip() == "raymetal-s3 700"
    finally:
        labkit.sh(HEAD, f"pkill -f 'train_resum[e].py'; rm -rf {work}", check=False)
        rc, out, _ = labkit.run_playbook("site.yml", labkit.LAB_INVENTORY)
    assert rc == 0, out
    # Switched off: the store stopped and its unit and identities gone, its port closed on the fabric; every
    # node's key and Ray's S3 environment gone; the data kept.
    assert labkit.sh(HEAD, f"systemctl is-active {S3_UNIT}", check=False).stdout.strip() in ("inactive", "unknown")
    assert labkit.sh(HEAD, f"test -e /etc/systemd/system/{S3_UNIT} || test -e /etc/raymetal/s3",
                     check=False).returncode == 1
    listening = labkit.sh(HEAD, "ss -ltnH").stdout
    assert f"{head_ip}:8333" not in listening and f"{head_ip}:8341" not in listening, listening
    # Prometheus no longer scrapes it (its target file is gone with the job).
    assert labkit.sh(HEAD, "test -e /etc/prometheus/raymetal/targets/s3_store.yml", check=False).returncode == 1
    assert int(labkit.sh(HEAD, f"du -sk {S3_DATA}").stdout.split()[0]) > 100, "the store's data stays"
    for name in lab:
        assert labkit.sh(name, f"test -e {S3_CREDENTIALS}", check=False).returncode == 1, name
        env = labkit.sh(name, "cat /etc/ray/ray.env").stdout
        assert "AWS_" not in env and f"RAYMETAL_STORAGE_PATH={PATH}" in env.splitlines(), (name, env)
