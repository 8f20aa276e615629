#!/usr/bin/env python3
"""The PyTorch side of issue 7's GPT-2 benchmark: training-step throughput and MFU of GPT-2
small on one GPU, eager and torch.compile, for the same model, shapes and precision that
ringmaster's GPU trainer runs, so the two can be compared in one call on one machine.

    python3 bench/gpu/gpt2_torch.py --batch 16 --context 1024 --modes eager,compile \
        --precisions bf16 --steps 20 --json out.json

The model is ringmaster's GPT (train/nn/gpt.h, after llm.c / nanoGPT): learned positions,
pre-LayerNorm blocks, causal attention, tanh GELU, a final LayerNorm; the LM head is tied
to the token embedding unless --untied (ringmaster's CPU model is untied). Attention is
F.scaled_dot_product_attention (is_causal=True: FlashAttention on Hopper). Optimizer: AdamW
(fused), lr 6e-4, betas (0.9, 0.95), weight decay 0.1, gradient clipping at 1.0.

Precision: fp32 (tf32 matrix products off unless --tf32), or bf16/fp16 autocast with fp32
master weights (fp16 with a GradScaler).

FLOPs per token (what MFU counts): 6 N for the matrix products of every parameter (N
without the position embedding, whose lookup does no arithmetic; the tied head counted
once, as it is used once), plus attention's score and value products, 6 * 2 * L * T * C
with the causal half: 6 L T C. MFU = FLOPs per token x tokens/s / peak, with the peak
given by --peak_tflops (989.4: the H100 SXM's dense bf16 figure; the H200 has the same).
Timing: CUDA events around --steps steps after --warmup steps; the median step time.
Data: random tokens from a fixed generator, resident on the GPU (no input pipeline cost).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.fc_proj = nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        x = x + self.fc_proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x


class Gpt(nn.Module):
    def __init__(self, vocab, context, width, layers, heads, tied):
        super().__init__()
        self.wte = nn.Embedding(vocab, width)
        self.wpe = nn.Embedding(context, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.lnf = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t, device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.lnf(x))
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def parameter_count(model, exclude_positions):
    seen, n = set(), 0
    for name, p in model.named_parameters():
        if id(p) in seen or (exclude_positions and name == "wpe.weight"):
            continue
        seen.add(id(p))
        n += p.numel()
    return n


def run(args, mode, precision):
    torch.manual_seed(1234)
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    model = Gpt(args.vocab, args.context, args.width, args.layers, args.heads,
                not args.untied).to(device)
    n_all = parameter_count(model, exclude_positions=False)
    n_flop = parameter_count(model, exclude_positions=True)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    dtype = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[precision]
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    gen = torch.Generator(device=device).manual_seed(7)
    batches = [torch.randint(0, args.vocab, (args.batch, args.context + 1), device=device,
                             generator=gen) for _ in range(4)]

    def step(i):
        data = batches[i % len(batches)]
        with torch.autocast("cuda", dtype=dtype, enabled=dtype is not None):
            loss = step_model(data[:, :-1], data[:, 1:])
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss

    torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(args.warmup):
        step(i)
    torch.cuda.synchronize()
    warmup_s = time.perf_counter() - t0
    times = []
    loss = None
    for i in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loss = step(args.warmup + i)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    step_s = statistics.median(times)
    tokens = args.batch * args.context
    flops_per_token = 6 * n_flop + 6 * args.layers * args.context * args.width
    tflops = flops_per_token * tokens / step_s / 1e12
    return {
        "framework": "pytorch " + torch.__version__,
        "mode": mode,
        "precision": precision,
        "gpu": torch.cuda.get_device_name(),
        "batch": args.batch,
        "context": args.context,
        "params": n_all,
        "params_flop": n_flop,
        "flops_per_token": flops_per_token,
        "step_ms_median": step_s * 1e3,
        "step_ms_min": min(times) * 1e3,
        "step_ms_max": max(times) * 1e3,
        "tokens_per_s": tokens / step_s,
        "tflops": tflops,
        "mfu": tflops / args.peak_tflops,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "warmup_s": warmup_s,
        "final_loss": float(loss),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=1024)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--untied", action="store_true", help="separate LM head (ringmaster's CPU GPT)")
    p.add_argument("--modes", default="eager,compile")
    p.add_argument("--precisions", default="bf16")
    p.add_argument("--tf32", action="store_true", help="allow tf32 products in fp32 runs")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--peak_tflops", type=float, default=989.4,
                   help="dense peak of the precision's matrix unit (H100/H200 SXM bf16: 989.4)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpt2_torch.py: no CUDA device; this benchmark needs a GPU")
    for name in ("batch", "context", "vocab", "width", "layers", "heads", "steps"):
        if getattr(args, name) <= 0:
            sys.exit(f"gpt2_torch.py: --{name} must be positive")
    if args.width % args.heads:
        sys.exit("gpt2_torch.py: --width must be a multiple of --heads")
    results = []
    for precision in args.precisions.split(","):
        for mode in args.modes.split(","):
            if mode not in ("eager", "compile") or precision not in ("fp32", "bf16", "fp16"):
                sys.exit(f"gpt2_torch.py: unknown mode {mode!r} or precision {precision!r}")
            r = run(args, mode, precision)
            results.append(r)
            print(f"pytorch {mode:7s} {precision}: {r['step_ms_median']:8.2f} ms/step  "
                  f"{r['tokens_per_s']:9.0f} tok/s  {r['tflops']:6.1f} TFLOP/s  "
                  f"MFU {100 * r['mfu']:5.1f} %  peak mem {r['peak_memory_gib']:.1f} GiB  "
                  f"(params {r['params'] / 1e6:.1f} M, loss {r['final_loss']:.3f})", flush=True)
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
