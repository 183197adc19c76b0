"""heapsnap attach and detach (docs/design/attach.md): a program
started without heapsnap is recorded from the moment of attach, exactly as
under `heapsnap run`, and detach ends the log while the program runs on
unchanged. Every refusal has its line and its exit status.

tests/programs/attach_target.c is the program; its sites are exact.
"""

import os
import pwd
import re
import shutil
import subprocess
import tempfile
import threading
import time

from harness import HEAPSNAP, PROGRAMS_DIR, TIMEOUT, HeapsnapTest, main, program

ATTACHED = re.compile(r"^heapsnap: attached in \d+\.\d ms$")


class Bare:
    """tests/programs/attach_target started without heapsnap."""

    def __init__(self, test, argv=None):
        self.test = test
        self.proc = subprocess.Popen(argv or [program("attach_target")], cwd=test.tmp, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        test.addCleanup(self.kill)
        ready = self.proc.stdout.readline().strip()
        m = re.match(r"ready pid=(\d+)$", ready)
        test.assertTrue(m, "the program said %r" % ready)
        self.pid = int(m.group(1))
        self.said = [ready]

    def send(self, command, answer):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().rstrip("\n")
        self.said.append(line)
        self.test.assertEqual(line, answer, "answer to %r" % command)

    def finish(self):
        out, err = self.proc.communicate("quit\n", timeout=TIMEOUT)
        self.said += out.splitlines()
        return self.proc.returncode, err

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class AttachTest(HeapsnapTest):
    def attach(self, pid, *options):
        """`heapsnap attach PID`: its two lines; returns the log."""
        result = self.heapsnap("attach", str(pid), *options)
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 2, result.stderr)
        m = re.match(r"^heapsnap: log: (/.*)$", lines[0])
        self.assertTrue(m, result.stderr)
        self.assertRegex(lines[1], ATTACHED)
        self.assertEqual(result.stdout, "")
        return m.group(1)

    def detach(self, pid, log):
        result = self.heapsnap("detach", str(pid))
        self.assertEqual(result.stderr, "heapsnap: log: %s\n" % log)
        self.assertEqual(result.stdout, "")

    def labels(self, log):
        data = self.markers(log)
        return [(m["label"], m["cause"]) for m in data["markers"]], data

    def grow_between_snapshots(self, bare):
        """Snapshots A and B of an attached attach_target around `grow`;
        asserts the exact growth of its two sites; returns the diff."""
        a = self.snapshot(str(bare.pid), "--label", "A", "-o", self.path("a.hsnap"))
        bare.send("grow", "grown")
        b = self.snapshot(str(bare.pid), "--label", "B", "-o", self.path("b.hsnap"))
        diff = self.diff(a, b)
        self.assert_site(diff, "attach_grow", "attach_target.c", "attach_grow", 13500, 9, old_bytes=0)
        self.assert_site(diff, "attach_calloc", "attach_target.c", "attach_calloc", 3000, 3, old_bytes=0)
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), (16500, 12))
        return diff

    def test_growth_after_attach(self):
        bare = Bare(self)
        log = self.attach(bare.pid, "-o", self.path("t.%p.hslog"))
        self.assertEqual(log, self.path("t.%d.hslog" % bare.pid))
        self.assertIn(bare.pid, [row["pid"] for row in self.json_of("ps", "--format", "json")])
        diff = self.grow_between_snapshots(bare)
        self.assert_no_recorder_frames(diff)
        self.detach(bare.pid, log)
        self.assertNotIn(bare.pid, [row["pid"] for row in self.json_of("ps", "--format", "json")])
        labels, data = self.labels(log)
        self.assertEqual(labels, [("A", "request"), ("B", "request"), ("detach", "exit")])
        self.assertTrue(data["complete"])
        # The default moment of a log is its exit-like marker: detach.
        report = self.json_of("report", log, "--format", "json")
        self.assertEqual((report["totals"]["live_bytes"], report["totals"]["live_blocks"]), (16500, 12))
        # Nothing more is recorded; the program goes on as before.
        bare.send("grow", "grown")
        status, err = bare.finish()
        self.assertEqual((status, err), (3, ""))
        self.assertEqual(bare.said, ["ready pid=%d" % bare.pid, "grown", "grown", "bye"])
        self.assertEqual(self.labels(log)[0], labels)

    def test_frees_of_blocks_allocated_before_attach(self):
        """The seven 100-byte blocks live before attach are freed after it:
        counted apart, with the usable size the program itself measured
        (104 each on glibc x86-64), in dump, report, diff (text, JSON,
        CSV); the reconciliation shows what recording does not cover."""
        bare = Bare(self)
        log = self.attach(bare.pid, "-o", self.path("before.hslog"))
        a = self.snapshot(str(bare.pid), "--label", "A", "-o", self.path("a.hsnap"))
        bare.send("free-before", "freed 7 usable 728")
        b = self.snapshot(str(bare.pid), "--label", "B", "-o", self.path("b.hsnap"))
        dump = self.heapsnap("dump", log).stdout.splitlines()
        self.assertTrue(dump[0].startswith("process ") and dump[0].endswith(" attached=1"), dump[0])
        frees = [line for line in dump if line.startswith("free ") and "untracked=1" in line]
        self.assertEqual([line.split()[-1] for line in frees], ["usable=104"] * 7)

        diff = self.diff(a, b)
        self.assertEqual(diff["freed_before_recording"],
                         {"blocks_delta": 7, "bytes_delta": 728, "old_blocks": 0, "new_blocks": 7, "old_bytes": 0,
                          "new_bytes": 728})
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), (0, 0))
        self.assertEqual((diff["old"]["attached"], diff["new"]["attached"]), (True, True))
        text = self.heapsnap("diff", a, b).stdout
        self.assertIn("\n  freed, allocated before recording: +7 blocks, +728 bytes (usable sizes)\n", text)
        csv = self.heapsnap("diff", a, b, "--format", "csv").stdout.splitlines()
        self.assertEqual(csv[-1], '728,7,0,728,0,7,freed_before_recording,"freed, allocated before recording",')

        report = self.json_of("report", b, "--format", "json")
        self.assertEqual(report["totals"]["freed_before_recording"], {"blocks": 7, "bytes": 728})
        self.assertEqual(report["totals"]["untracked_frees"], 0)
        self.assertIn("\n  freed, allocated before recording  7 blocks, 728 bytes (usable sizes)\n",
                      self.heapsnap("report", b).stdout)

        # In use per mallinfo2 minus tracked live: what was allocated before
        # attach and is still live, and malloc's overhead.
        for snap in (a, b):
            space = self.json_of("maps", snap, "--format", "json")
            self.assertTrue(space["attached"])
            self.assertEqual(space["not_covered_bytes"], space["malloc_in_use_bytes"] - space["tracked_live_bytes"])
            self.assertGreater(space["not_covered_bytes"], 0)
            self.assertRegex(self.heapsnap("maps", snap).stdout, r"\n +not covered by recording +[-+]?[\d.]+ \w*B "
                                                                 r"\(in use - tracked live: blocks from before attach")
        self.detach(bare.pid, log)
        self.assertEqual(bare.finish(), (3, ""))

    def test_executable_with_canonical_plt_entries(self):
        """A non-PIE executable that keeps malloc's and free's addresses, as
        Debian's python3 does, exports them as undefined symbols whose value
        is its own PLT entry; dlsym answers with that entry, which jumps
        through the slot attach rewrites to the hook. The hooks must reach
        libc's functions: the program allocates, is recorded exactly, and
        goes on after detach."""
        exe = program("attach_target_nopie")
        symbols = self.run_cmd(["readelf", "--dyn-syms", "-W", exe], expect=0).stdout
        for name in ("malloc", "free"):
            self.assertRegex(symbols, r"\n\s*\d+: 0*[1-9a-f][0-9a-f]* +0 FUNC +GLOBAL DEFAULT +UND %s@" % name)
        bare = Bare(self, [exe])
        log = self.attach(bare.pid, "-o", self.path("nopie.hslog"))
        diff = self.grow_between_snapshots(bare)
        self.detach(bare.pid, log)
        bare.send("grow", "grown")
        self.assertEqual(bare.finish(), (3, ""))
        self.assertEqual(bare.said, ["ready pid=%d" % bare.pid, "grown", "grown", "bye"])

    def test_process_without_executable_memory(self):
        """Where the process may not map anonymous executable memory (SELinux
        without execmem; here a seccomp filter), the recorder is loaded and
        started in the stopped thread itself, and records the same."""
        bare = Bare(self, [program("no_execmem"), program("attach_target")])
        log = self.attach(bare.pid, "-o", self.path("noexec.hslog"))
        self.grow_between_snapshots(bare)
        self.detach(bare.pid, log)
        self.assertEqual(bare.finish(), (3, ""))

    def test_attach_while_eight_threads_allocate(self):
        bare = Bare(self)
        bare.send("threads 8", "started 8")
        log = self.attach(bare.pid, "-o", self.path("busy.hslog"))
        s = self.snapshot(str(bare.pid), "--label", "busy", "-o", self.path("busy.hsnap"))
        self.assertTrue(os.path.isfile(s))
        bare.send("stop", "stopped 1")
        self.detach(bare.pid, log)
        labels, data = self.labels(log)
        self.assertEqual(labels, [("busy", "request"), ("detach", "exit")])
        self.assertTrue(data["complete"])
        # Every thread's churn was recorded: its site holds at most the
        # eight blocks per thread it keeps.
        report = self.json_of("report", log + "@busy", "--format", "json")
        self.assertGreater(data["markers"][0]["events"], 0)
        self.assertEqual(bare.finish(), (3, ""))
        self.assertEqual(bare.said[-2:], ["stopped 1", "bye"])
        self.assertIsNotNone(report)

    def test_hundred_attach_detach_cycles(self):
        bare = Bare(self)
        logs = []
        for i in range(100):
            logs.append(self.attach(bare.pid, "-o", self.path("cycle.hslog")))
            self.detach(bare.pid, logs[-1])
        self.assertEqual(len(set(logs)), 100)
        self.assertEqual(logs[0], self.path("cycle.hslog"))
        self.assertEqual(logs[1], self.path("cycle-1.hslog"))
        for log in (logs[0], logs[50], logs[99]):
            labels, data = self.labels(log)
            self.assertEqual(labels, [("detach", "exit")])
            self.assertTrue(data["complete"])
        # The process is as it was: one thread, no descriptor of heapsnap's.
        self.assertEqual(os.listdir("/proc/%d/task" % bare.pid), [str(bare.pid)])
        fds = {os.readlink("/proc/%d/fd/%s" % (bare.pid, fd)) for fd in os.listdir("/proc/%d/fd" % bare.pid)}
        self.assertFalse([fd for fd in fds if "hslog" in fd or "socket" in fd], fds)
        bare.send("grow", "grown")
        self.assertEqual(bare.finish(), (3, ""))
        self.assertEqual(bare.said, ["ready pid=%d" % bare.pid, "grown", "bye"])

    def test_arena_locked_by_a_blocked_thread(self):
        """The only thread heapsnap may use is the main thread, and another
        thread holds the main arena's lock for as long as the test wants
        (malloc_stats writing to a full pipe). Starting the loader thread
        would make the main thread wait for that lock; each try is let go
        instead, and after 5 s attach gives up, leaving nothing behind.
        Once the lock is free, attach goes through."""
        bare = Bare(self)
        bare.send("hold-arena", "holding")
        # Until the holder sleeps in write(2, ...) inside malloc_stats.
        deadline = time.monotonic() + TIMEOUT
        holder = None
        while holder is None and time.monotonic() < deadline:
            for tid in os.listdir("/proc/%d/task" % bare.pid):
                with open("/proc/%d/task/%s/syscall" % (bare.pid, tid)) as f:
                    if f.read().startswith("1 0x2 "):
                        holder = int(tid)
            time.sleep(0.01)
        self.assertIsNotNone(holder)
        with open("/proc/%d/maps" % bare.pid) as f:
            maps = f.read()
        result = self.heapsnap("attach", str(bare.pid), "-o", self.path("held.hslog"), expect=1)
        self.assertRegex(result.stderr, r"^heapsnap: error: process %d: no thread could load the recorder safely "
                                        r"within 5 s \(thread %d: another thread holds the lock of its malloc "
                                        r"arena; thread %d: it is in libc's [^;]+\)\n$" % (bare.pid, bare.pid, holder))
        self.assertEqual(result.stdout, "")
        with open("/proc/%d/maps" % bare.pid) as f:
            self.assertEqual(f.read(), maps)  # the loader's region is gone
        self.assertFalse(os.path.exists(self.path("held.hslog")))
        bare.send("ping", "unknown command")  # the main thread runs on
        # Reading the pipe lets malloc_stats finish and free the lock.
        drained = threading.Thread(target=bare.proc.stderr.read, daemon=True)
        drained.start()
        bare.send("join-arena", "joined")
        log = self.attach(bare.pid, "-o", self.path("free.hslog"))
        self.grow_between_snapshots(bare)
        self.detach(bare.pid, log)
        bare.proc.stdin.write("quit\n")
        bare.proc.stdin.close()
        self.assertEqual(bare.proc.wait(timeout=TIMEOUT), 3)
        self.assertEqual(bare.proc.stdout.read(), "bye\n")

    def test_owner_attach_leaves_scheduling_as_it_was(self):
        """An unprivileged owner attaches: the thread heapsnap borrowed gets
        its own scheduler settings back (slice, no reset-on-fork flag, which
        only a privileged caller could clear again), and so do the threads
        started from it (the loader, then the recorder's writer)."""
        if os.geteuid() != 0:
            self.skipTest("needs root to run the program and heapsnap as another user")
        nobody = pwd.getpwnam("nobody")
        as_nobody = ["setpriv", "--reuid=%d" % nobody.pw_uid, "--regid=%d" % nobody.pw_gid, "--clear-groups"]
        home = tempfile.mkdtemp(prefix="heapsnap-nobody-")  # the test's own directory is root's, 0700
        self.addCleanup(shutil.rmtree, home, True)
        os.chown(home, nobody.pw_uid, nobody.pw_gid)

        def scheduling(pid):
            """Each thread's policy (with its flags) and slice."""
            out = {}
            for tid in sorted(os.listdir("/proc/%d/task" % pid)):
                with open("/proc/%d/task/%s/sched" % (pid, tid)) as f:
                    slice_ns = re.search(r"^se\.slice\s*:\s*(\d+)$", f.read(), re.M).group(1)
                out[int(tid)] = (os.sched_getscheduler(int(tid)), int(slice_ns))
            return out

        bare = Bare(self, as_nobody + [program("attach_target")])
        before = scheduling(bare.pid)
        self.assertEqual(list(before), [bare.pid])
        env = dict(os.environ, XDG_RUNTIME_DIR=home, HOME=home)
        result = self.run_cmd(as_nobody + [HEAPSNAP, "attach", str(bare.pid), "-o", os.path.join(home, "t.hslog")],
                              env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRegex(result.stderr.splitlines()[1], ATTACHED)
        # The program's thread, the writer, and the loader if it has not
        # ended yet.
        after = scheduling(bare.pid)
        self.assertGreaterEqual(len(after), 2, after)
        self.assertEqual(set(after.values()), set(before.values()))
        result = self.run_cmd(as_nobody + [HEAPSNAP, "detach", str(bare.pid)], env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        # The writer (and the loader) may not have ended yet.
        after = scheduling(bare.pid)
        self.assertEqual(after[bare.pid], before[bare.pid])
        self.assertEqual(set(after.values()), set(before.values()))
        self.assertEqual(bare.finish(), (3, ""))

    # ---- refusals ------------------------------------------------------------

    def test_no_such_process(self):
        gone = subprocess.Popen(["true"])
        gone.wait()
        self.assert_error(["attach", str(gone.pid)], "no process with PID %d" % gone.pid, status=4)
        self.assert_error(["detach", str(gone.pid)], "no process with PID %d" % gone.pid, status=4)

    def test_another_users_process(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run heapsnap as another user")
        bare = Bare(self)
        nobody = pwd.getpwnam("nobody")
        result = self.run_cmd(["setpriv", "--reuid=%d" % nobody.pw_uid, "--regid=%d" % nobody.pw_gid,
                               "--clear-groups", HEAPSNAP, "attach", str(bare.pid)])
        self.assertEqual(result.returncode, 5, result.stderr)
        self.assertEqual(result.stderr, "heapsnap: error: process %d belongs to another user (uid 0); only root "
                                        "and that user may attach to it\n" % bare.pid)

    def test_statically_linked(self):
        static = os.path.join(PROGRAMS_DIR, "static_idle")
        if not os.path.exists(static):
            self.skipTest("the toolchain cannot link -static (no libc.a)")
        bare = Bare(self, [static])
        self.assert_error(["attach", str(bare.pid)], "process %d (%s) is statically linked" % (bare.pid, static),
                          status=6)

    def test_already_recorded(self):
        proc = subprocess.Popen([HEAPSNAP, "run", "-o", self.path("run.hslog"), "--", program("attach_target")],
                                cwd=self.tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        self.addCleanup(proc.kill)
        pid = int(proc.stdout.readline().split("=")[1])
        self.assert_error(["attach", str(pid)], "process %d is already recorded into %s" % (pid, self.path("run.hslog")),
                          status=8)
        self.assert_error(["detach", str(pid)], "process %d: the recorder was not attached" % pid)
        proc.communicate("quit\n", timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 3)

    def test_attached_twice(self):
        bare = Bare(self)
        log = self.attach(bare.pid, "-o", self.path("twice.hslog"))
        self.assert_error(["attach", str(bare.pid)], "process %d is already recorded into %s" % (bare.pid, log),
                          status=8)
        self.detach(bare.pid, log)
        self.assert_error(["detach", str(bare.pid)], "process %d is not recorded by heapsnap" % bare.pid, status=9)
        self.assertEqual(bare.finish(), (3, ""))

    def test_ptrace_forbidden_by_seccomp(self):
        bare = Bare(self)
        # LeakSanitizer stops the world with ptrace at exit, which the
        # filter forbids too (tools/test --sanitize): leak checks off here.
        asan = ":".join(filter(None, [os.environ.get("ASAN_OPTIONS"), "detect_leaks=0"]))
        result = self.run_cmd([program("no_ptrace"), HEAPSNAP, "attach", str(bare.pid)], env={"ASAN_OPTIONS": asan})
        self.assertEqual(result.returncode, 7, result.stderr)
        self.assertEqual(result.stderr, "heapsnap: error: cannot trace process %d: a seccomp filter on heapsnap "
                                        "forbids ptrace (Seccomp: 2 in /proc/self/status); run it outside the filter "
                                        "(a container: --security-opt seccomp=unconfined)\n" % bare.pid)
        self.assertEqual(bare.finish(), (3, ""))


if __name__ == "__main__":
    main()
