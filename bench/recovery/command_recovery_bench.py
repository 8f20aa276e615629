#!/usr/bin/python3
"""bench/recovery/command_recovery_bench.py: a plain PyTorch program's recovery from a
SIGKILL of one of its 4 ranks, under ringmaster and under torchrun, in the same run.

    bazel build //cli:ringctl && bazel run //bench/recovery:command_recovery_bench
    bench/recovery/command_recovery_bench.py [--repeats 3] [--kill_at 60] [--steps 100]

The program is ddp_steps.py (4-rank DDP over Gloo, written for torchrun, rank 0 saving a
checkpoint every 25 steps); rank 3 SIGKILLs itself right after step --kill_at. Launchers:
  ringmaster        ringctl local --workers 4 -- /usr/bin/python3 ddp_steps.py ...
  ringmaster-preload  the same with --set command.preload=[torch, torch.distributed,
                    torch.nn]: each rank's runner keeps an interpreter with them imported and
                    forks the program from it every epoch (worker/zygote.h)
  torchrun          /usr/bin/torchrun --standalone --nproc_per_node 4 --max_restarts 3
                    (its defaults: a 5 s monitor interval)
  torchrun-0.1      the same with --monitor_interval 0.1 (today's upstream default)
  ringmaster-inprocess  inprocess_steps.py (the same model, data and steps, written with
                    ringmaster.inprocess: it opts in to in-process recovery) under ringctl
                    local --workers 4 --set elastic.min_ranks=2, --inprocess_steps steps
                    (--inprocess_workers N: N ranks, the last one killed). A run of it that
                    fails is reported, and the other launchers' go on
(Debian's torchrun 1.13 on Python 3.11 needs --redirects 2 --tee 2: its default "0" crashes.)

Every rank logs wall-clock times (ddp_steps.py's docstring); from them, per run:
  recovery      the kill -> every rank's first training step in a process started after it
  steps lost    the killed rank's last step - the step the new processes resumed from
  and, as the last rank reached each, the restart's parts: kill -> exec of the new processes
  (detection, the group stopped, the new epoch formed), -> `import torch` done,
  -> init_process_group returned (rendezvous), -> checkpoint loaded, -> first step.
Reported: the median of --repeats runs of each launcher, the runs interleaved, and the
ratios of both ringmaster rows to torchrun (goal <= 0.5) and to torchrun-0.1 (goal <= 1.0).
In-process (inprocess_steps.py's logs, one per slot): the kill -> every survivor's process
in the new group, -> every survivor's first step in it (goal <= 1 s), and the replacement's
process exec'd, torch imported, in the group with a survivor's state, training; steps lost
(the killed rank's last step - the step the survivors went on from); its ratios to torchrun.
Healthy overhead: --steps_healthy steps without a failure, steps/s of rank 0 from step 50
to the end, each ringmaster row against torchrun (goal >= 0.98).
The machine is shared and noisy: only numbers of one run compare.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.realpath(__file__))
PROGRAM = os.path.join(HERE, "ddp_steps.py")
PYTHON = "/usr/bin/python3"
TORCHRUN = "/usr/bin/torchrun"
PRELOAD = ["torch", "torch.distributed", "torch.nn"]  # what ddp_steps.py imports
INPROCESS = "ringmaster-inprocess"
INPROCESS_PROGRAM = os.path.join(HERE, "inprocess_steps.py")


def find_ringctl():
    """ringctl in this binary's runfiles (bazel run) or the workspace's bazel-bin."""
    candidates = []
    for runfiles in (os.environ.get("RUNFILES_DIR"), sys.argv[0] + ".runfiles"):
        if runfiles:
            candidates.append(os.path.join(runfiles, "ringmaster", "cli", "ringctl"))
    root = os.environ.get("BUILD_WORKSPACE_DIRECTORY") or os.path.dirname(os.path.dirname(HERE))
    candidates.append(os.path.join(root, "bazel-bin", "cli", "ringctl"))
    for c in candidates:
        if os.access(c, os.X_OK):
            return c
    return None


def launcher_argv(kind, ringctl, run_dir, workers=4):
    if kind.startswith("ringmaster"):
        argv = [ringctl, "local", "--workers", str(workers if kind == INPROCESS else 4),
                "--run_dir", os.path.join(run_dir, "run")]
        if kind == "ringmaster-preload":
            argv += ["--set", "command.preload=[" + ", ".join(PRELOAD) + "]"]
        if kind == INPROCESS:
            return argv + ["--set", "elastic.min_ranks=2", "--", PYTHON, INPROCESS_PROGRAM]
        return argv + ["--", PYTHON, PROGRAM]
    argv = [TORCHRUN, "--standalone", "--nproc_per_node", "4", "--max_restarts", "3",
            "--redirects", "2", "--tee", "2"]
    if kind == "torchrun-0.1":
        argv += ["--monitor_interval", "0.1"]
    return argv + [PROGRAM]


def run_once(kind, ringctl, work, name, program_args, timeout_s, workers=4):
    """Runs the program under `kind` in a fresh directory; returns that directory. A launcher
    that fails is run again once, saying so (torchrun 1.13's agent has lost its own
    rendezvous store here: 'RendezvousConnectionError ... Broken pipe')."""
    try:
        return run_in(kind, ringctl, os.path.join(work, name), program_args, timeout_s, workers)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        print(f"{kind}: {e}; running it again", flush=True)
        return run_in(kind, ringctl, os.path.join(work, name + "-again"), program_args,
                      timeout_s, workers)


def run_in(kind, ringctl, run_dir, program_args, timeout_s, workers=4):
    os.makedirs(run_dir)
    argv = launcher_argv(kind, ringctl, run_dir, workers) + [
        "--ckpt", os.path.join(run_dir, "ckpt.pt"), "--log_dir", run_dir] + program_args
    with open(os.path.join(run_dir, "launcher.out"), "w") as out:
        rc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=run_dir,
                            timeout=timeout_s).returncode
    if rc != 0:
        raise RuntimeError(f"{kind} exited {rc}; see {run_dir}/launcher.out")
    return run_dir


def read_events(run_dir):
    """{rank: [(event, time, pid, step)]} from ddp_steps.py's logs (inprocess_steps.py's:
    {slot: ...})."""
    events = {}
    for name in os.listdir(run_dir):
        if not (name.startswith(("rank", "slot")) and name.endswith(".log")):
            continue
        rows = []
        with open(os.path.join(run_dir, name)) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                step = int(parts[3]) if len(parts) > 3 else None
                rows.append((parts[0], float(parts[1]), int(parts[2]), step))
        events[int(name[4:-4])] = rows
    return events


PARTS = ["exec", "imported", "group", "loaded", "step"]


def recovery(events):
    """The kill, and per part of the restart the time from the kill to the last rank's
    reaching it in a process exec'd after the kill; steps lost."""
    kills = [e for rows in events.values() for e in rows if e[0] == "kill"]
    if len(kills) != 1:
        raise RuntimeError(f"expected one kill in the logs, found {len(kills)}")
    _, t_kill, _, kill_step = kills[0]
    reached = {p: [] for p in PARTS}
    resumed_from = []
    for rank, rows in events.items():
        new_pids = [pid for ev, t, pid, _ in rows if ev == "exec" and t > t_kill]
        if not new_pids:
            raise RuntimeError(f"rank {rank} was not restarted after the kill")
        pid = new_pids[0]
        for part in PARTS:
            times = [t for ev, t, p, _ in rows if ev == part and p == pid]
            if not times:
                raise RuntimeError(f"rank {rank}'s new process (pid {pid}) never reached {part}")
            reached[part].append(times[0] - t_kill)
        resumed_from += [s for ev, _, p, s in rows if ev == "loaded" and p == pid]
    out = {p: max(v) for p, v in reached.items()}
    out["lost"] = kill_step - min(resumed_from)
    return out


INPROCESS_PARTS = ["group", "again", "r_exec", "r_imported", "r_group", "r_step"]


def inprocess_recovery(events):
    """In-process recovery, from inprocess_steps.py's logs: per part, seconds from the kill
    until the last survivor went on in the new group ("group") and trained a step in it
    ("again"), and until the replacement's process was exec'd, imported torch, was in the
    group with a survivor's state and trained ("r_..."); steps lost."""
    kills = [e for rows in events.values() for e in rows if e[0] == "kill"]
    if len(kills) != 1:
        raise RuntimeError(f"expected one kill in the logs, found {len(kills)}")
    _, t_kill, killed_pid, kill_step = kills[0]
    group, again, went_on_from, out = [], [], [], {}
    for slot, rows in events.items():
        old = [pid for ev, t, pid, _ in rows if ev == "exec" and t < t_kill]
        new = [pid for ev, t, pid, _ in rows if ev == "exec" and t > t_kill]
        for pid in old:
            if pid == killed_pid:
                continue
            switched = [(t, s) for ev, t, p, s in rows if ev == "epoch" and p == pid and
                        t > t_kill]
            if not switched:
                raise RuntimeError(f"slot {slot}'s survivor (pid {pid}) never went on into a "
                                   "new epoch")
            t_group, from_step = switched[0]
            steps = [t for ev, t, p, _ in rows if ev == "step" and p == pid and t > t_group]
            if not steps:
                raise RuntimeError(f"slot {slot}'s survivor (pid {pid}) never trained again")
            group.append(t_group - t_kill)
            again.append(steps[0] - t_kill)
            went_on_from.append(from_step)
        for pid in new:
            for part, ev_name in (("r_exec", "exec"), ("r_imported", "imported"),
                                  ("r_group", "group"), ("r_step", "step")):
                times = [t for ev, t, p, _ in rows if ev == ev_name and p == pid]
                if not times:
                    raise RuntimeError(f"slot {slot}'s replacement (pid {pid}) never reached "
                                       f"{ev_name}")
                out[part] = max(out.get(part, 0.0), times[0] - t_kill)
    if not group:
        raise RuntimeError("no survivor of the kill found in the logs")
    if "r_step" not in out:
        raise RuntimeError("the killed rank was not replaced (no process exec'd after the kill)")
    out.update(group=max(group), again=max(again), lost=kill_step - min(went_on_from))
    return out


def steps_per_second(events, first=50):
    rows = [(t, s) for ev, t, _, s in events[0] if ev == "step" and s >= first]
    if len(rows) < 2:
        raise RuntimeError("too few steps to time")
    return (rows[-1][1] - rows[0][1]) / (rows[-1][0] - rows[0][0])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kill_at", type=int, default=60)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--steps_healthy", type=int, default=400)
    p.add_argument("--inprocess_steps", type=int, default=300,
                   help="ringmaster-inprocess's steps: the replacement must join before the end")
    p.add_argument("--inprocess_workers", type=int, default=4,
                   help="ringmaster-inprocess's ranks (the last one is killed)")
    p.add_argument("--launchers",
                   default="ringmaster,ringmaster-preload,torchrun,torchrun-0.1," + INPROCESS)
    p.add_argument("--no_healthy", action="store_true", help="only the recovery runs")
    p.add_argument("--no_kill", action="store_true", help="only the healthy runs")
    p.add_argument("--keep", action="store_true", help="keep the runs' logs")
    p.add_argument("--timeout_s", type=float, default=300)
    args = p.parse_args()
    try:
        import torch  # noqa: F401  (only to say why not)
    except ImportError:
        print("command_recovery_bench: skipped: /usr/bin/python3 has no torch "
              "(Debian: apt install python3-torch)")
        return 0
    ringctl = find_ringctl()
    if ringctl is None:
        print("command_recovery_bench: build ringctl first: bazel build //cli:ringctl",
              file=sys.stderr)
        return 2
    launchers = args.launchers.split(",")
    if not os.access(TORCHRUN, os.X_OK):
        print(f"command_recovery_bench: no {TORCHRUN}: ringmaster only")
        launchers = [k for k in launchers if k.startswith("ringmaster")]
    work = tempfile.mkdtemp(prefix="command-recovery-bench-")
    print(f"command_recovery_bench: runs in {work}; ringctl {ringctl}")
    results = {k: [] for k in launchers}
    inprocess_failures = []
    for i in range(0 if args.no_kill else args.repeats):
        for kind in launchers:
            if kind == INPROCESS:
                try:
                    d = run_once(kind, ringctl, work, f"{kind}-kill-{i}",
                                 ["--steps", str(args.inprocess_steps), "--die_at",
                                  str(args.kill_at), "--die_rank",
                                  str(args.inprocess_workers - 1)],
                                 args.timeout_s, args.inprocess_workers)
                    r = inprocess_recovery(read_events(d))
                except (RuntimeError, subprocess.TimeoutExpired) as e:
                    print(f"{kind} run {i + 1}: FAILED: {e}", flush=True)
                    inprocess_failures.append(str(e))
                    continue
                results[kind].append(r)
                print(f"{kind} run {i + 1}: " + ", ".join(
                    f"{part} {r[part]:.2f}" for part in INPROCESS_PARTS) + " s after the kill; "
                    f"{r['lost']} steps lost", flush=True)
                continue
            d = run_once(kind, ringctl, work, f"{kind}-kill-{i}",
                         ["--steps", str(args.steps), "--die_at", str(args.kill_at)],
                         args.timeout_s)
            r = recovery(read_events(d))
            results[kind].append(r)
            print(f"{kind} run {i + 1}: " + ", ".join(
                f"{part} {r[part]:.2f}" for part in PARTS) + f" s after the kill; "
                f"{r['lost']} steps lost", flush=True)
    healthy = {}
    if not args.no_healthy:
        kinds = [k for k in ("ringmaster", "ringmaster-preload", "torchrun") if k in launchers]
        healthy = {k: [] for k in kinds}
        for i in range(args.repeats):
            for kind in kinds:
                d = run_once(kind, ringctl, work, f"{kind}-healthy-{i}",
                             ["--steps", str(args.steps_healthy)], args.timeout_s)
                healthy[kind].append(steps_per_second(read_events(d)))
                print(f"{kind} healthy run {i + 1}: {healthy[kind][-1]:.1f} steps/s", flush=True)
    report(results, healthy, args.repeats)
    if INPROCESS in launchers and not args.no_kill:
        print(f"{INPROCESS} on {args.inprocess_workers} ranks: "
              f"{len(results[INPROCESS])} of {args.repeats} runs recovered"
              + (f"; failed: {inprocess_failures[0]}" if inprocess_failures else ""))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


def print_recovery(results, repeats):
    med = statistics.median
    print(f"\nkill -9 of 1 of 4 ranks: seconds from the kill until the last rank reached each "
          f"part (median of {repeats})")
    print("| launcher | new process exec'd | torch imported | process group | checkpoint "
          "loaded | **training again** (range) | steps lost |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, rs in results.items():
        if kind == INPROCESS:
            continue
        first = [r["step"] for r in rs]
        print(f"| {kind} | " + " | ".join(f"{med([r[p] for r in rs]):.2f}" for p in PARTS[:-1]) +
              f" | **{med(first):.2f}** ({min(first):.2f}–{max(first):.2f}) | "
              f"{med([r['lost'] for r in rs]):g} |")
    for ours in ("ringmaster", "ringmaster-preload"):
        for peer, goal in (("torchrun", 0.5), ("torchrun-0.1", 1.0)):
            if ours not in results or peer not in results:
                continue
            ratio = (med([r["step"] for r in results[ours]]) /
                     med([r["step"] for r in results[peer]]))
            print(f"goal: recovery {ours}/{peer} <= {goal}: "
                  f"{'PASS' if ratio <= goal else 'MISS'} ({ratio:.2f})")
    if results.get(INPROCESS):
        print_inprocess(results, repeats)


def print_inprocess(results, repeats):
    med = statistics.median
    rs = results[INPROCESS]
    again = [r["again"] for r in rs]
    print(f"\nin-process recovery ({INPROCESS}), kill -9 of 1 rank: seconds from the kill "
          f"(median of the {len(rs)} runs that recovered)")
    print("| survivors in the new group | **survivors training again** (range) | replacement "
          "exec'd | replacement imported torch | replacement in the group | replacement "
          "training | steps lost |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    print(f"| {med([r['group'] for r in rs]):.2f} | **{med(again):.2f}** "
          f"({min(again):.2f}–{max(again):.2f}) | " +
          " | ".join(f"{med([r[p] for r in rs]):.2f}" for p in INPROCESS_PARTS[2:]) +
          f" | {med([r['lost'] for r in rs]):g} |")
    print(f"goal: {INPROCESS} survivors training again <= 1 s: "
          f"{'PASS' if med(again) <= 1.0 else 'MISS'} ({med(again):.2f} s)")
    for peer in ("torchrun", "torchrun-0.1"):
        if results.get(peer):
            ratio = med(again) / med([r["step"] for r in results[peer]])
            replaced = med([r["r_step"] for r in rs]) / med([r["step"] for r in results[peer]])
            print(f"{INPROCESS}/{peer}: survivors training again {ratio:.2f}, "
                  f"the replacement training {replaced:.2f}")


def report(results, healthy, repeats):
    med = statistics.median
    if any(results.values()):
        print_recovery(results, repeats)
    if "torchrun" in healthy:
        b = med(healthy["torchrun"])
        for ours in ("ringmaster", "ringmaster-preload"):
            if ours not in healthy:
                continue
            a = med(healthy[ours])
            print(f"healthy steps/s (median of {repeats}): {ours} {a:.1f}, torchrun {b:.1f}")
            print(f"goal: healthy steps/s {ours}/torchrun >= 0.98: "
                  f"{'PASS' if a / b >= 0.98 else 'MISS'} ({a / b:.3f})")


if __name__ == "__main__":
    sys.exit(main())
