#!/usr/bin/env python3
"""Compare three ways of reading a Ray cluster's state, interleaved, in one run.

(a) module:     the ray_cluster_facts module through ansible-playbook on ray_head
(b) ray-status: `ray status --address <gcs>` through ansible.builtin.command on ray_head
                (as root, RAY_AUTH_MODE=token, RAY_AUTH_TOKEN_PATH=<token file>)
(c) rest:       the same four REST calls as the module, with urllib from the controller
(d) noop:       ansible.builtin.ping through ansible-playbook: the fixed cost of (a) and (b),
                subtracted to show the net cost of each way

Usage (from the repository root):
    .venv/bin/python bench/facts/run.py -i inventory/lab -n 10
    .venv/bin/python bench/facts/run.py -i bench/facts/inventory-local.yml -n 10

Host vars read from the inventory: raymetal_summary_config_path (default
/etc/ray/cluster.json) and bench_ray_bin (default /opt/ray/venv/bin/ray).
The cluster.json and the token are read once, untimed, through Ansible.
Prints each repetition, then medians and ratios; exits 1 if the module is not
at least --target times faster than `ray status` via Ansible.
"""

import argparse
import base64
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.dirname(sys.executable)

PLAY_HEAD = """
- name: Bench {name}
  hosts: "{{{{ bench_hosts }}}}"
  gather_facts: false
  become: "{{{{ ansible_connection | default('ssh') != 'local' }}}}"
  tasks:
{tasks}
"""

TASK_MODULE = """
    - name: Read the cluster with the module
      ray_cluster_facts:
        config_path: "{{ raymetal_summary_config_path | default('/etc/ray/cluster.json') }}"
"""

TASK_STATUS = """
    - name: Read the cluster with ray status
      ansible.builtin.command:
        argv: ["{{ bench_ray_bin | default('/opt/ray/venv/bin/ray') }}", status, --address, "{{ bench_gcs }}"]
      environment:
        RAY_AUTH_MODE: token
        RAY_AUTH_TOKEN_PATH: "{{ bench_token_path }}"
        LC_ALL: C
      changed_when: false
"""

TASK_NOOP = """
    - name: Do nothing on the head (the fixed cost of one Ansible task)
      ansible.builtin.ping:
"""

# The raw REST leg, timed inside one Python process on the head: used when the
# controller cannot reach the dashboard (raymetal's firewall lets only cluster
# nodes in), so only the HTTP work is measured, not SSH or Ansible.
TASK_REST_ON_HEAD = """
    - name: Time the four REST calls on the head itself, with this script's own rest()
      ansible.builtin.script:
        cmd: "{{ bench_script }} --rest-on-node {{ bench_dashboard }} {{ bench_token_path }} {{ bench_n }}"
        executable: python3
      become: true
      register: bench_rest
      changed_when: false

    - name: Save the timings
      ansible.builtin.copy:
        content: "{{ bench_rest.stdout }}"
        dest: "{{ bench_out }}"
        mode: "0600"
      delegate_to: localhost
"""

TASK_PREP = """
    - name: Read cluster.json
      ansible.builtin.slurp:
        src: "{{ raymetal_summary_config_path | default('/etc/ray/cluster.json') }}"
      register: bench_config
    - name: Read the token
      ansible.builtin.slurp:
        src: "{{ (bench_config.content | b64decode | from_json).token_path }}"
      register: bench_token
      no_log: true
    - name: Hand them over
      ansible.builtin.copy:
        dest: "{{ bench_out }}"
        content: "{{ {'config': bench_config.content | b64decode | from_json, 'token': bench_token.content} | to_json }}"
        mode: "0600"
      delegate_to: localhost
      become: false
"""


def env():
    # The repository's ansible.cfg as users run it, with the opt-in profile_tasks (both Ansible variants).
    return dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
                ANSIBLE_CALLBACKS_ENABLED="ansible.posix.profile_tasks",
                ANSIBLE_STDOUT_CALLBACK="ansible.builtin.minimal",
                PATH=BIN + os.pathsep + os.environ.get("PATH", ""))


def playbook(tmp, name, tasks):
    path = os.path.join(tmp, name + ".yml")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(PLAY_HEAD.format(name=name, tasks=tasks))
    return path


def ansible(inventory, play, extravars):
    cmd = [os.path.join(BIN, "ansible-playbook"), "-i", inventory, play, "-e", json.dumps(extravars)]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, check=False)
    took = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit("%s failed (rc=%d):\n%s%s" % (os.path.basename(play), proc.returncode, proc.stdout[-3000:],
                                                proc.stderr[-2000:]))
    return took


def rest(base, token):
    start = time.monotonic()
    for path in ("/api/version", "/api/v0/nodes?detail=true", "/api/gcs_healthz", "/api/cluster_status"):
        req = urllib.request.Request(base + path, headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(req, timeout=30) as resp:
            body = resp.read()
        if path != "/api/gcs_healthz":
            json.loads(body)
    return time.monotonic() - start


def rest_on_node(base, token_path, n):
    """Entry point when this script runs on the head: print n REST timings as JSON."""
    with open(token_path, encoding="utf-8") as fh:
        token = fh.read().strip()
    rest(base, token)  # warm-up, not counted
    print(json.dumps([rest(base, token) for _ in range(n)]))


def main():
    if sys.argv[1:2] == ["--rest-on-node"]:
        rest_on_node(sys.argv[2], sys.argv[3], int(sys.argv[4]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("-i", "--inventory", default="inventory/lab")
    parser.add_argument("-n", "--repetitions", type=int, default=10)
    parser.add_argument("--hosts", default="ray_head")
    parser.add_argument("--target", type=float, default=2.0, help="required ray-status/module time ratio")
    args = parser.parse_args()
    inventory = os.path.abspath(args.inventory)

    with tempfile.TemporaryDirectory(prefix="raymetal-bench-") as tmp:
        out = os.path.join(tmp, "prep.json")
        ansible(inventory, playbook(tmp, "prep", TASK_PREP), {"bench_hosts": args.hosts, "bench_out": out})
        with open(out, encoding="utf-8") as fh:
            prep = json.load(fh)
        config, token = prep["config"], base64.b64decode(prep["token"]).decode().strip()
        extravars = {"bench_hosts": args.hosts, "bench_gcs": config["gcs_address"],
                     "bench_token_path": config["token_path"]}
        plays = {"module": playbook(tmp, "module", TASK_MODULE), "ray-status": playbook(tmp, "ray_status", TASK_STATUS),
                 "noop": playbook(tmp, "noop", TASK_NOOP)}
        base = config["dashboard_url"].rstrip("/")
        try:
            rest(base, token)
            rest_on_head = None
        except OSError as err:  # the firewall keeps the controller out: time REST on the head
            print("controller cannot reach %s (%s): timing the raw REST calls on the head" % (base, err))
            rest_out = os.path.join(tmp, "rest.json")
            ansible(inventory, playbook(tmp, "rest", TASK_REST_ON_HEAD),
                    dict(extravars, bench_dashboard=base, bench_n=args.repetitions + 1, bench_out=rest_out,
                         bench_script=os.path.abspath(__file__)))
            with open(rest_out, encoding="utf-8") as fh:
                rest_on_head = json.load(fh)
        runs = {
            "module": lambda: ansible(inventory, plays["module"], extravars),
            "ray-status": lambda: ansible(inventory, plays["ray-status"], extravars),
            "rest": (lambda: rest(base, token)) if rest_on_head is None else (lambda: rest_on_head.pop()),
            "noop": lambda: ansible(inventory, plays["noop"], extravars),
        }
        order = list(runs)
        for name in order:  # warm-up, not counted (imports, SSH ControlMaster)
            runs[name]()
        times = dict((name, []) for name in order)
        for rep in range(args.repetitions):
            rotated = order[rep % len(order):] + order[:rep % len(order)]
            for name in rotated:
                times[name].append(runs[name]())
            print("rep %2d: %s" % (rep + 1, "  ".join("%s %.3fs" % (n, times[n][-1]) for n in order)), flush=True)

    med = dict((name, statistics.median(values)) for name, values in times.items())
    print("\ninventory %s, hosts %s, %d repetitions, interleaved" % (args.inventory, args.hosts, args.repetitions))
    for name in order:
        print("  %-10s median %.3f s  (min %.3f, max %.3f)" % (name, med[name], min(times[name]), max(times[name])))
    ratio = med["ray-status"] / med["module"]
    print("  ray status via Ansible / module via Ansible: %.2fx" % ratio)
    print("  module via Ansible / raw REST: %.1fx" % (med["module"] / med["rest"]))
    print("  ray status via Ansible - module via Ansible: %.3f s" % (med["ray-status"] - med["module"]))
    net_module, net_status = med["module"] - med["noop"], med["ray-status"] - med["noop"]
    print("  net of the Ansible no-op: module %.3f s, ray status %.3f s (%.1fx)"
          % (net_module, net_status, net_status / net_module if net_module > 0 else float("inf")))
    if ratio < args.target:
        print("TARGET MISSED: module is %.2fx faster than ray status, target %.1fx" % (ratio, args.target))
        sys.exit(1)
    print("target met: module >= %.1fx faster than ray status via Ansible" % args.target)


if __name__ == "__main__":
    main()
