"""raymetal filters for the monitoring role: Prometheus scrape targets from the inventory."""

from __future__ import annotations

from ansible_collections.raymetal.cluster.plugins.plugin_utils.ssh_tunnel import tunnel_command

# Prometheus job of each Ray metrics port the ray role publishes in ray_ports
# (entries flagged metrics: true); any other flagged port gets "ray_<name>".
RAY_JOBS = {
    "metrics_export": "ray_node",
    "autoscaler_metrics": "ray_autoscaler",
    "dashboard_metrics": "ray_dashboard",
}
NODE_EXPORTER_JOB = "node"
# dcgm-exporter on the hosts whose monitoring role turned DCGM on (__monitoring_dcgm_on).
DCGM_JOB = "gpu"
# Prometheus job of each metrics port the shared_storage role publishes in shared_storage_ports (its S3
# store's, on the store's host); any other flagged port gets "storage_<name>".
STORAGE_JOBS = {"s3_metrics": "s3_store"}


def _address(host, addresses):
    address = str((addresses or {}).get(host) or "")
    if not address:
        raise ValueError("no fabric address known for %s (ray_node_ip, ray_node_ip_address or fabric facts)" % host)
    return address


def _truthy(value):
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _target(address, port):
    return "[%s]:%d" % (address, port) if ":" in address else "%s:%d" % (address, port)


def monitoring_scrape_targets(hosts, hostvars, addresses, head_hosts, node_exporter_port, dcgm_exporter_port=None):
    """Return {job: [file_sd entry, ...]}, one entry per host and port, sorted by job and host.

    hosts: the cluster's inventory names; hostvars: Ansible's hostvars (each
    host's ray_ports, as the ray role publishes it); addresses: {host: fabric
    IP} (the ray_fabric_ips filter); head_hosts: hosts whose head-scope ports
    are scraped. Each entry is {'targets': ['IP:port'], 'labels': {'host':
    inventory name, 'ray_role': head|worker}}. Every job appears for every
    host that runs it, so one Prometheus target is one (host, port).
    dcgm_exporter_port: the "gpu" job, for hosts whose __monitoring_dcgm_on
    (the monitoring role's preflight) is true. The metrics ports in a host's
    shared_storage_ports (the shared_storage role's S3 store) are the
    "s3_store" job.
    """
    jobs = {}
    head_hosts = set(head_hosts or [])
    for host in hosts or []:
        address = _address(host, addresses)
        role = "head" if host in head_hosts else "worker"
        labels = {"host": host, "ray_role": role}
        hvars = hostvars[host] if host in hostvars else {}

        def add(job, port):
            jobs.setdefault(job, []).append({"targets": [_target(address, int(port))], "labels": dict(labels)})

        for entry in hvars.get("ray_ports") or []:
            if not entry.get("metrics"):
                continue
            if entry.get("scope", "all") == "head" and role != "head":
                continue
            if entry.get("scope") == "closed":
                continue
            add(RAY_JOBS.get(entry["name"], "ray_" + str(entry["name"])), entry["port"])
        for entry in hvars.get("shared_storage_ports") or []:
            if entry.get("metrics"):
                add(STORAGE_JOBS.get(entry["name"], "storage_" + str(entry["name"])), entry["port"])
        add(NODE_EXPORTER_JOB, node_exporter_port)
        if dcgm_exporter_port and _truthy(hvars.get("__monitoring_dcgm_on")):
            add(DCGM_JOB, dcgm_exporter_port)
    return {job: sorted(entries, key=lambda e: e["labels"]["host"]) for job, entries in sorted(jobs.items())}


def monitoring_ports(is_monitoring_host, is_head, prometheus_port, node_exporter_port, dcgm_exporter_port=None,
                     grafana_port=None, alertmanager_ports=None):
    """Ports this node opens for monitoring, in the firewall role's firewall_ports format.

    node_exporter on every node and dcgm-exporter where it runs (metrics
    ports: open to the scrapers only); Prometheus and Grafana on the
    monitoring host, reachable from admin networks (and loopback, where the
    SSH tunnel arrives); from the cluster too when the monitoring host is not
    the head, whose dashboard queries them. Alertmanager's ports (its web port and its HA cluster port,
    alertmanager_ports) closed to all but loopback: it listens there alone once configured, and on every
    address in the moment between the package's install and that restart.
    """
    ports = [{"name": "node_exporter", "port": int(node_exporter_port), "proto": "tcp", "scope": "all",
              "metrics": True}]
    if dcgm_exporter_port:
        ports.append({"name": "dcgm_exporter", "port": int(dcgm_exporter_port), "proto": "tcp", "scope": "all",
                      "metrics": True})
    if is_monitoring_host:
        ports.append({"name": "prometheus", "port": int(prometheus_port), "proto": "tcp",
                      "scope": "closed" if is_head else "all", "admin": True})
        if grafana_port:
            ports.append({"name": "grafana", "port": int(grafana_port), "proto": "tcp",
                          "scope": "closed" if is_head else "all", "admin": True})
        for name, number in zip(("alertmanager", "alertmanager_cluster"), alertmanager_ports or []):
            ports.append({"name": name, "port": int(number), "proto": "tcp", "scope": "closed"})
    return ports


def monitoring_targets_summary(targets_response):
    """Summarise Prometheus's /api/v1/targets answer: {'up': n, 'total': n, 'down': ['job host (error)', ...]}."""
    data = (targets_response or {}).get("data") or {}
    active = data.get("activeTargets") or []
    down = []
    for target in active:
        if target.get("health") != "up":
            labels = target.get("labels") or {}
            down.append("%s %s (%s)" % (labels.get("job", "?"), labels.get("host", labels.get("instance", "?")),
                                        target.get("lastError") or target.get("health") or "unknown"))
    return {"up": len(active) - len(down), "total": len(active), "down": sorted(down)}


TARGET_FILE_HEADER = "# Managed by Ansible (raymetal monitoring role); local edits are overwritten.\n"


def monitoring_target_files(jobs, directory):
    """The node_files entries of the file_sd files, one per job: DIRECTORY/JOB.yml, root's, 0644, in job order."""
    # Here, not at the file's import: Ansible imports every filter file for each task. Ansible's own
    # to_nice_yaml, as the copy task used, represents what Ansible hands a filter (its lazy containers).
    from ansible.plugins.filter.core import to_nice_yaml

    if not isinstance(jobs, dict):
        raise ValueError("monitoring_target_files takes {job: [file_sd entry, ...]}, got %s" % type(jobs).__name__)
    return [{"path": "%s/%s.yml" % (str(directory).rstrip("/"), job),
             "content": TARGET_FILE_HEADER + to_nice_yaml(targets, indent=2),
             "owner": "root", "group": "root", "mode": "0644"}
            for job, targets in sorted(jobs.items())]


def monitoring_tunnel_command(address, port, ssh=None):
    """The SSH tunnel that brings address:port to 127.0.0.1:port on a workstation.

    ssh: host, user, port, key, common_args as Ansible reaches the host; cwd: key paths under it
    are shown relative to it.
    """
    return tunnel_command(address, port, ssh)


class FilterModule(object):
    """raymetal filters for the monitoring role."""

    def filters(self):
        return {
            "monitoring_scrape_targets": monitoring_scrape_targets,
            "monitoring_ports": monitoring_ports,
            "monitoring_targets_summary": monitoring_targets_summary,
            "monitoring_target_files": monitoring_target_files,
            "monitoring_tunnel_command": monitoring_tunnel_command,
        }
