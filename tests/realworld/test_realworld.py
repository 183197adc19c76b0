"""Real programs, unchanged, under `heapsnap run`: Debian's python3 (a
threaded workload and a few of its own regression tests), git, g++ (which
forks and execs cc1plus and as), sqlite3 and a shell pipeline. Each runs
once plain and once recorded in the same place with the same input; stdout,
stderr and the exit status must be the same, and every log that the
recorded run leaves (one per process, exec'd images included) must replay:
`heapsnap markers` and `heapsnap snapshot --at exit` (`--at end` for a log
that ended in an exec) succeed.

A test skips, saying which, only when the Debian package it needs is not
installed (tools/test installs them).
"""

import os
import re
import shutil
import subprocess
import unittest

from harness import main
from unchanged import UnchangedTest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON = "/usr/bin/python3"  # Debian's interpreter; `python3` on PATH may be a wrapper (pyenv)
# Every Python object a malloc block; hashes the same in both runs.
PYTHON_ENV = {"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}


def need(path, package):
    """Skips the test unless `path` exists (it comes with Debian `package`)."""
    if not os.path.exists(path):
        raise unittest.SkipTest("%s not installed (Debian package %s)" % (path, package))


def python_testsuite():
    """The Debian package with Python's regression tests, and whether it is
    installed (test_json and test_re are all this test runs)."""
    out = subprocess.run([PYTHON, "-c", "import sys, sysconfig; print('%d.%d' % sys.version_info[:2]); "
                                        "print(sysconfig.get_paths()['stdlib'])"], capture_output=True, text=True)
    version, stdlib = out.stdout.split()
    installed = os.path.isdir(os.path.join(stdlib, "test", "test_json")) and os.path.exists(
        os.path.join(stdlib, "test", "test_re.py"))
    return "libpython%s-testsuite" % version, installed




class RealWorldTest(UnchangedTest):
    def assert_all_replay(self, logs, killed=()):
        """Every log replays (see assert_replays): exit (exit or _exit:
        dash leaves every time by _exit) or exec, and no End record only
        for children of recorded processes and those named in `killed`. Every log, even
        one of a process that died at once, has at least its Process record.
        Returns {log: markers listing}."""
        out = {}
        processes = {log: self.process_of(log) for log in logs}
        pids = {p["pid"] for p in processes.values()}
        for log in logs:
            exe = os.path.basename(processes[log]["exe"])
            # Children of a recorded process may be killed by it.
            child = processes[log]["ppid"] in pids
            ended = ("exit", "exec", None) if exe in killed or child else ("exit", "exec")
            with self.subTest(log=os.path.basename(log)):
                out[log] = self.assert_replays(log, ended=ended)
        self.assertTrue(out, "no readable log among %s" % logs)
        return out

    def exes(self, logs):
        """The executable names of the logs (from the -o pattern %e.%p)."""
        return sorted(os.path.basename(log).rsplit(".", 2)[0] for log in logs)

    # ---- python3 ---------------------------------------------------------------

    def test_python_threads(self):
        need(PYTHON, "python3")
        result, logs = self.assert_unchanged([PYTHON, os.path.join(HERE, "py_threads.py")], status=0,
                                             env=PYTHON_ENV)
        self.assertIn(b"consumer (800, ", result.stdout)
        listings = self.assert_all_replay(logs)
        self.assertEqual(len(listings), 1, logs)
        (data,) = listings.values()
        exit_marker = data["markers"][-1]
        self.assertEqual(exit_marker["label"], "exit")
        self.assertGreater(exit_marker["events"], 100000, "PYTHONMALLOC=malloc: every object is recorded")

    def test_python_regression_tests(self):
        need(PYTHON, "python3")
        package, installed = python_testsuite()
        if not installed:
            raise unittest.SkipTest("Python's regression tests not installed (Debian package %s)" % package)

        def normalize(text):
            text = re.sub(rb"(?m)^\d+:\d\d:\d\d (load avg: [\d.]+ )?", b"", text)
            text = re.sub(rb" -- running: .*| \(\d+(\.\d+)? (sec|ms|min)\)| passed \(.*\)", b"", text)
            return re.sub(rb"Total duration: .*", b"Total duration: -", text)

        work = self.path("work")
        result, logs = self.assert_unchanged([PYTHON, "-m", "test", "test_json", "test_re"], status=0,
                                             env=dict(PYTHON_ENV, TMPDIR=work), normalize=normalize,
                                             prepare=lambda: os.makedirs(work, exist_ok=True))
        self.assertIn(b"All 2 tests OK.", result.stdout)
        # test_json's json.tool tests start more interpreters: each has its own log.
        self.assert_all_replay(logs)
        self.assertGreater(len(logs), 1)
        self.assertEqual(set(self.exes(logs)), {"python3.11"})

    # ---- git -------------------------------------------------------------------

    def test_git(self):
        need("/usr/bin/git", "git")
        repo = self.path("repo")
        script = """
            set -e
            git init -q -b main repo
            cd repo
            for i in $(seq 1 50); do seq 1 $i > file$i.txt; done
            git add .
            git commit -q -m 'fifty files'
            sed -i 's/^1$/one/' file7.txt file9.txt
            git rm -q file3.txt
            git commit -q -am 'edit two, remove one'
            git log --stat --format='%H %s'
            git status --short
            git diff HEAD~1 --stat
        """
        env = {"HOME": self.tmp, "GIT_CONFIG_NOSYSTEM": "1", "GIT_AUTHOR_NAME": "Heap Snap",
               "GIT_AUTHOR_EMAIL": "hs@example.invalid", "GIT_COMMITTER_NAME": "Heap Snap",
               "GIT_COMMITTER_EMAIL": "hs@example.invalid", "GIT_AUTHOR_DATE": "2024-01-01T00:00:00Z",
               "GIT_COMMITTER_DATE": "2024-01-01T00:00:00Z", "LC_ALL": "C"}
        result, logs = self.assert_unchanged(["/bin/sh", "-c", script], status=0, env=env,
                                             prepare=lambda: shutil.rmtree(repo, ignore_errors=True))
        self.assertIn(b"edit two, remove one", result.stdout)
        self.assertIn(b"file3.txt | 3 ---", result.stdout)
        self.assert_all_replay(logs)
        self.assertIn("git", self.exes(logs))

    # ---- g++ -------------------------------------------------------------------

    def test_gxx_compile(self):
        need("/usr/bin/g++", "g++")
        source = self.path("small.cpp")
        with open(source, "w") as f:
            f.write("#include <map>\n#include <string>\n#include <vector>\n"
                    "std::map<std::string, std::vector<int>> build(int n) {\n"
                    "    std::map<std::string, std::vector<int>> m;\n"
                    "    for (int i = 0; i < n; ++i) m[std::to_string(i)].push_back(i * i);\n"
                    "    return m;\n}\n")
        obj = self.path("small.o")
        objects = []

        def prepare():
            if os.path.exists(obj):
                with open(obj, "rb") as f:
                    objects.append(f.read())
                os.unlink(obj)

        _, logs = self.assert_unchanged(["/usr/bin/g++", "-O2", "-c", source, "-o", obj], status=0,
                                        prepare=prepare)
        prepare()
        self.assertEqual(len(objects), 2)
        self.assertEqual(objects[0], objects[1], "the object file compiled under heapsnap run differs")
        # The driver forks and execs cc1plus and as: each process its own log.
        self.assert_all_replay(logs)
        exes = self.exes(logs)
        self.assertIn("cc1plus", exes)
        self.assertTrue(any(e == "as" or e.endswith("-as") for e in exes), exes)
        self.assertTrue(any(re.fullmatch(r"(x86_64-linux-gnu-)?g\+\+(-\d+)?", e) for e in exes), exes)

    # ---- sqlite3 ---------------------------------------------------------------

    def test_sqlite3(self):
        need("/usr/bin/sqlite3", "sqlite3")
        db = self.path("work.db")
        script = b"""
            CREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT, v INTEGER);
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20000)
              INSERT INTO t(k, v) SELECT 'key' || (i % 97), i * 7 % 1000 FROM n;
            CREATE INDEX t_k ON t(k);
            SELECT count(*), sum(v) FROM t;
            SELECT k, count(*), max(v) FROM t GROUP BY k ORDER BY k LIMIT 5;
            UPDATE t SET v = v + 1 WHERE id % 3 = 0;
            DELETE FROM t WHERE v > 900;
            SELECT count(*), sum(v) FROM t;
            SELECT group_concat(k, ',') FROM (SELECT DISTINCT k FROM t ORDER BY k LIMIT 10);
            VACUUM;
            PRAGMA integrity_check;
        """

        def prepare():
            if os.path.exists(db):
                os.unlink(db)

        result, logs = self.assert_unchanged(["/usr/bin/sqlite3", db], status=0, input=script, prepare=prepare)
        self.assertIn(b"20000|", result.stdout)
        self.assertTrue(result.stdout.rstrip().endswith(b"ok"))
        (data,) = self.assert_all_replay(logs).values()
        self.assertGreater(data["markers"][-1]["events"], 1000)

    # ---- a shell pipeline ------------------------------------------------------

    def test_shell_pipeline(self):
        result, logs = self.assert_unchanged(["/bin/sh", "-c", "seq 1 20000 | sort -r | head -5"], status=0)
        self.assertEqual(result.stdout, b"9999\n9998\n9997\n9996\n9995\n")
        # sort may die of SIGPIPE once head has its five lines: its log then
        # has no End record and replays `--at end`. dash forks a child per
        # command, which execs it: those logs end with reason exec.
        self.assert_all_replay(logs, killed={"sort"})
        exes = set(self.exes(logs))
        self.assertTrue({"seq", "sort", "head"} <= exes, exes)


if __name__ == "__main__":
    main()
