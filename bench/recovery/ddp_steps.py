#!/usr/bin/python3
"""The program of bench/recovery/command_recovery_bench.sh: a plain PyTorch DDP training
program written for torchrun (it reads only torchrun's environment), run unchanged under
ringmaster (`ringctl local -- /usr/bin/python3 ddp_steps.py ...`) and under torchrun.

It trains the Fashion-MNIST-shaped MLP (784-512-512-10, SGD with momentum, global batch
512) on synthetic data over Gloo, rank 0 checkpointing to --ckpt every --save_every steps
(every rank resumes from it at start, as torchrun's documentation asks). Each rank appends
one line per event to --log_dir/rank<RANK>.log, with wall-clock Unix times:

    exec <t> <pid>       the process's exec (from /proc: its start time)
    start <t> <pid>      the script's first line ran (the interpreter is up)
    imported <t> <pid>   `import torch` done
    group <t> <pid>      init_process_group(env://) returned (the rendezvous)
    loaded <t> <pid> <step>   the checkpoint read (step 0: none)
    step <t> <pid> <step>     a training step done (the first after start, then every step)
    kill <t> <pid> <step>     about to SIGKILL itself (--die_at)

With --die_at S, the rank of RANK --die_rank SIGKILLs itself right after step S, once per
--log_dir (a marker file says it did): the restarted group trains on.
"""
import os
import time

T_START = time.time()

import argparse  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402


def exec_time():
    """The Unix time this process was exec'd: its start in /proc (clock ticks since boot)
    against the time since boot now."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat
        with open("/proc/uptime") as f:
            up = float(f.read().split()[0])
        return time.time() - (up - started)
    except (OSError, ValueError, IndexError):
        return T_START


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--save_every", type=int, default=25)
    parser.add_argument("--ckpt", required=True, help="the checkpoint file")
    parser.add_argument("--log_dir", required=True)
    parser.add_argument("--die_at", type=int, default=0, help="0: never")
    parser.add_argument("--die_rank", type=int, default=3)
    args = parser.parse_args()

    rank_env = int(os.environ["RANK"])
    log = open(os.path.join(args.log_dir, f"rank{rank_env}.log"), "a", buffering=1)
    pid = os.getpid()

    def event(name, *rest, t=None):
        log.write(" ".join([name, f"{time.time() if t is None else t:.4f}", str(pid)] +
                           [str(x) for x in rest]) + "\n")

    event("exec", t=exec_time())
    event("start", t=T_START)
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    event("imported")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    event("group")
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    start = 0
    if os.path.exists(args.ckpt):
        state = torch.load(args.ckpt)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = state["step"]
    event("loaded", start)
    ddp = nn.parallel.DistributedDataParallel(model)
    gen = torch.Generator().manual_seed(7)
    data = torch.randn(2048, 784, generator=gen)
    labels = torch.randint(0, 10, (2048,), generator=gen)
    per_rank = 512 // world
    marker = os.path.join(args.log_dir, "killed")
    for step in range(start, args.steps):
        lo = (step * 512 + rank * per_rank) % (2048 - per_rank)
        x, y = data[lo:lo + per_rank], labels[lo:lo + per_rank]
        loss = nn.functional.cross_entropy(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        event("step", step + 1)
        if rank == 0 and (step + 1) % args.save_every == 0:
            tmp = args.ckpt + ".tmp"
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "step": step + 1}, tmp)
            os.replace(tmp, args.ckpt)
        if (step + 1 == args.die_at and rank == args.die_rank and
                not os.path.exists(marker)):
            open(marker, "w").close()
            event("kill", step + 1)
            os.kill(pid, signal.SIGKILL)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
