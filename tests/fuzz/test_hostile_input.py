"""Hand-made bad input (tests/fuzz/hostile_inputs.cpp writes it) through
the real CLI: every command that reads the file fails with exit status 1
and one line 'heapsnap: error: ...' saying what is wrong, or, where the
input is odd but legal, succeeds with a warning. Never a crash, a hang or
an unbounded allocation: each command runs under a 2 GiB address-space
limit (under AddressSanitizer: a 2 GiB allocation limit) and a timeout.

The same kinds of input, mutated at random, are what tools/fuzz feeds the
decoders (tests/fuzz/fuzz_*.cpp); the inputs it once found are replayed by
the fuzz-corpus-* tests.
"""

import json
import os
import re
import resource
import socket
import stat
import subprocess
import tempfile
import threading
import time

from harness import HEAPSNAP, HeapsnapTest, main, program

HOSTILE_INPUTS = os.environ.get("HOSTILE_INPUTS", "")
MEMORY_LIMIT = 2 << 30
TIMEOUT = 60

# Log files and the error each reader gives. Cut-* files end one byte early
# inside a record of that kind, in a frame whose checksum is right.
LOG_ERRORS = {
    "empty.hslog": "not a heapsnap log (bad magic)",
    "bad-magic.hslog": "not a heapsnap log (bad magic)",
    "short-header.hslog": "truncated heapsnap log: the header is incomplete",
    "newer-version.hslog": "unsupported log format version 11 (this heapsnap reads versions 6 to 10)",
    "version-max.hslog": "unsupported log format version 4294967295",
    "header-only.hslog": "truncated heapsnap log: no complete frame",
    "unknown-tag.hslog": "corrupt log: unknown record tag 117",
    "no-process-first.hslog": "corrupt log: no process record first",
    "second-process.hslog": "corrupt log: a second process record",
    "huge-frame-count.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "huge-region-count.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "huge-string.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "huge-stack-id.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "undefined-stack.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "alloc-at-null.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "free-of-unknown-block.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "free-twice.hslog": "corrupt log: truncated or malformed record in the frame at byte 16",
    "frame-huge-size.hslog": "corrupt log: bad frame header at byte",
    "frame-no-size.hslog": "corrupt log: bad frame header at byte",
}
RECORD_KINDS = ["process", "module", "stack", "thread", "thread-start", "marker", "alloc", "free", "mmap", "munmap",
                "thread-exit", "module-unload", "exit-marker", "end"]
for kind in RECORD_KINDS:
    LOG_ERRORS["cut-%s.hslog" % kind] = "corrupt log: truncated or malformed record in the frame at byte 16"

SNAPSHOT_ERRORS = {
    "empty.hsnap": "not a heapsnap snapshot (bad magic)",
    "bad-magic.hsnap": "not a heapsnap snapshot (bad magic)",
    "short-header.hsnap": "truncated snapshot: the header is incomplete",
    "newer-version.hsnap": "unsupported snapshot format version 7 (this heapsnap reads versions 3 to 6)",
    "cut-frame.hsnap": "truncated snapshot",
    "huge-body-size.hsnap": "corrupt snapshot: bad body size",
    "trailing-bytes.hsnap": "corrupt snapshot: trailing bytes after the body",
    "bad-checksum.hsnap": "corrupt snapshot: body does not decompress",
    "cut-body.hsnap": "corrupt snapshot: malformed body",
    "body-trailing.hsnap": "corrupt snapshot: malformed body",
    "huge-module-count.hsnap": "corrupt snapshot: malformed body",
    "huge-region-count.hsnap": "corrupt snapshot: malformed body",
    "entry-unknown-stack.hsnap": "corrupt snapshot: entry names unknown stack 77",
    "entry-bad-kind.hsnap": "corrupt snapshot: malformed body",
}


# An AddressSanitizer build reserves terabytes of shadow memory, so its
# limit is ASAN_OPTIONS=max_allocation_size_mb (tools/test --sanitize).
SANITIZED = os.environ.get("HEAPSNAP_SANITIZE", "none") not in ("", "none")


def limited():
    if not SANITIZED:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class HostileCase(HeapsnapTest):
    """The inputs hostile_inputs writes, once per class, and ways to run
    heapsnap on them."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.inputs = tempfile.mkdtemp(prefix="heapsnap-hostile-")
        # alloc_pattern: a real ELF with a build-id, for the build-id cases.
        subprocess.run([HOSTILE_INPUTS, cls.inputs, program("alloc_pattern")], check=True)

    @classmethod
    def tearDownClass(cls):
        if not os.environ.get("HEAPSNAP_KEEP_TMP"):
            subprocess.run(["rm", "-rf", cls.inputs])

    def input(self, name):
        return os.path.join(self.inputs, name)

    def run_limited(self, args):
        """heapsnap ARGS with 2 GiB of address space and a timeout."""
        try:
            return subprocess.run([HEAPSNAP] + args, cwd=self.tmp, capture_output=True, text=True,
                                  errors="replace", timeout=TIMEOUT, preexec_fn=limited)
        except subprocess.TimeoutExpired:
            self.fail("heapsnap %s hung (more than %d s)" % (" ".join(args), TIMEOUT))

    def assert_fails(self, args, needle, streams=False):
        r = self.run_limited(args)
        what = "heapsnap %s" % " ".join(args)
        self.assertEqual(r.returncode, 1, "%s: status %d\nstderr: %s" % (what, r.returncode, r.stderr))
        if not streams:
            self.assertEqual(r.stdout, "", what)
        lines = r.stderr.strip("\n").splitlines()
        self.assertEqual(len(lines), 1, "%s: expected one error line:\n%s" % (what, r.stderr))
        self.assertTrue(lines[0].startswith("heapsnap: error: "), "%s: %s" % (what, r.stderr))
        self.assertIn(needle, lines[0], what)

    def assert_succeeds(self, args):
        r = self.run_limited(args)
        self.assertEqual(r.returncode, 0, "heapsnap %s: status %d\nstderr: %s" % (" ".join(args), r.returncode,
                                                                                   r.stderr))
        self.assertNotIn("error", r.stderr)
        return r



class HostileInputTest(HostileCase):
    # ---- logs -----------------------------------------------------------------

    def test_every_reader_rejects_bad_logs(self):
        out = self.path("x.hsnap")
        for name, needle in sorted(LOG_ERRORS.items()):
            path = self.input(name)
            with self.subTest(log=name):
                # Whatever reads the whole log meets the defect.
                self.assert_fails(["markers", path], needle)
                self.assert_fails(["markers", path, "--format", "json"], needle)
                self.assert_fails(["snapshot", path, "--at", "end", "-o", out], needle)
                self.assert_fails(["snapshot", path, "--at", "peak", "-o", out], needle)
                self.assert_fails(["dump", path], needle, streams=True)
                self.assertFalse(os.path.exists(out), "a failed snapshot left a file")
                # A moment before the defect (only the End record lies past
                # the exit marker) reads fine: the reader stops there.
                if name == "cut-end.hslog":
                    self.assert_succeeds(["snapshot", path, "--at", "exit", "-o", out])
                    self.assert_succeeds(["diff", path + "@1", path + "@exit"])
                    os.unlink(out)
                    continue
                self.assert_fails(["snapshot", path, "--at", "exit", "-o", out], needle)
                self.assert_fails(["diff", path + "@1", path + "@exit"], needle)
                self.assert_fails(["report", path + "@exit"], needle)
                self.assertFalse(os.path.exists(out), "a failed snapshot left a file")

    def test_good_log_reads(self):
        """The cases above are one defect away from this well-formed log."""
        good = self.input("good.hslog")
        markers = self.markers(good)
        self.assertTrue(markers["complete"])
        self.assertEqual([(m["label"], m["live_bytes"], m["live_blocks"]) for m in markers["markers"]],
                         [("A", 0, 0), ("exit", 300, 2)])
        diff = self.diff(good + "@A", good + "@exit")
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), (300 + 4096, 3))

    def test_missing_marker(self):
        good = self.input("good.hslog")
        self.assert_fails(["diff", good + "@nosuch", good + "@exit"], 'no marker "nosuch"; markers: 1 "A" 2 "exit"')
        self.assert_fails(["snapshot", good, "--at", "3", "-o", self.path("x.hsnap")], 'no marker "3"')
        self.assert_fails(["diff", good + "@A", self.input("nosuch.hslog") + "@exit"], "No such file or directory")

    def test_far_thread_index(self):
        """A thread index near 2^32 is legal (a fork child keeps its
        parent's numbering): every reader copes, in bounded memory."""
        log = self.input("far-thread-index.hslog")
        self.assert_succeeds(["markers", log])
        self.assert_succeeds(["snapshot", log, "--at", "peak", "-o", self.path("peak.hsnap")])
        self.assert_succeeds(["report", log + "@exit"])
        self.assert_succeeds(["diff", log + "@A", log + "@exit"])

    def test_stack_in_unknown_module(self):
        """A frame naming a module the log never loaded shows as an address,
        and everything else still symbolizes as it can."""
        log = self.input("unknown-module.hslog")
        r = self.assert_succeeds(["diff", log + "@A", log + "@exit", "--format", "json"])
        diff = json.loads(r.stdout)
        orphan = [e for e in diff["entries"] if e["bytes_delta"] == 200]
        self.assertEqual(len(orphan), 1, diff["entries"])
        self.assertEqual([(f["function"], f["offset"]) for f in orphan[0]["frames"]], [(None, 0x2222)])

    def test_mismatched_build_id(self):
        """The recorded build-id differs from the file's: no names at all
        from that file (never a wrong one), and one warning saying why."""
        log = self.input("mismatched-build-id.hslog")
        r = self.assert_succeeds(["diff", log + "@A", log + "@exit", "--format", "json"])
        diff = json.loads(r.stdout)
        self.assertTrue(diff["entries"])
        for e in diff["entries"]:
            for f in e["frames"]:
                self.assertIsNone(f["function"], e)
        warnings = [line for line in r.stderr.splitlines() if "build-id mismatch" in line]
        self.assertEqual(len(warnings), 1, r.stderr)
        self.assertTrue(warnings[0].startswith("heapsnap: warning: " + program("alloc_pattern")), warnings)
        matching = self.input("matching-build-id.hslog")
        r = self.assert_succeeds(["diff", matching + "@A", matching + "@exit"])
        self.assertNotIn("build-id mismatch", r.stderr)

    # ---- snapshots ------------------------------------------------------------

    def test_every_reader_rejects_bad_snapshots(self):
        good = self.input("good.hsnap")
        for name, needle in sorted(SNAPSHOT_ERRORS.items()):
            path = self.input(name)
            with self.subTest(snapshot=name):
                self.assert_fails(["diff", path, good], needle)
                self.assert_fails(["diff", good, path], needle)
                self.assert_fails(["diff", good, good, path], needle)
                self.assert_fails(["maps", path], needle)
                # report takes a log or a snapshot, and says so when it is neither.
                report_needle = "neither a heapsnap log nor a snapshot" if "magic" in needle else needle
                self.assert_fails(["report", path], report_needle)

    def test_snapshots_of_different_programs(self):
        """Allowed, with a clear warning: two builds of one program may
        differ in name."""
        a, b = self.input("good.hsnap"), self.input("other-program.hsnap")
        r = self.assert_succeeds(["diff", a, b, "--format", "json"])
        diff = json.loads(r.stdout)
        self.assertEqual((diff["old"]["exe"], diff["new"]["exe"]), ("/nonexistent/hostile-app", "/nonexistent/another-app"))
        warnings = [line for line in r.stderr.splitlines() if "different programs" in line]
        self.assertEqual(warnings, ["heapsnap: warning: the snapshots are of different programs "
                                    "(/nonexistent/hostile-app and /nonexistent/another-app)"])
        self.assertIn("different programs", " ".join(diff.get("warnings", [])))

    def test_module_is_a_fifo(self):
        """A module path that names a FIFO (or a device) is not opened for
        reading: frames show as addresses, with a warning, at once."""
        snap = self.input("fifo-module.hsnap")
        r = self.assert_succeeds(["diff", snap, snap])
        self.assertIn("heapsnap: warning: %s: cannot open: not a regular file" % self.input("fifo"), r.stderr)
        self.assert_succeeds(["report", snap])

    def test_not_utf8(self):
        """Labels, paths and arguments are bytes: a marker labelled in
        Latin-1 still lists, snapshots and diffs as JSON (U+FFFD)."""
        growth = subprocess.run([HEAPSNAP, "run", "-o", self.path("latin1.hslog"), "--", program("growth")],
                                input=b"phase1\nmark caf\xe9\nphase2\nquit\n", capture_output=True, timeout=TIMEOUT)
        self.assertEqual(growth.returncode, 0, growth.stderr)
        log = self.path("latin1.hslog")
        markers = self.markers(log)
        self.assertEqual([m["label"] for m in markers["markers"]], ["caf\ufffd", "exit"])
        diff = self.diff(log + "@1", log + "@exit")
        self.assertEqual(diff["old"]["label"], "caf\ufffd")
        snap = self.snapshot(log, "--at", "1", "-o", self.path("latin1.hsnap"))
        self.json_of("maps", snap, "--format", "json")
        self.json_of("diff", snap, log + "@exit", "--format", "json")


class SpecialFilesTest(HeapsnapTest):
    """What is not a regular file (a FIFO, a device, a directory, a socket)
    never blocks a reader: each refuses it at once with one line."""

    def test_every_reader_refuses_special_files(self):
        good = self.path("good.hsnap")
        subprocess.run([HOSTILE_INPUTS, self.tmp, program("alloc_pattern")], check=True)
        fifo = self.path("fifo.hslog")
        os.mkfifo(fifo)
        sock_path = self.path("socket.hslog")
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(sock_path)
        self.addCleanup(sock.close)
        directory = self.path("dir.hslog")
        os.mkdir(directory)
        kinds = {fifo: "a FIFO", "/dev/zero": "a character device", "/dev/null": "a character device",
                 sock_path: "a socket", directory: "a directory"}
        out = self.path("x.hsnap")
        for path, kind in kinds.items():
            needle = "heapsnap: error: %s: not a regular file (%s)" % (path, kind)
            for args in (["markers", path], ["dump", path], ["snapshot", path, "-o", out],
                         ["snapshot", path, "--at", "peak", "-o", out], ["diff", path, good], ["diff", good, path],
                         ["diff", path + "@1", good], ["diff", path + "@*"], ["report", path], ["report", path + "@exit"],
                         ["maps", path], ["maps", path + "@1"]):
                with self.subTest(args=args):
                    start = time.monotonic()
                    r = subprocess.run([HEAPSNAP] + args, cwd=self.tmp, capture_output=True, text=True,
                                       errors="replace", timeout=TIMEOUT)
                    self.assertLess(time.monotonic() - start, 5)
                    self.assertEqual((r.returncode, r.stderr), (1, needle + "\n"))
                    self.assertFalse(os.path.exists(out))

    def test_planted_checkpoint_is_left_alone(self):
        """Something at LOG.checkpoint that is not the caller's own 0600
        file: never read, written through, replaced or waited on; the
        snapshot is made without it, with one warning."""
        subprocess.run([HOSTILE_INPUTS, self.tmp, program("alloc_pattern")], check=True)
        log = self.path("good.hslog")
        checkpoint = log + ".checkpoint"
        warning = ("heapsnap: warning: %s: not a regular file of yours with mode 0600; left alone, and no checkpoint "
                   "is used\n" % checkpoint)
        victim = self.path("victim")
        with open(victim, "w") as f:
            f.write("precious\n")

        def plant_fifo():
            os.mkfifo(checkpoint, 0o600)

        def plant_readable():
            with open(checkpoint, "w") as f:
                f.write("precious\n")
            os.chmod(checkpoint, 0o644)

        def plant_symlink():
            os.symlink(victim, checkpoint)

        for plant, still in ((plant_fifo, stat.S_ISFIFO), (plant_readable, stat.S_ISREG), (plant_symlink, stat.S_ISLNK)):
            with self.subTest(planted=plant.__name__):
                plant()
                before = os.lstat(checkpoint)
                for at in ("exit", "1"):
                    start = time.monotonic()
                    r = subprocess.run([HEAPSNAP, "snapshot", log, "--at", at, "-o", self.path("x.hsnap")],
                                       capture_output=True, text=True, timeout=TIMEOUT)
                    self.assertLess(time.monotonic() - start, 5)
                    self.assertEqual((r.returncode, r.stderr), (0, warning))
                after = os.lstat(checkpoint)
                self.assertTrue(still(after.st_mode))
                self.assertEqual((after.st_ino, after.st_mtime_ns, after.st_size),
                                 (before.st_ino, before.st_mtime_ns, before.st_size))
                os.unlink(checkpoint)
        with open(victim) as f:
            self.assertEqual(f.read(), "precious\n")
        # The caller's own checkpoint is used and kept up to date.
        self.heapsnap("snapshot", log, "--at", "1", "-o", self.path("x.hsnap"))
        self.assertEqual(stat.S_IMODE(os.lstat(checkpoint).st_mode), 0o600)
        r = self.heapsnap("snapshot", log, "--at", "exit", "-o", self.path("x.hsnap"))
        self.assertEqual(r.stderr, "")


# Small crafted files that describe a lot (tests/fuzz/hostile_inputs.cpp,
# "bombs"), each with what stops `markers`: a limit on one record
# (corruption), or the read budget (util/read_budget.h). The other
# commands hold other things, and may run out of another budget first.
BOMBS = {
    "bomb-stack-frames.hslog": r"corrupt log: truncated or malformed record",
    "bomb-stack-again.hslog": r"corrupt log: truncated or malformed record",
    "bomb-labels.hslog": r"corrupt log: truncated or malformed record",
    "bomb-markers.hslog": r"reading it needs more than \S+ MiB of memory \(markers\)",
    "bomb-blocks.hslog": r"reading it needs more than \S+ MiB of memory \(live blocks\)",
    "bomb-infos.hslog": r"reading it needs more than \S+ MiB of memory \(",
    "bomb-mappings.hslog": r"reading it needs more than \S+ MiB of memory \(live mappings\)",
    "bomb-events.hslog": r"reading it goes through more than \S+ MiB \(decompressed\)",
    # A marker of 1.4 million regions fits the budget (150 MiB): it reads.
    "bomb-regions.hslog": None,
}
BOMB_MEMORY = 256 << 20
BOMB_SECONDS = 10
# An unoptimised sanitizer build runs several times slower: it gets a
# smaller budget, and only the outcome is checked.
SANITIZED_BUDGET = {"HEAPSNAP_READ_MEMORY": "32M", "HEAPSNAP_READ_VOLUME": "32M"}


class BombTest(HostileCase):
    def run_measured(self, args, env=None):
        """heapsnap ARGS: (exit status, stderr, seconds, peak resident bytes)."""
        with tempfile.TemporaryFile() as err:
            start = time.monotonic()
            proc = subprocess.Popen([HEAPSNAP] + args, cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=err,
                                    preexec_fn=limited, env=env)
            timer = threading.Timer(TIMEOUT, proc.kill)
            timer.start()
            _, status, usage = os.wait4(proc.pid, 0)  # the child's own peak RSS, which Popen would not give
            timer.cancel()
            proc.returncode = os.waitstatus_to_exitcode(status)
            seconds = time.monotonic() - start
            err.seek(0)
            return proc.returncode, err.read().decode(errors="replace"), seconds, usage.ru_maxrss * 1024

    def test_bombs_cost_little(self):
        """Every reader of every bomb: one error line, within 256 MiB of
        memory and 10 s."""
        out = self.path("x.hsnap")
        for name, needle in sorted(BOMBS.items()):
            path = self.input(name)
            self.assertLess(os.path.getsize(path), 1 << 20)
            for args in (["markers", path], ["dump", path], ["snapshot", path, "--at", "end", "-o", out],
                         ["snapshot", path, "--at", "peak", "-o", out], ["report", path + "@end"],
                         ["diff", path + "@1", path + "@end"], ["diff", path + "@*"]):
                with self.subTest(args=args):
                    env = dict(os.environ, **SANITIZED_BUDGET) if SANITIZED else None
                    status, err, seconds, peak = self.run_measured(args, env=env)
                    if not SANITIZED:
                        self.assertLess(seconds, BOMB_SECONDS)
                        self.assertLess(peak, BOMB_MEMORY)
                    if needle is None:
                        self.assertIn(status, (0, 1), err)
                        self.assertLessEqual(len(err.splitlines()), 1, err)
                        continue
                    self.assertEqual(status, 1, err)
                    # dump prints what it decoded before it meets the defect.
                    self.assertEqual(len(err.splitlines()), 1, err)
                    if args[0] == "markers" or "corrupt" in needle:
                        self.assertRegex(err, needle)
                    else:
                        self.assertRegex(err, r"reading it (needs more than \S+ MiB of memory|goes through more than)")
                    self.assertTrue(err.startswith("heapsnap: error: " + path + ": "), err)

    def test_a_genuine_file_reads_with_a_larger_budget(self):
        """The limits name the variable that lifts them, and lifting it
        reads the file: 16 million live blocks (256 MiB) in 3 KB."""
        path = self.input("blocks-16m.hslog")
        status, err, _, _ = self.run_measured(["markers", path])
        self.assertEqual(status, 1, err)
        self.assertIn("allow more with HEAPSNAP_READ_MEMORY=768M or more (or unlimited)", err)
        env = dict(os.environ, HEAPSNAP_READ_MEMORY="512M")
        status, err, _, peak = self.run_measured(["markers", path], env=env)
        self.assertEqual((status, err), (0, ""))
        if not SANITIZED:
            self.assertLess(peak, 512 << 20)
        status, err, _, _ = self.run_measured(["markers", path], env=dict(os.environ, HEAPSNAP_READ_MEMORY="lots"))
        self.assertEqual((status, err), (1, "heapsnap: error: HEAPSNAP_READ_MEMORY=lots: not a size (such as 512M, 4G "
                                            "or unlimited)\n"))


class ControlCharactersTest(HostileCase):
    """Labels, program and module paths with terminal control sequences:
    escaped in every text output and message, per spec in JSON and CSV."""

    RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x9b\u202e]")

    def assert_clean(self, text, what):
        bad = self.RAW.search(text.replace("\n", ""))
        self.assertIsNone(bad, "%s: raw control character %r in:\n%s" % (what, bad and bad.group(), text))

    def test_escaped_everywhere(self):
        log, snap = self.input("control-chars.hslog"), self.input("control-chars.hsnap")
        label = "A\\x1b]0;owned\\x07\\x1b[2J\\r\\nforged: 0 bytes\\x7f\\u009b31m\\u202eevil"
        for args in (["markers", log], ["dump", log], ["diff", log + "@1", log + "@exit"],
                     ["diff", log + "@1", log + "@exit", "--format", "csv"],
                     ["diff", log + "@1", log + "@exit", "--format", "folded"], ["report", log + "@exit"],
                     ["report", log + "@exit", "--format", "csv"], ["diff", snap, snap], ["report", snap],
                     ["maps", snap], ["diff", log + "@*"], ["diff", snap, snap, snap]):
            with self.subTest(args=args[0:1] + args[2:]):
                r = self.run_limited(args)
                self.assertEqual(r.returncode, 0, r.stderr)
                self.assert_clean(r.stdout, "stdout")
                self.assert_clean(r.stderr, "stderr")
                # No line of the output starts with the forged text.
                self.assertNotIn("\nforged", r.stdout + r.stderr)
        markers = self.run_limited(["markers", log]).stdout
        self.assertIn(label, markers)
        self.assertEqual([m["label"] for m in self.markers(log)["markers"]],
                         ["A\x1b]0;owned\x07\x1b[2J\r\nforged: 0 bytes\x7f\x9b31m\u202eevil", "exit"])
        csv = self.run_limited(["diff", log + "@1", log + "@exit", "--format", "csv"]).stdout.splitlines()
        self.assertIn(',"lib\\x1b]0;x\\x07,""q"".so+0x1139",', csv[1] + csv[2])
        r = self.run_limited(["diff", log + "@nosuch", log + "@exit"])
        self.assertEqual(r.returncode, 1)
        self.assertIn(label, r.stderr)
        self.assert_clean(r.stderr, "error")


if __name__ == "__main__":
    main()
