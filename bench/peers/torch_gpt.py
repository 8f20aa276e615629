#!/usr/bin/python3
"""PyTorch peer of `trainbench --sections gpt`: ringmaster's GPT trained with AdamW on bytes.

The model is train/nn/gpt.h's, written in plain eager PyTorch (fp32): a learned token and
position embedding, pre-LayerNorm blocks (fused Q/K/V projection with bias, causal
multi-head self-attention, output projection; an MLP of 4 x width with GELU in its tanh
form), a final LayerNorm and an untied LM head without bias; GPT-2's initialisation
(weights and embeddings normal(0, 0.02), the two residual projections of each block
normal(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorm gains 1). Its parameter count is
checked against the formula of train/nn/gpt.h's tensor table before training and printed.

The data are the bytes of --text: every step each rank takes --batch windows of context + 1
bytes at random offsets (the order differs from ringmaster's sampler; the work per step is
the same). AdamW (torch.optim.AdamW: --lr, betas --beta1/--beta2, --weight_decay on every
parameter), the global gradient norm clipped to --clip_grad_norm (0: not clipped).

World 1 is plain PyTorch; world N > 1 runs N processes (torch.multiprocessing.spawn) joined
by torch.distributed's gloo backend over loopback (a FileStore rendezvous), the model
wrapped in DistributedDataParallel with its default buckets, exactly as torch_ddp.py.

Rank 0 writes one JSON object per logged window to --metrics, in the fields of ringmaster's
metrics.jsonl that trainbench reads (step, samples_per_second over all ranks, a sample
being one sequence of context tokens, window_seconds), and prints one line on stdout
before training:

  peer torch=<version> blas=<library torch loaded> blas_core=<its kernels> blas_threads=<n>
       torch_threads=<n>
       data=<text file> world=<n> parameters=<n>

The BLAS and thread environment are checked by torch_ddp.py's code (OpenBLAS through
LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-pthread; OPENBLAS_NUM_THREADS and
OMP_NUM_THREADS equal to --threads before the interpreter starts).

Exit status: 0 done; 2 bad arguments; 3 wrong BLAS or thread environment; 4 missing data;
5 PyTorch is not installed; 1 anything else (a rank failed, or the model's parameter count
is not the formula's).
"""

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_ddp  # noqa: E402  (its checks, launch and step loop; stdlib imports only)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    torch_ddp.add_run_args(p)
    p.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--heads", type=int, default=4, help="must divide --width")
    p.add_argument("--context", type=int, default=256, help="tokens a sequence predicts")
    p.add_argument("--vocab", type=int, default=256, help="bytes")
    p.add_argument("--tied", action="store_true",
                   help="the LM head is wte (GPT-2's; ringmaster's model.gpt2)")
    p.add_argument("--steps", type=int, default=30, help="optimizer steps")
    p.add_argument("--log_every", type=int, default=5, help="steps per timed window")
    p.add_argument("--text", default="/usr/share/common-licenses/GPL-3",
                   help="the byte file to train on")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.95)
    p.add_argument("--weight_decay", type=float, default=0.1)
    p.add_argument("--clip_grad_norm", type=float, default=1.0)
    a = p.parse_args(argv)
    for name in ("world", "batch", "layers", "width", "heads", "context", "vocab", "steps",
                 "log_every", "threads"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(a, name)}")
    if a.width % a.heads != 0:
        p.error(f"--heads {a.heads} does not divide --width {a.width}")
    return a


def expected_parameters(layers, width, context, vocab, tied=False):
    """train/nn/gpt.h's tensor table: wte, wpe, the blocks, lnf and the LM head (none when
    tied)."""
    block = (2 * width                      # ln1
             + 3 * width * width + 3 * width  # attn.qkv
             + width * width + width          # attn.proj
             + 2 * width                      # ln2
             + 4 * width * width + 4 * width  # mlp.fc
             + 4 * width * width + width)     # mlp.proj
    head = 0 if tied else vocab * width
    return vocab * width + context * width + layers * block + 2 * width + head


def build_model(torch, args):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(args.width)
            self.qkv = nn.Linear(args.width, 3 * args.width)
            self.attn_proj = nn.Linear(args.width, args.width)
            self.ln2 = nn.LayerNorm(args.width)
            self.fc = nn.Linear(args.width, 4 * args.width)
            self.mlp_proj = nn.Linear(4 * args.width, args.width)

        def forward(self, x, mask):
            b, t, c = x.shape
            hs = c // args.heads
            q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
            q = q.view(b, t, args.heads, hs).transpose(1, 2)
            k = k.view(b, t, args.heads, hs).transpose(1, 2)
            v = v.view(b, t, args.heads, hs).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            att = F.softmax(att.masked_fill(mask[:t, :t], float("-inf")), dim=-1)
            y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
            x = x + self.attn_proj(y)
            return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab, args.width)
            self.wpe = nn.Embedding(args.context, args.width)
            self.blocks = nn.ModuleList([Block() for _ in range(args.layers)])
            self.lnf = nn.LayerNorm(args.width)
            self.lm_head = nn.Linear(args.width, args.vocab, bias=False)
            if args.tied:
                self.lm_head.weight = self.wte.weight
            # Above the diagonal: the future a position may not see. A plain attribute, not a
            # buffer: DDP's broadcast of buffers over gloo refuses bool tensors.
            self.mask = torch.ones(args.context, args.context, dtype=torch.bool).triu(1)
            residual_std = 0.02 / math.sqrt(2 * args.layers)
            for name, p in self.named_parameters():
                if name.startswith("wte") or name.startswith("wpe") or name.endswith("weight"):
                    if ".ln" in name or name.startswith("lnf"):
                        nn.init.ones_(p)
                    elif name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight"):
                        nn.init.normal_(p, 0.0, residual_std)
                    else:
                        nn.init.normal_(p, 0.0, 0.02)
                else:
                    nn.init.zeros_(p)

        def forward(self, tokens):
            t = tokens.shape[1]
            x = self.wte(tokens) + self.wpe(torch.arange(t))
            for block in self.blocks:
                x = block(x, self.mask)
            return self.lm_head(self.lnf(x))

    return Gpt()


def train(rank, args):
    import torch
    import torch.nn.functional as F
    torch_ddp.start_rank(torch, rank, args)
    model = build_model(torch, args)
    parameters = sum(p.numel() for p in model.parameters())
    expected = expected_parameters(args.layers, args.width, args.context, args.vocab, args.tied)
    if parameters != expected:
        raise RuntimeError(f"the model has {parameters} parameters, train/nn/gpt.h's formula "
                           f"{expected}: not the same model")
    if args.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                  betas=(args.beta1, args.beta2),
                                  weight_decay=args.weight_decay)
    with open(args.text, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    if data.numel() < args.context + 1:
        raise ValueError(f"{args.text}: {data.numel()} bytes, fewer than context + 1 = "
                         f"{args.context + 1}")
    offsets = torch.arange(args.context + 1)
    generator = torch.Generator().manual_seed(args.seed + rank)

    metrics = None
    if rank == 0:
        metrics = torch_ddp.open_metrics(
            torch, args, f"data={args.text} world={args.world} parameters={parameters}",
            "torch_gpt")

    def step(_):
        starts = torch.randint(0, data.numel() - args.context, (args.batch, 1),
                               generator=generator)
        windows = data[starts + offsets]
        optimizer.zero_grad(set_to_none=True)
        logits = model(windows[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), windows[:, 1:].reshape(-1))
        loss.backward()
        if args.clip_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_grad_norm)
        optimizer.step()
        return loss

    torch_ddp.run_steps(args, args.batch * args.world, metrics, step)


def main(argv):
    args = parse_args(argv)
    torch_ddp.check_thread_environment(args.threads, "torch_gpt")
    try:
        import torch  # noqa: F401
        import torch.multiprocessing  # noqa: F401
    except ImportError as e:
        sys.stderr.write(f"torch_gpt: PyTorch is not installed ({e}); install it: "
                         f"{torch_ddp.INSTALL_HINT}\n")
        return 5
    if not os.path.isfile(args.text):
        sys.stderr.write(f"torch_gpt: --text {args.text} does not exist\n")
        return 4
    return torch_ddp.launch(train, args, "torch_gpt")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
