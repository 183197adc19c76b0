"""Hostile programs against the recorder's promise that the traced program
never notices it (the oracle suite's second half; test_oracle.py compares
real programs with valgrind):

- the exit marker comes after every free the process makes on its way out
  (exit_frees: exit handlers of every kind, a thread-local destructor, a
  shared library's destructor);
- the recorder's descriptors take no number the program would get, survive
  closefrom and dup2 onto their numbers under a low RLIMIT_NOFILE, and none
  of its bytes reach the program's files (fd_closefrom, fd_dup2); one lost
  to a system call no hook sees ends recording with one message, and the
  writer does not spin;
- under --no-follow the program and its children see the environment they
  would see bare (bash, whose unsetenv is its own).
"""

import os
import resource
import shutil
import subprocess
import unittest

from harness import HEAPSNAP, PROGRAMS_DIR, HeapsnapTest, main

VALGRIND = shutil.which("valgrind.bin")


def nofile(limit):
    return lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))


class QuietTest(HeapsnapTest):
    def run_program(self, argv, record, preexec=None, env=None, options=("--no-follow",)):
        """Runs argv bare or under `heapsnap run`; returns (result, log)."""
        log = self.path("run-%d.hslog" % len(os.listdir(self.tmp)))
        if record:
            argv = [HEAPSNAP, "run", *options, "-o", log, "--"] + argv
        result = subprocess.run(argv, cwd=self.tmp, capture_output=True, env=env, preexec_fn=preexec,
                                timeout=300)
        return result, log

    def exit_marker(self, log):
        markers = self.markers(log)
        self.assertTrue(markers["complete"])
        (marker,) = [m for m in markers["markers"] if m["label"] == "exit"]
        return marker["live_bytes"], marker["live_blocks"]

    # ---- 1. the last free counts ---------------------------------------------

    def test_exit_frees(self):
        result, log = self.run_program([os.path.join(PROGRAMS_DIR, "oracle_exit_frees")], True)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(self.exit_marker(log), (0, 0))
        events = self.heapsnap("dump", log).stdout.splitlines()
        allocs = sorted(int(line.split(" size=")[1].split()[0]) for line in events if line.startswith("alloc "))
        # 32: glibc's entry for the thread-local destructor.
        self.assertEqual(allocs, [32, 111, 222, 333, 444, 1000])
        self.assertEqual(sum(line.startswith("free ") for line in events), 6)

    @unittest.skipUnless(VALGRIND, "valgrind is not installed")
    def test_exit_frees_valgrind_agrees(self):
        report = self.path("valgrind.txt")
        subprocess.run([VALGRIND, "--run-libc-freeres=no", "--run-cxx-freeres=no", "--log-file=" + report,
                        os.path.join(PROGRAMS_DIR, "oracle_exit_frees")], check=True, timeout=300)
        with open(report) as f:
            text = f.read()
        self.assertIn("in use at exit: 0 bytes in 0 blocks", text)
        self.assertIn("total heap usage: 6 allocs, 6 frees, 2,142 bytes allocated", text)

    # ---- 2. descriptors the program can't touch or see -----------------------

    def closefrom_run(self, mode, record, limit):
        files = self.path("files-%s-%d-%d" % (mode, record, limit[0]))
        os.makedirs(files)
        result, log = self.run_program([os.path.join(PROGRAMS_DIR, "oracle_fd_closefrom"), mode, files], record,
                                       preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit))
        for i in range(1000):
            with open(os.path.join(files, "f%d" % i), "rb") as f:
                self.assertEqual(f.read(), b"file %d\n" % i, "f%d holds more than the program wrote" % i)
        lines = result.stderr.decode().splitlines()
        idle = [int(line.split()[1]) for line in lines if line.startswith("idle_ms ")]
        result.stderr = [line for line in lines if not line.startswith("idle_ms ")]
        return result, log, idle[0] / 1000 if idle else None

    def test_closefrom_then_1000_opens(self):
        # Soft limit below the hard one (the recorder's descriptors above
        # it), and equal (they sit at the top of the range).
        for limit in ((1024, 4096), (1100, 1100)):
            bare, _, _ = self.closefrom_run("closefrom", False, limit)
            recorded, log, _ = self.closefrom_run("closefrom", True, limit)
            self.assertEqual(bare.returncode, 0, bare.stderr)
            self.assertEqual(recorded.stdout, bare.stdout)
            self.assertEqual(recorded.stdout, b"first 3 last 1002\n")
            self.assertEqual(self.exit_marker(log), (2331 + 4096, 3 + 1))  # and stdout's buffer

    def test_raw_close_range_stops_recording_once(self):
        recorded, log, cpu = self.closefrom_run("raw", True, (1024, 4096))
        self.assertEqual(recorded.returncode, 0)
        self.assertEqual(recorded.stdout, b"first 3 last 1002\n")
        messages = [line for line in recorded.stderr if not line.startswith("heapsnap: log:")]
        self.assertEqual(len(messages), 1, messages)
        self.assertIn("recording stopped", messages[0])
        self.assertLess(cpu, 0.2, "the process used %.2f CPU-s while it slept 1 s" % cpu)

    def dup2_run(self, record, limit):
        target = self.path("dup2-%d-%d.txt" % (record, limit))
        result, log = self.run_program([os.path.join(PROGRAMS_DIR, "oracle_fd_dup2"), target], record,
                                       preexec=nofile(limit))
        self.assertEqual(result.returncode, 0, result.stderr)
        with open(target, "rb") as f:
            return f.read(), log

    def test_dup2_onto_low_and_top_descriptors(self):
        # soft = hard (`ulimit -n 64`): the recorder's descriptors sit at the
        # top of the range, where the program puts its file too.
        for limit in (64, 256):
            bare, _ = self.dup2_run(False, limit)
            recorded, log = self.dup2_run(True, limit)
            self.assertEqual(recorded, bare)
            self.assertEqual(bare.count(b"\n"), 13)
            self.assertEqual(self.exit_marker(log), (1234, 1))

    def test_first_open_as_bare(self):
        argv = ["/usr/bin/python3", "-c", "import os; print(os.open('/dev/null', os.O_RDONLY), os.pipe())"]
        bare, _ = self.run_program(argv, False)
        recorded, log = self.run_program(argv, True)
        self.assertEqual(recorded.stdout, bare.stdout)
        self.assertEqual(bare.stdout, b"3 (4, 5)\n")
        self.exit_marker(log)

    # ---- 3. the environment ----------------------------------------------------

    def test_bash_children_see_the_bare_environment(self):
        env = {"PATH": "/usr/bin:/bin", "HOME": self.tmp, "LC_ALL": "C", "KEEP": "1"}
        argv = ["/bin/bash", "-c", "env; true"]
        bare, _ = self.run_program(argv, False, env=env)
        recorded, log = self.run_program(argv, True, env=env)
        self.assertEqual(recorded.stdout, bare.stdout)
        self.assertNotIn(b"HEAPSNAP", recorded.stdout)
        self.assertNotIn(b"LD_PRELOAD", recorded.stdout)
        self.exit_marker(log)


if __name__ == "__main__":
    main()
