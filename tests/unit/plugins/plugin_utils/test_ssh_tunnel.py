"""plugins/plugin_utils/ssh_tunnel.py: the one SSH tunnel command both summaries print.

Imported by its collection name, as the filters import it (pytest.ini puts collections/,
where raymetal.cluster links to this repository, on sys.path).
"""

from __future__ import annotations

import os

from ansible_collections.raymetal.cluster.plugins.plugin_utils.ssh_tunnel import tunnel_command


def test_plain_host_gives_the_shortest_command():
    assert tunnel_command("10.0.0.1", 8265, {"host": "192.0.2.1"}) == \
        "ssh -N -o ExitOnForwardFailure=yes -L 8265:10.0.0.1:8265 192.0.2.1"


def test_user_port_key_under_cwd_and_common_args_in_ssh_order():
    cmd = tunnel_command("10.0.0.1", "9090", {
        "host": "192.0.2.1", "user": "root", "port": "2222", "key": "/repo/inventory/lab/../../lab/.state/key",
        "cwd": "/repo", "common_args": "  -o StrictHostKeyChecking=no "})
    assert cmd == ("ssh -N -o ExitOnForwardFailure=yes -L 9090:10.0.0.1:9090 -p 2222 -i lab/.state/key "
                   "-o StrictHostKeyChecking=no root@192.0.2.1")


def test_default_port_is_left_out_and_keys_elsewhere_stay_absolute():
    for port in (None, "", 22, "22"):
        assert " -p " not in tunnel_command("10.0.0.1", 8265, {"host": "h", "port": port})
    cmd = tunnel_command("10.0.0.1", 8265, {"host": "h", "key": "~/.ssh/site", "cwd": "/elsewhere"})
    assert cmd.endswith("-i %s h" % os.path.expanduser("~/.ssh/site"))
    # A relative key (not under cwd by construction) is only normalised.
    assert tunnel_command("10.0.0.1", 8265, {"host": "h", "key": "a/../k", "cwd": "/repo"}).endswith("-i k h")


def test_unknown_host_is_shown_as_a_question_mark():
    assert tunnel_command("10.0.0.1", 8265, None).endswith(" ?")
    assert tunnel_command("10.0.0.1", 8265, {"user": "ops"}).endswith(" ops@?")


def test_both_summaries_print_the_helpers_command():
    import importlib

    ssh = {"host": "192.0.2.1", "user": "root", "port": 2222, "key": "/repo/k", "cwd": "/repo"}
    mon = importlib.import_module("ansible_collections.raymetal.cluster.plugins.filter.monitoring")
    ray = importlib.import_module("ansible_collections.raymetal.cluster.plugins.filter.ray_cluster")
    assert mon.monitoring_tunnel_command("10.0.0.1", 9090, ssh) == tunnel_command("10.0.0.1", 9090, ssh)
    lines = ray.ray_access_lines({"address": "http://10.0.0.1:8265"}, ssh)
    assert lines[1] == "  from a workstation: %s" % tunnel_command("10.0.0.1", 8265, ssh)
