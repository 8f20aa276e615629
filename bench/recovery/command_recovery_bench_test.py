#!/usr/bin/python3
"""command_recovery_bench.py's reading of ddp_steps.py's logs, on logs written here."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.realpath(__file__)))
import command_recovery_bench as bench  # noqa: E402


def write(d, rank, lines):
    with open(os.path.join(d, f"rank{rank}.log"), "w") as f:
        f.write("".join(line + "\n" for line in lines))


class RecoveryTest(unittest.TestCase):
    def test_the_last_rank_of_the_new_processes_decides_and_old_steps_do_not_count(self):
        with tempfile.TemporaryDirectory() as d:
            # Rank 0: its old process finished step 60 after the kill (not training again);
            # its new process started 0.5 s after the kill.
            write(d, 0, ["exec 100.0 11", "step 109.0 11 59", "step 110.2 11 60",
                         "exec 110.5 21", "imported 110.6 21", "group 110.7 21",
                         "loaded 110.8 21 50", "step 111.0 21 51", "step 111.1 21 52"])
            write(d, 1, ["exec 100.0 12", "step 109.5 12 60", "kill 110.0 12 60",
                         "exec 110.4 22", "imported 110.9 22", "group 111.0 22",
                         "loaded 111.1 22 50", "step 111.5 22 51"])
            r = bench.recovery(bench.read_events(d))
        self.assertAlmostEqual(r["exec"], 0.5)
        self.assertAlmostEqual(r["imported"], 0.9)
        self.assertAlmostEqual(r["group"], 1.0)
        self.assertAlmostEqual(r["loaded"], 1.1)
        self.assertAlmostEqual(r["step"], 1.5)
        self.assertEqual(r["lost"], 10)

    def test_a_rank_that_was_not_restarted_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, 0, ["exec 100.0 11", "step 111.0 11 61"])
            write(d, 1, ["exec 100.0 12", "kill 110.0 12 60", "exec 110.4 22",
                         "imported 110.9 22", "group 111.0 22", "loaded 111.1 22 50",
                         "step 111.5 22 51"])
            with self.assertRaisesRegex(RuntimeError, "rank 0 was not restarted"):
                bench.recovery(bench.read_events(d))

    def test_in_process_the_last_survivor_and_the_replacement_decide(self):
        with tempfile.TemporaryDirectory() as d:
            # Slot 3's process (pid 13) kills itself after step 60; slots 0 and 1 go on in
            # their processes (slot 1's old-group step 60, logged after the kill, is no
            # training again); slot 3's replacement (pid 23) joins later.
            write(d, 0, ["exec 100.0 11", "step 109.9 11 60", "epoch 110.2 11 60 2",
                         "step 110.3 11 61", "epoch 112.0 11 70 3", "step 112.1 11 71"])
            write(d, 1, ["exec 100.0 12", "step 110.1 12 60", "epoch 110.4 12 60 2",
                         "step 110.6 12 61"])
            write(d, 3, ["exec 100.0 13", "step 110.0 13 60", "kill 110.0 13 60",
                         "exec 110.3 23", "imported 111.5 23", "group 112.0 23 70",
                         "step 112.2 23 71"])
            r = bench.inprocess_recovery(bench.read_events(d))
        self.assertAlmostEqual(r["group"], 0.4)
        self.assertAlmostEqual(r["again"], 0.6)
        self.assertAlmostEqual(r["r_exec"], 0.3)
        self.assertAlmostEqual(r["r_imported"], 1.5)
        self.assertAlmostEqual(r["r_group"], 2.0)
        self.assertAlmostEqual(r["r_step"], 2.2)
        self.assertEqual(r["lost"], 0)

    def test_in_process_a_survivor_that_never_went_on_is_an_error(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, 0, ["exec 100.0 11", "step 109.9 11 60"])
            write(d, 3, ["exec 100.0 13", "kill 110.0 13 60", "exec 110.3 23",
                         "imported 111.5 23", "group 112.0 23 70", "step 112.2 23 71"])
            with self.assertRaisesRegex(RuntimeError, "never went on into a new epoch"):
                bench.inprocess_recovery(bench.read_events(d))

    def test_steps_per_second_from_step_50(self):
        with tempfile.TemporaryDirectory() as d:
            write(d, 0, ["exec 1.0 11"] + [f"step {10 + s * 0.1:.1f} 11 {s}" for s in range(1, 101)])
            self.assertAlmostEqual(bench.steps_per_second(bench.read_events(d)), 10.0, places=3)


if __name__ == "__main__":
    unittest.main()
