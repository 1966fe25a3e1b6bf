"""Security defaults that live in configuration rather than in a role."""

from __future__ import annotations

import configparser
import pathlib

import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_ansible_checks_ssh_host_keys_by_default():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.getboolean("defaults", "host_key_checking", fallback=True) is True


def test_only_the_lab_inventory_turns_host_key_checking_off():
    offenders = []
    for path in sorted((ROOT / "inventory").rglob("*.yml")):
        text = path.read_text()
        if "StrictHostKeyChecking=no" in text and "inventory/lab/" not in str(path.relative_to(ROOT)) + "/":
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []
    lab = yaml.safe_load((ROOT / "inventory" / "lab" / "group_vars" / "ray_cluster.yml").read_text())
    assert "StrictHostKeyChecking=no" in lab["ansible_ssh_common_args"]


def test_wheelhouse_rsync_checks_host_keys_like_ansible_does():
    for task_file in ("roles/ray/tasks/install-venv.yml",):
        tasks = yaml.safe_load((ROOT / task_file).read_text())
        flat = []
        for task in tasks:
            flat.extend(task.get("block", [task]))
        syncs = [t["ansible.posix.synchronize"] for t in flat if "ansible.posix.synchronize" in t]
        assert syncs, task_file
        for sync in syncs:
            assert sync.get("verify_host") is True and sync.get("use_ssh_args") is True, (task_file, sync)
