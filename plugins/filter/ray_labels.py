"""Ray node labels derived from the hardware raymetal detects, and Ray's label syntax rules."""

from __future__ import annotations

import re

from ansible_collections.raymetal.cluster.plugins.plugin_utils.labels import GPU_DOMAIN, PREFIX


# Ray's rules (ray/_private/label_utils.py): an optional DNS-subdomain prefix and a name or value of
# at most 63 characters, alphanumeric at both ends, with - _ . inside. Values may be empty.
_PREFIX_RE = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)$")
_NAME_RE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]*[a-zA-Z0-9])?$")
_RATE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*Gb/sec")
_NO_CLUSTER = "00000000-0000-0000-0000-000000000000"


def label_value(text) -> str:
    """Fit free text (a GPU name, a host name) to Ray's value syntax: invalid runs become '-'."""
    value = re.sub(r"[^a-zA-Z0-9_.-]+", "-", str(text)).strip("-_.")[:63]
    return value.rstrip("-_.")


def _rate_gbps(rate):
    match = _RATE_RE.match(rate or "")
    if not match:
        return None
    figure = float(match.group(1))
    return int(figure) if figure.is_integer() else figure


def _gpu_domain(driver, hostname):
    cliques = {(c.get("cluster_uuid") or "", str(c.get("clique_id") or ""))
               for c in (driver or {}).get("fabric_cliques") or []
               if (c.get("state") or "") == "Completed" and c.get("cluster_uuid") not in (None, "", _NO_CLUSTER)}
    if len(cliques) == 1:
        uuid, clique = cliques.pop()
        return label_value(f"{uuid}.{clique}")
    return label_value(hostname)


def ray_node_labels(fabric, gpu=None, driver=None, hostname="", topology=None):
    """{label: value} of one node, from its facts and the site's topology (see ray_node_labels.yml)."""
    fabric = fabric or {}
    gpu = gpu or {}
    driver = driver or {}
    labels = {}
    kind = fabric.get("kind")
    if kind:
        labels[PREFIX + "fabric"] = kind
    if kind in ("infiniband", "roce"):
        hcas = set(fabric.get("hcas") or [])
        rails = [p for p in fabric.get("rdma_devices") or [] if f"{p.get('name')}:{p.get('port')}" in hcas]
        labels[PREFIX + "rdma-rails"] = str(len(hcas))
        rates = [r for r in (_rate_gbps(p.get("rate")) for p in rails) if r is not None]
        if rates:
            labels[PREFIX + "link-rate-gbps"] = str(min(rates))
    count = int(gpu.get("count") or driver.get("count") or 0)
    if count > 0:
        labels[PREFIX + "gpu-count"] = str(count)
        names = sorted(set(driver.get("names") or []))
        if len(names) == 1:
            labels[PREFIX + "gpu-model"] = label_value(names[0])
        memory = [m for m in driver.get("memory_total_mib") or [] if m]
        if memory:
            labels[PREFIX + "gpu-memory-gib"] = str(round(min(memory) / 1024))
        labels[GPU_DOMAIN] = _gpu_domain(driver, hostname)
    for key, value in sorted((topology or {}).items()):
        labels[PREFIX + str(key)] = str(value)
    return labels


def ray_label_problems(labels):
    """One message per label Ray would refuse (see ray_label_problems.yml)."""
    problems = []
    for key, value in sorted((labels or {}).items(), key=lambda kv: str(kv[0])):
        key = str(key)
        prefix, dummy, name = key.rpartition("/")
        if "/" in key and (len(prefix) > 253 or not _PREFIX_RE.match(prefix)):
            problems.append(f"label '{key}': its prefix '{prefix}' must be DNS labels separated by dots "
                            "(lower-case letters, digits and -), at most 253 characters")
        elif len(name) > 63 or not _NAME_RE.match(name):
            problems.append(f"label '{key}': its name '{name}' must be 1-63 characters, letters and digits at both "
                            "ends, - _ . inside")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)  # written as a string in the labels file
        if not isinstance(value, str):
            problems.append(f"label '{key}': its value {value!r} must be a string or a number (quote it in YAML)")
        elif value and (len(value) > 63 or not _NAME_RE.match(value)):
            problems.append(f"label '{key}': its value '{value}' must be empty or 1-63 characters, letters and "
                            "digits at both ends, - _ . inside")
    return problems


class FilterModule:
    def filters(self):
        return {
            "ray_node_labels": ray_node_labels,
            "ray_label_problems": ray_label_problems,
        }
