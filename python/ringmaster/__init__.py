"""Report a command job's progress to ringmaster, and learn when to stop.

A program run as a ringmaster command job (`ringctl local -- python3 train.py`, or a spec
with `command:`) may use this module; it needs nothing but Python's standard library:

    import ringmaster

    for step in range(start, steps):
        if ringmaster.stop_requested():   # a drain, the group re-forming, the job's end
            save(step)
            break
        loss = train_one_step()
        ringmaster.report(step + 1, loss=loss.item(), samples=global_batch)

Its reports reach `ringctl top` and `status`, the dashboard's curves, the coordinator's
Prometheus metrics and the job's metrics JSONL (rank 0's), as a built-in trainer's do; and
once the program has called the module, a frozen program (SIGSTOP, a hung host) is found in
seconds: the module sends a heartbeat every 0.5 s from a daemon thread, and when they stop,
ringmaster re-forms the job's group.

Where it is found: each rank's ringtrainer prepends this module's directory to PYTHONPATH
(python/ beside bin/ in the release bundle). A program started otherwise can add that
directory to its PYTHONPATH itself.

Outside ringmaster (under torchrun, or plain `python3 train.py`) RINGMASTER_CONTROL_SOCKET is
not set and every function is a no-op: report() does nothing, stop_requested() returns False
and installs no signal handler, so a program that uses the module runs unchanged there.

SIGTERM. Ringmaster stops a program by sending {"type": "stop"} through the channel and then
SIGTERM to the program's process group (SIGKILL after command.stop_grace_s). The first call
of stop_requested() (not report()) installs a SIGTERM handler, from the main thread only, and
only when the program has none of its own (the handler is SIG_DFL): the handler records the
stop, which stop_requested() then returns, instead of ending the process; a second SIGTERM
ends it as SIGTERM would have. A program with its own SIGTERM handler keeps it, and still
sees stop_requested() turn True when the stop message arrives. A program that only reports,
never asking stop_requested(), keeps SIGTERM's default: it ends at once.

A process forked by the program (DataLoader workers) does not share the channel: the calls
are no-ops there.
"""

import json
import math
import os
import queue
import signal
import socket
import sys
import threading
import time

__all__ = [
    "report",
    "stop_requested",
    "stop_reason",
    "enabled",
    "rank",
    "world_size",
    "checkpoint_dir",
]

SOCKET_ENV = "RINGMASTER_CONTROL_SOCKET"
HEARTBEAT_INTERVAL_S = 0.5
_CONNECT_TIMEOUT_S = 5.0

_lock = threading.RLock()        # the channel's state below
_send_lock = threading.Lock()    # one line at a time on the socket
_sock = None                     # connected socket, or None
_pid = None                      # the process that connected (forks do not share it)
_failed = False                  # gave up: the channel could not be used
_inprocess = False               # what the last hello said
_stop = threading.Event()
_stop_reason = None
_sigterms = 0
_handler_checked = False
_subscribers = {}                # message type -> queue.Queue (for ringmaster.inprocess)
_world = None                    # the current world, when ringmaster.inprocess set one


def _warn(message):
    print(f"ringmaster: {message}", file=sys.stderr, flush=True)


def _encode_number(value, name):
    """A float for the wire; NaN and infinities as the strings the runner reads back."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"ringmaster.report: {name} must be a number, got {value!r}") from None
    if math.isfinite(x):
        return x
    return "NaN" if math.isnan(x) else ("Infinity" if x > 0 else "-Infinity")


def _count(value, name):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"ringmaster.report: {name} must be an integer, got {value!r}")
    value = int(value.__index__())
    if value < 0:
        raise ValueError(f"ringmaster.report: {name} must be >= 0, got {value}")
    return value


def _send(message):
    """Writes one message (a dict with "type"); False when the channel is not usable."""
    global _sock, _failed
    if not _connect():
        return False
    line = _line(message)
    with _send_lock:
        sock = _sock
        if sock is None:
            return False
        try:
            sock.sendall(line)
            return True
        except OSError as e:
            with _lock:
                if _sock is sock:
                    _sock, _failed = None, True
            _warn(f"lost the channel to the runner ({e}); progress is no longer reported")
            return False


def _hello_message():
    return {"type": "hello", "pid": os.getpid(), "inprocess": _inprocess}


def _line(message):
    return (json.dumps(message, separators=(",", ":"), allow_nan=False) + "\n").encode()


def _connect_unix(sock, path):
    """Connects `sock` to the socket at `path`; a path longer than a Unix socket address holds
    (108 bytes) is reached through its directory's /proc/self/fd entry, as the runner binds it."""
    if len(os.fsencode(path)) < 108:
        sock.connect(path)
        return
    directory, name = os.path.split(path)
    fd = os.open(directory or ".", os.O_PATH | os.O_DIRECTORY)
    try:
        sock.connect(f"/proc/self/fd/{fd}/{name}")
    finally:
        os.close(fd)


def _connect():
    """Connects on first use; True when connected in this process."""
    global _sock, _pid, _failed
    with _lock:
        if _sock is not None and _pid == os.getpid():
            return True
        if _failed or _pid is not None:  # gave up, or a forked child of the connected process
            return False
        path = os.environ.get(SOCKET_ENV)
        if not path:
            return False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(_CONNECT_TIMEOUT_S)
        try:
            _connect_unix(sock, path)
            sock.sendall(_line(_hello_message()))  # the first message, before any other
        except OSError as e:
            sock.close()
            _failed = True
            _warn(f"cannot connect to {SOCKET_ENV}={path} ({e}); progress is not reported")
            return False
        _sock, _pid = sock, os.getpid()
    threading.Thread(target=_heartbeats, args=(sock,), name="ringmaster-heartbeat",
                     daemon=True).start()
    threading.Thread(target=_reader, args=(sock,), name="ringmaster-reader",
                     daemon=True).start()
    return True


def _heartbeats(sock):
    while _sock is sock:
        time.sleep(HEARTBEAT_INTERVAL_S)
        if _sock is not sock or not _send({"type": "heartbeat"}):
            return


def _reader(sock):
    """Takes the runner's messages: stop sets stop_requested(); others go to subscribers."""
    global _stop_reason
    sock.settimeout(None)
    buffer = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                message = json.loads(line)
                kind = message["type"]
            except (ValueError, KeyError, TypeError):
                _warn(f"skipped a message from the runner that is not JSON with a type: {line!r}")
                continue
            if kind == "stop":
                with _lock:  # the runner's reason says more than the SIGTERM that follows it
                    if _stop_reason in (None, "sigterm"):
                        _stop_reason = message.get("reason", "stop")
                _stop.set()
            q = _subscribers.get(kind)
            if q is not None:
                q.put(message)


def _subscribe(kind):
    """A queue of the runner's messages of `kind` (for ringmaster.inprocess)."""
    with _lock:
        return _subscribers.setdefault(kind, queue.Queue())


def _set_inprocess(inprocess=True):
    """Says in a hello that the program survives a membership change in its own process."""
    global _inprocess
    _inprocess = bool(inprocess)
    return _send(_hello_message())


def _on_sigterm(signum, frame):
    global _sigterms, _stop_reason
    _sigterms += 1
    if _sigterms > 1:  # asked twice: end as SIGTERM's default would
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    if _stop_reason is None:
        _stop_reason = "sigterm"
    _stop.set()


def _install_sigterm_handler():
    global _handler_checked
    if _handler_checked or threading.current_thread() is not threading.main_thread():
        return
    _handler_checked = True
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)


def enabled():
    """True under ringmaster with the channel to the runner working."""
    return _connect()


def report(step, loss=None, samples=None, tokens=None, **scalars):
    """Reports that the program has done `step` steps (an integer >= 0).

    loss: the step's loss (a number; NaN allowed). samples, tokens: what this step took,
    all ranks together (the global batch; tokens for a language model), from which the
    job's samples/s and tokens/s are measured. scalars: any other named numbers, written to
    the job's metrics JSONL; lr, grad_norm and comm_fraction (the step's share spent in
    collectives, which lets ringmaster tell a slow rank's compute from its peers': a
    straggler) also fill those columns of its views. Call it once a step, from any
    thread; rank 0's reports make the job's curves, every rank's its hang and straggler
    detection. Raises TypeError or ValueError, naming the argument, for a bad value; a no-op
    outside ringmaster.
    """
    message = {"type": "report", "step": _count(step, "step"), "time": time.time()}
    if loss is not None:
        message["loss"] = _encode_number(loss, "loss")
    if samples is not None:
        message["samples"] = _count(samples, "samples")
    if tokens is not None:
        message["tokens"] = _count(tokens, "tokens")
    if scalars:
        message["scalars"] = {str(k): _encode_number(v, k) for k, v in scalars.items()}
    _send(message)


def stop_requested():
    """True once ringmaster asked the program to stop (or SIGTERM came, see the module's
    doc): save at this step boundary and exit 0. False outside ringmaster."""
    if not _connect():
        return False
    _install_sigterm_handler()
    return _stop.is_set()


def stop_reason():
    """Why the stop came: "drain" (the node is drained, or the job cancelled), "epoch" (the
    group re-forms: a peer failed, or it resizes), "job_over", "sigterm" (a SIGTERM, and
    no stop message yet); None before a stop."""
    return _stop_reason


def _env_int(name, default):
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        return default


def rank():
    """This process's rank (torchrun's RANK; 0 when not set)."""
    return _world["rank"] if _world else _env_int("RANK", 0)


def world_size():
    """The ranks of the job now (torchrun's WORLD_SIZE; 1 when not set)."""
    return _world["world_size"] if _world else _env_int("WORLD_SIZE", 1)


def checkpoint_dir(default=None):
    """RINGMASTER_CHECKPOINT_DIR (checkpoint.dir/<job>, the same across restarts), else
    `default`."""
    return os.environ.get("RINGMASTER_CHECKPOINT_DIR", default)
