"""Helpers for tests that run a program twice, once plain and once under
`heapsnap run`, and require that the program cannot tell the difference:
same stdout, same stderr (less the launcher's "heapsnap: log:" lines), same
exit status. Every log the recorded run leaves must then replay cleanly.

Used by tests/realworld (real Debian programs) and tests/stress (the C
programs next to those tests). Builds on tests/integration/harness.py
(meson puts both directories on PYTHONPATH).
"""

import json
import os
import re
import resource
import subprocess

from harness import HEAPSNAP, HeapsnapTest

LOG_LINE = re.compile(rb"^heapsnap: log: (/.*)$")
# A hang detector, not a performance bound: generous even on a loaded
# 2-core machine.
HANG_TIMEOUT = 300


def no_core_dumps():
    """preexec_fn: programs that die by a signal on purpose leave no core."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class UnchangedTest(HeapsnapTest):
    # ---- running ----------------------------------------------------------

    def logs_dir(self):
        path = self.path("logs")
        os.makedirs(path, exist_ok=True)
        return path

    def run_raw(self, argv, cwd=None, env=None, input=None, timeout=HANG_TIMEOUT):
        """Runs argv (bytes in and out); a hang fails the test with what it
        printed so far."""
        full_env = dict(os.environ)
        full_env.update(env or {})
        try:
            return subprocess.run(argv, cwd=cwd or self.tmp, env=full_env, input=input, capture_output=True,
                                  timeout=timeout, preexec_fn=no_core_dumps)
        except subprocess.TimeoutExpired as e:
            self.fail("%s hung (no exit within %d s; a deadlock?)\n--- stdout:\n%s\n--- stderr:\n%s" % (
                " ".join(map(str, argv)), timeout, (e.stdout or b"")[-3000:].decode(errors="replace"),
                (e.stderr or b"")[-3000:].decode(errors="replace")))

    def run_recorded(self, argv, options=(), cwd=None, env=None, input=None, timeout=HANG_TIMEOUT):
        """`heapsnap run -o LOGS/%e.%p.hslog [options] -- argv`. Returns the
        completed process with the launcher's "heapsnap: log:" lines taken
        out of its stderr, and the log paths those lines named."""
        pattern = os.path.join(self.logs_dir(), "%e.%p.hslog")
        result = self.run_raw([HEAPSNAP, "run", "-o", pattern, *options, "--", *argv], cwd=cwd, env=env,
                              input=input, timeout=timeout)
        logs, rest = [], []
        for line in result.stderr.splitlines(keepends=True):
            m = LOG_LINE.match(line.rstrip(b"\n"))
            if m:
                logs.append(m.group(1).decode())
            else:
                rest.append(line)
        result.stderr = b"".join(rest)
        for log in logs:
            self.assertTrue(os.path.isfile(log), "printed log %s does not exist" % log)
        return result, logs

    def assert_unchanged(self, argv, status=None, options=(), cwd=None, env=None, input=None, normalize=None,
                         prepare=None, timeout=HANG_TIMEOUT):
        """Runs argv plain, then recorded, and compares what they did.
        `prepare()` (re)creates whatever the program works on before each
        run; `normalize(bytes) -> bytes` takes out what legitimately differs
        between two runs (timings). Returns (recorded result, logs)."""
        if prepare:
            prepare()
        plain = self.run_raw(argv, cwd=cwd, env=env, input=input, timeout=timeout)
        if status is not None:
            self.assertEqual(128 - plain.returncode if plain.returncode < 0 else plain.returncode, status, "plain run of %s: stderr %s" % (argv, plain.stderr[-2000:]))
        if prepare:
            prepare()
        recorded, logs = self.run_recorded(argv, options=options, cwd=cwd, env=env, input=input, timeout=timeout)
        norm = normalize or (lambda b: b)
        # A launcher reports death by signal N as 128 + N, like a shell.
        plain_status = 128 - plain.returncode if plain.returncode < 0 else plain.returncode
        self.assertEqual(recorded.returncode, plain_status,
                         "exit status under heapsnap run differs; stderr:\n%s" % recorded.stderr[-3000:].decode(
                             errors="replace"))
        self.assertEqual(norm(recorded.stdout).decode(errors="replace"), norm(plain.stdout).decode(errors="replace"),
                         "stdout under heapsnap run differs")
        self.assertEqual(norm(recorded.stderr).decode(errors="replace"), norm(plain.stderr).decode(errors="replace"),
                         "stderr under heapsnap run differs")
        self.assertTrue(logs, "heapsnap run printed no log path")
        return recorded, logs

    # ---- reading the logs --------------------------------------------------------

    def end_record(self, log):
        """The fields of the log's End record, or None if it has none."""
        out = self.heapsnap("dump", log).stdout
        last = out.rstrip("\n").rsplit("\n", 1)[-1]
        if not last.startswith("end "):
            return None
        return dict(re.findall(r"(\w+)=(\S+)", last))

    def assert_replays(self, log, ended=("exit", "exec")):
        """The log reads back: `markers` succeeds; a log with an exit marker
        snapshots `--at exit`, any other `--at end`. `ended` lists the End
        reasons allowed (None in it allows a log without End record: a
        process that died by a signal). Returns the markers listing."""
        data = self.markers(log)
        self.assertFalse(data["truncated"], "%s is truncated" % log)
        end = self.end_record(log)
        reason = end["reason"] if end else None
        self.assertIn(reason, ended, "%s: End record %s" % (log, end))
        self.assertEqual(data["complete"], end is not None)
        has_exit = any(m["label"] == "exit" and m["cause"] == "exit" for m in data["markers"])
        self.assertEqual(has_exit, reason == "exit", "%s: an exit marker exactly when it ended by exit" % log)
        snap = self.path(os.path.basename(log) + ".hsnap")
        self.heapsnap("snapshot", log, "--at", "exit" if has_exit else "end", "-o", snap)
        self.assertTrue(os.path.isfile(snap))
        data["end"] = reason
        return data

    def process_of(self, log):
        first = self.heapsnap("dump", log).stdout.split("\n", 1)[0]
        self.assertTrue(first.startswith("process "), first)
        return dict(re.findall(r"(\w+)=(\S+)", first))


def pretty(obj):
    return json.dumps(obj, indent=1)
