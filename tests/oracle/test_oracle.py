"""valgrind as the oracle: real Debian programs run under valgrind's
memcheck and under `heapsnap run --no-follow` must agree on what the
process allocated and freed, down to its last free: live bytes and blocks
at exit, allocations, frees and bytes allocated.

Both runs get the same environment, byte for byte (a handful of fixed
variables), the same arguments, input and working directory. valgrind runs
as valgrind.bin, not through Debian's `valgrind` script, which exports
variables of its own; with --run-libc-freeres=no and --run-cxx-freeres=no,
so it frees nothing the program would not. The one difference a program
can see is valgrind's own: it adds LD_PRELOAD (its vgpreload libraries) to
the program's environment (test_environment).

heapsnap's side: the `exit` marker's live bytes and blocks (`markers
--format json`), and the alloc and free records of `heapsnap dump`
(realloc is one of each, as memcheck counts it).

One difference is not the program's and is accounted for exactly:
valgrind's LD_PRELOAD is one more environment variable. A program that
makes a shell variable of each (bash) or calls setenv (git: glibc's setenv
reallocs `environ` to count + 2 pointers) allocates more for it; the
recorded run gets a stand-in of the same name length and value
(valgrind_preload_standin).

The recorder adds no TLS module (glibc's `_dl_allocate_tls` callocs every
new thread's DTV with an entry per module): zstd's two threads allocate
under heapsnap exactly what they allocate under valgrind
(docs/design/invisible-recorder.md, "Threads").
"""

import json
import os
import random
import re
import shutil
import subprocess
import unittest

from harness import HEAPSNAP, HeapsnapTest, main

VALGRIND = shutil.which("valgrind.bin")
IN_USE = re.compile(r"in use at exit: ([\d,]+) bytes in ([\d,]+) blocks")
TOTAL = re.compile(r"total heap usage: ([\d,]+) allocs, ([\d,]+) frees, ([\d,]+) bytes allocated")


def number(text):
    return int(text.replace(",", ""))


@unittest.skipUnless(VALGRIND, "valgrind is not installed (tools/test installs it)")
class OracleTest(HeapsnapTest):
    def setUp(self):
        super().setUp()
        rng = random.Random(6)
        with open(self.path("words.txt"), "w") as f:
            for _ in range(3000):
                f.write("%d %s\n" % (rng.randint(0, 10**6),
                                     "".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 12)))))
        os.makedirs(self.path("tree/sub"))
        for i in range(20):
            with open(self.path("tree/sub/f%d" % i), "w") as f:
                f.write("x" * i * 50)
        with open(self.path("data.json"), "w") as f:
            f.write('{"a": [1, 2, 3], "b": {"c": "d"}}\n')

    def environment(self):
        return {"PATH": "/usr/bin:/bin", "HOME": self.tmp, "LC_ALL": "C"}

    def run_exactly(self, argv, extra=None):
        """Runs argv in the test directory with environment() (and `extra`)
        and nothing else; returns (status, stdout)."""
        result = subprocess.run(argv, cwd=self.tmp, env=dict(self.environment(), **(extra or {})),
                                stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
        return result.returncode, result.stdout

    def under_valgrind(self, argv, extra=None):
        report = self.path("valgrind.txt")
        status, out = self.run_exactly([VALGRIND, "--tool=memcheck", "--run-libc-freeres=no",
                                        "--run-cxx-freeres=no", "--log-file=" + report] + argv, extra)
        with open(report) as f:
            text = f.read()
        in_use, total = IN_USE.search(text), TOTAL.search(text)
        self.assertTrue(in_use and total, "no HEAP SUMMARY from valgrind:\n" + text[-3000:])
        return status, out, {"live_bytes": number(in_use.group(1)), "live_blocks": number(in_use.group(2)),
                             "allocs": number(total.group(1)), "frees": number(total.group(2)),
                             "bytes_allocated": number(total.group(3))}

    def under_heapsnap(self, argv, extra=None):
        log = self.path("recorded.hslog")
        if os.path.exists(log):
            os.unlink(log)
        status, out = self.run_exactly([HEAPSNAP, "run", "--no-follow", "-o", log, "--"] + argv, extra)
        markers = json.loads(self.heapsnap("markers", log, "--format", "json").stdout)
        self.assertTrue(markers["complete"], "the log has no End record")
        exits = [m for m in markers["markers"] if m["label"] == "exit"]
        self.assertEqual(len(exits), 1, "one exit marker")
        counts = {"live_bytes": exits[0]["live_bytes"], "live_blocks": exits[0]["live_blocks"],
                  "allocs": 0, "frees": 0, "bytes_allocated": 0}
        self.threads_started = 0
        for line in self.heapsnap("dump", log).stdout.splitlines():
            if line.startswith("thread-start "):
                self.threads_started += 1
            elif line.startswith("alloc "):
                counts["allocs"] += 1
                counts["bytes_allocated"] += int(re.search(r" size=(\d+)", line).group(1))
            elif line.startswith("free "):
                counts["frees"] += 1
        return status, out, counts

    def assert_agree(self, *argv, extra=None, prepare=None, valgrind_extra=None, adjust=None):
        """Runs argv under valgrind (`valgrind_extra` added to its
        environment) and under heapsnap (`extra` added); `prepare()` runs
        before each; `adjust(counts)` gives the figures heapsnap must have
        from valgrind's. Returns heapsnap's."""
        if not shutil.which(argv[0]):
            self.skipTest("%s is not installed" % argv[0])
        argv = list(argv)
        if prepare:
            prepare()
        v_status, v_out, expected = self.under_valgrind(argv, valgrind_extra)
        if prepare:
            prepare()
        h_status, h_out, got = self.under_heapsnap(argv, extra)
        self.assertEqual((h_status, h_out), (v_status, v_out), "the program did not do the same twice")
        self.assertEqual(got, adjust(expected) if adjust else expected)
        return got

    def valgrind_preload_standin(self):
        """valgrind's LD_PRELOAD, as a variable of the same name length and
        value for the recorded run: the program has as many environment
        variables, each as long, as it has under valgrind."""
        _, env = self.run_exactly([VALGRIND, "--log-file=" + self.path("v.txt"), "env"])
        preload = [line for line in env.decode().splitlines() if line.startswith("LD_PRELOAD=")][0]
        return {"XD_PRELOAD": preload.split("=", 1)[1]}

    def git_repository(self):
        """repo/: three commits of f.txt, fixed dates, files dated in the
        past (no racily clean index entry: `git status` rewrites nothing),
        and the index refreshed once bare."""
        repo = self.path("repo")
        env = dict(self.environment(), GIT_AUTHOR_NAME="a", GIT_AUTHOR_EMAIL="a@b", GIT_COMMITTER_NAME="a",
                   GIT_COMMITTER_EMAIL="a@b", GIT_AUTHOR_DATE="@1000000000 +0000",
                   GIT_COMMITTER_DATE="@1000000000 +0000")
        git = lambda *args: subprocess.run(["git", "-C", repo] + list(args), env=env, check=True,
                                           stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        os.makedirs(repo)
        git("init", "-q", "-b", "main")
        for i in range(3):
            with open(os.path.join(repo, "f.txt"), "a") as f:
                f.write("line %d\n" % i)
            os.utime(os.path.join(repo, "f.txt"), (1000000000, 1000000000))
            git("add", "f.txt")
            git("commit", "-q", "-m", "c%d" % i)
        with open(os.path.join(repo, "f.txt"), "a") as f:
            f.write("changed\n")
        os.utime(os.path.join(repo, "f.txt"), (1000000000, 1000000000))
        git("status")
        return repo

    # ---- the programs -------------------------------------------------------

    def test_ls(self):
        self.assert_agree("ls", "-la", "tree/sub")

    def test_sort(self):
        self.assert_agree("sort", "-k2", "words.txt")

    def test_grep(self):
        self.assert_agree("grep", "-c", "-E", "ab+c", "words.txt")

    def test_sed(self):
        self.assert_agree("sed", "-e", "s/a/b/g", "-e", "/c.*d/d", "words.txt")

    def test_mawk(self):
        self.assert_agree("mawk", "{ n[$2] += $1 } END { for (k in n) s += n[k]; print s }", "words.txt")

    def test_diff(self):
        self.assert_agree("diff", "words.txt", "data.json")

    def test_tar(self):
        self.assert_agree("tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "-cf", "-", "tree")

    def test_xz(self):
        self.assert_agree("xz", "-c", "words.txt")

    def test_bzip2(self):
        self.assert_agree("bzip2", "-c", "words.txt")

    def test_sqlite3(self):
        self.assert_agree("sqlite3", ":memory:", "create table t(x, y); insert into t values (1, 'a'), (2, 'b');"
                          " select sum(x), group_concat(y) from t;")

    def test_jq(self):
        self.assert_agree("jq", "-c", ".a, .b", "data.json")

    def test_bash(self):
        # bash makes a shell variable of every environment variable, and
        # valgrind's LD_PRELOAD is one: the recorded bash gets a stand-in of
        # the same name length and value. No subshell: valgrind would report
        # the fork child's heap too.
        got = self.assert_agree("bash", "-c", "for i in 1 2 3; do y=$y$i; done; echo $y",
                                extra=self.valgrind_preload_standin())
        self.assertGreater(got["allocs"], 400)

    def test_git(self):
        # git calls setenv (GIT_DIR and the like) as it starts; glibc's
        # setenv reallocs `environ` to (variables + 2) pointers, one more
        # under valgrind for its LD_PRELOAD: 8 bytes a realloc and 8 live
        # bytes at exit without the stand-in. No pager, no child: stdout is
        # a pipe and these commands run none.
        if not shutil.which("git"):
            self.skipTest("git is not installed")
        repo = self.git_repository()
        standin = self.valgrind_preload_standin()
        for argv in (["log", "-p"], ["status"], ["diff", "HEAD~1"], ["rev-parse", "HEAD"]):
            with self.subTest(argv=argv):
                self.assert_agree("git", "-C", repo, *argv, extra=standin)
        fresh = self.path("fresh")
        with self.subTest(argv=["init"]):
            self.assert_agree("git", "init", "-q", fresh, extra=standin,
                              prepare=lambda: shutil.rmtree(fresh, ignore_errors=True))

    def test_zstd(self):
        # zstd 1.5.4 reads and writes through two I/O threads, both started
        # at once (so each gets a new stack and a new DTV, none is reused).
        # The recorder adds no TLS module, so each DTV is as large as bare.
        if not shutil.which("zstd"):
            self.skipTest("zstd is not installed")
        subprocess.run(["zstd", "-q", "-o", self.path("words.zst"), self.path("words.txt")], check=True,
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        for argv in (["-T2", "-c", "words.txt"], ["-d", "-c", "words.zst"]):
            with self.subTest(argv=argv):
                self.assert_agree("zstd", *argv)
                self.assertEqual(self.threads_started, 2)

    # ---- the environment both give the program ------------------------------

    def test_environment(self):
        """heapsnap --no-follow: exactly the bare environment; valgrind: the
        bare environment and its own LD_PRELOAD."""
        _, bare = self.run_exactly(["env"])
        _, recorded = self.run_exactly([HEAPSNAP, "run", "--no-follow", "-o", self.path("env.hslog"), "--", "env"])
        _, valgrind = self.run_exactly([VALGRIND, "--log-file=" + self.path("valgrind.txt"), "env"])
        self.assertEqual(recorded, bare)
        extra = [line for line in valgrind.splitlines() if line not in bare.splitlines()]
        self.assertEqual([line.split(b"=")[0] for line in extra], [b"LD_PRELOAD"])


if __name__ == "__main__":
    main()
