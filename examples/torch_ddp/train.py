#!/usr/bin/env python3
"""A plain PyTorch DDP training program, written for torchrun and nothing else.

It reads only torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT
through init_method="env://"), so it runs unchanged under either:

    torchrun --nproc_per_node 2 examples/torch_ddp/train.py --steps 200
    ringctl local --workers 2 -- /usr/bin/python3 examples/torch_ddp/train.py --steps 200

It trains a small MLP on synthetic regression data (a fixed random teacher), checkpoints to
$RINGMASTER_CHECKPOINT_DIR when ringmaster sets it (else --ckpt), resumes from there, and
on SIGTERM (a drain, or the group being re-formed) saves at the next step boundary, agreed by
all ranks, and exits 0. At the end every rank prints its parameters' checksum: equal on every
rank when data parallelism kept the replicas in step.

Where ringmaster's module can be imported (ringmaster puts it on PYTHONPATH), the program also
reports each step's loss and samples through it (`ringctl top`, the dashboard, the metrics
file, hang detection) and asks it whether a stop was requested; without it (under torchrun)
it runs exactly as before.
"""
import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    import ringmaster  # optional: progress reports and the stop request under ringmaster
except ImportError:
    ringmaster = None

STOP = False


def on_sigterm(signum, frame):
    global STOP
    STOP = True


def batch_for(step, rank, world, batch, teacher):
    """The step's global batch is fixed by the step; each rank takes its share."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch * world, 16, generator=g)
    y = x @ teacher
    share = slice(rank * batch, (rank + 1) * batch)
    return x[share], y[share]


def save(path, model, optimizer, step):
    tmp = path + ".tmp"
    torch.save({"step": step, "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict()}, tmp)
    os.replace(tmp, path)  # a reader sees the old checkpoint or the new one, never half


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--save_every", type=int, default=20)
    parser.add_argument("--step_time", type=float, default=0.0,
                        help="sleep this long per step (to make a short run last)")
    parser.add_argument("--ckpt", default="ckpt", help="without RINGMASTER_CHECKPOINT_DIR")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, on_sigterm)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                    torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))

    ckpt_dir = os.environ.get("RINGMASTER_CHECKPOINT_DIR", args.ckpt)
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, "train.pt")
    step = 0
    if os.path.exists(path):
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = state["step"]
        print(f"rank {rank}: resumed from step {step} ({path})", flush=True)
    print(f"rank {rank} of {world}: training from step {step} to {args.steps} "
          f"(restart {os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')})", flush=True)

    stop = torch.zeros(1)
    first_step = step
    while step < args.steps:
        # Every rank stops at the same step: a SIGTERM seen by any rank stops them all.
        stopping = STOP or (ringmaster is not None and ringmaster.stop_requested())
        stop[0] = 1.0 if stopping else 0.0
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)
        if stop[0] > 0:
            if rank == 0:
                save(path, model, optimizer, step)
            print(f"rank {rank}: stopped at step {step} (SIGTERM), saved", flush=True)
            dist.barrier()
            return 0
        x, y = batch_for(step, rank, world, args.batch, teacher)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if ringmaster is not None:
            ringmaster.report(step, loss=loss.item(), samples=args.batch * world)
        if step == first_step + 1:
            print(f"rank {rank}: trained step {step}, the first of this run", flush=True)
        if args.step_time > 0:
            time.sleep(args.step_time)
        if step % 10 == 0:
            print(f"rank {rank}: step {step} loss {loss.item():.6f}", flush=True)
        if rank == 0 and step % args.save_every == 0:
            save(path, model, optimizer, step)
    if rank == 0:
        save(path, model, optimizer, step)
    checksum = sum(p.double().sum().item() for p in model.module.parameters())
    print(f"rank {rank}: done at step {step}, params checksum {checksum:.12f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
