#!/usr/bin/python3
"""Tests of python/ringmaster (the command-job module), standard library only.

Each case runs a real Python program that imports the module, in a child process, against a
listening Unix socket that plays the runner (the module keeps per-process state: a
connection, a signal handler).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
DEADLINE_S = 20  # bounds a broken case; a passing one takes well under a second


class FakeRunner:
    """The runner's end of the channel: listens, accepts one program, reads its lines."""

    def __init__(self, directory):
        self.path = os.path.join(directory, "control.sock")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(4)
        self.listener.settimeout(DEADLINE_S)
        self.conn = None
        self.buffer = b""

    def accept(self):
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(DEADLINE_S)

    def message(self):
        """The program's next message, or None when it closed the channel."""
        while b"\n" not in self.buffer:
            chunk = self.conn.recv(65536)
            if not chunk:
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def next_of(self, kind):
        """The next message of `kind`, skipping others (heartbeats)."""
        while True:
            m = self.message()
            if m is None or m["type"] == kind:
                return m

    def send(self, message):
        self.conn.sendall((json.dumps(message) + "\n").encode())

    def close(self):
        if self.conn is not None:
            self.conn.close()
        self.listener.close()


class ModuleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="rm", dir="/tmp")  # a socket path must be short
        self.runner = FakeRunner(self.dir)

    def tearDown(self):
        self.runner.close()
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    def start(self, code, with_socket=True):
        env = {k: v for k, v in os.environ.items() if k != "RINGMASTER_CONTROL_SOCKET"}
        env["PYTHONPATH"] = HERE
        if with_socket:
            env["RINGMASTER_CONTROL_SOCKET"] = self.runner.path
        return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    def finish(self, proc):
        out, err = proc.communicate(timeout=DEADLINE_S)
        return proc.returncode, out, err

    def test_without_the_socket_every_call_is_a_noop(self):
        proc = self.start("""
            import signal, ringmaster
            ringmaster.report(1, loss=0.5, samples=32, lr=0.1)
            print(ringmaster.stop_requested(), ringmaster.enabled(), ringmaster.stop_reason())
            print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
            print(ringmaster.rank(), ringmaster.world_size())
            """, with_socket=False)
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.split("\n")[:3], ["False False None", "True", "0 1"])
        self.assertEqual(err, "")

    def test_hello_then_reports_with_every_field(self):
        proc = self.start("""
            import os, ringmaster
            ringmaster.report(3, loss=0.25, samples=64, tokens=4096, lr=0.001, grad_norm=2)
            ringmaster.report(4, loss=float("nan"))
            print(os.getpid())
            """)
        self.runner.accept()
        hello = self.runner.message()
        first = self.runner.next_of("report")
        second = self.runner.next_of("report")
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(hello, {"type": "hello", "pid": int(out), "inprocess": False})
        self.assertEqual(first["step"], 3)
        self.assertEqual(first["loss"], 0.25)
        self.assertEqual(first["samples"], 64)
        self.assertEqual(first["tokens"], 4096)
        self.assertEqual(first["scalars"], {"lr": 0.001, "grad_norm": 2.0})
        self.assertAlmostEqual(first["time"], time.time(), delta=DEADLINE_S)
        self.assertEqual(second["loss"], "NaN")
        self.assertNotIn("samples", second)

    def test_bad_values_are_refused_naming_the_argument(self):
        proc = self.start("""
            import ringmaster
            for args, kwargs in [((-1,), {}), (("7",), {}), ((True,), {}),
                                 ((1,), {"loss": "high"}), ((1,), {"samples": 1.5}),
                                 ((1,), {"lr": None})]:
                try:
                    ringmaster.report(*args, **kwargs)
                    print("accepted", args, kwargs)
                except (TypeError, ValueError) as e:
                    print(e)
            """)
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        lines = out.strip().split("\n")
        self.assertEqual(len(lines), 6, out)
        for line, name in zip(lines, ["step", "step", "step", "loss", "samples", "lr"]):
            self.assertTrue(line.startswith(f"ringmaster.report: {name} must be"), line)

    def test_heartbeats_every_half_second_while_the_program_runs(self):
        proc = self.start("""
            import sys, ringmaster
            ringmaster.report(0)
            sys.stdin.readline()   # the program is busy; its daemon thread beats
            """)
        self.runner.accept()
        self.runner.next_of("report")
        start = time.monotonic()
        for _ in range(3):
            self.assertEqual(self.runner.next_of("heartbeat"), {"type": "heartbeat"})
        took = time.monotonic() - start
        self.assertGreater(took, 1.0)  # 3 beats at 0.5 s: ~1.5 s
        self.assertLess(took, 5.0)
        proc.stdin.write("\n")
        proc.stdin.flush()
        rc, _, err = self.finish(proc)
        self.assertEqual(rc, 0, err)

    def test_a_frozen_program_sends_no_heartbeat(self):
        proc = self.start("""
            import sys, ringmaster
            ringmaster.report(0)
            sys.stdin.readline()
            """)
        self.runner.accept()
        self.runner.next_of("heartbeat")
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.1)  # a beat already in flight
        self.runner.conn.settimeout(0)
        try:
            while self.runner.message() is not None:
                pass
        except BlockingIOError:
            pass
        self.runner.conn.settimeout(1.5)  # three intervals
        with self.assertRaises(socket.timeout):
            self.runner.message()
        os.kill(proc.pid, signal.SIGCONT)
        self.runner.conn.settimeout(DEADLINE_S)
        self.assertEqual(self.runner.next_of("heartbeat"), {"type": "heartbeat"})
        proc.stdin.write("\n")
        proc.stdin.flush()
        self.finish(proc)

    def test_the_stop_message_sets_stop_requested(self):
        proc = self.start("""
            import sys, time, ringmaster
            print(ringmaster.stop_requested(), flush=True)
            while not ringmaster.stop_requested():
                time.sleep(0.01)
            print(ringmaster.stop_reason())
            """)
        self.runner.accept()
        self.assertEqual(proc.stdout.readline(), "False\n")
        self.runner.send({"type": "stop", "reason": "drain"})
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "drain\n")

    def test_sigterm_is_recorded_once_stop_requested_was_asked(self):
        proc = self.start("""
            import signal, time, ringmaster
            ringmaster.stop_requested()
            print(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, flush=True)
            while not ringmaster.stop_requested():
                time.sleep(0.01)
            print(ringmaster.stop_reason(), flush=True)
            time.sleep(60)   # a second SIGTERM ends it
            """)
        self.runner.accept()
        self.assertEqual(proc.stdout.readline(), "True\n")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.stdout.readline(), "sigterm\n")
        proc.send_signal(signal.SIGTERM)
        rc, _, err = self.finish(proc)
        self.assertEqual(rc, -signal.SIGTERM, err)

    def test_report_alone_keeps_sigterms_default(self):
        proc = self.start("""
            import signal, time, ringmaster
            ringmaster.report(1)
            print(signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, flush=True)
            time.sleep(60)
            """)
        self.runner.accept()
        self.assertEqual(proc.stdout.readline(), "True\n")
        proc.send_signal(signal.SIGTERM)
        rc, _, _ = self.finish(proc)
        self.assertEqual(rc, -signal.SIGTERM)

    def test_the_programs_own_sigterm_handler_is_kept(self):
        proc = self.start("""
            import os, signal, sys, time, ringmaster
            mine = lambda s, f: os.write(1, b"mine\\n")  # not print: it may interrupt one
            signal.signal(signal.SIGTERM, mine)
            ringmaster.stop_requested()
            print(signal.getsignal(signal.SIGTERM) is mine, flush=True)
            sys.stdin.readline()
            print(ringmaster.stop_requested())
            """)
        self.runner.accept()
        self.assertEqual(proc.stdout.readline(), "True\n")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.stdout.readline(), "mine\n")
        proc.stdin.write("\n")
        proc.stdin.flush()
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "False\n")  # its own handler ran, not the module's

    def test_a_forked_child_does_not_use_the_channel(self):
        proc = self.start("""
            import os, ringmaster
            ringmaster.report(1)
            pid = os.fork()
            if pid == 0:
                ringmaster.report(99)
                os._exit(0 if not ringmaster.stop_requested() else 1)
            _, status = os.waitpid(pid, 0)
            ringmaster.report(2)
            print(os.waitstatus_to_exitcode(status))
            """)
        self.runner.accept()
        steps = [self.runner.next_of("report")["step"] for _ in range(2)]
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "0\n")
        self.assertEqual(steps, [1, 2])

    def test_a_socket_path_longer_than_a_socket_address_is_reached(self):
        deep = os.path.join(self.dir, "d" * 120)
        os.mkdir(deep)
        path = os.path.join(deep, "control.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        fd = os.open(deep, os.O_PATH | os.O_DIRECTORY)
        try:  # bound as the runner binds it (worker/program_channel.cc)
            listener.bind(f"/proc/self/fd/{fd}/control.sock")
        finally:
            os.close(fd)
        listener.listen(1)
        listener.settimeout(DEADLINE_S)
        self.runner.path = path
        proc = self.start("""
            import ringmaster
            ringmaster.report(5)
            """)
        conn, _ = listener.accept()
        conn.settimeout(DEADLINE_S)
        received = b""
        while received.count(b"\n") < 2:
            chunk = conn.recv(65536)
            if not chunk:
                break
            received += chunk
        rc, _, err = self.finish(proc)
        conn.close()
        listener.close()
        os.unlink(path)
        os.rmdir(deep)
        self.assertEqual(rc, 0, err)
        lines = [json.loads(x) for x in received.split(b"\n") if x]
        self.assertEqual([m["type"] for m in lines[:2]], ["hello", "report"], err)

    def test_a_missing_runner_is_said_once_and_the_program_runs_on(self):
        self.runner.close()
        os.unlink(self.runner.path)
        proc = self.start("""
            import ringmaster
            for step in range(3):
                ringmaster.report(step)
            print(ringmaster.stop_requested())
            """)
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "False\n")
        self.assertEqual(err.count("cannot connect to RINGMASTER_CONTROL_SOCKET="), 1, err)

    def test_a_runner_that_goes_away_does_not_stop_the_program(self):
        proc = self.start("""
            import sys, ringmaster
            ringmaster.report(1)
            sys.stdin.readline()
            for step in range(2, 200):
                ringmaster.report(step)
            print("done")
            """)
        self.runner.accept()
        self.runner.next_of("report")
        self.runner.conn.close()
        self.runner.conn = None
        proc.stdin.write("\n")
        proc.stdin.flush()
        rc, out, err = self.finish(proc)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "done\n")
        self.assertEqual(err.count("lost the channel to the runner"), 1, err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
