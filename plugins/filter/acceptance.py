"""Acceptance verdicts: per-node PASS/WARN/FAIL from node_checks facts, drift and traffic figures.

The playbook (playbooks/acceptance.yml) gathers each node's ``node_checks`` fact and hands them
here; everything that decides a verdict lives in these functions, which the unit tests call directly.
"""

from __future__ import annotations

import json
import re


# Compared first, in this order; any other version a node reports (cupy, acceptance_packages) after them.
DRIFT_KEYS = ("nvidia_driver", "cuda", "nccl", "ray", "python", "kernel", "rdma-core", "hca_firmware")
DRIFT_LABELS = {"nvidia_driver": "NVIDIA driver", "cuda": "CUDA", "nccl": "NCCL", "ray": "Ray",
                "python": "Python", "kernel": "kernel", "rdma-core": "rdma-core", "hca_firmware": "HCA firmware"}
DEFAULT_DRIFT_FAIL = ("nvidia_driver", "cuda", "nccl", "ray", "python")
SEVERITY_ORDER = {"fail": 0, "warn": 1}


def _natural(name):
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def _finding(severity, check, subject, message):
    return {"severity": severity, "check": check, "subject": subject, "message": message}


def acceptance_nodes(hosts, hostvars, fact="node_checks"):
    """{host: node_checks fact}; hosts without it get a fail finding naming why."""
    nodes = {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        facts = hvars.get("ansible_facts") or {}
        record = facts.get(fact)
        if isinstance(record, dict):
            nodes[host] = record
            continue
        why = hvars.get("__acceptance_error") or "unreachable, or the node_checks module failed"
        nodes[host] = {"ports": [], "pcie": [], "gpu_count": None, "nvidia_peermem": None, "hca_firmware": {},
                       "versions": {}, "findings": [_finding("fail", "reachable", host,
                                                             "no node checks: %s" % str(why).strip())]}
    return nodes


def acceptance_gate_left_out(hosts, hostvars):
    """{host: reason} for the hosts the deploy's acceptance gate leaves out (acceptance_gate_left_out true)."""
    found = {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        if hvars.get("acceptance_gate_left_out") in (True, "True", "true"):
            reasons = hvars.get("acceptance_gate_reasons") or ["failed its node checks"]
            found[host] = "acceptance gate: FAIL " + "; ".join(str(r) for r in reasons)
    return found


def _value(record, key):
    if key == "hca_firmware":
        firmware = sorted(set((record.get("hca_firmware") or {}).values()))
        return ",".join(firmware) if firmware else None
    return (record.get("versions") or {}).get(key)


def _show(value):
    return "none" if value in (None, "") else str(value)


def drift(nodes, pinned=None, fail_keys=DEFAULT_DRIFT_FAIL):
    """Version differences across nodes and against pinned values: one finding per host and key.

    Returns (findings_by_host, drift_list). The reference for a key is its most common value;
    a tie goes to the value of the first host in the order given (the head comes first).
    """
    pinned = dict((k, v) for k, v in (pinned or {}).items() if v not in (None, ""))
    hosts = [h for h in nodes if nodes[h].get("versions")]
    by_host = dict((h, []) for h in nodes)
    listing = []
    extra = sorted(set(k for h in hosts for k in nodes[h]["versions"]) - set(DRIFT_KEYS))
    for key in list(DRIFT_KEYS) + extra:
        values = dict((h, _value(nodes[h], key)) for h in hosts)
        if not values:
            continue
        severity = "fail" if key in fail_keys else "warn"
        label = DRIFT_LABELS.get(key, key)
        if key in pinned:
            for host in hosts:
                if str(values[host]) != str(pinned[key]):
                    message = "%s %s, pinned %s" % (label, _show(values[host]), pinned[key])
                    by_host[host].append(_finding(severity, "drift", key, message))
                    listing.append({"key": key, "host": host, "value": values[host], "expected": pinned[key],
                                    "against": "pinned"})
            continue
        counts = {}
        for host in hosts:
            counts.setdefault(values[host], []).append(host)
        if len(counts) < 2:
            continue
        reference = max(counts, key=lambda v: (len(counts[v]), -hosts.index(counts[v][0])))
        for value, members in counts.items():
            if value == reference:
                continue
            for host in members:
                message = "%s %s, others %s (%s)" % (label, _show(value), _show(reference),
                                                     ", ".join(counts[reference]))
                by_host[host].append(_finding(severity, "drift", key, message))
                listing.append({"key": key, "host": host, "value": value, "expected": reference,
                                "against": "majority"})
    return by_host, listing


def rate_findings(nodes):
    """Ports that trained below the best rate of their link layer across the cluster.

    Ports already below the best of their own node are reported by node_checks itself.
    """
    best = {}
    for record in nodes.values():
        for port in record.get("ports") or []:
            if port.get("state") == "ACTIVE" and port.get("rate_gbps"):
                layer = port.get("link_layer")
                best[layer] = max(best.get(layer, 0), port["rate_gbps"])
    by_host = dict((h, []) for h in nodes)
    for host, record in nodes.items():
        active = [p for p in record.get("ports") or [] if p.get("state") == "ACTIVE" and p.get("rate_gbps")]
        for layer in sorted(set(p.get("link_layer") for p in active)):
            mine = [p for p in active if p.get("link_layer") == layer]
            node_best = max(p["rate_gbps"] for p in mine)
            if node_best >= best[layer]:
                continue
            for port in mine:
                if port["rate_gbps"] == node_best:
                    name = port.get("netdev") or "%s:%s" % (port.get("name"), port.get("port"))
                    by_host[host].append(_finding("fail", "port_rate", "%s:%s" % (port.get("name"), port.get("port")),
                                                  "%s rate %g Gb/s, others %g Gb/s" % (name, node_best, best[layer])))
    return by_host


def traffic_findings(nodes, traffic):
    """Findings from ring tests: each result names its sender; a failed or slow pair fails the sender."""
    by_host = dict((h, []) for h in nodes)
    for item in traffic or []:
        host = item.get("src")
        if host not in by_host:
            continue
        kind = item.get("kind", "traffic")
        if item.get("error"):
            by_host[host].append(_finding(item.get("severity", "fail"), kind, item.get("dst"),
                                          ("%s to %s: %s" % (kind, item["dst"], item["error"])) if item.get("dst")
                                          else "%s: %s" % (kind, item["error"])))
        elif kind == "storage" and item.get("floor_mb_per_s"):
            figures = (("write", "write_mb_per_s"), ("read", "read_mb_per_s"))
            slow = ["%s %.1f MB/s" % (what, item[key]) for what, key in figures
                    if item.get(key) is not None and item[key] < item["floor_mb_per_s"]]
            if slow:
                by_host[host].append(_finding("fail", kind, item.get("path"), "storage %s: %s, below %.1f MB/s" % (
                    item.get("path"), ", ".join(slow), item["floor_mb_per_s"])))
        elif item.get("threshold_gbps") and (item.get("gbps") or 0) < item["threshold_gbps"]:
            by_host[host].append(_finding("fail", kind, item.get("dst"), "%s to %s %.2f Gb/s, below %.2f Gb/s" % (
                kind, item.get("dst"), item.get("gbps") or 0, item["threshold_gbps"])))
    return by_host


def _figures(record):
    """A short line of what was measured on a node, for PASS lines."""
    ports = [p for p in record.get("ports") or [] if p.get("state") == "ACTIVE"]
    parts = []
    if ports:
        rates = sorted(set(p.get("rate_gbps") for p in ports if p.get("rate_gbps")))
        parts.append("%d RDMA port(s) at %s Gb/s" % (len(ports), "/".join("%g" % r for r in rates) or "?"))
    else:
        parts.append("no RDMA ports")
    count = record.get("gpu_count")
    if count:
        widths = sorted(set("x%s" % p.get("width") for p in record.get("pcie") or [] if p.get("kind") == "gpu"))
        parts.append("%d GPU(s) PCIe %s" % (count, "/".join(widths)))
        parts.append("nvidia_peermem %s" % ("loaded" if record.get("nvidia_peermem") else "not loaded"))
    elif count == 0:
        parts.append("no GPUs")
    versions = record.get("versions") or {}
    if versions.get("ray"):
        parts.append("Ray %s" % versions["ray"])
    return ", ".join(parts)


def acceptance_report(nodes, pinned=None, fail_keys=None, traffic=None):
    """Per-node verdicts and the report (see acceptance_report.yml)."""
    fail_keys = DEFAULT_DRIFT_FAIL if fail_keys is None else tuple(fail_keys)
    drift_by_host, drift_list = drift(nodes, pinned, fail_keys)
    rates = rate_findings(nodes)
    moves = traffic_findings(nodes, traffic)
    report = {"nodes": {}, "drift": drift_list, "traffic": list(traffic or []), "lines": [],
              "summary": {"PASS": 0, "WARN": 0, "FAIL": 0}}
    for host in nodes:
        record = nodes[host]
        findings = list(record.get("findings") or []) + rates[host] + drift_by_host[host] + moves[host]
        findings.sort(key=lambda f: SEVERITY_ORDER.get(f.get("severity"), 2))
        severities = set(f.get("severity") for f in findings)
        verdict = "FAIL" if "fail" in severities else "WARN" if "warn" in severities else "PASS"
        figures = _figures(record)
        sent = ["%s to %s %.2f Gb/s" % (t.get("kind"), t.get("dst"), t["gbps"]) for t in traffic or []
                if t.get("src") == host and t.get("gbps") is not None]
        for item in traffic or []:
            if item.get("src") == host and item.get("mb_per_s") is not None:
                text = "Ray object to %s %.1f MB/s" % (item.get("dst"), item["mb_per_s"])
                if item.get("ratio") is not None:
                    text += " (TCP %.1f MB/s, ratio %.2f)" % (item["tcp_mb_per_s"], item["ratio"])
                sent.append(text)
        storage = None
        for item in traffic or []:
            if item.get("src") == host and item.get("kind") == "storage":
                storage = dict((k, item.get(k)) for k in ("path", "write_mb_per_s", "read_mb_per_s", "peer",
                                                          "floor_mb_per_s", "error"))
                if item.get("write_mb_per_s") is not None:
                    text = "storage write %.1f MB/s" % item["write_mb_per_s"]
                    if item.get("read_mb_per_s") is not None:
                        text += ", read %.1f MB/s (%s's file)" % (item["read_mb_per_s"], item.get("peer"))
                    sent.append(text)
        for item in traffic or []:
            if item.get("src") != host or item.get("kind") != "nccl":
                continue
            if item.get("busbw_gbs") is not None:
                sent.append("NCCL all-reduce %d rank(s) busbw %.2f GB/s (algbw %.2f GB/s) via %s%s" % (
                    item.get("ranks") or 0, item["busbw_gbs"], item.get("algbw_gbs") or 0,
                    item.get("transport") or "no transport NCCL reported", "/GDRDMA" if item.get("gdrdma") else ""))
            elif item.get("note"):
                sent.append(item["note"])
        if sent:
            figures = ", ".join([figures] + sent)
        report["nodes"][host] = {"verdict": verdict, "findings": findings, "figures": figures,
                                 "versions": record.get("versions") or {}}
        if storage is not None:
            report["nodes"][host]["storage"] = storage
        report["summary"][verdict] += 1
        reasons = "; ".join(f["message"] for f in findings) if findings else figures
        report["lines"].append("%s: %s %s" % (host, verdict, reasons))
    report["failed"] = report["summary"]["FAIL"] > 0
    return report


def threshold_gbps(link_src, link_dst, fraction, minimum=0):
    """The pass mark of one pair: ``minimum`` when set (> 0), else ``fraction`` of the slower link; None if unknown."""
    if minimum and float(minimum) > 0:
        return float(minimum)
    rates = [link.get("gbps") for link in (link_src, link_dst) if isinstance(link, dict) and link.get("gbps")]
    return round(float(fraction) * min(rates), 3) if rates else None


def ring_why_not(missing, receiver, receiver_missing="", check_mode=False):
    """Why a ring pair is not run, '' when it is: what keeps the sender out, else what keeps the receiver
    out (named), else check mode."""
    if missing:
        return missing
    if receiver_missing:
        return "receiver %s: %s" % (receiver, receiver_missing)
    return "check mode: no traffic sent" if check_mode else ""


def _not_run(res, missing=""):
    """Why a ring pair has no figure before its output is read: ``missing`` (a reason the pair was not run) or
    a skipped task; None when the run's output is to be read."""
    if missing:
        return missing
    if (res or {}).get("skipped"):
        return "not run (%s)" % ((res or {}).get("skip_reason") or "skipped")
    return None


def iperf3_result(res, src, dst, threshold=None, missing=""):
    """One ring pair from a registered ``iperf3 -J`` client run: {kind, src, dst, gbps, threshold_gbps, ...}.

    ``missing`` (a reason) wins: the pair was not run. A non-zero exit or unparseable output becomes
    ``error`` with iperf3's own message.
    """
    item = {"kind": "iperf3", "src": src, "dst": dst, "gbps": None, "threshold_gbps": threshold,
            "retransmits": None, "error": _not_run(res, missing)}
    if item["error"]:
        return item
    res = res or {}
    text = res.get("stdout") or ""
    try:
        data = json.loads(text) if text.strip() else {}
    except ValueError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if data.get("error") or res.get("rc") not in (0, None) or "end" not in data:
        why = data.get("error") or (res.get("stderr") or "").strip() or text.strip()[-300:] or "no output"
        if res.get("rc") == 124:
            why = "timed out (%s)" % why
        item["error"] = "iperf3 failed (rc=%s): %s" % (res.get("rc"), why)
        return item
    end = data["end"]
    received = end.get("sum_received") or end.get("sum") or {}
    sent = end.get("sum_sent") or {}
    item["gbps"] = round(float(received.get("bits_per_second", 0)) / 1e9, 3)
    item["retransmits"] = sent.get("retransmits")
    item["seconds"] = received.get("seconds")
    return item


_PERFTEST_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def ib_write_bw_result(text, src, dst, threshold=None):
    """One pair from ib_write_bw's client output (perftest): average bandwidth in Gb/s.

    Reads the unit from the header (``BW average[Gb/sec]`` with --report_gbits, else ``[MB/sec]``) and
    the last result row (the largest message size with -a).
    """
    item = {"kind": "ib_write_bw", "src": src, "dst": dst, "gbps": None, "threshold_gbps": threshold,
            "error": None}
    unit = None
    row = None
    for line in (text or "").splitlines():
        header = re.search(r"BW average\[(Gb/sec|MB/sec|MiB/sec)\]", line)
        if header:
            unit = header.group(1)
            continue
        match = _PERFTEST_ROW.match(line)
        if match and unit:
            row = match
    if row is None:
        tail = " | ".join(line.strip() for line in (text or "").strip().splitlines()[-3:])
        item["error"] = "no bandwidth in ib_write_bw output: %s" % (tail or "empty")
        return item
    average = float(row.group(4))
    if unit == "MB/sec":
        average = average * 8 / 1000.0
    elif unit == "MiB/sec":
        average = average * 8 * 1.048576 / 1000.0
    item["gbps"] = round(average, 3)
    item["bytes"] = int(row.group(1))
    return item


def ib_write_bw_run(res, src, dst, threshold=None, missing=""):
    """One RDMA ring pair from a registered ib_write_bw client run (the command task's result).

    ``missing`` (a reason) wins: the pair was not run. A skipped task, a non-zero exit (perftest's own
    message is kept) or output without a result row becomes ``error``.
    """
    item = {"kind": "ib_write_bw", "src": src, "dst": dst, "gbps": None, "threshold_gbps": threshold,
            "error": _not_run(res, missing)}
    if item["error"]:
        return item
    res = res or {}
    if res.get("rc") not in (0, None):
        text = " | ".join(line.strip() for line in ((res.get("stderr") or "") + "\n" + (res.get("stdout") or ""))
                          .strip().splitlines()[-3:])
        item["error"] = "ib_write_bw exited %s%s" % (res.get("rc"), (": " + text) if text else "")
        return item
    return ib_write_bw_result(res.get("stdout") or "", src, dst, threshold)


def rdma_ring_next(host, hosts, hostvars, key="__acceptance_rdma_device"):
    """The next host in the ring among ``hosts`` that have an RDMA port behind the fabric interface ('' if none)."""
    members = [h for h in hosts or [] if (hostvars[h] if h in hostvars else {}).get(key)]
    if host not in members:
        return ""
    return ring_next(host, members) or ""


def acceptance_traffic(hosts, hostvars, keys=("__acceptance_traffic_items", "__acceptance_ray_items",
                                              "__acceptance_nccl_items", "__acceptance_storage_items")):
    """Every ring result the hosts recorded (a list per host under each of ``keys``), in host order."""
    items = []
    for key in [keys] if isinstance(keys, str) else keys:
        for host in hosts or []:
            hvars = hostvars[host] if host in hostvars else {}
            value = hvars.get(key)
            if isinstance(value, dict):
                value = [value]
            for item in value or []:
                if isinstance(item, dict):
                    items.append(item)
    return items


def ray_transfer_items(res, hosts, hostvars, tcp=None):
    """Ring pairs from roles/acceptance/files/ray_transfer.py, named by host, next to iperf3's TCP figure.

    ``res`` is the registered script result; node IPs are matched to hosts by their fabric address.
    Each item: {kind: ray_object, src, dst, mb_per_s, tcp_mb_per_s, ratio, error}.
    """
    res = res or {}
    by_ip = {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        address = ((hvars.get("ansible_facts") or {}).get("fabric") or {}).get("address")
        if address:
            by_ip[address] = host
    if res.get("skipped"):
        return []
    try:
        data = json.loads((res.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        data = {"error": "ray_transfer.py failed (rc=%s): %s" % (
            res.get("rc"), ((res.get("stderr") or res.get("msg") or "").strip().splitlines() or ["no output"])[-1][:300])}
    if not isinstance(data, dict):
        data = {"error": "unexpected output from ray_transfer.py: %r" % (res.get("stdout") or "")[:200]}
    if data.get("error"):
        head = (hosts or ["head"])[0]
        return [{"kind": "ray_object", "src": head, "dst": None, "mb_per_s": None, "error": data["error"]}]
    tcp_by_pair = dict(((t.get("src"), t.get("dst")), t.get("gbps")) for t in tcp or [] if t.get("kind") == "iperf3")
    items = []
    for pair in data.get("pairs") or []:
        src, dst = by_ip.get(pair.get("src_ip"), pair.get("src_ip")), by_ip.get(pair.get("dst_ip"), pair.get("dst_ip"))
        item = {"kind": "ray_object", "src": src, "dst": dst, "mb_per_s": pair.get("mb_per_s"),
                "bytes": pair.get("bytes"), "seconds": pair.get("seconds"), "tcp_mb_per_s": None, "ratio": None,
                "error": pair.get("error")}
        gbps = tcp_by_pair.get((src, dst))
        if gbps:
            item["tcp_mb_per_s"] = round(gbps * 1000 / 8, 1)
            if item["mb_per_s"]:
                item["ratio"] = round(item["mb_per_s"] / item["tcp_mb_per_s"], 3)
        items.append(item)
    return items


_NCCL_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")
_NCCL_CHANNEL = re.compile(r"NCCL INFO Channel \S+ : .* via (NET/[A-Za-z]+)(/\d+)?(/GDRDMA)?")
_NCCL_VERSION = re.compile(r"NCCL INFO NCCL version (\S+)")
_NCCL_IB_DEVICES = re.compile(r"NCCL INFO NET/IB : Using (.*?)(?: ;|$)")


def nccl_transport(log):
    """What NCCL chose, from NCCL_DEBUG=INFO output.

    Returns {network: IB|Socket|None, transport: NET/IB|NET/Socket|None, gdrdma: bool, version,
    ib_devices: [...]}. ``network`` comes from "Using network X", ``transport`` from the channels'
    "via NET/X" (the first seen), ``gdrdma`` whether any network channel uses GPUDirect RDMA.
    """
    result = {"network": None, "transport": None, "gdrdma": False, "version": None, "ib_devices": []}
    for line in (log or "").splitlines():
        match = _NCCL_NETWORK.search(line)
        if match and result["network"] is None:
            result["network"] = match.group(1)
        match = _NCCL_CHANNEL.search(line)
        if match:
            result["transport"] = result["transport"] or match.group(1)
            result["gdrdma"] = result["gdrdma"] or bool(match.group(3))
        match = _NCCL_VERSION.search(line)
        if match and result["version"] is None:
            result["version"] = match.group(1)
        match = _NCCL_IB_DEVICES.search(line)
        if match:
            result["ib_devices"] = re.findall(r"\](\S+?)/(?:IB|RoCE)", match.group(1))
    if result["transport"] is None and result["network"]:
        result["transport"] = "NET/%s" % result["network"]
    return result


def nccl_busbw(size_bytes, seconds, ranks):
    """All-reduce bandwidths as nccl-tests reports them: (algbw, busbw) in GB/s.

    algbw = size / time; busbw = algbw * 2 * (n - 1) / n, the traffic each rank's link carries in a
    ring all-reduce, comparable to the link's own rate. One rank: busbw 0.
    """
    if seconds <= 0 or ranks < 1:
        raise ValueError("need a positive time and at least one rank, got %r s, %r ranks" % (seconds, ranks))
    algbw = size_bytes / seconds / 1e9
    return round(algbw, 3), round(algbw * 2 * (ranks - 1) / ranks, 3)


def nccl_verdict(transport, rdma_fabric, host, ranks=2):
    """A finding (or None) for the transport NCCL chose on this host.

    On an RDMA fabric, NET/Socket is a failure (NCCL fell back to TCP), and NET/IB without GPUDirect
    RDMA a warning. A one-rank communicator uses no network and proves only that NCCL loads.
    """
    if ranks < 2:
        return None
    chosen = transport.get("transport")
    if chosen is None:
        return _finding("fail", "nccl", host, "NCCL reported no network transport (was NCCL_DEBUG=INFO set?)")
    if rdma_fabric and chosen == "NET/Socket":
        return _finding("fail", "nccl", host, "NCCL chose NET/Socket on an RDMA fabric: collectives go over TCP "
                                              "(check NCCL_IB_HCA, nvidia_peermem and the HCAs' state)")
    if rdma_fabric and chosen == "NET/IB" and not transport.get("gdrdma"):
        return _finding("warn", "nccl", host, "NCCL uses NET/IB without GPUDirect RDMA (GDRDMA): data is staged "
                                              "through host memory (is nvidia_peermem loaded?)")
    return None


def nccl_allreduce_items(res, hosts, hostvars, rdma_kinds=("infiniband", "roce")):
    """Per-rank results of roles/acceptance/files/ray_nccl.py, named by host, with NCCL's transport.

    ``res`` is the registered script result; ranks are matched to hosts by their fabric address, and
    a host whose fabric is one of ``rdma_kinds`` must see NCCL use the network over IB (nccl_verdict).
    Each item: {kind: nccl, src, dst: None, ranks, bytes, seconds, algbw_gbs, busbw_gbs, transport,
    gdrdma, library, error, severity}; with one rank no bandwidth or transport but a note (nothing crossed
    the fabric); {kind: nccl, src: the head, note} when nothing ran on a GPU.
    """
    res = res or {}
    by_ip, rdma = {}, {}
    for host in hosts or []:
        hvars = hostvars[host] if host in hostvars else {}
        fabric = (hvars.get("ansible_facts") or {}).get("fabric") or {}
        if fabric.get("address"):
            by_ip[fabric["address"]] = host
        rdma[host] = fabric.get("kind") in rdma_kinds
    head = (hosts or ["head"])[0]
    if res.get("skipped"):
        return []
    try:
        data = json.loads((res.get("stdout") or "").strip().splitlines()[-1])
    except (ValueError, IndexError):
        data = {"error": "ray_nccl.py failed (rc=%s): %s" % (
            res.get("rc"), ((res.get("stderr") or res.get("msg") or "").strip().splitlines() or ["no output"])[-1][:300])}
    if not isinstance(data, dict):
        data = {"error": "unexpected output from ray_nccl.py: %r" % (res.get("stdout") or "")[:200]}
    if data.get("skipped"):
        return [{"kind": "nccl", "src": head, "dst": None, "note": "NCCL all-reduce not run: %s" % data["skipped"]}]
    if data.get("error"):
        return [{"kind": "nccl", "src": head, "dst": None, "error": data["error"]}]
    ranks, nbytes = data.get("ranks") or 0, data.get("bytes") or 0
    items = []
    for result in data.get("results") or []:
        host = by_ip.get(result.get("ip"), result.get("ip"))
        item = {"kind": "nccl", "src": host, "dst": None, "ranks": ranks, "bytes": nbytes,
                "seconds": result.get("seconds"), "algbw_gbs": None, "busbw_gbs": None,
                "library": result.get("library"), "error": result.get("error")}
        item.update(dict((k, v) for k, v in nccl_transport(result.get("nccl_log")).items()
                         if k in ("transport", "gdrdma", "version")))
        if not item["error"] and result.get("sum_ok") is False:
            item["error"] = "the all-reduce returned a wrong sum (expected %d on every element)" % ranks
        if not item["error"] and ranks < 2:
            # One rank sends nothing: NCCL still names the network plugin it loaded ("Using network
            # Socket" on a real H100 host with NCCL 2.28), and the in-place all-reduce takes microseconds,
            # so neither a transport nor a bandwidth is a reading of the fabric.
            item["transport"], item["gdrdma"] = None, False
            item["note"] = ("NCCL all-reduce on one rank: NCCL %s summed right on the GPU, no network used "
                            "(a fabric figure needs two or more GPU nodes)" % (item.get("version") or "(version unknown)"))
        elif not item["error"] and item["seconds"]:
            item["algbw_gbs"], item["busbw_gbs"] = nccl_busbw(nbytes, item["seconds"], ranks)
            finding = nccl_verdict(item, rdma.get(host, False), host, ranks)
            if finding:
                item["error"], item["severity"] = finding["message"], finding["severity"]
        items.append(item)
    return items


def storage_probe_result(text):
    """The JSON object files/storage_probe.py printed ({} when there is none)."""
    for line in reversed(str(text or "").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


def storage_hung(res):
    """Whether a registered storage probe step ran out of acceptance_storage_timeout: the poll gave up on its async job,
    or (on a loaded controller, when the job's own limit came first) Ansible's async wrapper killed it and said so."""
    if not isinstance(res, dict) or res.get("skipped"):
        return False
    msg = str(res.get("msg") or "")
    # The step's task has failed_when false, so its result's own `failed` says nothing: the words do.
    return "did not complete within" in msg or msg == "Timeout exceeded"


def storage_writers(hosts, hostvars, key="__acceptance_storage_write"):
    """The hosts whose storage probe write finished with a digest (the reads expect a file from them only)."""
    writers = []
    for host in hosts or []:
        res = (hostvars[host] if host in hostvars else {}).get(key)
        if isinstance(res, dict) and storage_probe_result(res.get("stdout")).get("sha256"):
            writers.append(host)
    return writers


def storage_peer(host, hosts, writers):
    """The node whose file ``host`` reads back: the next of ``writers`` after ``host`` in ``hosts``' ring order,
    never ``host`` itself ('' when no other node wrote)."""
    hosts = list(hosts or [])
    writers = set(writers or [])
    if host not in hosts:
        return ""
    start = hosts.index(host)
    for step in range(1, len(hosts)):
        candidate = hosts[(start + step) % len(hosts)]
        if candidate in writers:
            return candidate
    return ""


def _probe_error(res, what, timeout=None):
    """Why a registered probe run gave no figure ('' when it did)."""
    if not isinstance(res, dict) or res.get("skipped"):
        return ""
    if storage_hung(res):
        return ("the %s step did not finish in %s: the storage hangs on this node (a hard NFS mount whose server is "
                "gone, a stuck parallel filesystem client); the probe was killed" % (
                    what, "%s s (acceptance_storage_timeout)" % timeout if timeout else "acceptance_storage_timeout"))
    data = storage_probe_result(res.get("stdout"))
    if data.get("error"):
        return data["error"]
    if res.get("rc") not in (0, None) or not data:
        detail = (res.get("stderr") or res.get("msg") or "no output").strip().splitlines()
        return "the %s step failed: %s" % (what, detail[-1] if detail else "no output")
    return ""


def storage_items(results, host, peer, path, floor_mb_per_s=0, timeout=None):
    """One {kind: storage, src, path, peer, write_mb_per_s, read_mb_per_s, floor_mb_per_s, error} item from the
    registered write and read runs of files/storage_probe.py on ``host`` (roles/acceptance/tasks/storage.yml)."""
    write, read = (list(results or []) + [None, None])[:2]
    item = {"kind": "storage", "src": host, "dst": None, "path": path, "peer": peer or None,
            "write_mb_per_s": None, "read_mb_per_s": None, "floor_mb_per_s": float(floor_mb_per_s or 0),
            "error": None}
    error = _probe_error(write, "write", timeout)
    if error:
        item["error"] = error
        return [item]
    item["write_mb_per_s"] = storage_probe_result(write.get("stdout")).get("write_mb_per_s")
    error = _probe_error(read, "read", timeout)
    data = storage_probe_result((read or {}).get("stdout")) if isinstance(read, dict) else {}
    item["read_mb_per_s"] = data.get("read_mb_per_s")
    item["error"] = error or None
    return [item]


def ring_pairs(hosts):
    """[(sender, receiver)]: each host sends to the next, the last to the first (none for one host)."""
    hosts = list(hosts or [])
    if len(hosts) < 2:
        return []
    return [(hosts[i], hosts[(i + 1) % len(hosts)]) for i in range(len(hosts))]


def ring_next(host, hosts):
    """The host this one sends to in the ring, or None."""
    for sender, receiver in ring_pairs(hosts):
        if sender == host:
            return receiver
    return None


class FilterModule:
    """Acceptance filters."""

    def filters(self):
        return {
            "storage_probe_result": storage_probe_result,
            "storage_items": storage_items,
            "storage_hung": storage_hung,
            "storage_writers": storage_writers,
            "storage_peer": storage_peer,
            "acceptance_nodes": acceptance_nodes,
            "acceptance_report": acceptance_report,
            "ring_next": ring_next,
            "threshold_gbps": threshold_gbps,
            "iperf3_result": iperf3_result,
            "ib_write_bw_result": ib_write_bw_result,
            "ib_write_bw_run": ib_write_bw_run,
            "rdma_ring_next": rdma_ring_next,
            "ring_why_not": ring_why_not,
            "acceptance_gate_left_out": acceptance_gate_left_out,
            "acceptance_traffic": acceptance_traffic,
            "ray_transfer_items": ray_transfer_items,
            "nccl_transport": nccl_transport,
            "nccl_busbw": nccl_busbw,
            "nccl_verdict": nccl_verdict,
            "nccl_allreduce_items": nccl_allreduce_items,
        }
