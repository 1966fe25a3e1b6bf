#!/usr/bin/env python3
"""A Ray Train run on a real GPU that checkpoints to a storage path, crashes, and resumes from its checkpoint.

    python3 tools/gpu_train_resume.py STORAGE_PATH [STEPS] [FAIL_AT]

What the lab's CPU-only run (tests/lab/train_resume.py) cannot show: a TorchTrainer worker training a model on the
GPU (bf16 matmuls, SGD with momentum) reports a checkpoint of its model and optimizer after every step to
STORAGE_PATH (RunConfig(storage_path=...), as a job on raymetal's cluster does with RAYMETAL_STORAGE_PATH); its
first attempt exits at step FAIL_AT (default 6 of 12) as a worker does when its node dies; Ray Train's failure
handling starts the run again, the worker loads the last checkpoint onto the GPU, checks that the weights it
loaded are those that were saved (a checksum stored beside them), and goes on from the next step. Prints one JSON
line: the steps each attempt started from, the checksum comparison, the losses and the final metrics.
"""

import json
import os
import sys
import tempfile
import time

import ray
import ray.train
import ray.train.torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

STORAGE, STEPS = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 12
FAIL_AT = int(sys.argv[3]) if len(sys.argv) > 3 else 6
MARK = os.path.join(STORAGE, "failed-once")
# RAYMETAL_TRAIN_CPU=1: the same run on the CPU with a small model, to try the script where no GPU is.
CPU = os.environ.get("RAYMETAL_TRAIN_CPU") == "1"
WIDTH, BATCH = (256, 512) if CPU else (4096, 8192)


def loop(config):
    import torch

    device = ray.train.torch.get_device()
    torch.manual_seed(0)
    width, batch = config["width"], config["batch"]
    model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    start, loaded_ok = 0, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as directory:
            state = torch.load(os.path.join(directory, "state.pt"), map_location=device)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = state["step"] + 1
            loaded = float(sum(p.double().sum() for p in model.parameters()))
            loaded_ok = abs(loaded - state["checksum"]) < 1e-6 * max(1.0, abs(state["checksum"]))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print("ATTEMPT START %d DEVICE %s LOADED_OK %s" % (start, name, loaded_ok),
          flush=True)
    for step in range(start, config["steps"]):
        generator = torch.Generator(device=device).manual_seed(step)
        x = torch.randn(batch, width, device=device, generator=generator)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = (model(x) - x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step == config["fail_at"] and not os.path.exists(config["mark"]):
            open(config["mark"], "w").close()
            print("CRASH at step %d, before its checkpoint" % step, flush=True)
            os._exit(1)
        with tempfile.TemporaryDirectory() as directory:
            checksum = float(sum(p.double().sum() for p in model.parameters()))
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
                        "checksum": checksum}, os.path.join(directory, "state.pt"))
            ray.train.report({"step": step, "loss": float(loss), "start": start, "loaded_ok": loaded_ok},
                             checkpoint=Checkpoint.from_directory(directory))


def main():
    os.makedirs(STORAGE, exist_ok=True)
    if os.path.exists(MARK):
        os.unlink(MARK)
    ray.init(include_dashboard=False, logging_level="ERROR")
    began = time.time()
    trainer = TorchTrainer(
        loop, train_loop_config={"steps": STEPS, "fail_at": FAIL_AT, "mark": MARK, "width": WIDTH, "batch": BATCH},
        scaling_config=ScalingConfig(num_workers=1, use_gpu=not CPU),
        run_config=RunConfig(name="gpu-resume", storage_path=STORAGE, failure_config=FailureConfig(max_failures=2)))
    result = trainer.fit()
    print("RESULT " + json.dumps({"metrics": result.metrics, "checkpoint": str(result.checkpoint.path),
                                  "seconds": round(time.time() - began, 1), "ray": ray.__version__}), flush=True)


if __name__ == "__main__":
    main()
