"""NCCL all-reduce through Ray actors: one rank per GPU node, ray.util.collective with CuPy.

Run on the head by playbooks/acceptance.yml (roles/acceptance/tasks/ray_transfer.yml) with the Ray venv's
Python, as the Ray user, with the cluster's RAY_AUTH_* environment. One actor per alive node that
offers a GPU to Ray (num_gpus=1, pinned to that node), all in one NCCL group: one rank per node, so
the figure is the fabric's, not NVLink's. Each rank all-reduces --mib MiB of float32 on its GPU,
--warmup times untimed, then --iters times timed, and checks a small all-reduce's sum. NCCL writes
its NCCL_DEBUG=INFO lines (INIT and NET) to a file that the rank returns, so the controller can
read which transport NCCL chose (the nccl_transport filter).

Prints one JSON object on its last line:
  {"ranks": N, "bytes": B, "iters": I, "results": [{ip, rank, seconds, sum_ok, library, nccl_log,
   error}]}, seconds being one all-reduce's mean time on that rank;
  {"skipped": reason} when no alive node offers a GPU; {"error": reason} when nothing ran.
"""

import argparse
import json
import re
import sys
import time

# The NCCL_DEBUG=INFO lines the controller reads (version, network, channels' transport, HCAs)
# and every warning; the rest of the log stays on the node.
KEEP = re.compile(r"NCCL version|Using network|NET/IB : Using|NET/Socket : Using| via NET/| WARN ")


def rank_main(world, rank, group, nbytes, warmup, iters):
    """Runs inside the actor (its GPU is device 0, Ray set CUDA_VISIBLE_DEVICES)."""
    import ctypes
    import importlib.util
    import os
    import tempfile

    import ray

    out = {"ip": ray.util.get_node_ip_address(), "rank": rank}
    log_dir = tempfile.mkdtemp(prefix="raymetal-nccl-")
    log_path = os.path.join(log_dir, "nccl.log")
    # NCCL reads these when the communicator is created (after this point); they win over
    # /etc/nccl.conf, which keeps every other setting the nccl role wrote.
    os.environ.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,NET", NCCL_DEBUG_FILE=log_path)
    try:
        # The NCCL wheel in Ray's venv (the nccl role installs it there): load it before CuPy,
        # whose NCCL bindings then use it instead of looking for libnccl.so.2 on the linker path.
        spec = importlib.util.find_spec("nvidia.nccl")
        if spec is not None and spec.submodule_search_locations:
            wheel_lib = os.path.join(list(spec.submodule_search_locations)[0], "lib", "libnccl.so.2")
            if os.path.exists(wheel_lib):
                ctypes.CDLL(wheel_lib, mode=ctypes.RTLD_GLOBAL)
        try:
            import cupy
        except ImportError as exc:
            raise RuntimeError("CuPy is not in Ray's venv (%s). Fix: add cupy-cuda12x (pinned) to ray_pip_packages "
                               "and to the wheelhouse, or set acceptance_nccl_allreduce: false" % exc) from exc
        from ray.util import collective

        if not collective.nccl_available():
            raise RuntimeError("ray.util.collective cannot use NCCL: CuPy's NCCL bindings did not load")
        collective.init_collective_group(world, rank, backend="nccl", group_name=group)
        try:
            check = cupy.ones(1024, dtype=cupy.float32)
            collective.allreduce(check, group_name=group)
            data = cupy.ones(nbytes // 4, dtype=cupy.float32)
            for dummy in range(warmup):
                collective.allreduce(data, group_name=group)
            cupy.cuda.runtime.deviceSynchronize()
            start = time.perf_counter()
            for dummy in range(iters):
                collective.allreduce(data, group_name=group)
            cupy.cuda.runtime.deviceSynchronize()
            out["seconds"] = (time.perf_counter() - start) / iters
            out["sum_ok"] = bool((check == world).all())
        finally:
            collective.destroy_collective_group(group)
    except Exception as exc:  # noqa: BLE001  (every failure becomes this rank's reason)
        lines = [line for line in str(exc).splitlines() if line.strip()]
        out["error"] = "%s: %s" % (type(exc).__name__, (lines[-1] if lines else "")[:300])
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        out["library"] = next((line.split()[-1] for line in maps if "libnccl.so" in line), None)
    try:
        with open(log_path, encoding="utf-8", errors="replace") as fh:
            out["nccl_log"] = "".join(line for line in fh if KEEP.search(line))[-20000:]
    except OSError:
        out["nccl_log"] = ""
    return out


class NcclRank:
    """One rank: an actor on one GPU of one node."""

    def run(self, *args):
        return rank_main(*args)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True, help="GCS address, ip:port")
    parser.add_argument("--mib", type=int, default=256, help="all-reduce size in MiB")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed for the whole run")
    args = parser.parse_args()
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError as exc:
        print(json.dumps({"error": "cannot import ray: %s" % exc}))
        return 0

    ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    nodes = sorted((n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("GPU", 0) >= 1),
                   key=lambda n: n["NodeManagerAddress"])
    if not nodes:
        print(json.dumps({"skipped": "no alive Ray node offers a GPU (Ray's GPU resource)"}))
        ray.shutdown()
        return 0

    rank_actor = ray.remote(num_gpus=1, num_cpus=0)(NcclRank)
    group = "raymetal-acceptance-%d" % int(time.time())
    actors = [rank_actor.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
              .remote() for n in nodes]
    refs = [actor.run.remote(len(actors), rank, group, args.mib * 2**20, args.warmup, args.iters)
            for rank, actor in enumerate(actors)]
    ready, pending = ray.wait(refs, num_returns=len(refs), timeout=args.timeout)
    results = []
    for rank, ref in enumerate(refs):
        if ref in ready:
            try:
                results.append(ray.get(ref))
                continue
            except Exception as exc:  # noqa: BLE001  (an actor that died is this rank's reason)
                reason = "%s: %s" % (type(exc).__name__, (str(exc).strip().splitlines() or [""])[-1][:300])
        else:
            # NCCL waits for every rank: one that cannot connect holds the others.
            reason = "no answer in %.0f s (the ranks wait for each other: look at the other ranks' errors)" % args.timeout
        results.append({"ip": nodes[rank]["NodeManagerAddress"], "rank": rank, "error": reason})
    for actor in actors:
        ray.kill(actor)
    print(json.dumps({"ranks": len(nodes), "bytes": args.mib * 2**20, "iters": args.iters, "results": results}))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
