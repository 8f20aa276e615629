#!/usr/bin/python3
"""PyTorch peer of `trainbench`: the Fashion-MNIST MLP trained with SGD and momentum.

World 1 is plain PyTorch; world N > 1 runs N processes (torch.multiprocessing.spawn) joined
by torch.distributed's gloo backend over loopback (a FileStore rendezvous), the model
wrapped in DistributedDataParallel with its default buckets. Every step each rank takes its
own --batch samples of one global batch drawn from a per-epoch permutation of the data, as
ringmaster's sampler does.

Rank 0 writes one JSON object per logged window to --metrics, in the fields of ringmaster's
metrics.jsonl that trainbench reads (step, samples_per_second over all ranks,
window_seconds), and prints one line on stdout before training:

  peer torch=<version> blas=<library torch loaded> blas_core=<its kernels> blas_threads=<n>
       torch_threads=<n> data=<fashion_mnist|random> world=<n>

The BLAS must be OpenBLAS (the trainer's): run with
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread so that torch's libblas.so.3 is
OpenBLAS's whatever Debian's alternative says; the script stops with exit status 3 when
another BLAS was loaded. OpenBLAS picks its kernels when it loads: OPENBLAS_CORETYPE (which
trainbench passes on, as it gives ringmaster's trainers) names them where the library does
not know the CPU (blas_core says which ran). The thread counts must be in OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS before the interpreter starts (--threads checks them).

Exit status: 0 done; 2 bad arguments; 3 wrong BLAS or thread environment; 4 missing data;
5 PyTorch is not installed; 1 anything else (a rank failed).
"""

import argparse
import gzip
import os
import sys
import time

OPENBLAS_DIR = "/usr/lib/x86_64-linux-gnu/openblas-pthread"
INSTALL_HINT = "apt-get install -y python3-torch"


def add_run_args(p):
    """The flags of start_rank, open_metrics and launch (torch_gpt.py's too)."""
    p.add_argument("--world", type=int, default=1, help="number of ranks (processes)")
    p.add_argument("--threads", type=int, required=True,
                   help="BLAS and torch threads per rank (must equal OPENBLAS_NUM_THREADS)")
    p.add_argument("--store", required=True,
                   help="rendezvous file for world > 1 (must not exist yet)")
    p.add_argument("--metrics", required=True, help="JSONL file rank 0 writes")
    p.add_argument("--seed", type=int, default=1)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_args(p)
    p.add_argument("--batch", type=int, default=128, help="samples per rank per step")
    p.add_argument("--hidden", default="512,512", help="hidden layer widths, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--log_every", type=int, default=10, help="steps per timed window")
    p.add_argument("--data", choices=["fashion_mnist", "random"], default="fashion_mnist")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    a = p.parse_args(argv)
    for name in ("world", "batch", "steps", "log_every", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(a, name)}")
    try:
        a.hidden = [int(h) for h in a.hidden.split(",") if h.strip()]
    except ValueError:
        p.error(f"--hidden: \"{a.hidden}\" is not a comma-separated list of widths")
    if not a.hidden or min(a.hidden) < 1:
        p.error("--hidden: give at least one positive width")
    return a


def check_thread_environment(threads, program="torch_ddp"):
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"):
        if os.environ.get(var) != str(threads):
            sys.stderr.write(f"{program}: {var} must be {threads} (--threads) before Python "
                             f"starts; it is {os.environ.get(var)!r}\n")
            sys.exit(3)


def loaded_blas():
    """The BLAS libraries mapped into this process (after torch ran a matrix product)."""
    libs = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            name = os.path.basename(path)
            if "blas" in name and ".so" in name:
                libs.add(os.path.realpath(path))
    return sorted(libs)


def openblas_threads(blas_paths):
    import ctypes
    for path in blas_paths:
        try:
            lib = ctypes.CDLL(path)
            return lib.openblas_get_num_threads()
        except (OSError, AttributeError):
            continue
    return -1


def openblas_core(blas_paths):
    """The kernels the loaded OpenBLAS runs (openblas_get_corename: e.g. Prescott when it did
    not recognise the CPU, SkylakeX under OPENBLAS_CORETYPE=SkylakeX), or "?"."""
    import ctypes
    for path in blas_paths:
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return "?"


def read_idx(path, magic):
    with gzip.open(path, "rb") as f:
        data = f.read()
    import numpy as np
    if len(data) < 8 or int.from_bytes(data[0:4], "big") != magic:
        raise ValueError(f"{path}: not an IDX file with magic {magic:#x}")
    count = int.from_bytes(data[4:8], "big")
    header = 16 if magic == 0x803 else 8
    item = 784 if magic == 0x803 else 1
    if len(data) != header + count * item:
        raise ValueError(f"{path}: {len(data)} bytes, expected {header + count * item}")
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(count, item)


def load_data(args, torch):
    """Training images as normalised float32 [N, 784] and labels int64 [N]."""
    if args.data == "random":
        g = torch.Generator().manual_seed(args.seed)
        n = 60000
        return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)
    images = read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"), 0x803)
    labels = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"), 0x801)
    if len(images) != len(labels):
        raise ValueError(f"{args.data_dir}: {len(images)} images but {len(labels)} labels")
    x = torch.from_numpy(images.astype("float32") / 255.0)
    x = (x - x.mean()) / x.std()
    return x.contiguous(), torch.from_numpy(labels.reshape(-1).astype("int64"))


def build_model(torch, hidden):
    layers, width = [], 784
    for h in hidden:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    layers.append(torch.nn.Linear(width, 10))
    return torch.nn.Sequential(*layers)


# The parts of a rank that torch_gpt.py shares: start_rank, open_metrics, run_steps, launch.


def start_rank(torch, rank, args):
    """This rank's thread count and seed; with --world > 1 it joins the gloo group."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    if args.world > 1:
        import torch.distributed as dist
        dist.init_process_group("gloo", init_method=f"file://{args.store}", rank=rank,
                                world_size=args.world)


def open_metrics(torch, args, fields, program="torch_ddp"):
    """Rank 0: stops with exit status 3 unless torch loaded OpenBLAS, prints the peer line
    (its BLAS and thread counts, then `fields`) and opens --metrics."""
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # make sure the BLAS is loaded
    blas = loaded_blas()
    if not blas or not all("openblas" in b for b in blas):
        sys.stderr.write(f"{program}: torch loaded {blas or 'no BLAS library'}, not "
                         f"OpenBLAS; run with LD_LIBRARY_PATH={OPENBLAS_DIR}\n")
        sys.exit(3)
    print(f"peer torch={torch.__version__} blas={','.join(blas)} "
          f"blas_core={openblas_core(blas)} blas_threads={openblas_threads(blas)} "
          f"torch_threads={torch.get_num_threads()} "
          f"{fields}", flush=True)
    return open(args.metrics, "w")


def run_steps(args, global_batch, metrics, step):
    """Runs step(i) for i = 1..--steps (it returns the step's loss tensor), writing a window to
    `metrics` (None on ranks other than 0) after step 1, every --log_every steps and the last;
    then closes it and, with --world > 1, leaves the group."""
    window_start, window_steps = time.perf_counter(), 0
    for i in range(1, args.steps + 1):
        loss = step(i)
        window_steps += 1
        if i % args.log_every == 0 or i == args.steps or i == 1:
            loss_value = loss.item()
            now = time.perf_counter()
            seconds = now - window_start
            if metrics is not None:
                metrics.write(f'{{"step":{i},"loss":{loss_value:.6g},'
                              f'"samples_per_second":{window_steps * global_batch / seconds:.6g},'
                              f'"window_seconds":{seconds:.6g}}}\n')
                metrics.flush()
            window_start, window_steps = time.perf_counter(), 0
    if metrics is not None:
        metrics.close()
    if args.world > 1:
        import torch.distributed as dist
        dist.barrier()
        dist.destroy_process_group()


def launch(train, args, program="torch_ddp"):
    """train(0, args) in this process at world 1, else --world spawned processes; the exit
    status (2 when --store already exists)."""
    import torch.multiprocessing as mp
    if args.world == 1:
        train(0, args)
        return 0
    if os.path.exists(args.store):
        sys.stderr.write(f"{program}: --store {args.store} already exists\n")
        return 2
    mp.spawn(train, args=(args,), nprocs=args.world, join=True)
    return 0


def train(rank, args):
    import torch
    import torch.nn.functional as F
    start_rank(torch, rank, args)
    model = build_model(torch, args.hidden)
    if args.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    x_all, y_all = load_data(args, torch)
    n = x_all.shape[0]
    global_batch = args.batch * args.world
    if global_batch > n:
        raise ValueError(f"global batch {global_batch} exceeds the {n} training samples")

    metrics = None
    if rank == 0:
        metrics = open_metrics(torch, args, f"data={args.data} world={args.world}")

    epoch, cursor = 0, 0
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed))

    def step(_):
        nonlocal epoch, cursor, perm
        if cursor + global_batch > n:
            epoch += 1
            cursor = 0
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(args.seed + epoch))
        idx = perm[cursor + rank * args.batch:cursor + (rank + 1) * args.batch]
        cursor += global_batch
        x, y = x_all.index_select(0, idx), y_all.index_select(0, idx)
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    run_steps(args, global_batch, metrics, step)


def main(argv):
    args = parse_args(argv)
    check_thread_environment(args.threads)
    try:
        import torch  # noqa: F401
        import torch.multiprocessing  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"torch_ddp: PyTorch is not installed ({e}); install it: "
                         f"{INSTALL_HINT}\n")
        return 5
    if args.data == "fashion_mnist" and not os.path.isdir(args.data_dir):
        sys.stderr.write(f"torch_ddp: --data_dir {args.data_dir} does not exist (Debian's "
                         "dataset-fashion-mnist), or use --data random\n")
        return 4
    return launch(train, args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
