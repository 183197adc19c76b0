"""Daemons as servers run them: a fork child that never allocates can be
snapshotted, a relative output pattern survives the daemon's chdir("/"),
a child that forks only to exec leaves no log, and a process that cannot
record says so where the user looks (its stderr, and `heapsnap snapshot`).
Also: a marker's own buffer is not in the address space it describes."""

import json
import os
import signal
import subprocess
import time

from harness import PRELOAD, HeapsnapTest, main, program


class IdleDaemonTest(HeapsnapTest):
    def start(self, output, *args):
        """Starts idle_daemon under plain LD_PRELOAD with HEAPSNAP_OUTPUT
        as given (no launcher, which would make it absolute); returns the
        daemon's pid and its exec-only child's, once the daemon is idle."""
        pidfile = self.path("daemon.pid")
        env = dict(os.environ, LD_PRELOAD=PRELOAD, HEAPSNAP_OUTPUT=output)
        # Files, not pipes: the daemon keeps its stdio open while it waits.
        with open(self.path("stdout"), "w") as out, open(self.path("stderr"), "w") as err:
            started = subprocess.run([program("idle_daemon"), pidfile, *args], cwd=self.tmp, env=env, stdout=out,
                                     stderr=err, timeout=60)
        self.assertEqual(started.returncode, 0, open(self.path("stderr")).read())
        deadline = time.monotonic() + 30
        while not (os.path.exists(pidfile) and open(pidfile).read().endswith("\n")):
            self.assertLess(time.monotonic(), deadline, "the daemon never wrote its pid file")
            time.sleep(0.02)
        daemon, child = (int(v) for v in open(pidfile).read().split())
        self.addCleanup(self.stop, daemon)
        return daemon, child, open(self.path("stderr")).read()

    def stop(self, pid):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    def test_idle_daemon_is_snapshotted_and_logs_where_started(self):
        daemon, child, started = self.start("%e.%p.hslog")
        self.assertEqual(started, "")
        log = self.path("idle_daemon.%d.hslog" % daemon)
        self.assertTrue(os.path.isfile(log), sorted(os.listdir(self.tmp)))
        self.assertFalse(os.path.exists("/idle_daemon.%d.hslog" % daemon))
        # The exec-only child: no log of its own before the exec, one for
        # the program it became.
        self.assertFalse(os.path.exists(self.path("idle_daemon.%d.hslog" % child)))
        self.assertTrue(os.path.isfile(self.path("true.%d.hslog" % child)), sorted(os.listdir(self.tmp)))

        # It never allocates after the fork, yet answers at once.
        snap = self.snapshot(str(daemon), "-o", self.path("idle.hsnap"), "--timeout", "10")
        moment = self.json_of("markers", log, "--format", "json")
        self.assertEqual([(m["label"], m["live_bytes"], m["live_blocks"]) for m in moment["markers"]],
                         [("snapshot", 0, 0)])
        ps = self.json_of("ps", "--format", "json")
        mine = [p for p in ps if p["pid"] == daemon]
        self.assertEqual(len(mine), 1, ps)
        self.assertEqual(mine[0]["log"], log)

        # The marker's own 8 MiB buffer is not in the regions it captured:
        # the snapshot's busy size is /proc's, not 8 MiB above it.
        recorded = self.json_of("maps", snap, "--format", "json")
        live = self.json_of("maps", str(daemon), "--format", "json")
        self.assertLess(abs(recorded["busy_bytes"] - live["busy_bytes"]), 1 << 20,
                        (recorded["busy_bytes"], live["busy_bytes"]))

    def test_cannot_record_says_why(self):
        # The process started records; its daemon cannot create its log
        # (the directory was renamed away), says so on the stderr it still
        # has, and heapsnap snapshot says that it is not recording.
        os.mkdir(self.path("out"))
        daemon, _, started = self.start(self.path("out/%e.%p.hslog"), self.path("out"),
                                        self.path("moved"))
        # /bin/true, exec'd by the daemon's child, cannot either.
        lines = started.splitlines()
        self.assertIn("heapsnap: cannot create log %s/out/idle_daemon.%d.hslog: No such file or directory; "
                      "recording disabled" % (self.tmp, daemon), lines)
        self.assertEqual(len(lines), 2, started)
        lines.remove("heapsnap: cannot create log %s/out/idle_daemon.%d.hslog: No such file or directory; "
                     "recording disabled" % (self.tmp, daemon))
        self.assertRegex(lines[0], r"^heapsnap: cannot create log %s/out/true\.\d+\.hslog: No such file or "
                                   r"directory; recording disabled$" % self.tmp)
        logs = [f for f in os.listdir(self.path("moved")) if f.endswith(".hslog")]
        self.assertEqual(len(logs), 1, logs)
        self.assert_error(["snapshot", str(daemon), "--timeout", "5"],
                          "heapsnap: error: process %d has the heapsnap recorder loaded but is not recording (it "
                          "could not create its log, or its recording ended): its stderr and the system log say "
                          "why (journalctl -t heapsnap)\n" % daemon)

    def test_unrecorded_process(self):
        sleeper = subprocess.Popen(["sleep", "60"], cwd=self.tmp)
        self.addCleanup(sleeper.wait)
        self.addCleanup(sleeper.kill)
        self.assert_error(["snapshot", str(sleeper.pid), "--timeout", "5"],
                          "heapsnap: error: process %d is not recorded by heapsnap (no control socket; start it "
                          "with 'heapsnap run')\n" % sleeper.pid)


if __name__ == "__main__":
    main()
