#!/usr/bin/python3
"""PyTorch peer of ringmaster's model.resnet18 (train/nn/resnet.h): the same CIFAR-style
ResNet-18 in plain eager PyTorch (no torchvision), on 28x28 images padded to 32x32 with the
channel repeated to 3.

  torch_resnet.py check DUMP   compares with a dump written by //tests:resnet_torch_test:
      loads ringmaster's parameters and running statistics, runs the dump's batch in
      training mode (batch statistics), and compares the logits, the mean loss, every
      parameter gradient and the updated running statistics with ringmaster's. A tensor
      agrees when max |ours - torch| <= 1e-4 + 1e-3 * max |torch|. Prints one line per
      tensor that does not, and a summary; exit status 0 when all agree, 1 otherwise, 6
      when some ReLU input lies within 5e-6 of 0 (fp32 rounding may put it on the other side
      of the kink: the caller should dump another batch). With --forward_only, only the
      logits, the loss and the running statistics (ReLU is continuous: no kink check).
  torch_resnet.py train --world N --threads T --store F --metrics M [--batch B] [--steps S]
      trains (SGD with momentum) on random images, plain at world 1, DDP over gloo beyond
      (per-rank BatchNorm statistics, buffers broadcast from rank 0: DDP's defaults),
      writing windows to --metrics as torch_ddp.py does (see its doc for the environment;
      the peer line adds parameters=N, parameters and running statistics as ringmaster
      counts them). Convolutions run through oneDNN (mkldnn), PyTorch's default on the CPU;
      --mkldnn off runs its own im2col convolution over the BLAS.

Exit status 5 when PyTorch is not installed (install it: apt-get install -y python3-torch).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ddp  # noqa: E402  (its checks, launch and step loop; stdlib imports only)


# With record_pre_relu set, every ReLU input of a forward is appended to PRE_RELU (check
# mode: how close the batch comes to a kink).
PRE_RELU = []


def build_resnet18(torch, width=64, classes=10, record_pre_relu=False):
    nn = torch.nn
    F = torch.nn.functional

    def relu(x):
        if record_pre_relu:
            PRE_RELU.append(x.detach())
        return F.relu(x)

    class BasicBlock(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(cout)
            self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(cout)
            self.shortcut = nn.Sequential()
            if stride != 1 or cin != cout:
                self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                              nn.BatchNorm2d(cout))

        def forward(self, x):
            out = relu(self.bn1(self.conv1(x)))
            out = self.bn2(self.conv2(out))
            return relu(out + self.shortcut(x))

    class ResNet18(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(3, width, 3, 1, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            cin = width
            for stage in range(4):
                cout = width << stage
                blocks = []
                for i in range(2):
                    blocks.append(BasicBlock(cin, cout, 2 if stage > 0 and i == 0 else 1))
                    cin = cout
                setattr(self, f"layer{stage + 1}", nn.Sequential(*blocks))
            self.linear = nn.Linear(cin, classes)

        def forward(self, images):
            side = int(round(images.shape[1] ** 0.5))
            pad = (32 - side) // 2
            x = images.view(-1, 1, side, side)
            x = F.pad(x, (pad, 32 - side - pad, pad, 32 - side - pad)).repeat(1, 3, 1, 1)
            out = relu(self.bn1(self.conv1(x)))
            for stage in range(4):
                out = getattr(self, f"layer{stage + 1}")(out)
            out = F.adaptive_avg_pool2d(out, 1).flatten(1)
            return self.linear(out)

    return ResNet18()


def read_dump(path, torch):
    """The dump: a line "RMDUMP1", a JSON line (width, classes, batch, side, tensors: name,
    shape, offset in floats), then little-endian float32 data."""
    with open(path, "rb") as f:
        if f.readline() != b"RMDUMP1\n":
            raise ValueError(f"{path}: not a ringmaster dump")
        header = json.loads(f.readline())
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.float32)
    tensors = {}
    for t in header["tensors"]:
        n = 1
        for d in t["shape"]:
            n *= d
        tensors[t["name"]] = data[t["offset"]:t["offset"] + n].view(*t["shape"]).clone()
    return header, tensors


KINK = 5e-6


def check(path, forward_only=False):
    import torch
    import torch.nn.functional as F
    torch.manual_seed(0)
    header, t = read_dump(path, torch)
    model = build_resnet18(torch, header["width"], header["classes"], True).double()
    state = {}
    for name, value in model.state_dict().items():
        if name.endswith("num_batches_tracked"):
            state[name] = value
            continue
        state[name] = t["param/" + name].double()
    model.load_state_dict(state)
    model.train()
    x = t["batch/features"].double()
    y = t["batch/labels"].long()
    logits = model(x)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    # A ReLU input within fp32's rounding of 0 may be on the other side in ringmaster's fp32
    # forward: that unit's gradient then flows in one and not the other, and the comparison
    # means nothing. Such a batch is refused (exit status 6; the caller takes another).
    nearest = min(v.abs().min().item() for v in PRE_RELU)
    if nearest < KINK and not forward_only:
        print(f"kink: a ReLU input is {nearest:.3g} from 0 (< {KINK}); take another batch")
        return 6
    results = [("logits", t["ours/logits"], logits.detach()),
               ("loss", t["ours/loss"], loss.detach().view(1))]
    for name, p in model.named_parameters():
        if not forward_only:
            results.append(("grad/" + name, t["grad/" + name], p.grad))
    for name, b in model.named_buffers():
        if "running" in name:
            results.append(("updated/" + name, t["updated/" + name], b))
    bad, worst = 0, 0.0
    for name, ours, want in results:
        want = want.double()
        diff = (ours.double() - want).abs().max().item()
        scale = want.abs().max().item()
        worst = max(worst, diff / (1e-4 + 1e-3 * scale) if scale == scale else float("inf"))
        if not diff <= 1e-4 + 1e-3 * scale:
            bad += 1
            print(f"MISMATCH {name}: max |ours - torch| = {diff:.3g}, max |torch| = {scale:.3g}")
    gradients = 0 if forward_only else len(list(model.parameters()))
    print(f"torch={torch.__version__} compared {len(results)} tensors (logits, loss, "
          f"{gradients} gradients, running statistics) in float64 "
          f"against ringmaster's fp32: {bad} disagree; worst error / tolerance = {worst:.3g} "
          f"(tolerance 1e-4 + 1e-3 * max |torch|)")
    return 1 if bad else 0


def train(rank, args):
    import torch
    import torch.nn.functional as F
    torch_ddp.start_rank(torch, rank, args)
    torch.backends.mkldnn.enabled = args.mkldnn == "on"
    model = build_resnet18(torch, args.width)
    if args.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    g = torch.Generator().manual_seed(args.seed + rank)
    x = torch.randn(args.batch, 784, generator=g)
    y = torch.randint(0, 10, (args.batch,), generator=g)
    global_batch = args.batch * args.world
    metrics = None
    if rank == 0:
        # Parameters and running statistics: what ringmaster's tensor table holds.
        count = sum(p.numel() for p in model.parameters()) + sum(
            b.numel() for n, b in model.named_buffers() if "running" in n)
        metrics = torch_ddp.open_metrics(
            torch, args, f"model=resnet18 width={args.width} mkldnn={args.mkldnn} "
            f"world={args.world} parameters={count}", program="torch_resnet")

    def step(_):
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    torch_ddp.run_steps(args, global_batch, metrics, step)


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("check")
    c.add_argument("dump")
    c.add_argument("--forward_only", action="store_true",
                   help="compare the logits, loss and running statistics only (a ReLU input "
                        "near 0 moves them by rounding only, not by a flipped unit)")
    t = sub.add_parser("train")
    torch_ddp.add_run_args(t)
    t.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    t.add_argument("--width", type=int, default=64)
    t.add_argument("--steps", type=int, default=10)
    t.add_argument("--log_every", type=int, default=5)
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--mkldnn", choices=["on", "off"], default="on",
                   help="off: PyTorch's own im2col convolution over the BLAS")
    args = p.parse_args(argv)
    try:
        import torch  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"torch_resnet: PyTorch is not installed ({e}); install it: "
                         f"{torch_ddp.INSTALL_HINT}\n")
        return 5
    if args.command == "check":
        return check(args.dump, args.forward_only)
    torch_ddp.check_thread_environment(args.threads, program="torch_resnet")
    return torch_ddp.launch(train, args, program="torch_resnet")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
