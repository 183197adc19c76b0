"""allocators.c under each malloc: glibc's, and jemalloc, tcmalloc and
mimalloc preloaded after the recorder (`LD_PRELOAD=LIB heapsnap run`). The
program must run as it does alone, never hang, and leave the same live set
at its @site lines whatever allocator served it; `heapsnap maps` must name
the allocator. Sites are compared one by one, not as totals: jemalloc and
tcmalloc pull in libstdc++, whose constructor allocates its 72704-byte
emergency exception pool.

A preloaded allocator that is not installed (Debian libjemalloc2,
libtcmalloc-minimal4, libmimalloc2.0) skips its case, saying which.
"""

import os
import re
import shutil
import subprocess

from harness import HEAPSNAP, TIMEOUT, HeapsnapTest, main, program, site_line

SRC = "allocators.c"
OUTPUT = "allocators: 8 sites, 5566080 bytes kept in 33 blocks\n"
# function, @site, live bytes and blocks at exit (allocators.c's header).
KEPT = [
    ("keep_small", "keep_small", 960, 20),
    ("keep_calloc", "keep_calloc", 3000, 3),
    ("keep_realloc", "keep_realloc", 7000, 1),
    ("keep_aligned", "keep_aligned", 2000, 2),
    ("keep_page", "keep_page", 8192, 1),
    ("keep_large", "keep_large", 300000, 1),
    ("keep_huge", "keep_huge", 5 << 20, 1),
    ("other_thread", "thread_keep", 2048, 4),
]
KEPT_BYTES = sum(k[2] for k in KEPT)
# Sites whose every block was freed or reallocated.
GONE = ["realloc_seed", "churn", "handed"]
ALLOCATORS = {
    "jemalloc": ("libjemalloc.so.2", "libjemalloc2"),
    "tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc-minimal4"),
    "mimalloc": ("libmimalloc.so.2", "libmimalloc2.0"),
}


def sanitized_launcher():
    """Whether the heapsnap under test links AddressSanitizer's runtime."""
    ldd = subprocess.run(["ldd", HEAPSNAP], capture_output=True, text=True)
    return "libasan" in ldd.stdout


def library(name):
    """The path of shared library `name` for this system's ABI (that of its
    libc.so.6) in the dynamic linker's cache, or None."""
    # Not on a user's PATH on Debian.
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    cache = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    entries = re.findall(r"^\s*(\S+) \(([^)]*)\) => (\S+)$", cache, re.M)
    abi = [flags for lib, flags, _ in entries if lib == "libc.so.6"]
    for lib, flags, path in entries:
        if lib == name and flags in abi[:1] and os.path.exists(path):
            return path
    return None


class AllocatorTest(HeapsnapTest):
    def preload(self, allocator):
        """LD_PRELOAD for `allocator` ({} for glibc); skips if not installed."""
        if allocator == "glibc":
            return {}
        name, package = ALLOCATORS[allocator]
        path = library(name)
        if not path:
            self.skipTest("%s not installed (Debian package %s)" % (name, package))
        return {"LD_PRELOAD": path}

    def run_under(self, allocator):
        """allocators 5 recorded under `allocator`: same output and status as
        alone; returns the snapshot of its exit marker."""
        env = self.preload(allocator)
        alone = self.run_cmd([program("allocators"), "5"], env=env, timeout=TIMEOUT)
        self.assertEqual((alone.returncode, alone.stdout), (5, OUTPUT), alone.stderr)
        # TIMEOUT turns a deadlock between the recorder and the allocator
        # into a failure instead of a hang. The launcher inherits the
        # preload too.
        if env and sanitized_launcher():
            self.skipTest("heapsnap is built with AddressSanitizer (tools/test --sanitize), whose runtime cannot "
                          "share the launcher's process with another malloc")
        recorded = self.run_cmd([HEAPSNAP, "run", "-o", "%e.%p.hslog", "--",
                                 program("allocators"), "5"], env=env, timeout=TIMEOUT)
        self.assertEqual((recorded.returncode, recorded.stdout), (5, OUTPUT), recorded.stderr)
        logs = self.logs_of(recorded.stderr)
        self.assertEqual(len(logs), 1, recorded.stderr)
        self.assertTrue(self.markers(logs[0])["complete"])
        return logs[0], self.snapshot(logs[0], "-o", self.path("exit.hsnap"))

    def assert_live_set(self, log, exit_snap):
        """Live at exit, per @site line: KEPT exactly, nothing at GONE."""
        diff = self.diff(log + "@0s", exit_snap, "--group-by", "line")
        by_line = {}
        for e in diff["entries"]:
            top = e["frames"][0]
            if os.path.basename(top["file"] or "") == SRC:
                by_line.setdefault(top["line"], []).append(e)
        for function, site, size, blocks in KEPT:
            line = site_line(SRC, site)
            self.assertEqual(len(by_line.get(line, [])), 1, "entries at %s:%d: %s" % (SRC, line, by_line.get(line)))
            e = by_line[line][0]
            self.assertEqual((e["frames"][0]["function"], e["bytes_delta"], e["blocks_delta"]),
                             (function, size, blocks), "%s:%d" % (SRC, line))
        for site in GONE:
            self.assertNotIn(site_line(SRC, site), by_line, site)

    def assert_maps(self, exit_snap, allocator):
        space = self.json_of("maps", exit_snap, "--format", "json")
        named = space["allocator"]
        self.assertEqual(named["name"], allocator)
        self.assertGreaterEqual(space["tracked_live_bytes"], KEPT_BYTES)
        # The 5 MiB and 300 000-byte blocks are the allocator's heap, not
        # anonymous memory, whoever mapped them.
        self.assertGreaterEqual(space["categories"]["Heap"]["size_bytes"], (5 << 20) + 300000)
        if allocator == "glibc":
            self.assertEqual(set(named.values()), {"glibc", None}, named)
        elif allocator == "mimalloc":
            # mimalloc gives only its committed memory.
            self.assertGreaterEqual(named["committed_bytes"], space["tracked_live_bytes"])
            self.assertEqual(named["allocated_bytes"], None)
        else:
            # Every block the recorder saw is still allocated: the
            # allocator's own count holds at least those bytes.
            self.assertGreaterEqual(named["allocated_bytes"], space["tracked_live_bytes"])
            self.assertGreaterEqual(named["active_bytes"], named["allocated_bytes"])

    def check(self, allocator):
        log, exit_snap = self.run_under(allocator)
        self.assert_live_set(log, exit_snap)
        self.assert_maps(exit_snap, allocator)

    def test_glibc(self):
        self.check("glibc")

    def test_jemalloc(self):
        self.check("jemalloc")

    def test_tcmalloc(self):
        self.check("tcmalloc")

    def test_mimalloc(self):
        self.check("mimalloc")

    def test_maps_of_unrecorded_process(self):
        # No recorder: the name comes from the libraries mapped.
        env = dict(os.environ, **self.preload("jemalloc"))
        proc = subprocess.Popen([program("allocators"), "wait"], cwd=self.tmp, env=env, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)

        def stop():
            proc.kill()
            proc.wait()
            proc.stdout.close()
        self.addCleanup(stop)
        ready = proc.stdout.readline()
        self.assertEqual(ready, "ready pid=%d\n" % proc.pid)
        space = self.json_of("maps", str(proc.pid), "--format", "json")
        self.assertEqual(space["allocator"]["name"], "jemalloc")
        self.assertEqual((space["tracked"], space["recorder_bytes"]), (False, None))
        proc.stdin.close()
        self.assertEqual(proc.wait(timeout=TIMEOUT), 0)


if __name__ == "__main__":
    main()
