"""The molecule cluster scenario's steps on Debian 13, on lab 2's first deploy (extensions/molecule/cluster).

`make test` runs every other molecule scenario, but not this one: its converge is `playbooks/deploy.yml` on a
head and two workers wired like the lab, which each lab's session deploy already is, from scratch. Lab 1 proves
the scenario's steps on Debian 12 (tests/lab/test_ray_cluster.py), this module on Debian 13: the converge (the
session's `cluster` fixture, a fresh deploy), the idempotence (every task again, nothing changed, no Ray unit
restarted), the check (every task in check mode plans nothing) and the scenario's verify.yml. The scenario's own
`ray_wheelhouse_fanout: copy` is proven by tests/lab/test_scale_out.py, whose new worker gets its own copy.
`make molecule` still runs the scenario itself, with its idempotence step.
"""

from __future__ import annotations

from tests.lab import labkit

# First among lab 2's modules (pytest runs them in name order): the steps run on the fresh converge, as molecule's.
E2E_LAB = 2


def test_every_task_again_changes_nothing_and_restarts_no_ray_unit(cluster, lab):
    """molecule's idempotence step: a second converge with every task (not the fast path) reports changed=0."""
    before = labkit.invocation_ids(lab)
    ran = []
    facts, changed = labkit.counting_deploy(labkit.LAB_INVENTORY, {"raymetal_fast_path": False}, ran)
    assert changed == [], changed
    assert set(lab) <= {task.split(":", 1)[0] for task in ran}, ran
    assert facts["nodes_alive"] == len(lab) and facts["missing"] == [], facts
    assert labkit.invocation_ids(lab) == before


def test_check_mode_plans_nothing_and_the_scenario_s_verify_playbook_passes(cluster, lab):
    labkit.cluster_scenario_check_and_verify(lab)
