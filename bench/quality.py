#!/usr/bin/python3
"""Trains an example with 1, 2 and 4 local ranks (the same global batch) and prints, for each
run, its evaluation (a classifier's test accuracy; a language model's validation perplexity)
and how far the loss curves are apart.

    bazel build //cli:ringctl //worker:ringtrainer
    python3 bench/quality.py [--spec examples/fashion_mnist_mlp.yaml] [--workers 1,2,4]
        [--goal 0.88] [--set key=value ...] [--out out/quality]
    python3 bench/quality.py --spec examples/sotu_quality.yaml [--perplexity_tolerance 0.02]

The global batch and the data order do not depend on the number of ranks, so the runs see
the same batches in the same order: their loss curves differ only by floating-point
summation order (which grows slowly over many steps).

A classifier's goal: test accuracy >= --goal on every world size. A language model's (a
spec whose result has a validation perplexity, data.tokens with a validation file): every
run's final validation perplexity within --perplexity_tolerance (relative) of the first
run's (seed exercise 26.24 asks for 2 %); the perplexities at each evaluation step
(data.eval_every_steps) are printed side by side. Exits 1 when a run fails or misses the
goal.
"""
import argparse
import json
import os
import subprocess
import sys


def run_one(args, name, w):
    """Runs `ringctl local` on `w` workers: (summary, {step: loss}, {step: perplexity})."""
    metrics = os.path.abspath(f"{args.out}/{name}-w{w}.metrics.jsonl")
    summary = f"{args.out}/{name}-w{w}.json"
    for stale in (metrics, summary):
        if os.path.exists(stale):
            os.remove(stale)
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
        return None
    curve, perplexity = {}, {}
    for line in open(metrics):
        m = json.loads(line)
        curve[m["step"]] = m.get("loss")
        if "test_perplexity" in m:
            perplexity[m["step"]] = m["test_perplexity"]
    return result, curve, perplexity


def curve_distance(curve, base):
    common = sorted(set(curve) & set(base))
    diffs = [abs(curve[s] - base[s]) for s in common
             if curve[s] is not None and base[s] is not None]
    return max(diffs, default=0), sum(diffs) / max(1, len(diffs))


def report_rows(workers, runs, width, row):
    """Prints row(result, max distance, mean distance) -> (text, ok) for each run after the
    workers column (`width`: the first column's width, for "failed"); True when every run
    succeeded and was ok."""
    ok = True
    base = next(r for r in runs.values() if r is not None)
    for w in workers:
        if runs[w] is None:
            print(f"{w:>7} {'failed':>{width}}")
            ok = False
            continue
        result, curve, _ = runs[w]
        text, good = row(result, *curve_distance(curve, base[1]))
        print(f"{w:>7} {text}")
        ok &= good
    return ok


def report_classifier(args, workers, runs):
    print(f"{'workers':>7} {'test accuracy':>13} {'final loss':>10} {'samples/s':>10} "
          f"{'max |loss - loss(1st)|':>22} {'mean':>8}")

    def row(result, most, mean):
        acc = result.get("eval_accuracy")
        acc_text = f"{acc:>13.4f}" if acc is not None else f"{'none':>13}"
        return (f"{acc_text} {result['final_loss']:>10.4f} "
                f"{result['samples_per_second']:>10.0f} {most:>22.4g} {mean:>8.3g}",
                acc is not None and acc >= args.goal)

    ok = report_rows(workers, runs, 13, row)
    print(f"goal: test accuracy >= {args.goal} on every world size: {'met' if ok else 'NOT met'}")
    return ok


def report_language_model(args, workers, runs):
    base_ppl = next(r for r in runs.values() if r is not None)[0]["eval_perplexity"]
    print(f"{'workers':>7} {'val perplexity':>14} {'val loss':>9} {'vs 1st':>9} "
          f"{'final loss':>10} {'tokens/s':>9} {'max |loss - loss(1st)|':>22} {'mean':>8}")

    def row(result, most, mean):
        ppl = result.get("eval_perplexity")
        if ppl is None:
            return f"{'none':>14}", False
        rel = ppl / base_ppl - 1
        return (f"{ppl:>14.4f} {result['eval_loss']:>9.4f} {100 * rel:>+8.1e}% "
                f"{result['final_loss']:>10.4f} {result.get('tokens_per_second', 0):>9.0f} "
                f"{most:>22.4g} {mean:>8.3g}", abs(rel) <= args.perplexity_tolerance)

    ok = report_rows(workers, runs, 14, row)
    steps = sorted(set().union(*(r[2].keys() for r in runs.values() if r is not None)))
    if steps:
        print("\nvalidation perplexity by step:")
        print(f"{'step':>7} " + " ".join(f"{f'{w} workers':>12}" for w in workers))
        for s in steps:
            cells = []
            for w in workers:
                p = runs[w][2].get(s) if runs[w] is not None else None
                cells.append(f"{p:>12.4f}" if p is not None else f"{'-':>12}")
            print(f"{s:>7} " + " ".join(cells))
    print(f"goal: final validation perplexity within {100 * args.perplexity_tolerance:g} % of "
          f"the first run's on every world size: {'met' if ok else 'NOT met'}")
    return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", default="examples/fashion_mnist_mlp.yaml")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--goal", type=float, default=0.88, help="test accuracy to reach")
    p.add_argument("--perplexity_tolerance", type=float, default=0.02,
                   help="language models: largest relative distance of a run's final "
                        "validation perplexity from the first run's")
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

    runs = {w: run_one(args, name, w) for w in workers}
    print(f"\n{name}: same global batch on every world size")
    if all(r is None for r in runs.values()):
        print("every run failed")
        return 1
    base = next(r for r in runs.values() if r is not None)
    if "eval_perplexity" in base[0]:
        ok = report_language_model(args, workers, runs)
    else:
        ok = report_classifier(args, workers, runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
