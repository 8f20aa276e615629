#!/usr/bin/python3
"""The PyTorch peer of ringmaster's GPT-2 weights: a GPT-2 in plain PyTorch (Debian's
python3-torch; no transformers, no safetensors package) that reads and writes Hugging Face's
safetensors layout by hand (struct + json + torch.frombuffer).

    gpt2_peer.py tokens --out T --samples N --context C --vocab V [--seed S] [--text FILE]
        token ids, int32 little-endian, N samples of C + 1 (tests/gpt_weights_eval.cc): random,
        or windows of FILE's bytes
    gpt2_peer.py check --weights W --tokens T --ringmaster R.json --heads H [--tolerance E]
        GPT-2's logits and loss on T with the weights in W, compared with ringmaster's on the
        same batch (R.json from gpt_weights_eval): the mean loss, each sample's loss, the
        next-token accuracy, and the log-softmax of the logits at each sample's last position
        over the whole vocabulary; exits 1 when a difference exceeds --tolerance (absolute)
    gpt2_peer.py write --out W --layers L --heads H --width D --context C --vocab V [--seed S]
        a freshly initialised GPT-2 (GPT2LMHeadModel's names: "transformer." prefix, the
        attention-mask buffers h.<l>.attn.bias and masked_bias, an untied lm_head), for a
        ringmaster job to start from (init_from)

The model (GPT-2, with its names and its Conv1D layout [in, out]): x = wte[t] + wpe[pos];
per block x += c_proj(attn(c_attn(ln_1(x)))), x += mlp.c_proj(gelu_tanh(mlp.c_fc(ln_2(x))));
logits = ln_f(x) @ lm_head^T (wte when the file has no lm_head: tied). LayerNorm eps 1e-5.
Computed in float64 so that the comparison measures ringmaster's float32 error only.

Exit status: 0 agreed or written; 1 a difference beyond the tolerance or a bad file;
2 bad usage; 5 PyTorch is not installed.
"""
import argparse
import json
import math
import struct
import sys

try:
    import torch
except ImportError:
    print("PyTorch is not installed (Debian's python3-torch)", file=sys.stderr)
    sys.exit(5)

DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "F64": torch.float64, "I64": torch.int64, "I32": torch.int32, "U8": torch.uint8,
          "BOOL": torch.bool}


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    header.pop("__metadata__", None)
    body = bytearray(data[8 + n:])  # writable, so frombuffer does not warn
    tensors = {}
    for name, e in header.items():
        begin, end = e["data_offsets"]
        dtype = DTYPES[e["dtype"]]
        size = torch.tensor([], dtype=dtype).element_size()
        t = (torch.frombuffer(body, dtype=dtype, count=(end - begin) // size, offset=begin)
             if end > begin else torch.zeros(0, dtype=dtype))
        tensors[name] = t.reshape(e["shape"]).clone()
    return tensors


def save_safetensors(path, tensors, metadata=None):
    header, offset, blobs = {}, 0, []
    if metadata:
        header["__metadata__"] = metadata
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        dtype = {v: k for k, v in DTYPES.items()}[t.dtype]
        blob = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - (8 + len(text)) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def gpt2_logits(sd, tokens, heads):
    """GPT-2 forward: tokens [B, T] -> logits [B, T, vocab], in float64."""
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v.double()
          for k, v in sd.items()}
    ln = lambda x, p: torch.nn.functional.layer_norm(x, x.shape[-1:], sd[p + ".weight"],
                                                     sd[p + ".bias"], 1e-5)
    conv1d = lambda x, p: x @ sd[p + ".weight"] + sd[p + ".bias"]  # Conv1D: [in, out]
    b, t = tokens.shape
    x = sd["wte.weight"][tokens] + sd["wpe.weight"][:t]
    width = x.shape[-1]
    mask = torch.ones(t, t, dtype=torch.bool).tril()
    layer = 0
    while f"h.{layer}.ln_1.weight" in sd:
        h = f"h.{layer}"
        q, k, v = conv1d(ln(x, h + ".ln_1"), h + ".attn.c_attn").split(width, dim=2)
        q, k, v = (z.view(b, t, heads, width // heads).transpose(1, 2) for z in (q, k, v))
        s = (q @ k.transpose(-2, -1)) / math.sqrt(width // heads)
        a = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ v
        x = x + conv1d(a.transpose(1, 2).reshape(b, t, width), h + ".attn.c_proj")
        m = torch.nn.functional.gelu(conv1d(ln(x, h + ".ln_2"), h + ".mlp.c_fc"),
                                     approximate="tanh")
        x = x + conv1d(m, h + ".mlp.c_proj")
        layer += 1
    head = sd.get("lm_head.weight", sd["wte.weight"])
    return ln(x, "ln_f") @ head.T


def check(args):
    sd = load_safetensors(args.weights)
    theirs = json.load(open(args.ringmaster))
    with open(args.tokens, "rb") as f:
        raw = f.read()
    samples = len(theirs["sample_loss"])
    ids = torch.tensor(struct.unpack(f"<{len(raw) // 4}i", raw)).view(samples, -1)
    logits = gpt2_logits(sd, ids[:, :-1], args.heads)
    vocab = logits.shape[-1]
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, vocab), ids[:, 1:].reshape(-1), reduction="none").view(samples, -1)
    last = torch.log_softmax(logits[:, -1, :], dim=-1)
    ours = {"loss": losses.mean().item(), "sample_loss": losses.mean(dim=1).tolist(),
            "correct": int((logits.argmax(dim=-1) == ids[:, 1:]).sum())}
    diffs = {
        "loss": abs(ours["loss"] - theirs["loss"]),
        "sample_loss": max(abs(a - b) for a, b in zip(ours["sample_loss"], theirs["sample_loss"])),
        "last_logprobs": (last - torch.tensor(theirs["last_logprobs"], dtype=torch.float64))
        .abs().max().item(),
    }
    print(f"peer torch={torch.__version__} weights={args.weights} samples={samples} "
          f"vocab={vocab} loss: pytorch {ours['loss']:.7f} ringmaster {theirs['loss']:.7f}; "
          f"correct: pytorch {ours['correct']} ringmaster {theirs['correct']}; "
          + "; ".join(f"max |difference| {k} {v:.2e}" for k, v in diffs.items())
          + f" (tolerance {args.tolerance:g})")
    bad = [k for k, v in diffs.items() if not v <= args.tolerance]
    # Ties between the top two logits could flip the count: allow a difference of one.
    if abs(ours["correct"] - theirs["correct"]) > 1:
        bad.append("correct")
    if bad:
        print("DISAGREE: " + ", ".join(bad), file=sys.stderr)
        return 1
    return 0


def write(args):
    g = torch.Generator().manual_seed(args.seed)
    normal = lambda *shape, std=0.02: torch.randn(*shape, generator=g) * std
    d, sd = args.width, {}
    sd["wte.weight"] = normal(args.vocab, d)
    sd["wpe.weight"] = normal(args.context, d, std=0.01)
    for l in range(args.layers):
        h = f"h.{l}"
        # Biases and LayerNorms not at 0 and 1, so that a mix-up of any two shows.
        for ln in ("ln_1", "ln_2"):
            sd[f"{h}.{ln}.weight"] = 1 + normal(d, std=0.1)
            sd[f"{h}.{ln}.bias"] = normal(d, std=0.1)
        for name, n_in, n_out in (("attn.c_attn", d, 3 * d), ("attn.c_proj", d, d),
                                  ("mlp.c_fc", d, 4 * d), ("mlp.c_proj", 4 * d, d)):
            sd[f"{h}.{name}.weight"] = normal(n_in, n_out)
            sd[f"{h}.{name}.bias"] = normal(n_out, std=0.05)
        sd[f"{h}.attn.bias"] = torch.ones(args.context, args.context).tril().view(
            1, 1, args.context, args.context)
        sd[f"{h}.attn.masked_bias"] = torch.tensor(-1e4)
    sd["ln_f.weight"] = 1 + normal(d, std=0.1)
    sd["ln_f.bias"] = normal(d, std=0.1)
    tensors = {"transformer." + k: v for k, v in sd.items()}
    tensors["lm_head.weight"] = normal(args.vocab, d)
    save_safetensors(args.out, tensors, {"format": "pt"})
    print(f"wrote {args.out}: {len(tensors)} tensors")
    return 0


def tokens(args):
    g = torch.Generator().manual_seed(args.seed)
    if args.text:  # windows of the text's bytes at random offsets
        data = torch.tensor(list(open(args.text, "rb").read()), dtype=torch.int32)
        starts = torch.randint(0, len(data) - args.context - 1, (args.samples,), generator=g)
        ids = torch.stack([data[s:s + args.context + 1] for s in starts.tolist()])
    else:
        ids = torch.randint(0, args.vocab, (args.samples, args.context + 1), generator=g,
                            dtype=torch.int32)
    with open(args.out, "wb") as f:
        f.write(ids.numpy().astype("<i4").tobytes())
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("tokens")
    t.add_argument("--out", required=True)
    t.add_argument("--samples", type=int, default=3)
    t.add_argument("--text", help="take windows of this file's bytes (vocab 256), not random ids")
    w = sub.add_parser("write")
    w.add_argument("--out", required=True)
    w.add_argument("--layers", type=int, required=True)
    w.add_argument("--width", type=int, required=True)
    for q in (t, w):
        q.add_argument("--context", type=int, required=True)
        q.add_argument("--vocab", type=int, required=True)
        q.add_argument("--seed", type=int, default=1)
    c = sub.add_parser("check")
    c.add_argument("--weights", required=True)
    c.add_argument("--tokens", required=True)
    c.add_argument("--ringmaster", required=True)
    c.add_argument("--tolerance", type=float, default=1e-4)
    for q in (w, c):
        q.add_argument("--heads", type=int, required=True)
    args = p.parse_args()
    return {"tokens": tokens, "write": write, "check": check}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
