# Copyright: raymetal contributors
# SPDX-License-Identifier: Apache-2.0
"""What a node's GPU health checks read, and how each finding is classed.

One implementation for every caller: the acceptance role's ``node_checks`` module and the node's
health loop read the same inputs through these functions and class the same faults the same way.

Inputs (all read-only, standard library only):
- ``nvidia-smi --query-gpu=<HEALTH_QUERY> --format=csv,noheader,nounits``: uncorrectable ECC errors
  since the driver loaded, pages waiting for retirement (pre-Ampere GPUs; ``[N/A]`` on Hopper),
  rows waiting for remapping and remapping failures (Ampere and later);
- the kernel log (``/dev/kmsg``, one record per read: ``prio,seq,usec,flags;text``): the driver's
  ``NVRM: Xid (PCI:...): N, ...`` lines and "fallen off the bus";
- ``/proc/driver/nvidia/gpus/<pci address>/``: the GPUs the driver holds, without nvidia-smi.

Each finding has a class: ``hardware`` (the GPU needs an operator: uncorrectable ECC, a GPU gone
from the bus or from the driver, a failed row remap) or ``transient`` (it may pass by itself). An
Xid an application causes (13, 31, 43, 45: a bad pointer in someone's kernel, as the recording of
a real H200 in tests/fixtures/nvidia/recorded-h200-vm shows) says nothing about the node and is
no finding; an Xid this table does not know is a warning, never a fail.
"""

from __future__ import annotations

import errno
import os
import re
import stat

# nvidia-smi --query-gpu fields, in this order (checked against --help-query-gpu of driver 580).
HEALTH_QUERY = (
    "index", "pci.bus_id", "uuid", "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total", "ecc.errors.uncorrected.aggregate.total",
    "retired_pages.pending", "remapped_rows.pending", "remapped_rows.failure",
    "remapped_rows.uncorrectable",
)

HARDWARE = "hardware"
TRANSIENT = "transient"

# Xids that mean the GPU (not the program on it) failed: NVIDIA's Xid catalog, "reset the GPU" or
# "report to the vendor" resolutions.
XID_HARDWARE = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}
# Xids a program causes, or that the driver recovered from for it: no finding on the node.
XID_APPLICATION = {
    13: "graphics engine exception (a program's fault)",
    31: "GPU memory page fault (a program's illegal address)",
    43: "GPU stopped processing (a program's fault)",
    45: "preemptive cleanup after an earlier error",
    63: "row remapping recorded (remapped_rows.pending says whether a reset is due)",
    94: "contained ECC error (the program using that memory was stopped)",
}

_XID = re.compile(r"NVRM: Xid \(PCI:(?P<pci>[0-9A-Fa-f:.]+)\): (?P<xid>\d+)(?:, pid=(?P<pid>[^,]*))?(?:, name=(?P<name>[^,]*))?")
_OFF_BUS = re.compile(r"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>[0-9A-Fa-f:.]+):? GPU has fallen off the bus")
_NOT_A_VALUE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "")


def smi_health_command(nvidia_smi="nvidia-smi"):
    """The nvidia-smi command line whose output parse_smi_health reads."""
    return [nvidia_smi, "--query-gpu=" + ",".join(HEALTH_QUERY), "--format=csv,noheader,nounits"]


def _value(text):
    text = text.strip()
    if text in _NOT_A_VALUE:
        return None
    if text in ("Yes", "No"):
        return text == "Yes"
    try:
        return int(text)
    except ValueError:
        return text


def parse_smi_health(text):
    """One dict per GPU, keyed by HEALTH_QUERY's fields; [N/A] is None, Yes/No are booleans."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) != len(HEALTH_QUERY):
            raise ValueError("nvidia-smi gave %d fields where %d were asked for: %r" % (len(cells), len(HEALTH_QUERY), line))
        rows.append(dict(zip(HEALTH_QUERY, [_value(cell) for cell in cells])))
    return rows


def short_pci(address):
    """'00000000:00:06.0' (nvidia-smi), '0000:00:06.0' (sysfs) and '0000:00:06' (Xid lines) as '0000:00:06'."""
    address = str(address or "").lower()
    domain, dummy, rest = address.partition(":")
    if not rest:
        return address
    return "%s:%s" % (domain[-4:].rjust(4, "0"), rest.split(".")[0])


def finding(severity, check, subject, message, klass=None):
    """A finding as node_checks returns them; ``class`` is set for the faults the health loop acts on."""
    found = {"severity": severity, "check": check, "subject": subject, "message": message}
    if klass:
        found["class"] = klass
    return found


def gpu_health_findings(rows):
    """Findings from parse_smi_health's rows: each is a hardware fault."""
    found = []
    for row in rows:
        gpu = "GPU %s (%s)" % (row.get("index"), row.get("pci.bus_id"))
        subject = str(row.get("pci.bus_id"))
        volatile = row.get("ecc.errors.uncorrected.volatile.total")
        if isinstance(volatile, int) and volatile > 0:
            found.append(finding("fail", "gpu_ecc", subject, "%s: %d uncorrectable ECC error(s) since the driver loaded"
                                 % (gpu, volatile), HARDWARE))
        if row.get("remapped_rows.failure") is True:
            found.append(finding("fail", "gpu_row_remap", subject, "%s: a row remapping failed (the GPU needs the "
                                 "vendor's repair)" % gpu, HARDWARE))
        elif row.get("remapped_rows.pending") is True:
            found.append(finding("fail", "gpu_row_remap", subject, "%s: a row remapping is pending (the GPU needs a "
                                 "reset before its memory is trusted)" % gpu, HARDWARE))
        if row.get("retired_pages.pending") is True:
            found.append(finding("fail", "gpu_page_retirement", subject, "%s: a page retirement is pending (the GPU "
                                 "needs a reset)" % gpu, HARDWARE))
    return found


def parse_kmsg_record(record):
    """{prio, seq, usec, text} of one /dev/kmsg record ('6,1234,5678,-;text'), None for a continuation line."""
    head, sep, text = record.partition(";")
    fields = head.split(",")
    if not sep or len(fields) < 3:
        return None
    try:
        prio, seq, usec = int(fields[0]), int(fields[1]), int(fields[2])
    except ValueError:
        return None
    return {"prio": prio & 7, "seq": seq, "usec": usec, "text": text.split("\n", 1)[0].rstrip()}


def read_kmsg(path="/dev/kmsg", after_seq=-1):
    """The kernel log's records with a sequence number above after_seq.

    /dev/kmsg gives one record per read and raises EPIPE when the record it was at was overwritten
    (the reader then goes on with the oldest one left); a regular file (a recording) is read as one
    record per line. Raises OSError when the log cannot be read (no /dev/kmsg in a container).
    """
    records = []
    if not stat.S_ISCHR(os.stat(path).st_mode):
        with open(path, "r", encoding="utf-8", errors="replace") as handle:
            lines = handle.read().splitlines()
        parsed = [parse_kmsg_record(line) for line in lines]
        return [rec for rec in parsed if rec and rec["seq"] > after_seq]
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, 8192)
            except BlockingIOError:
                break
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    continue
                raise
            if not chunk:
                break
            rec = parse_kmsg_record(chunk.decode("utf-8", "replace"))
            if rec and rec["seq"] > after_seq:
                records.append(rec)
    finally:
        os.close(fd)
    return records


def xid_events(records):
    """The driver's Xid and fallen-off-the-bus lines among kernel log records, with their class."""
    events = []
    for rec in records:
        text = rec["text"]
        match = _XID.search(text)
        if match:
            xid = int(match.group("xid"))
            klass = HARDWARE if xid in XID_HARDWARE else "application" if xid in XID_APPLICATION else "unknown"
            meaning = XID_HARDWARE.get(xid) or XID_APPLICATION.get(xid) or "not in raymetal's table"
            events.append({"seq": rec["seq"], "usec": rec["usec"], "pci": short_pci(match.group("pci")), "xid": xid,
                           "class": klass, "meaning": meaning, "process": match.group("name"), "text": text})
            continue
        match = _OFF_BUS.search(text)
        if match:
            events.append({"seq": rec["seq"], "usec": rec["usec"], "pci": short_pci(match.group("pci")), "xid": 79,
                           "class": HARDWARE, "meaning": XID_HARDWARE[79], "process": None, "text": text})
    return events


def xid_findings(events):
    """One finding per GPU and Xid: hardware ones fail, unknown ones warn, a program's own are none."""
    found, seen = [], set()
    for event in events:
        key = (event["pci"], event["xid"])
        if event["class"] == "application" or key in seen:
            continue
        seen.add(key)
        count = len([e for e in events if (e["pci"], e["xid"]) == key])
        times = " (%d times)" % count if count > 1 else ""
        if event["class"] == HARDWARE:
            found.append(finding("fail", "gpu_xid", event["pci"], "GPU %s: Xid %d, %s%s in the kernel log" % (
                event["pci"], event["xid"], event["meaning"], times), HARDWARE))
        else:
            found.append(finding("warn", "gpu_xid", event["pci"], "GPU %s: Xid %d%s in the kernel log, %s" % (
                event["pci"], event["xid"], times, event["meaning"])))
    return found


def driver_gpus(proc_root="/proc/driver/nvidia/gpus"):
    """PCI addresses of the GPUs the loaded driver holds; None when the driver is not loaded."""
    try:
        return sorted(name.lower() for name in os.listdir(proc_root))
    except OSError:
        return None


def lost_gpu_findings(pci_gpus, held):
    """GPUs on the PCI bus that the loaded driver no longer holds (held None: no driver, no finding)."""
    if held is None:
        return []
    have = set(short_pci(address) for address in held)
    return [finding("fail", "gpu_lost", address, "GPU %s is on the PCI bus but the NVIDIA driver does not hold it "
                    "(fallen off the bus, or failed to initialise)" % address, HARDWARE)
            for address in pci_gpus if short_pci(address) not in have]


# ---------------------------------------------------------------------------------------------
# The node's own checks beyond the GPU (the fabric interface, Ray's temp dir): both transient.

def interface_findings(sysfs_root, interface, expected_address, addresses):
    """The fabric interface down, or without the address Ray is bound to: a transient fail each.

    ``addresses`` are the interface's IPv4/IPv6 addresses now (the caller reads them); an empty
    ``expected_address`` checks the link alone.
    """
    operstate = None
    try:
        with open(os.path.join(sysfs_root, "class", "net", interface, "operstate"), encoding="ascii") as handle:
            operstate = handle.read().strip()
    except OSError:
        return [finding("fail", "fabric_link", interface, "the fabric interface %s is gone" % interface, TRANSIENT)]
    found = []
    # "unknown" is what virtual and some IPoIB devices report while they carry traffic.
    if operstate not in ("up", "unknown"):
        found.append(finding("fail", "fabric_link", interface, "the fabric interface %s is %s" % (interface, operstate),
                             TRANSIENT))
    if expected_address and expected_address not in addresses:
        found.append(finding("fail", "fabric_address", interface, "the fabric interface %s lost %s, the address Ray "
                             "is bound to (it has: %s)" % (interface, expected_address, ", ".join(addresses) or "none"),
                             TRANSIENT))
    return found


def temp_dir_findings(path, min_free_bytes):
    """Ray's temp dir with less free space than min_free_bytes: a transient fail (object spilling, logs)."""
    try:
        stats = os.statvfs(path)
    except OSError as exc:
        return [finding("fail", "temp_dir", path, "Ray's temp dir %s cannot be read: %s" % (path, exc.strerror),
                        TRANSIENT)]
    free = stats.f_bavail * stats.f_frsize
    if free < min_free_bytes:
        return [finding("fail", "temp_dir", path, "Ray's temp dir %s has %d MiB free, %d MiB needed" % (
            path, free // 2 ** 20, min_free_bytes // 2 ** 20), TRANSIENT)]
    return []


# ---------------------------------------------------------------------------------------------
# The loop's decisions, kept apart from its inputs: what one round does with its findings.

QUARANTINED = "quarantined"


def worst(findings):
    """(class, the fails of that class) of a round: hardware before transient; (None, []) when none fails."""
    fails = [f for f in findings if f["severity"] == "fail"]
    hardware = [f for f in fails if f.get("class") == HARDWARE]
    if hardware:
        return HARDWARE, hardware
    return (TRANSIENT, fails) if fails else (None, [])


def next_state(record, findings, now, readmit_passes):
    """One round: (the node's new quarantine record or None, the action).

    Actions: ``quarantine`` (a healthy node fails: the caller asks the breaker first, then drains and
    stops Ray), ``readmit`` (a transient quarantine passed ``readmit_passes`` rounds in a row), ``hold``
    (stays quarantined; a hardware one always does until an operator re-admits it), ``worse`` (a
    transient quarantine now shows a hardware fault: it becomes hardware) or None (healthy, nothing to do).
    """
    klass, fails = worst(findings)
    if not record:
        if klass is None:
            return None, None
        first = fails[0]
        return ({"state": QUARANTINED, "class": klass, "check": first["check"], "subject": first["subject"],
                 "finding": "; ".join(f["message"] for f in fails), "since": now, "passes": 0}, "quarantine")
    record = dict(record)
    if record["class"] == HARDWARE:
        record["passes"] = 0 if klass else record.get("passes", 0) + 1
        return record, "hold"
    if klass == HARDWARE:
        record.update({"class": HARDWARE, "check": fails[0]["check"], "subject": fails[0]["subject"],
                       "finding": "; ".join(f["message"] for f in fails), "passes": 0})
        return record, "worse"
    if klass:
        record["passes"] = 0
        return record, "hold"
    record["passes"] = record.get("passes", 0) + 1
    if record["passes"] >= readmit_passes:
        return None, "readmit"
    return record, "hold"


def breaker(quarantines, host, workers, max_share, max_at_once, window_s, now):
    """(allowed, why not): may ``host`` be quarantined now, given the cluster's quarantine records?

    ``quarantines`` maps each worker to its record (those of the last ``window_s`` seconds count, lifted
    ones included when the caller keeps them with a ``lifted`` time); at most ``max_at_once`` held at
    once and at most ``max_share`` (0-1) of the ``workers`` in the window, rounded down, never fewer than
    one. A fault across the fabric must not empty the cluster: past the limit the loop alerts instead.
    """
    held = sorted(name for name, rec in quarantines.items() if name != host and not rec.get("lifted"))
    recent = sorted(name for name, rec in quarantines.items()
                    if name != host and now - rec.get("since", now) <= window_s)
    in_window = max(1, int(workers * max_share))
    if len(held) >= max_at_once:
        return False, ("%s was not quarantined: %d worker(s) already are (%s), the limit at once is %d"
                       % (host, len(held), ", ".join(held), max_at_once))
    if len(recent) >= in_window:
        return False, ("%s was not quarantined: %d of %d worker(s) were in the last %d s (%s), the limit is %d "
                       "(%g%% of the workers)" % (host, len(recent), workers, window_s, ", ".join(recent), in_window,
                                                  max_share * 100))
    return True, ""


def round_findings(config, state, read):
    """(findings, kernel log records read) of one round's checks: the GPUs, the Xid lines logged after the
    state's ``kmsg_seq``, the fabric interface and Ray's temp dir (``node_round`` and ``operator_readmit``)."""
    findings = []
    rows = read["smi"]() if config.get("gpus") else None
    findings.extend(gpu_health_findings(rows or []))
    findings.extend(lost_gpu_findings(config.get("gpus") or [], read["driver_gpus"]() if config.get("gpus") else None))
    records = read["kmsg"](state.get("kmsg_seq", -1))
    findings.extend(xid_findings(xid_events(records)))
    if config.get("interface"):
        findings.extend(interface_findings(config.get("sysfs_root", "/sys"), config["interface"],
                                           config.get("address", ""), read["addresses"](config["interface"])))
    if config.get("temp_dir"):
        findings.extend(temp_dir_findings(config["temp_dir"], int(config.get("min_free_bytes", 0))))
    return findings, records


def last_seq(records, state):
    """The kernel log cursor after a round: the last record read, or the state's where none was."""
    return max([rec["seq"] for rec in records] + [state.get("kmsg_seq", -1)])


def _boot_id(read):
    reader = read.get("boot_id")
    return (reader() or None) if reader else None


def _with_boot(state, boot):
    if boot:
        state["boot_id"] = boot
    return state


def this_boot(state, boot):
    """(the state to read the kernel log from, whether what the round reads is history): the cursor of one boot.

    The kernel numbers its log's records from 0 at every boot, so a cursor (``kmsg_seq``) kept from the boot
    before would hide every record of this boot below it: an Xid logged after a reboot would go unseen. The state
    keeps the id of the boot its cursor counts in (``boot_id``, /proc/sys/kernel/random/boot_id). Another id: the
    cursor starts over and what this boot logged counts (it came after whatever the node went through before
    the reboot). No state yet (the loop's first round), or a cursor without an id (kept by a loop older than the
    id): the log since boot is read as history (``before_the_loop``), and the id is kept from then on. An id that
    cannot be read keeps the cursor as it is.
    """
    if "kmsg_seq" not in state:
        return state, True
    if not boot or state.get("boot_id") == boot:
        return state, False
    return dict(state, kmsg_seq=-1), "boot_id" not in state


def before_the_loop(found):
    """A hardware Xid the first round read, logged before this loop started: a warning, not a fault to act on.

    A fresh loop (no state yet: just installed, or its state removed) reads the log since boot. An Xid
    there may predate a GPU reset or a repair; what the GPU is now, the same round's other checks say (the GPU
    lost from the driver, nvidia-smi's health), and those still quarantine. Other findings are unchanged.
    """
    if found["check"] != "gpu_xid" or found["severity"] != "fail":
        return found
    return finding("warn", "gpu_xid", found["subject"], "%s, logged before this health loop started (not acted on: "
                   "the GPU's present state is checked apart)" % found["message"])


def node_round(config, state, now, read):
    """One round of the node's health loop: (new state, the round's findings, the action).

    ``config``: ``role`` (``head`` or ``worker``), ``interface`` and ``address`` (the fabric interface and the
    address Ray is bound to), ``temp_dir`` and ``min_free_bytes``, ``gpus`` (the PCI addresses of the GPUs
    on the bus, as the deploy found them), ``readmit_passes``, ``sysfs_root``.
    ``state``: what the last round kept: ``record`` (the quarantine record or None) and ``kmsg_seq`` (the
    last kernel log record read; -1 at first).
    ``read``: the inputs, as callables (tests pass recordings): ``smi()`` -> parse_smi_health rows or None,
    ``kmsg(after_seq)`` -> read_kmsg records, ``driver_gpus()`` -> driver_gpus, ``addresses(interface)`` ->
    the interface's addresses, and optionally ``boot_id()`` -> this boot's id (None: unknown).

    Only kernel log records after ``kmsg_seq`` count, so an Xid is a finding in the round it appears (a
    hardware one quarantines the node until an operator re-admits it; the same line never counts twice).
    The first round (a state without ``kmsg_seq``: no round ran yet) reads the log since boot, and an Xid
    there is a warning only (``before_the_loop``); a loop that ran with no kernel log to read keeps -1.
    The cursor belongs to one boot (``boot_id``, ``this_boot``): after a reboot this boot's log is read from
    its start, and what it holds counts.
    On the head the action is ``report`` where a worker's would be ``quarantine``: the loop never stops
    the head.
    """
    boot = _boot_id(read)
    state, history = this_boot(state, boot)
    findings, records = round_findings(config, state, read)
    if history:
        findings = [before_the_loop(f) for f in findings]
    record, action = next_state(state.get("record"), findings, now, int(config.get("readmit_passes", 4)))
    seq = last_seq(records, state)
    if record and action == "quarantine":
        record["kmsg_seq"] = seq
    if config.get("role") == "head" and action in ("quarantine", "worse"):
        action = "report"
    return _with_boot({"record": record, "kmsg_seq": seq}, boot), findings, action


def operator_readmit(config, state, read):
    """An operator's re-admission after a repair (playbooks/readmit.yml): (new state, findings, verdict).

    The same checks as a round, run once: any FAIL refuses (verdict ``refused``; the record and the kernel
    log cursor stay as they were, so the Xid that caused a hardware quarantine is not read again, but a new
    one is). Otherwise the record is cleared, the cursor moves past what was read (verdict ``admitted``).
    A node without a record is ``not quarantined`` and nothing changes.
    """
    if not state.get("record"):
        return state, [], "not quarantined"
    boot = _boot_id(read)
    reading = this_boot(state, boot)[0]
    findings, records = round_findings(config, reading, read)
    if any(f["severity"] == "fail" for f in findings):
        return state, findings, "refused"
    seq = last_seq(records, reading)
    return _with_boot({"record": None, "kmsg_seq": seq}, boot), findings, "admitted"
