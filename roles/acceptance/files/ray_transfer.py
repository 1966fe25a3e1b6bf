"""Ray object transfer in a ring: a large object made on one node, fetched on the next.

Run on the head by playbooks/acceptance.yml with the Ray venv's Python, as the Ray user, with the
cluster's RAY_AUTH_* environment. Prints one JSON object: {"pairs": [{src_ip, dst_ip, bytes,
seconds, mb_per_s}], "nodes": N} or {"error": "..."}. Pairs run one after another so they do not
share bandwidth; each is bounded by --timeout.
"""

import argparse
import json
import re
import sys
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True, help="GCS address, ip:port")
    parser.add_argument("--mib", type=int, default=256, help="object size in MiB")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per pair")
    args = parser.parse_args()
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError as exc:
        print(json.dumps({"error": "cannot import ray: %s" % exc}))
        return 0

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    nodes = sorted((n for n in ray.nodes() if n.get("Alive")), key=lambda n: n["NodeManagerAddress"])

    # bytes, not numpy: ray[default] does not bring numpy. Large values live in the object store.
    @ray.remote(num_cpus=0)
    def make(mib):
        return b"\x01" * (mib * 2**20)

    @ray.remote(num_cpus=0)
    def fetch(refs):
        start = time.perf_counter()
        value = ray.get(refs[0])
        return len(value), time.perf_counter() - start

    def on(node):
        return NodeAffinitySchedulingStrategy(node_id=node["NodeID"], soft=False)

    pairs = []
    if len(nodes) > 1:
        for index, src in enumerate(nodes):
            dst = nodes[(index + 1) % len(nodes)]
            item = {"src_ip": src["NodeManagerAddress"], "dst_ip": dst["NodeManagerAddress"]}
            try:
                ref = make.options(scheduling_strategy=on(src)).remote(args.mib)
                ready, dummy = ray.wait([ref], timeout=args.timeout, fetch_local=False)
                if not ready:
                    raise TimeoutError("the object was not made on %s in %.0f s" % (item["src_ip"], args.timeout))
                nbytes, seconds = ray.get(fetch.options(scheduling_strategy=on(dst)).remote([ref]),
                                          timeout=args.timeout)
                item.update(bytes=nbytes, seconds=round(seconds, 4), mb_per_s=round(nbytes / seconds / 1e6, 1))
                del ref
            except Exception as exc:  # noqa: BLE001  (every failure becomes this pair's reason)
                lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", str(exc)).splitlines() if line.strip()]
                item["error"] = "%s: %s" % (type(exc).__name__, (lines[-1] if lines else "")[:300])
            pairs.append(item)
    print(json.dumps({"nodes": len(nodes), "mib": args.mib, "pairs": pairs}))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
