"""A torchrun-style DDP program of which one rank fails first (tests/command_job_test.sh).

Every rank all-reduces for a few steps over Gloo (init_method="env://"), then one rank
raises ValueError under torchelastic's @record (its TORCHELASTIC_ERROR_FILE gets the message
and the time) and the others fail in Gloo ("Connection closed by peer"), each under @record
too, once its connections close.

In the first run (TORCHELASTIC_RESTART_COUNT 0) the culprit is --culprit, and it is slow to
exit, as a program with cleanup to do is: only --linger_s after it raised does it close its
process group (making the others fail), and it exits --linger_s later still. So the others'
failures reach the coordinator first and the culprit's comes last: the first failure named
must still be the culprit's, the earliest. In a restarted run the culprit is --then_culprit,
which raises (once --go_file exists) and exits at once.
"""
import argparse
import atexit
import os
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--culprit", type=int, default=2)
    parser.add_argument("--then_culprit", type=int, default=1)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--linger_s", type=float, default=1.0)
    parser.add_argument("--go_file", default="")
    args = parser.parse_args()
    restarted = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0
    culprit = args.then_culprit if restarted else args.culprit
    dist.init_process_group("gloo", init_method="env://")
    rank = dist.get_rank()
    if restarted and args.go_file:
        deadline = time.time() + 300
        while not os.path.exists(args.go_file) and time.time() < deadline:
            time.sleep(0.05)
    value = torch.ones(1)
    for step in range(args.steps):
        dist.all_reduce(value)
        print(f"rank {rank}: step {step}", flush=True)
    if rank == culprit:
        if not restarted:

            def linger():
                time.sleep(args.linger_s)
                print(f"rank {rank}: closing the process group", flush=True)
                dist.destroy_process_group()  # the others' all_reduce fails now
                time.sleep(args.linger_s)

            atexit.register(linger)
        raise ValueError(f"rank {rank} found a bad batch at step {args.steps}")
    dist.all_reduce(value)  # waits for the culprit, which never comes
    print(f"rank {rank}: not reached", flush=True)


if __name__ == "__main__":
    main()
