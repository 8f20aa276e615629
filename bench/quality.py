#!/usr/bin/python3
"""Trains a Fashion-MNIST example with 1, 2 and 4 local ranks (the same global batch) and
prints the test accuracy of each run and how far their loss curves are apart.

    bazel build //cli:ringctl //worker:ringtrainer
    python3 bench/quality.py [--spec examples/fashion_mnist_mlp.yaml] [--workers 1,2,4]
        [--goal 0.88] [--set key=value ...] [--out out/quality]

The global batch and the data order do not depend on the number of ranks, so the runs see
the same batches in the same order: their loss curves differ only by floating-point
summation order (which grows slowly over many steps). Exits 1 when a run fails or misses
--goal.
"""
import argparse
import json
import os
import subprocess
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="examples/fashion_mnist_mlp.yaml")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--goal", type=float, default=0.88, help="test accuracy to reach")
    p.add_argument("--set", action="append", default=[], help="spec override key=value")
    p.add_argument("--out", default="out/quality")
    p.add_argument("--ringctl", default="bazel-bin/cli/ringctl")
    args = p.parse_args()

    if not os.access(args.ringctl, os.X_OK):
        sys.exit(f"quality.py: {args.ringctl} not found; build it: "
                 "bazel build //cli:ringctl //worker:ringtrainer")
    try:
        workers = [int(w) for w in args.workers.split(",")]
    except ValueError:
        sys.exit(f"quality.py: --workers: {args.workers!r} is not a list of numbers")
    os.makedirs(args.out, exist_ok=True)
    name = os.path.splitext(os.path.basename(args.spec))[0]

    runs = {}
    for w in workers:
        metrics = os.path.abspath(f"{args.out}/{name}-w{w}.metrics.jsonl")
        summary = f"{args.out}/{name}-w{w}.json"
        cmd = [args.ringctl, "local", "--workers", str(w), args.spec,
               "--set", f"metrics.jsonl={metrics}", "--set", "diagnostics.log_every=10",
               "--summary", summary]
        for s in args.set:
            cmd += ["--set", s]
        print(f"running {' '.join(cmd)}", flush=True)
        rc = subprocess.call(cmd, stdout=subprocess.DEVNULL)
        result = json.load(open(summary)) if os.path.exists(summary) else {"status": "missing"}
        if rc != 0 or result.get("status") != "succeeded":
            print(f"  workers {w}: {result.get('status')} (exit {rc})")
            runs[w] = None
            continue
        curve = {}
        for line in open(metrics):
            m = json.loads(line)
            curve[m["step"]] = m["loss"]
        runs[w] = (result, curve)

    print(f"\n{name}: same global batch on every world size")
    print(f"{'workers':>7} {'test accuracy':>13} {'final loss':>10} {'samples/s':>10} "
          f"{'max |loss - loss(1st)|':>22} {'mean':>8}")
    ok = True
    base = next((r for r in runs.values() if r is not None), None)
    for w in workers:
        r = runs[w]
        if r is None:
            print(f"{w:>7} {'failed':>13}")
            ok = False
            continue
        result, curve = r
        common = sorted(set(curve) & set(base[1]))
        diffs = [abs(curve[s] - base[1][s]) for s in common
                 if curve[s] is not None and base[1][s] is not None]
        acc = result["eval_accuracy"]
        ok &= acc is not None and acc >= args.goal
        print(f"{w:>7} {acc:>13.4f} {result['final_loss']:>10.4f} "
              f"{result['samples_per_second']:>10.0f} {max(diffs, default=0):>22.4g} "
              f"{sum(diffs) / max(1, len(diffs)):>8.3g}")
    print(f"goal: test accuracy >= {args.goal} on every world size: {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
