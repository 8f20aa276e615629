"""PyTorch peer of attention_bench: times torch.nn.functional.scaled_dot_product_attention
(is_causal=True) forward and backward at the same shapes and prints the same lines.

Layouts follow ours: qkv [B, T, 3C] split and viewed as [B, NH, T, hs] (strided views, as a
GPT-2 block feeds SDPA). Backward is timed as autograd of out against a fixed dout, with
the inputs' gradients cleared in between (outside the timed region). FLOPs are counted as
in attention_bench.cc: forward 4 * B * NH * T^2 * hs / 2, backward 2.5x forward.

Usage: python3 bench/gpu/attention_torch.py [iterations]   (default 50)
"""
import statistics
import sys

import torch
import torch.nn.functional as F


def median_ms(fn, warmup, iters, before=None):
    for _ in range(warmup):
        if before:
            before()
        fn()
    times = []
    for _ in range(iters):
        if before:
            before()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def bench(precision, dtype, batch, seq_len, heads, hs, iters):
    channels = heads * hs
    gen = torch.Generator(device="cuda").manual_seed(1)
    qkv = (torch.rand(batch, seq_len, 3 * channels, device="cuda", generator=gen,
                      dtype=torch.float32) * 2 - 1).to(dtype).requires_grad_(True)
    dout = (torch.rand(batch, heads, seq_len, hs, device="cuda", generator=gen,
                       dtype=torch.float32) * 2 - 1).to(dtype)

    def split(x):
        q, k, v = x.split(channels, dim=2)
        return [t.view(batch, seq_len, heads, hs).transpose(1, 2) for t in (q, k, v)]

    def forward():
        with torch.no_grad():
            q, k, v = split(qkv)
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q, k, v = split(qkv)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def backward():
        torch.autograd.grad(out, qkv, dout, retain_graph=True)

    fwd_ms = median_ms(forward, 5, iters)
    bwd_ms = median_ms(backward, 5, iters)
    fwd_flops = 4.0 * batch * heads * seq_len * seq_len * hs / 2
    bwd_flops = 2.5 * fwd_flops
    print(f"torch {precision} B={batch} T={seq_len} NH={heads} hs={hs}  "
          f"forward {fwd_ms:.3f} ms {fwd_flops / fwd_ms * 1e-9:.1f} TFLOP/s  "
          f"backward {bwd_ms:.3f} ms {bwd_flops / bwd_ms * 1e-9:.1f} TFLOP/s", flush=True)


def main():
    iters = int(sys.argv[1]) if len(sys.argv) > 1 else 50
    if iters < 1:
        sys.exit("usage: attention_torch.py [iterations >= 1]")
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"{iters} iterations, median", flush=True)
    for batch in (8, 16):
        bench("bf16", torch.bfloat16, batch, 1024, 12, 64, iters)
    bench("bf16", torch.bfloat16, 8, 1024, 6, 128, iters)
    bench("fp16", torch.float16, 8, 1024, 12, 64, iters)
    bench("fp16", torch.float16, 8, 1024, 6, 128, iters)
    bench("fp32", torch.float32, 8, 1024, 12, 64, min(iters, 10))


if __name__ == "__main__":
    main()
