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
- Hardening: every pod mounts no service-account token and runs its containers with a
  read-only root filesystem; a container writes only to the volumes it mounts writable,
  and only the agents' host-directory init container runs as root (with CAP_CHOWN alone;
  its script is run here under exactly that capability where the test runs as root).
- GPU agents: the DaemonSet runs the GPU image (Dockerfile.gpu, which refuses a bundle
  without CUDA) with --gpus=required; its preemption notice file lies on a host directory
  and its preStop hook writes that very file; its work directory (the trainers' logs, the
  node credential) is a host directory that outlives the pod; a headless Service and a
  NetworkPolicy select the agents and name the log port they listen on.
- The agent's GPU check: the bundled ringworker with --gpus=required and no usable GPU
  exits 3 naming the cause (a default bundle: built without CUDA; a CUDA bundle on a machine
  without a driver or GPU: that); with a GPU, it says what it found. A CUDA bundle's is also
  run with a fake driver (deploy/testing/fake_libcuda.cc, argv[2]) that is too old, and one
  that finds no GPU. A bad --gpus exits 2.
- A CUDA bundle (bazel build --config=cuda //deploy:bundle) carries the CUDA runtime,
  cuBLASLt and NCCL in lib/ and never the driver's libcuda.
- Command jobs: the README's example program, examples/torch_ddp/train.py, is there with its
  spec; where /usr/bin/python3 has torch, the bundle's ringctl runs it from the bundle's
  directory, as the README says, on 2 ranks to equal parameters.
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
    ldd = run(["ldd", path], env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}).stdout
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
             "PersistentVolumeClaim", "NetworkPolicy"]:
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

# Hardening: no service-account token, read-only root filesystems, writable volumes only
# where mounted so.
def volumes_of(d):
    vols = {v["name"]: v for v in pod_spec(d).get("volumes", [])}
    for t in d["spec"].get("volumeClaimTemplates", []):
        vols[t["metadata"]["name"]] = {"persistentVolumeClaim": t["spec"]}
    return vols


for kind in ["StatefulSet", "DaemonSet", "Job"]:
    for d in by_kind.get(kind, []):
        name = f"{kind} {d['metadata']['name']}"
        spec = pod_spec(d)
        check(spec.get("automountServiceAccountToken") is False,
              f"{name}: automountServiceAccountToken is not false")
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            sc = c.get("securityContext", {})
            check(sc.get("readOnlyRootFilesystem") is True,
                  f"{name}/{c['name']}: readOnlyRootFilesystem is not true")
            check(sc.get("allowPrivilegeEscalation") is False,
                  f"{name}/{c['name']}: allowPrivilegeEscalation is not false")
            check("ALL" in sc.get("capabilities", {}).get("drop", []),
                  f"{name}/{c['name']}: capabilities are not dropped")
            vols = volumes_of(d)
            for m in c.get("volumeMounts", []):
                v = vols.get(m["name"], {})
                check(v, f"{name}/{c['name']}: volume {m['name']} is not defined")
                if "secret" in v or "configMap" in v:
                    check(m.get("readOnly") is True,
                          f"{name}/{c['name']}: {m['name']} ({m['mountPath']}) is not read-only")
        for c in spec.get("containers", []):
            check(c.get("securityContext", {}).get("runAsUser", 1) != 0 and
                  spec.get("securityContext", {}).get("runAsNonRoot") is True,
                  f"{name}/{c['name']}: may run as root")


def arg_value(args, flag):
    for a in args:
        if a.startswith(f"--{flag}="):
            return a.split("=", 1)[1]
    return None


def mount_of(d, c, path):
    """The volume mounted in container c over `path`, and the mount."""
    best = None
    for m in c.get("volumeMounts", []):
        p = m["mountPath"].rstrip("/")
        if (path == p or path.startswith(p + "/")) and (best is None or len(p) > len(best["mountPath"])):
            best = m
    return (volumes_of(d).get(best["name"]), best) if best else (None, None)


# The GPU agents.
gpu_dockerfile = os.path.join(root, "k8s", "Dockerfile.gpu")
check(os.path.isfile(gpu_dockerfile), "k8s/Dockerfile.gpu is missing")
gpu_image = ""
if os.path.isfile(gpu_dockerfile):
    text = open(gpu_dockerfile).read()
    m = re.search(r"docker build -t (\S+) -f deploy/k8s/Dockerfile\.gpu", text)
    check(m, "Dockerfile.gpu does not say how it is built (docker build -t IMAGE -f ...)")
    gpu_image = m.group(1) if m else ""
    check(re.search(r"bazel build --config=cuda //deploy:bundle", text),
          "Dockerfile.gpu is not built from the --config=cuda bundle")
    for lib in ["libcudart", "libnccl", "libcublasLt"]:
        check(re.search(r"^RUN[^\n]*(\\\n[^\n]*)*/opt/ringmaster/lib/%s\.so" % lib, text, re.M),
              f"Dockerfile.gpu does not refuse a bundle without {lib}")
    check("libcuda.so.1" not in re.sub(r"#.*", "", text), "Dockerfile.gpu ships the driver's libcuda")
for d in by_kind.get("DaemonSet", []):
    spec = pod_spec(d)
    labels = d["spec"]["template"]["metadata"]["labels"]
    for c in containers(d):
        args = c.get("args", [])
        check(c.get("image") == gpu_image,
              f"DaemonSet: image {c.get('image')} is not Dockerfile.gpu's {gpu_image}")
        check(arg_value(args, "gpus") == "required", "DaemonSet: no --gpus=required")
        gpus = c.get("resources", {}).get("limits", {}).get("nvidia.com/gpu")
        check(str(gpus) == arg_value(args, "slots"),
              f"DaemonSet: --slots={arg_value(args, 'slots')} is not the pod's {gpus} GPUs")
        check(c.get("terminationMessagePolicy") == "FallbackToLogsOnError",
              "DaemonSet: a failed GPU check's message is not the termination message")
        notice = arg_value(args, "preemption_notice_file")
        check(notice, "DaemonSet: no --preemption_notice_file")
        if notice:
            v, m = mount_of(d, c, notice)
            check(v and "hostPath" in v and not m.get("readOnly"),
                  f"DaemonSet: {notice} is not on a writable host directory (the node's spot hook writes it)")
            pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            check(pre and re.search(r"\btouch %s\b" % re.escape(notice), " ".join(pre)),
                  f"DaemonSet: the preStop hook does not write {notice}: {pre}")
        work_dir = arg_value(args, "work_dir")
        v, m = mount_of(d, c, work_dir or "/")
        check(work_dir and v and "hostPath" in v and not m.get("readOnly"),
              f"DaemonSet: --work_dir {work_dir} (trainer logs, node credential) is not a writable host directory")
        log_port = (arg_value(args, "log_listen") or "").rsplit(":", 1)[-1]
        check(log_port.isdigit(), "DaemonSet: --log_listen has no fixed port")
        services = [s for s in by_kind.get("Service", [])
                    if s["spec"].get("selector") and
                    all(labels.get(k) == v for k, v in s["spec"]["selector"].items())]
        check(services and services[0]["spec"].get("clusterIP") == "None" and
              any(str(p.get("port")) == log_port for p in services[0]["spec"].get("ports", [])),
              f"DaemonSet: no headless Service selects the agents with their log port {log_port}")
        policies = [p for p in by_kind.get("NetworkPolicy", [])
                    if all(labels.get(k) == v
                           for k, v in p["spec"]["podSelector"].get("matchLabels", {}).items())]
        check(policies and any(str(port.get("port")) == log_port
                               for rule in policies[0]["spec"].get("ingress", [])
                               for port in rule.get("ports", [])),
              f"DaemonSet: no NetworkPolicy admits the coordinator to the log port {log_port}")
    # Only the init container runs as root, with CAP_CHOWN alone.
    for c in spec.get("initContainers", []):
        sc = c.get("securityContext", {})
        check(sc.get("capabilities", {}).get("add", []) == ["CHOWN"],
              f"DaemonSet/{c['name']}: capabilities other than CHOWN: {sc.get('capabilities')}")
        script = c.get("command", [])[-1]
        # Needs root, and user 65532 mapped (not so in a user namespace of uid 0 alone).
        mapped = [l.split() for l in open("/proc/self/uid_map")]
        if (os.geteuid() != 0 or not shutil.which("setpriv") or
                not any(int(a) <= 65532 < int(a) + int(n) for a, _, n in mapped)):
            print(f"SKIP: DaemonSet/{c['name']}'s script not run (needs root, user 65532 and setpriv)")
            continue
        # The host directories as the kubelet leaves them the second time: the agent's,
        # with a notice of the previous pod in one.
        host = tempfile.mkdtemp(dir=work)
        for m in c.get("volumeMounts", []):
            p = host + m["mountPath"]
            os.makedirs(p)
            os.chown(p, 65532, 65532)
            os.chmod(p, 0o700)
        notice_dirs = [host + m["mountPath"] for m in c.get("volumeMounts", [])
                       if "preempt" in script and m["mountPath"] + "/preempt" in script]
        for p in notice_dirs:
            open(os.path.join(p, "preempt"), "w").close()
            os.chown(os.path.join(p, "preempt"), 65532, 65532)
        r = run(["setpriv", "--bounding-set", "-all,+chown", "/bin/sh", "-c",
                 script.replace("/host/", host + "/host/")])
        check(r.returncode == 0, f"DaemonSet/{c['name']}: its script fails with CAP_CHOWN only: {r.stderr}")
        for m in c.get("volumeMounts", []):
            st = os.stat(host + m["mountPath"])
            check((st.st_uid, st.st_gid) == (65532, 65532),
                  f"DaemonSet/{c['name']}: {m['mountPath']} is not the agent's after it")
        check(notice_dirs and not any(os.path.exists(os.path.join(p, "preempt")) for p in notice_dirs),
              f"DaemonSet/{c['name']}: a previous pod's notice is left for the new agent")

# The coordinator's metrics port, in its Service and its container.
for d in by_kind.get("StatefulSet", []):
    ports = {p.get("name"): p["containerPort"] for c in containers(d) for p in c.get("ports", [])}
    check(ports.get("metrics") == 9090, "StatefulSet: no metrics port 9090")
    svc = [s for s in by_kind.get("Service", []) if s["metadata"]["name"] == d["spec"]["serviceName"]]
    check(svc and any(p.get("targetPort") == "metrics" for p in svc[0]["spec"]["ports"]),
          "Service ringmaster: no metrics port")

# The bundle's flavour: a CUDA build carries CUDA's libraries, never the driver's.
libs = sorted(os.listdir(os.path.join(root, "lib")))
cuda_bundle = any(l.startswith("libcudart.so") for l in libs)
check(not any(l.startswith(("libcuda.so", "libnvidia")) for l in libs),
      f"lib/ carries the NVIDIA driver's libraries: {libs}")
if cuda_bundle:
    for lib in ["libcublasLt.so", "libnccl.so"]:
        check(any(l.startswith(lib) for l in libs), f"a CUDA bundle without {lib}: {libs}")
print("bundle:", "CUDA (--config=cuda)" if cuda_bundle else "CPU (default build)", "-", len(libs),
      "libraries", " ".join(l for l in libs if l.startswith(("libcu", "libnccl"))))

# The agent's GPU check, with the machine this test runs on.
ringworker = os.path.join(root, "bin", "ringworker")
bad = run([ringworker, "--gpus=sometimes", "--slots=1"], cwd=work)
check(bad.returncode == 2 and "--gpus" in bad.stderr, f"--gpus=sometimes: {bad.returncode} {bad.stderr}")
try:
    r = run([ringworker, "--gpus=required", "--slots=1", "--coordinator=127.0.0.1:9",
             f"--work_dir={work}/gpu-check"], cwd=work, timeout=15)
    out, rc = r.stdout + r.stderr, r.returncode
except subprocess.TimeoutExpired as e:  # passed the check; then waits for the coordinator
    text = lambda b: b.decode() if isinstance(b, bytes) else (b or "")
    out, rc = text(e.stdout) + text(e.stderr), None
print(f"ringworker --gpus=required on this machine: exit {rc}: {out.strip()[:400]}")
if not cuda_bundle:
    check(rc == 3 and "built without CUDA" in out, f"a default bundle's --gpus=required: {rc} {out}")
elif rc == 3:
    check(re.search(r"driver is missing|driver supports|no GPU is visible|usable GPU", out),
          f"--gpus=required failed without naming a cause: {out}")
else:
    check(re.search(r"\d+ GPU\(s\) for 1 slot\(s\)", out), f"--gpus=required passed silently: {rc} {out}")
# ... and with a driver that is too old, or one that finds no GPU (deploy/testing/fake_libcuda.cc).
fake_driver = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else ""
if cuda_bundle and os.path.isfile(os.path.join(fake_driver, "libcuda.so.1")):
    for version, init, cause in [("12080", "35", "the NVIDIA driver supports CUDA 12.8 but this "
                                  "build's runtime is CUDA 13"),
                                 ("13000", "100", "no GPU is visible to this process")]:
        env = dict(os.environ, LD_LIBRARY_PATH=fake_driver, FAKE_CUDA_DRIVER_VERSION=version,
                   FAKE_CUDA_INIT_RESULT=init)
        r = run([ringworker, "--gpus=required", "--slots=1", "--coordinator=127.0.0.1:9",
                 f"--work_dir={work}/gpu-check"], cwd=work, env=env, timeout=15)
        check(r.returncode == 3 and cause in r.stderr,
              f"--gpus=required with a driver for {version} whose cuInit gives {init}: "
              f"{r.returncode} {r.stderr}")
elif cuda_bundle:
    print("SKIP: no fake driver given; the old-driver and no-GPU cases were not run")

# Command jobs: the example program and its spec, run from the unpacked bundle.
for f in ["examples/torch_ddp/train.py", "examples/torch_ddp.yaml",
          "examples/torch_inprocess/train.py", "examples/torch_inprocess.yaml"]:
    check(os.path.isfile(os.path.join(root, f)), f"{f} is missing")
if run(["/usr/bin/python3", "-c", "import torch"]).returncode != 0:
    print("SKIP: command job from the bundle: /usr/bin/python3 cannot import torch")
else:
    r = run([os.path.join(root, "bin", "ringctl"), "local", "--workers", "2", "--run_dir",
             f"{work}/ddp", "examples/torch_ddp.yaml", "--set", "command.argv[3]=20"],
            cwd=root, timeout=300)
    logs = "".join(open(os.path.join(d, f)).read() for d, _, fs in os.walk(f"{work}/ddp")
                   for f in fs if f.startswith("slot-") and f.endswith(".log"))
    sums = set(re.findall(r"done at step 20, params checksum (\S+)", logs))
    check(r.returncode == 0 and len(re.findall(r"done at step 20,", logs)) == 2 and len(sums) == 1,
          f"ringctl local examples/torch_ddp.yaml from the bundle: exit {r.returncode}, "
          f"checksums {sums}: {(r.stdout + r.stderr)[-600:]}")

# The ringmaster Python module: in the bundle, and on a command job's program's PYTHONPATH.
check(os.path.isfile(os.path.join(root, "python", "ringmaster", "__init__.py")),
      "python/ringmaster/__init__.py is missing")
with open(f"{work}/uses_module.py", "w") as f:
    f.write("import ringmaster\nringmaster.report(1, loss=0.5)\n"
            "print('module at', ringmaster.__file__, 'enabled', ringmaster.enabled(), flush=True)\n")
r = run([os.path.join(root, "bin", "ringctl"), "local", "--workers", "1", "--run_dir",
         f"{work}/module", "--", "/usr/bin/python3", f"{work}/uses_module.py"],
        cwd=work, env={k: v for k, v in os.environ.items()
                       if k not in ("PYTHONPATH", "RUNFILES_DIR", "TEST_SRCDIR")}, timeout=120)
logs = "".join(open(os.path.join(d, f)).read() for d, _, fs in os.walk(f"{work}/module")
               for f in fs if f.startswith("slot-") and f.endswith(".log"))
want = f"module at {os.path.realpath(root)}/python/ringmaster/__init__.py enabled True"
check(r.returncode == 0 and want in logs,
      f"a command job's program from the bundle did not use the bundle's module ({want!r}): "
      f"exit {r.returncode}: {(r.stdout + r.stderr)[-300:]} {logs[-600:]}")

print(f"deploy_test: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
