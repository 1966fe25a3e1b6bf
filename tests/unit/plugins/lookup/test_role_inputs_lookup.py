"""raymetal.cluster.role_inputs (plugins/lookup/role_inputs.py): the digest of a role's inputs, resolved, that the
full path per role compares with a node's record (playbooks/apply.yml)."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleError
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

from ansible_collections.raymetal.cluster.plugins.lookup.role_inputs import LookupModule


def digest(variables, *prefixes):
    loader = DataLoader()
    lookup = LookupModule(loader=loader, templar=Templar(loader=loader, variables=variables))
    return lookup.run(list(prefixes), variables=variables)[0]


BASE = {
    "firewall_enabled": True,
    # A template, as the wiring role's values are (read from YAML, so trusted).
    "firewall_ports": trust_as_template("{{ ray_ports + [9100] }}"),
    "ray_ports": [6379, 8265],
    "health_enabled": True,
    "inventory_hostname": "w1",
}


def test_the_same_inputs_give_the_same_digest_and_no_value_is_returned():
    one = digest(dict(BASE), "firewall")
    assert one == digest(dict(BASE), "firewall")
    assert len(one) == 64 and "6379" not in one


def test_a_change_to_the_role_s_own_setting_or_to_what_its_wired_value_reads_changes_it():
    one = digest(dict(BASE), "firewall")
    assert digest(dict(BASE, firewall_enabled=False), "firewall") != one
    # firewall_ports reads ray_ports: resolved, so another role's change reaches the firewall's digest.
    assert digest(dict(BASE, ray_ports=[6379, 8266]), "firewall") != one
    # A new setting of the role (an inventory that adds one) counts too.
    assert digest(dict(BASE, firewall_admin_cidrs=["10.0.0.0/8"]), "firewall") != one


def test_other_roles_settings_and_the_digests_themselves_do_not_count():
    one = digest(dict(BASE), "firewall")
    assert digest(dict(BASE, health_enabled=False), "firewall") == one
    assert digest(dict(BASE, raymetal_role_inputs_firewall="abc"), "firewall") == one
    # A name that only starts like the prefix, without its underscore, is another variable.
    assert digest(dict(BASE, firewallish=1), "firewall") == one


def test_a_value_that_cannot_be_resolved_counts_by_its_error_and_does_not_stop_the_run():
    broken = dict(BASE, firewall_ports=trust_as_template("{{ undefined_thing + [1] }}"))
    assert digest(dict(broken), "firewall") == digest(dict(broken), "firewall")
    assert digest(dict(broken), "firewall") != digest(dict(BASE), "firewall")


def test_several_prefixes_and_none():
    assert digest(dict(BASE), "firewall", "health") != digest(dict(BASE), "firewall")
    with pytest.raises(AnsibleError, match="at least one prefix"):
        digest(dict(BASE))


def named(variables, prefixes, names):
    loader = DataLoader()
    lookup = LookupModule(loader=loader, templar=Templar(loader=loader, variables=variables))
    return lookup.run(list(prefixes), variables=variables, names=names)[0]


def test_whole_names_count_beside_the_prefixes_and_nothing_else_does():
    derived = dict(BASE, __firewall_targets=trust_as_template("{{ ray_ports | map('string') | list }}"))
    one = named(dict(derived), ["firewall"], ["__firewall_targets"])
    # Without the name, the derived value is not an input; with it, what it reads reaches the digest.
    assert named(dict(derived), ["firewall"], []) == digest(dict(derived), "firewall") != one
    assert named(dict(derived, ray_ports=[6379]), ["firewall"], ["__firewall_targets"]) != one
    # A name that is absent counts as nothing; a similar name is another variable.
    assert named(dict(derived, __firewall_targetsx=1), ["firewall"], ["__firewall_targets", "__absent"]) == one


def test_names_must_be_a_list_of_names():
    with pytest.raises(AnsibleError, match="names must be a list"):
        named(dict(BASE), ["firewall"], "__firewall_targets")
