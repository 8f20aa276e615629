#!/usr/bin/python3
"""Tests of python/ringmaster/inprocess.py against sockets that play the ranks' runners.

The end-to-end test with ringmaster's own runners and coordinator is tests/inprocess_test.sh;
this one drives the module alone, with worlds this test decides: three real programs
(examples/torch_inprocess/train.py, Gloo on loopback); kill -9 of one, the survivors given a
world of two, its replacement a world of three; or the stop of one (its node drained), the
others given a world of two. Skipped, saying why, without torch.
"""
import contextlib
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TRAIN = os.path.join(ROOT, "examples", "torch_inprocess", "train.py")
DEADLINE_S = 120  # bounds a broken case; torch imports slowly on a loaded machine

sys.path.insert(0, HERE)
import ringmaster  # noqa: E402
import ringmaster.inprocess as inprocess  # noqa: E402


def has_torch():
    return subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                          capture_output=True).returncode == 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeRunner:
    """One rank's runner: its channel's socket and its program."""

    def __init__(self, directory, index, args, log_dir):
        self.path = os.path.join(directory, f"rank{index}.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.listener.settimeout(DEADLINE_S)
        self.args = args
        self.log_path = os.path.join(log_dir, f"rank{index}.log")
        self.conn = None
        self.buffer = b""
        self.proc = None

    def start(self):
        env = dict(os.environ, RINGMASTER_CONTROL_SOCKET=self.path, PYTHONPATH=HERE,
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        with open(self.log_path, "a") as log:
            self.proc = subprocess.Popen(["/usr/bin/python3", TRAIN] + self.args, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        self.conn, _ = self.listener.accept()
        self.buffer = b""

    def messages(self):
        """What the program sent since the last call (it must be read: its reports would
        otherwise fill the socket and block it)."""
        out = []
        while select.select([self.conn], [], [], 0)[0]:
            chunk = self.conn.recv(65536)
            if not chunk:
                break
            self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines]

    def send(self, message):
        self.conn.sendall((json.dumps(message) + "\n").encode())

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.listener.close()

    def log(self):
        with open(self.log_path) as f:
            return f.read()


def send_world(runners, epoch):
    port = free_port()
    for rank, runner in enumerate(runners):
        runner.send({"type": "world", "epoch": epoch, "rank": rank, "world_size": len(runners),
                     "master_addr": "127.0.0.1", "master_port": port})


def pump_until(runners, done, what):
    """Reads every runner's channel until done(message_seen) or the deadline."""
    deadline = time.monotonic() + DEADLINE_S
    seen = []
    while time.monotonic() < deadline:
        for r in runners:
            seen += [(r, m) for m in r.messages()]
        if done(seen):
            return seen
        time.sleep(0.01)
    raise AssertionError(f"waited {DEADLINE_S} s for {what}")


@contextlib.contextmanager
def fake_runners(count, steps):
    """`count` runners of train.py for `steps` steps; every program killed and every socket
    closed at the end, whatever the test did."""
    with tempfile.TemporaryDirectory(dir="/tmp") as sockets, \
            tempfile.TemporaryDirectory() as logs:
        args = ["--steps", str(steps), "--step_time", "0.02"]
        runners = [FakeRunner(sockets, i, args, logs) for i in range(count)]
        try:
            yield runners
        finally:
            for r in runners:
                if r.proc is not None and r.proc.poll() is None:
                    r.proc.kill()
                    r.proc.wait()
                r.close()


def start_in_world_one(runners):
    """Starts every program, waits for each one's in-process hello, sends them epoch 1."""
    for r in runners:
        r.start()
    pump_until(runners, lambda seen: sum(m["type"] == "hello" and bool(m.get("inprocess"))
                                         for _, m in seen) == len(runners),
               f"{len(runners)} hellos")
    send_world(runners, 1)


class RecoverTest(unittest.TestCase):
    def test_an_error_no_collective_raised_is_raised_again(self):
        group = inprocess.Group(state=dict, load_state=lambda s: None)
        group._queue = object()  # as under a runner: recover() would wait for a world
        error = RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 5x6)")
        with self.assertRaises(RuntimeError) as raised:
            group.recover(error, 7)
        self.assertIs(raised.exception, error)

    def test_outside_ringmaster_recover_raises_again(self):
        group = inprocess.Group(state=dict, load_state=lambda s: None)
        error = RuntimeError("[../gloo/transport/tcp/pair.cc:598] Connection closed by peer")
        with self.assertRaises(RuntimeError):
            group.recover(error, 7)


@unittest.skipUnless(has_torch(), "/usr/bin/python3 cannot import torch "
                     "(apt-get install python3-torch)")
class ThreeRanksTest(unittest.TestCase):
    def test_survivors_go_on_and_a_replacement_rejoins(self):
        with fake_runners(3, 150) as runners:
            self.run_case(runners)

    def test_a_drained_rank_leaves_and_its_peers_go_on(self):
        with fake_runners(3, 100) as runners:
            start_in_world_one(runners)
            pump_until(runners, lambda seen: any(m["type"] == "report" and m["step"] >= 20
                                                 for _, m in seen), "step 20")
            runners[2].send({"type": "stop", "reason": "drain"})
            send_world(runners[:2], 2)
            self.wait_all(runners)
            self.assertRegex(runners[2].log(), r"rank 2: stopped at step \d+")
            for r in runners[:2]:
                self.assertRegex(r.log(), r"(recovered into|switched to) epoch 2")
            self.assertEqual(len(self.checksums(runners[:2], 100)), 1,
                             [r.log()[-400:] for r in runners])

    def test_a_survivor_that_was_not_exchanging_with_the_dead_rank_recovers_at_once(self):
        # 4 ranks, the last killed: a survivor waiting on another survivor (not on the dead
        # rank) in the collective under way is freed when that one tears its group down, not
        # after the group's 5 s timeout.
        with fake_runners(4, 100) as runners:
            start_in_world_one(runners)
            pump_until(runners, lambda seen: any(r is runners[3] and m["type"] == "report"
                                                 and m["step"] >= 20 for r, m in seen),
                       "rank 3 at step 20")
            runners[3].proc.kill()
            runners[3].proc.wait()
            send_world(runners[:3], 2)
            self.wait_all(runners[:3])
            took = [float(t) for r in runners[:3]
                    for t in re.findall(r"recovered in ([0-9.]+)s", r.log())]
            self.assertEqual(len(took), 3, [r.log()[-400:] for r in runners[:3]])
            self.assertLess(max(took), 2.5, took)
            self.assertEqual(len(self.checksums(runners[:3], 100)), 1,
                             [r.log()[-400:] for r in runners[:3]])

    def wait_all(self, runners):
        deadline = time.monotonic() + DEADLINE_S
        while any(r.proc.poll() is None for r in runners) and time.monotonic() < deadline:
            for r in runners:
                r.messages()
            time.sleep(0.05)
        for r in runners:
            if r.proc.poll() is None:
                r.proc.kill()
            self.assertEqual(r.proc.wait(), 0, r.log())

    def checksums(self, runners, steps):
        return {line.split("params checksum ")[1].split(",")[0]
                for r in runners for line in r.log().splitlines()
                if f"done at step {steps}" in line}

    def run_case(self, runners):
        start_in_world_one(runners)
        pump_until(runners, lambda seen: any(r is runners[1] and m["type"] == "report" and
                                             m["step"] >= 30 for r, m in seen),
                   "rank 1 at step 30")
        survivors = [runners[0], runners[2]]
        pids = [r.proc.pid for r in survivors]
        runners[1].proc.kill()
        runners[1].proc.wait()
        send_world(survivors, 2)
        pump_until(survivors, lambda seen: sum(m["type"] == "world_done" and m["epoch"] == 2
                                               for _, m in seen) == 2, "the survivors' group")
        runners[1].start()  # the replacement: says hello, then waits for its world
        pump_until([runners[1]], lambda seen: any(m["type"] == "hello" for _, m in seen),
                   "the replacement's hello")
        send_world(runners, 3)
        self.wait_all(runners)
        self.assertEqual([r.proc.pid for r in survivors], pids)
        for r in survivors:
            self.assertIn("recovered into epoch 2", r.log())
            self.assertIn("switched to epoch 3", r.log())
        self.assertRegex(runners[1].log(), r"rank 1 of 3: pid \d+ training from step [1-9]\d*")
        self.assertEqual(len(self.checksums(runners, 150)), 1, [r.log()[-400:] for r in runners])


if __name__ == "__main__":
    unittest.main()
