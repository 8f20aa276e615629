#!/usr/bin/env python3
"""A data-parallel PyTorch training loop that survives a peer's failure in its own process.

The same loop as examples/torch_ddp/train.py (a small MLP on synthetic regression data, the
gradients averaged over the ranks every step), written with ringmaster.inprocess: when a
rank dies, the others tear down their process group, build one without it and go on from
the parameters they hold, and the rank's replacement joins a few steps later with the state a
survivor sends it. No process of a survivor restarts, no checkpoint is read.

    ringctl local --workers 3 examples/torch_inprocess.yaml
    torchrun --nproc_per_node 2 examples/torch_inprocess/train.py   # runs, without recovery

At the end every rank prints its parameters' checksum (equal on every rank) and its pid.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

import ringmaster
import ringmaster.inprocess as inprocess


def batch_for(step, rank, world, batch, teacher):
    """The step's global batch is fixed by the step; each rank takes its share."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(batch * world, 16, generator=g)
    y = x @ teacher
    share = slice(rank * batch, (rank + 1) * batch)
    return x[share], y[share]


def average_gradients(model, world):
    """What DistributedDataParallel does after backward, in one flat all-reduce."""
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)
    flat /= world
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32, help="per rank")
    parser.add_argument("--step_time", type=float, default=0.0,
                        help="sleep this long per step (to make a short run last)")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="the process group's timeout, seconds")
    args = parser.parse_args()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    teacher = torch.randn(16, 1, generator=torch.Generator().manual_seed(7))

    group = inprocess.Group(
        state=lambda: {"model": model.state_dict(), "optimizer": optimizer.state_dict()},
        load_state=lambda s: (model.load_state_dict(s["model"]),
                              optimizer.load_state_dict(s["optimizer"])),
        timeout_s=args.timeout)
    step = group.start(0)
    print(f"rank {group.rank} of {group.world_size}: pid {os.getpid()} training from step "
          f"{step} to {args.steps} (epoch {group.epoch})", flush=True)

    recovered_at = None
    while step < args.steps:
        try:
            epoch = group.epoch
            step = group.sync(step)
            if group.epoch != epoch:
                print(f"rank {group.rank} of {group.world_size}: pid {os.getpid()} switched to "
                      f"epoch {group.epoch} at step {step}", flush=True)
            if group.stop_requested:
                print(f"rank {group.rank}: stopped at step {step}", flush=True)
                return 0
            x, y = batch_for(step, group.rank, group.world_size, args.batch, teacher)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            average_gradients(model, group.world_size)
            optimizer.step()
            step += 1
            ringmaster.report(step, loss=loss.item(), samples=args.batch * group.world_size)
            if recovered_at is not None:
                print(f"rank {group.rank}: trained step {step} at {time.time():.3f} "
                      f"(recovered in {group.last_recovery_s:.3f}s)", flush=True)
                recovered_at = None
            if args.step_time > 0:
                time.sleep(args.step_time)
            if step % 50 == 0:
                print(f"rank {group.rank}: step {step} loss {loss.item():.6f}", flush=True)
        except group.errors as error:
            print(f"rank {group.rank}: a collective failed at step {step} "
                  f"({str(error).splitlines()[0][:120]}); recovering", flush=True)
            step = group.recover(error, step)
            recovered_at = time.time()
            print(f"rank {group.rank} of {group.world_size}: pid {os.getpid()} recovered into "
                  f"epoch {group.epoch} at step {step}", flush=True)
    checksum = sum(p.double().sum().item() for p in model.parameters())
    print(f"rank {group.rank}: done at step {step}, params checksum {checksum:.12f}, "
          f"pid {os.getpid()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
