"""Unit tests for raymetal/runner.py: real ansible-runner runs of tiny playbooks on localhost.

The playbooks are written to a temporary directory and run with
``ansible_connection=local``; they need no Ray cluster and no network.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest


from raymetal import runner
from raymetal.runner import RaymetalError

INVENTORY = """
ray_cluster:
  children:
    ray_head:
      hosts:
        head1: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}
    ray_worker:
      hosts:
        worker1: {ansible_connection: local, ansible_python_interpreter: "{{ ansible_playbook_python }}"}
        ghost: {ansible_connection: ssh, ansible_host: 127.0.0.1, ansible_port: 1}
"""

PUBLISH = """
- name: Publish a fake cluster state
  hosts: ray_head
  gather_facts: false
  tasks:
    - name: Publish it
      ansible.builtin.set_stats:
        data:
          ray_cluster: {nodes_alive: "{{ nodes | int }}", ray_version: "2.60.0"}
        aggregate: false
"""

UNREACHABLE = """
- name: Reach every node
  hosts: ray_cluster
  gather_facts: false
  tasks:
    - name: Ping
      ansible.builtin.ping:
"""

FAIL = """
- name: Fail on one host
  hosts: ray_cluster:!ghost
  gather_facts: false
  tasks:
    - name: Step that works
      ansible.builtin.debug:
        msg: fine
    - name: Ignored failure
      ansible.builtin.command: /bin/false
      changed_when: false
      ignore_errors: true
    - name: Check the worker
      ansible.builtin.assert:
        that: inventory_hostname != 'worker1'
        fail_msg: worker1 is broken on purpose
"""


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY)
    return str(path)


def playbook(tmp_path: Path, text: str) -> str:
    path = tmp_path / "play.yml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_set_stats_data_is_returned_with_extravars_applied(tmp_path, inventory):
    events = []
    data = runner.run_playbook(playbook(tmp_path, PUBLISH), inventory, extravars={"nodes": 3},
                               on_event=events.append)
    assert data == {"ray_cluster": {"nodes_alive": 3, "ray_version": "2.60.0"}}
    assert {"play": "Publish a fake cluster state", "task": "Publish it", "host": "head1",
            "status": "ok", "changed": False} in events
    assert any(e["status"] == "started" for e in events)


def test_failure_names_host_task_and_message(tmp_path, inventory):
    events = []
    with pytest.raises(RaymetalError) as err:
        runner.run_playbook(playbook(tmp_path, FAIL), inventory, on_event=events.append)
    exc = err.value
    assert exc.rc != 0 and exc.status == "failed"
    assert exc.failures == [{"host": "worker1", "play": "Fail on one host", "task": "Check the worker",
                             "msg": "worker1 is broken on purpose", "unreachable": False}]
    assert "play.yml failed on 1 host(s):\n  worker1: task 'Check the worker': worker1 is broken on purpose" in str(exc)
    assert {"play": "Fail on one host", "task": "Check the worker", "host": "worker1",
            "status": "failed", "changed": False} in events


def test_unreachable_host_is_reported(tmp_path, inventory):
    with pytest.raises(RaymetalError) as err:
        runner.run_playbook(playbook(tmp_path, UNREACHABLE), inventory)
    (failure,) = err.value.failures
    assert failure["host"] == "ghost" and failure["unreachable"] is True
    assert "ghost: UNREACHABLE" in str(err.value)


def test_limit_is_passed(tmp_path, inventory):
    with pytest.raises(RaymetalError):
        runner.run_playbook(playbook(tmp_path, FAIL), inventory)
    # worker1 is left out by the limit, so the same playbook succeeds
    assert runner.run_playbook(playbook(tmp_path, FAIL), inventory, limit="head1") == {}


def test_runs_without_ansible_runners_jsonfile_fact_cache(tmp_path, inventory):
    """ansible-runner turns on a jsonfile fact cache unless told otherwise; ansible-core 2.19 decodes it again on
    every task for every host (a full deploy of the lab took 60% more controller CPU). The API runs with the
    memory cache that ansible.cfg gives ansible-playbook."""
    seen = playbook(tmp_path, """
        - name: Report the fact cache in effect
          hosts: head1
          gather_facts: false
          tasks:
            - name: Publish it
              ansible.builtin.set_stats:
                data:
                  cache: "{{ lookup('ansible.builtin.config', 'CACHE_PLUGIN') }}"
                aggregate: false
        """)
    assert runner.run_playbook(seen, inventory) == {"cache": "memory"}


def test_syntax_error_without_task_events_still_raises(tmp_path, inventory):
    with pytest.raises(RaymetalError) as err:
        runner.run_playbook(playbook(tmp_path, "- hosts: all\n  tasks: [{name: x, no_such_module: {}}]\n"), inventory)
    assert err.value.failures == []
    assert "without a task failure; output ends with" in str(err.value)
    assert "no_such_module" in str(err.value)


def test_status_requires_published_ray_cluster(tmp_path, inventory, monkeypatch):
    monkeypatch.setattr(runner, "STATUS_PLAYBOOK", playbook(tmp_path, PUBLISH.replace("ray_cluster:", "other:").replace('"{{ nodes | int }}"', "2")))
    with pytest.raises(RaymetalError, match="published no ray_cluster stats"):
        runner.status(inventory)


def test_status_returns_ray_cluster(tmp_path, inventory, monkeypatch):
    monkeypatch.setattr(runner, "STATUS_PLAYBOOK", playbook(tmp_path, PUBLISH.replace('"{{ nodes | int }}"', "2")))
    assert runner.status(inventory) == {"nodes_alive": 2, "ray_version": "2.60.0"}


def test_missing_inventory(tmp_path):
    with pytest.raises(RaymetalError, match="does not exist"):
        runner.status(str(tmp_path / "nope"))


def test_failures_from_events_skips_ignored():
    events = [
        {"event": "runner_on_failed", "event_data": {"host": "a", "task": "t", "play": "p", "ignore_errors": True,
                                                     "res": {"msg": "x"}}},
        {"event": "runner_on_failed", "event_data": {"host": "b", "task": "t", "play": "p",
                                                     "res": {"results": [{"failed": True, "msg": "item 1 bad"},
                                                                         {"failed": False, "msg": "ok"}]}}},
    ]
    assert runner.failures_from_events(events) == [
        {"host": "b", "play": "p", "task": "t", "msg": "item 1 bad", "unreachable": False}]


PUBLISH_THEN_FAIL_UNLESS_REPORT_ONLY = PUBLISH + """
    - name: Fail when an inventory host is not an alive Ray node
      ansible.builtin.fail:
        msg: "1 inventory host(s) not an ALIVE Ray node: worker1"
      when: not (raymetal_status_report_only | default(false) | bool)
"""


def test_status_reports_a_degraded_cluster_unless_all_must_be_alive(tmp_path, inventory, monkeypatch):
    # status.yml exits 2 when a host is not alive; the API still returns the report by default.
    monkeypatch.setattr(runner, "STATUS_PLAYBOOK",
                        playbook(tmp_path, PUBLISH_THEN_FAIL_UNLESS_REPORT_ONLY.replace('"{{ nodes | int }}"', "1")))
    assert runner.status(inventory) == {"nodes_alive": 1, "ray_version": "2.60.0"}
    with pytest.raises(RaymetalError) as err:
        runner.status(inventory, require_all_alive=True)
    assert err.value.rc == 2
    assert err.value.failures[0]["msg"] == "1 inventory host(s) not an ALIVE Ray node: worker1"


def published(cluster: str) -> str:
    """A status playbook that publishes ``cluster`` (a YAML flow mapping) as the ray_cluster fact."""
    return PUBLISH.replace('{nodes_alive: "{{ nodes | int }}", ray_version: "2.60.0"}', cluster)


@pytest.mark.parametrize("cluster, code, line", [
    ('{nodes_alive: 3, address: "http://h:8265", missing: [], left_out: {}}', 0, "3 node(s) alive at http://h:8265"),
    ('{nodes_alive: 2, missing: [worker2], left_out: {}}', 2, "worker2: not an ALIVE Ray node"),
    ('{nodes_alive: 2, missing: [], left_out: {worker1: "quarantined by the health loop (hardware, gpu_xid): Xid 79"}}',
     3, "worker1: quarantined by the health loop (hardware, gpu_xid): Xid 79"),
    # A missing node outranks a quarantined one: the script has to look at the cluster either way.
    ('{nodes_alive: 1, missing: [worker2], left_out: {worker1: "quarantined by the health loop (transient, fabric_link): x"}}',
     2, "worker1: quarantined by the health loop (transient, fabric_link): x"),
    # Left out by the acceptance gate, not quarantined: not this command's business (status.yml counts it alive or not).
    ('{nodes_alive: 2, missing: [], left_out: {worker2: "acceptance gate: FAIL"}}', 0, "worker2: acceptance gate: FAIL"),
    # The S3 store does not answer: named, exit 2 (a quarantine beside it does not hide it).
    ('{nodes_alive: 3, missing: [], left_out: {worker1: "quarantined by the health loop (transient, fabric_link): x"}, '
     'storage_path: "s3://ray", storage_endpoint: "http://10.0.0.10:8333", storage_answers: false}',
     2, "the S3 store at http://10.0.0.10:8333 does not answer: checkpoints to s3://ray fail until it does"),
    # It answers, or there is no store (storage_answers null): no line, the other cases decide.
    ('{nodes_alive: 3, missing: [], left_out: {}, storage_path: "s3://ray", storage_endpoint: "http://h:8333", '
     'storage_answers: true}', 0, "3 node(s) alive at ?"),
    ('{nodes_alive: 3, missing: [], left_out: {}, storage_path: "/mnt/ray-shared", storage_endpoint: "", '
     'storage_answers: null}', 0, "3 node(s) alive at ?"),
])
def test_the_status_command_tells_quarantined_from_missing_by_its_exit_status(tmp_path, inventory, monkeypatch, capsys,
                                                                               cluster, code, line):
    from raymetal import __main__ as cli

    monkeypatch.setattr(runner, "STATUS_PLAYBOOK", playbook(tmp_path, published(cluster)))
    assert cli.main(["status", "-i", inventory]) == code
    assert line in capsys.readouterr().out.splitlines()


def test_the_status_command_exits_4_when_the_head_is_unreachable(tmp_path, monkeypatch, capsys):
    from raymetal import __main__ as cli

    path = tmp_path / "hosts.yml"
    path.write_text(INVENTORY.replace("head1: {ansible_connection: local, ansible_python_interpreter: \"{{ ansible_playbook_python }}\"}",
                                      "head1: {ansible_connection: ssh, ansible_host: 127.0.0.1, ansible_port: 1}"))
    monkeypatch.setattr(runner, "STATUS_PLAYBOOK", playbook(tmp_path, UNREACHABLE.replace("ray_cluster", "ray_head")))
    assert cli.main(["status", "-i", str(path)]) == 4
    assert "raymetal status:" in capsys.readouterr().err
