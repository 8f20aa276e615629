"""Checks the release bundle (bazel build //deploy:bundle) unpacked in a fresh directory.

- Layout: bin/ holds ringmaster, ringworker, ringtrainer and ringctl; lib/, README.md,
  systemd/, k8s/ and examples/ are there.
- Relocatable: each binary's libraries resolve inside the bundle's lib/ (its RPATH is
  $ORIGIN/../lib), except glibc's, the C++ runtime and zlib; each runs --help from there.
- systemd: the units pass `systemd-analyze verify` without a single warning (with their
  paths pointed at the unpacked bundle); they restart on failure, stop with SIGTERM, run as
  a dedicated user with a state directory and hardening; the agent's TimeoutStopSec covers
  its drain; every flag in ExecStart and in the environment files is one the binary knows.
- Kubernetes: every manifest is valid YAML with apiVersion, kind, metadata.name and a
  namespace; the coordinator is a StatefulSet with a volume for its state, a Service and
  gRPC health probes on its port; the agents are a DaemonSet requesting GPUs with a grace
  period that covers their drain; secrets referenced exist; every flag a container passes
  is one its binary knows.
"""
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile

import yaml

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, **kw)


bundle = sys.argv[1]
work = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
with tarfile.open(bundle) as t:
    t.extractall(work)
root = os.path.join(work, "ringmaster")
BINARIES = ["ringmaster", "ringworker", "ringtrainer", "ringctl"]

# Layout.
for b in BINARIES:
    check(os.access(os.path.join(root, "bin", b), os.X_OK), f"bin/{b} is not an executable")
for d in ["lib", "systemd", "k8s", "examples"]:
    check(os.path.isdir(os.path.join(root, d)) and os.listdir(os.path.join(root, d)),
          f"{d}/ is missing or empty")
check(os.path.isfile(os.path.join(root, "README.md")), "README.md is missing")

# Relocatable: libraries from lib/, except what every host has.
BASE = re.compile(r"^(linux-vdso|ld-linux|libc\.|libm\.|libdl\.|libpthread\.|librt\.|"
                  r"libresolv\.|libutil\.|libgcc_s\.|libstdc\+\+\.|libz\.)")
lib_dir = os.path.realpath(os.path.join(root, "lib"))
helps = {}
for b in BINARIES:
    path = os.path.join(root, "bin", b)
    ldd = run(["ldd", path]).stdout
    check("not found" not in ldd, f"{b}: unresolved libraries:\n{ldd}")
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m or BASE.match(m.group(1)):
            continue
        check(os.path.realpath(m.group(2)).startswith(lib_dir + "/"),
              f"{b}: {m.group(1)} comes from {m.group(2)}, not from the bundle's lib/")
    out = run([path, "--help"], cwd=work)
    helps[b] = out.stdout + out.stderr
    check(len(helps[b]) > 100, f"{b} --help printed nothing useful: {helps[b][:200]}")


def known_flags(binary):
    text = helps[binary]
    if binary == "ringctl":
        return set(re.findall(r"--([a-z_]+)", text))
    return set(re.findall(r"--([a-z_0-9]+) \(", text))


def check_flags(binary, args, where):
    flags = known_flags(binary)
    check(flags, f"{binary}: no flags found in --help")
    for a in args:
        m = re.match(r"--([a-z_0-9]+)", a)
        if m:
            check(m.group(1) in flags, f"{where}: {binary} has no flag --{m.group(1)}")


# systemd.
units = {"ringmaster.service": "ringmaster", "ringworker.service": "ringworker"}
analyze = shutil.which("systemd-analyze")
for unit, binary in units.items():
    text = open(os.path.join(root, "systemd", unit)).read()
    keys = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z]+)=(.*)$", line)
        if m:
            keys.setdefault(m.group(1), []).append(m.group(2))
    get = lambda k: keys.get(k, [""])[-1]
    check(get("Restart") in ("on-failure", "always"), f"{unit}: Restart=on-failure missing")
    check(get("KillSignal") == "SIGTERM", f"{unit}: KillSignal=SIGTERM missing")
    check(get("User") or get("DynamicUser") == "yes", f"{unit}: no dedicated user")
    check(get("StateDirectory"), f"{unit}: no StateDirectory")
    for k, v in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                 ("PrivateTmp", "yes")]:
        check(get(k) == v, f"{unit}: {k}={v} missing")
    exec_start = get("ExecStart").split()
    check(exec_start and exec_start[0] == f"/opt/ringmaster/bin/{binary}",
          f"{unit}: ExecStart does not run /opt/ringmaster/bin/{binary}")
    check_flags(binary, exec_start[1:], f"{unit} ExecStart")
    env_file = os.path.join(root, "systemd", unit.replace(".service", ".env"))
    for line in open(env_file):
        if not line.startswith("#") and "FLAGS=" in line:
            check_flags(binary, line.split("=", 1)[1].split(), f"{os.path.basename(env_file)}")
    stop = re.match(r"(\d+)s?$", get("TimeoutStopSec"))
    check(stop, f"{unit}: TimeoutStopSec missing")
    if binary == "ringworker" and stop:
        grace = [int(a.split("=")[1]) if "=" in a else int(exec_start[i + 1])
                 for i, a in enumerate(exec_start) if a.startswith("--drain_grace_s")]
        check(grace and int(stop.group(1)) >= grace[0] + 15,
              f"{unit}: TimeoutStopSec {stop.group(1)} s does not cover --drain_grace_s {grace}")
    if analyze:
        local = os.path.join(work, unit)
        open(local, "w").write(text.replace("/opt/ringmaster", root))
        v = run([analyze, "verify", local], cwd=work)
        check(v.returncode == 0 and not (v.stdout + v.stderr).strip(),
              f"{unit}: systemd-analyze verify: {v.returncode} {v.stdout}{v.stderr}")
if not analyze:
    print("SKIP: systemd-analyze is not installed; the units were not verified by systemd")

# Kubernetes.
docs = []
for name in sorted(os.listdir(os.path.join(root, "k8s"))):
    if not name.endswith(".yaml"):
        continue
    with open(os.path.join(root, "k8s", name)) as f:
        try:
            loaded = [d for d in yaml.safe_load_all(f) if d]
        except yaml.YAMLError as e:
            check(False, f"k8s/{name}: not valid YAML: {e}")
            continue
    for d in loaded:
        docs.append((name, d))
        check(d.get("apiVersion") and d.get("kind"), f"k8s/{name}: an object without apiVersion/kind")
        meta = d.get("metadata", {})
        check(meta.get("name"), f"k8s/{name}: a {d.get('kind')} without metadata.name")
        if d.get("kind") != "Namespace":
            check(meta.get("namespace") == "ringmaster",
                  f"k8s/{name}: {d.get('kind')} {meta.get('name')} is not in namespace ringmaster")
by_kind = {}
for name, d in docs:
    by_kind.setdefault(d["kind"], []).append(d)
for kind in ["Namespace", "Service", "StatefulSet", "DaemonSet", "Secret", "Job", "ConfigMap",
             "PersistentVolumeClaim"]:
    check(kind in by_kind, f"k8s: no {kind}")
secrets = {d["metadata"]["name"] for d in by_kind.get("Secret", [])}


def pod_spec(d):
    return d["spec"]["template"]["spec"]


def containers(d):
    return pod_spec(d).get("containers", [])


for kind in ["StatefulSet", "DaemonSet", "Job"]:
    for d in by_kind.get(kind, []):
        for v in pod_spec(d).get("volumes", []):
            if "secret" in v:
                check(v["secret"]["secretName"] in secrets,
                      f"{kind} {d['metadata']['name']}: secret {v['secret']['secretName']} is not defined")
        for c in containers(d):
            cmd = c.get("command", [])
            check(cmd and cmd[0].startswith("/opt/ringmaster/bin/"),
                  f"{kind} {d['metadata']['name']}: command {cmd} is not a bundled binary")
            if cmd:
                binary = os.path.basename(cmd[0])
                check(binary in BINARIES, f"{kind}: unknown binary {binary}")
                if binary in BINARIES:
                    check_flags(binary, cmd[1:] + c.get("args", []), f"{kind} {d['metadata']['name']}")
for d in by_kind.get("StatefulSet", []):
    check(d["spec"].get("volumeClaimTemplates"), "StatefulSet: no volume for the coordinator's state")
    for c in containers(d):
        ports = {p["containerPort"] for p in c.get("ports", [])}
        for probe in ["livenessProbe", "readinessProbe"]:
            p = c.get(probe, {})
            check("grpc" in p and p["grpc"].get("port") in ports,
                  f"StatefulSet: {probe} is not the gRPC health service on the serving port")
        listen = [a for a in c.get("args", []) if a.startswith("--listen=")]
        check(listen and listen[0].endswith(":%d" % min(ports or {0})),
              f"StatefulSet: --listen {listen} is not the container port {ports}")
for d in by_kind.get("DaemonSet", []):
    spec = pod_spec(d)
    for c in containers(d):
        args = c.get("args", [])
        grace = [int(a.split("=")[1]) for a in args if a.startswith("--drain_grace_s=")]
        check(grace, "DaemonSet: no --drain_grace_s")
        check(grace and spec.get("terminationGracePeriodSeconds", 30) >= grace[0] + 15,
              "DaemonSet: terminationGracePeriodSeconds does not cover the drain")
        res = c.get("resources", {})
        check(res.get("requests", {}).get("nvidia.com/gpu") and
              res.get("requests", {}).get("nvidia.com/gpu") == res.get("limits", {}).get("nvidia.com/gpu"),
              "DaemonSet: GPUs not requested (nvidia.com/gpu, requests = limits)")
for d in by_kind.get("ConfigMap", []):
    for key, value in d.get("data", {}).items():
        if key.endswith(".yaml"):
            try:
                spec = yaml.safe_load(value)
                check(isinstance(spec, dict) and spec.get("name"), f"ConfigMap {key}: no job name")
            except yaml.YAMLError as e:
                check(False, f"ConfigMap {key}: not valid YAML: {e}")

print(f"deploy_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
