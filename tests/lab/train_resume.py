"""A data-parallel Ray Train run (two workers, one per node, no GPU) that checkpoints to the shared storage.

tests/lab/test_storage.py runs it on the head as a driver: python train_resume.py NAME STEPS STEP_SECONDS. Each rank
prints "RANK r START s NODE ip" when an attempt begins (s: the step it starts from: 0 on the first attempt, the last
checkpoint's step + 1 after Ray Train restarted the run), rank 0 "STEP n" once step n's checkpoint is reported;
at the end "RESULT {metrics}" and "CHECKPOINT path". The storage path is RAYMETAL_STORAGE_PATH, as a user's job
would read it: no other change for the shared storage.
"""
import json
import os
import sys
import tempfile
import time

import ray
import ray.train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

NAME, STEPS, STEP_S = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])


def loop(config):
    rank = ray.train.get_context().get_world_rank()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            with open(os.path.join(directory, "state.json")) as handle:
                start = json.load(handle)["step"] + 1
    print("RANK %d START %d NODE %s" % (rank, start, ray.util.get_node_ip_address()), flush=True)
    for step in range(start, config["steps"]):
        time.sleep(config["step_s"])
        with tempfile.TemporaryDirectory() as directory:
            saved = None
            if rank == 0:
                with open(os.path.join(directory, "state.json"), "w") as handle:
                    json.dump({"step": step}, handle)
                saved = Checkpoint.from_directory(directory)
            ray.train.report({"step": step, "start": start}, checkpoint=saved)
        if rank == 0:
            print("STEP %d" % step, flush=True)


ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), logging_level="ERROR")
trainer = DataParallelTrainer(
    loop,
    train_loop_config={"steps": STEPS, "step_s": STEP_S},
    # One worker per node: killing a worker node kills a training worker, and the run fits on the nodes left.
    scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}, placement_strategy="STRICT_SPREAD"),
    run_config=RunConfig(name=NAME, storage_path=os.environ["RAYMETAL_STORAGE_PATH"] + "/train",
                         failure_config=FailureConfig(max_failures=3)),
)
result = trainer.fit()
print("RESULT " + json.dumps(result.metrics), flush=True)
print("CHECKPOINT " + str(result.checkpoint.path if result.checkpoint else None), flush=True)
