#!/usr/bin/python3
"""The torchrun side of bench/recovery/recovery_bench.sh: the same MLP (784-512-512-10,
SGD with momentum, global batch 512) trained with PyTorch DDP over Gloo by an elastic
torchrun (torch.distributed.run --max_restarts), checkpointing every --every steps the
way torchrun's documentation asks (rank 0 saves, every worker loads at start).

Every step, rank 0 prints "STEP <step> <unix time>" so that the bench can find the first
step after a worker is killed. Run under torchrun; see recovery_bench.sh.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--checkpoint", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    start = 0
    if os.path.exists(args.checkpoint):
        state = torch.load(args.checkpoint)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    ddp = nn.parallel.DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(7)
    data = torch.randn(2048, 784, generator=gen)
    labels = torch.randint(0, 10, (2048,), generator=gen)
    per_rank = 512 // world
    for step in range(start, args.steps):
        lo = (step * 512 + rank * per_rank) % (2048 - per_rank)
        x, y = data[lo:lo + per_rank], labels[lo:lo + per_rank]
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(f"STEP {step + 1} {time.time():.3f}", flush=True)
            if (step + 1) % args.every == 0:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "step": step + 1}, tmp)
                os.replace(tmp, args.checkpoint)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
