#!/usr/bin/python3
"""The in-process program of bench/recovery/command_recovery_bench.py: ddp_steps.py's model,
data and steps, written with ringmaster.inprocess (as examples/torch_inprocess/train.py), so
that when a rank dies the others go on in their own processes and only the lost rank's is
replaced. Run as `ringctl local --workers 4 --set elastic.min_ranks=2 -- /usr/bin/python3
inprocess_steps.py ...`.

The ranks change with the epochs (the survivors of a world of 4 form one of 3), so each
process appends its lines to --log_dir/slot<RINGMASTER_SLOT>.log (else rank<RANK>.log), as
ddp_steps.py's with wall-clock Unix times:

    exec <t> <pid>              the process's exec (from /proc: its start time)
    imported <t> <pid>          `import torch` done
    group <t> <pid> <step>      group.start() returned: its first world, the state agreed
    epoch <t> <pid> <step> <e>  the process went on into membership epoch e (recover() or
                                sync() switched), at that step
    step <t> <pid> <step>       a training step done
    kill <t> <pid> <step>       about to SIGKILL itself (--die_at)

With --die_at S, the process of RANK --die_rank in the first epoch SIGKILLs itself right after
step S, once per --log_dir (a marker file says it did).
"""
import os
import time

T_START = time.time()

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

from ddp_steps import exec_time  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log_dir", required=True)
    parser.add_argument("--die_at", type=int, default=0, help="0: never")
    parser.add_argument("--die_rank", type=int, default=3)
    parser.add_argument("--ckpt", help="ignored: in-process recovery reads no checkpoint")
    parser.add_argument("--timeout", type=float, default=5.0,
                        help="the process group's timeout, seconds (as the example's)")
    args = parser.parse_args()

    name = (f"slot{os.environ['RINGMASTER_SLOT']}" if "RINGMASTER_SLOT" in os.environ
            else f"rank{os.environ['RANK']}")
    log = open(os.path.join(args.log_dir, f"{name}.log"), "a", buffering=1)
    pid = os.getpid()

    def event(what, *rest, t=None):
        log.write(" ".join([what, f"{time.time() if t is None else t:.4f}", str(pid)] +
                           [str(x) for x in rest]) + "\n")

    event("exec", t=exec_time())
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import ringmaster.inprocess as inprocess
    event("imported")
    torch.set_num_threads(1)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    group = inprocess.Group(
        state=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
        load_state=lambda s: (model.load_state_dict(s["model"]), opt.load_state_dict(s["opt"])),
        timeout_s=args.timeout)
    step = group.start(0)
    first_epoch = group.epoch
    dies = group.rank == args.die_rank
    event("group", step)
    gen = torch.Generator().manual_seed(7)
    data = torch.randn(2048, 784, generator=gen)
    labels = torch.randint(0, 10, (2048,), generator=gen)
    marker = os.path.join(args.log_dir, "killed")
    params = list(model.parameters())
    while step < args.steps:
        try:
            epoch = group.epoch
            step = group.sync(step)
            if group.epoch != epoch:
                event("epoch", step, group.epoch)
            if group.stop_requested:
                return 0
            per_rank = 512 // group.world_size
            lo = (step * 512 + group.rank * per_rank) % (2048 - per_rank)
            loss = nn.functional.cross_entropy(model(data[lo:lo + per_rank]),
                                               labels[lo:lo + per_rank])
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # DDP's all-reduce, in one
            dist.all_reduce(flat)
            flat /= group.world_size
            offset = 0
            for p in params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
            opt.step()
            step += 1
            event("step", step)
            if (step == args.die_at and dies and group.epoch == first_epoch and
                    not os.path.exists(marker)):
                open(marker, "w").close()
                event("kill", step)
                os.kill(pid, signal.SIGKILL)
        except group.errors as error:
            step = group.recover(error, step)
            event("epoch", step, group.epoch)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
