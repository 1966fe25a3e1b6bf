"""What each play of raymetal's playbooks hands the nccl, acceptance and gcs_redis roles, and the applied-state watch list,
from Ray's names (tests/unit/roles/test_shared_names.py runs this in a subprocess, with the project's ansible.cfg).

    shared_names_probe.py INVENTORY_DIR  ->  JSON on stdout: [{playbook, play, role, var, value}, ...]

Loads every playbook the way ansible-playbook does (imports expanded, roles imported), resolves each play's
variables for the head with Ansible's own VariableManager (inventory, role defaults, vars_files, task vars: the
real precedence) and templates the variables below for every task of those roles that reads them, and for
every play that loads playbooks/vars/applied_state.yml. Runs nothing on any host.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from ansible import constants as C
from ansible import context
from ansible.module_utils.common.collections import ImmutableDict
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible.playbook import Playbook
from ansible.playbook.block import Block
from ansible.inventory.manager import InventoryManager
from ansible.template import Templar, trust_as_template
from ansible.vars.hostvars import HostVars
from ansible.vars.manager import VariableManager
import yaml

REPO = Path(__file__).resolve().parents[3]
WATCHED = {
    "nccl": ["nccl_venv_path"],
    "acceptance": ["acceptance_ray_python", "acceptance_ray_user", "acceptance_ray_token_path", "acceptance_ray_config"],
    # The node's fabric address, as the ray role chooses it (ray_node_ip_address, else the fabric role's).
    "gcs_redis": ["gcs_redis_bind_address", "gcs_redis_clients"],
}
APPLIED = ["raymetal_applied_watch.venvs", "raymetal_applied_watch.units[:2]", "raymetal_applied_watch.paths[0]",
           "raymetal_applied_secret_files[0]"]


def uses(role):
    """The role's tasks files that read one of its watched names: directly, through a private variable of its
    vars/main.yml that does, or through a tasks file they include."""
    base = REPO / "roles" / role
    names = list(WATCHED[role])
    private = yaml.safe_load((base / "vars" / "main.yml").read_text()) if (base / "vars" / "main.yml").is_file() else {}
    names += [key for key, value in (private or {}).items() if any(n in json.dumps(value) for n in WATCHED[role])]
    texts = {path.name: path.read_text() for path in (base / "tasks").glob("*.yml")}
    direct = {name for name, text in texts.items() if any(re.search(r"\b%s\b" % n, text) for n in names)}
    return direct | {name for name, text in texts.items()
                     if any(re.search(r"_tasks: %s\b" % re.escape(d), text) for d in direct)}


def tasks(blocks):
    for block in blocks:
        if isinstance(block, Block):
            yield from tasks(block.block + block.rescue + block.always)
        else:
            yield block


def role_of(task):
    """The role a task belongs to (import_role) or an include_role task includes, and the tasks file it runs."""
    if task.action in ("include_role", "ansible.builtin.include_role"):
        return task.args.get("name"), task.args.get("tasks_from", "main.yml")
    if not task._role:
        return None, None
    return task._role.get_name(include_role_fqcn=False), Path(task.get_path().rsplit(":", 1)[0]).name


def main(inventory_dir):
    init_plugin_loader(C.COLLECTIONS_PATHS)
    context.CLIARGS = ImmutableDict(tags=["all"], skip_tags=[], check=False, diff=False, verbosity=0)
    loader = DataLoader()
    inventory = InventoryManager(loader=loader, sources=[inventory_dir])
    manager = VariableManager(loader=loader, inventory=inventory)
    HostVars(inventory=inventory, variable_manager=manager, loader=loader)  # hostvars, as a run has them
    head = inventory.get_host("head1")
    # What the fabric role finds on each node (the probe gathers nothing): a fabric address per host.
    for index, name in enumerate(("head1", "worker1"), 1):
        manager.set_host_facts(name, {"fabric": {"address": "10.1.1.%d" % index, "interface": "ib0"}})
    found = []
    reading = {role: uses(role) for role in WATCHED}
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        playbook = Playbook.load(str(path), variable_manager=manager, loader=loader)
        for play in playbook.get_plays():
            seen = set()
            for task in tasks(play.compile()):
                role, tasks_file = role_of(task)
                names = list(WATCHED[role]) if tasks_file in reading.get(role, ()) else []
                if "vars/applied_state.yml" in (play.vars_files or []) and "applied" not in seen:
                    names += APPLIED
                    seen.add("applied")
                for name in names:
                    if (role, name) in seen:
                        continue
                    seen.add((role, name))
                    variables = manager.get_vars(play=play, host=head, task=task)
                    if task.action in ("include_role", "ansible.builtin.include_role"):
                        # Loaded at run time: the included role's defaults lie under the play's variables.
                        defaults = REPO / "roles" / role / "defaults" / "main.yml"
                        variables = dict(yaml.safe_load(defaults.read_text()) or {}, **variables)
                    try:
                        value = Templar(loader=loader, variables=variables).template(trust_as_template("{{ %s }}" % name))
                    except Exception as exc:  # an undefined name is a finding, not a crash
                        value = "ERROR: %s" % str(exc).splitlines()[0]
                    found.append({"playbook": path.name, "play": play.get_name(), "role": role, "var": name,
                                  "value": value})
    json.dump(found, sys.stdout, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1])
