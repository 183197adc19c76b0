"""Shared helpers of the integration tests: run the real `heapsnap` CLI on
the programs of tests/programs and read its machine-readable output.

Standard library only. Meson sets the environment:
  HEAPSNAP              the heapsnap binary
  HEAPSNAP_PRELOAD_LIB  libheapsnap_preload.so (also read by `heapsnap run`)
  PROGRAMS_DIR          the built test programs
  PROGRAMS_SRC          their sources (tests find line numbers by @site:NAME)
  PLUGIN                the built leaky_plugin shared object
HEAPSNAP_KEEP_TMP=1 keeps each test's temporary directory for a post-mortem.

Every test runs its programs in a fresh temporary directory, so logs and
snapshots of different tests never mix.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HEAPSNAP = os.environ.get("HEAPSNAP", "")
PRELOAD = os.environ.get("HEAPSNAP_PRELOAD_LIB", "")
PROGRAMS_DIR = os.environ.get("PROGRAMS_DIR", "")
PROGRAMS_SRC = os.environ.get("PROGRAMS_SRC", "")
PLUGIN = os.environ.get("PLUGIN", "")

PAGE = os.sysconf("SC_PAGE_SIZE")
TIMEOUT = 120

LOG_LINE = re.compile(r"^heapsnap: log: (/.*)$")
FIELD = re.compile(r'([A-Za-z_][\w-]*)=("(?:[^"\\]|\\.)*"|\S*)')


def program(name):
    return os.path.join(PROGRAMS_DIR, name)


def site_line(source, site):
    """The 1-based line of `source` that carries the comment @site:SITE."""
    pattern = re.compile(r"@site:%s(?![\w])" % re.escape(site))
    with open(os.path.join(PROGRAMS_SRC, source)) as f:
        lines = [n for n, text in enumerate(f, 1) if pattern.search(text)]
    if len(lines) != 1:
        raise AssertionError("@site:%s occurs %d times in %s" % (site, len(lines), source))
    return lines[0]


def function_matches(name, wanted):
    """A frame's function is `wanted`: exactly, or as a demangled C++ name
    with its parameter list ("grow_vector()")."""
    return name == wanted or (name or "").startswith(wanted + "(")


def frame_index(entry, function):
    for i, frame in enumerate(entry["frames"]):
        if function_matches(frame.get("function"), function):
            return i
    return -1


def entries_with(diff, function):
    return [e for e in diff["entries"] if frame_index(e, function) >= 0]


def unescape(body):
    """The text `heapsnap dump` escaped between double quotes (\\", \\\\,
    \\xNN) as it was."""
    return re.sub(r'\\(x[0-9a-f]{2}|["\\])', lambda m: chr(int(m.group(1)[1:], 16)) if len(m.group(1)) == 3 else m.group(1),
                  body)


def split_argv(value):
    """The arguments of a dump's argv= field as printed (quoted or not):
    split on commas first, then unescaped (an argument's own comma is
    \\x2c)."""
    if value.startswith('"'):
        return [unescape(a) for a in value[1:-1].split(",")]
    return value.split(",")


def parse_dump(text):
    """`heapsnap dump` output as a list of (kind, {field: value}); quoted
    values are unquoted."""
    records = []
    for line in text.splitlines():
        if not line.strip():
            continue
        kind, _, rest = line.partition(" ")
        fields = {}
        for key, value in FIELD.findall(rest):
            if value.startswith('"'):
                value = unescape(value[1:-1])
            fields[key] = value
        records.append((kind, fields))
    return records


class Growth:
    """tests/programs/growth in its interactive mode under `heapsnap run`:
    send a command, get its one-line answer (see growth.c)."""

    def __init__(self, test, *run_options, env=None):
        self.test = test
        self.proc = subprocess.Popen([HEAPSNAP, "run", *run_options, "--", program("growth")], cwd=test.tmp,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, bufsize=1, env=dict(os.environ, **(env or {})))
        test.addCleanup(self.kill)
        ready = self.proc.stdout.readline()
        m = re.match(r"ready pid=(\d+)$", ready.strip())
        test.assertTrue(m, "growth said %r; stderr: %s" % (ready, self.stderr_if_dead()))
        self.pid = int(m.group(1))

    def stderr_if_dead(self):
        return self.proc.stderr.read() if self.proc.poll() is not None else "(running)"

    def send(self, command, answer=None):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().rstrip("\n")
        if answer is not None:
            self.test.assertEqual(line, answer, "answer to %r" % command)
        return line

    def finish(self, expect=0):
        """Ends the program ('quit'); returns the log paths `run` printed."""
        out, err = self.proc.communicate("quit\n", timeout=TIMEOUT)
        self.test.assertEqual(self.proc.returncode, expect, "heapsnap run -- growth: " + err)
        return self.test.logs_of(err)

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class HeapsnapTest(unittest.TestCase):
    maxDiff = None

    @classmethod
    def setUpClass(cls):
        missing = [n for n, v in (("HEAPSNAP", HEAPSNAP), ("HEAPSNAP_PRELOAD_LIB", PRELOAD),
                                  ("PROGRAMS_DIR", PROGRAMS_DIR), ("PROGRAMS_SRC", PROGRAMS_SRC)) if not v]
        if missing:
            raise unittest.SkipTest("not run by meson: %s unset" % ", ".join(missing))

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="heapsnap-%s-" % self._testMethodName)
        if os.environ.get("HEAPSNAP_KEEP_TMP"):
            sys.stderr.write("keeping %s\n" % self.tmp)
        else:
            self.addCleanup(shutil.rmtree, self.tmp, True)

    def path(self, name):
        return os.path.join(self.tmp, name)

    # ---- running things ---------------------------------------------------

    def run_cmd(self, args, expect=None, input=None, env=None, timeout=TIMEOUT):
        """Runs args in the test directory; checks the exit status if
        `expect` is given. Returns the CompletedProcess (text)."""
        full_env = dict(os.environ)
        if env:
            full_env.update(env)
        result = subprocess.run(args, cwd=self.tmp, input=input, capture_output=True, text=True,
                                env=full_env, timeout=timeout)
        if expect is not None and result.returncode != expect:
            self.fail("%s\nexit status %d, expected %d\n--- stdout:\n%s--- stderr:\n%s" % (
                " ".join(args), result.returncode, expect, result.stdout[-4000:], result.stderr[-4000:]))
        return result

    def heapsnap(self, *args, expect=0, input=None, env=None):
        return self.run_cmd([HEAPSNAP] + [str(a) for a in args], expect=expect, input=input, env=env)

    def record(self, name, *args, expect=0, options=(), input=None):
        """`heapsnap run [options] -- PROGRAM args`; returns the log paths it
        printed, in order."""
        result = self.heapsnap("run", *options, "--", program(name), *args, expect=expect, input=input)
        logs = self.logs_of(result.stderr)
        self.assertTrue(logs, "heapsnap run printed no log path:\n" + result.stderr)
        return logs

    def logs_of(self, stderr):
        logs = [m.group(1) for m in map(LOG_LINE.match, stderr.splitlines()) if m]
        for log in logs:
            self.assertTrue(os.path.isfile(log), "printed log %s does not exist" % log)
        return logs

    def single_log(self, name, *args, **kwargs):
        logs = self.record(name, *args, **kwargs)
        self.assertEqual(len(logs), 1, "expected one log, got %s" % logs)
        return logs[0]

    # ---- reading output ---------------------------------------------------

    def json_of(self, *args, expect=0):
        result = self.heapsnap(*args, expect=expect)
        try:
            return json.loads(result.stdout)
        except ValueError as e:
            self.fail("heapsnap %s: not JSON (%s):\n%s" % (" ".join(map(str, args)), e, result.stdout[:2000]))

    def markers(self, log):
        data = self.json_of("markers", log, "--format", "json")
        self.assertEqual(data["format"], "heapsnap-markers")
        self.assertEqual(data["version"], 1)
        return data

    def marker(self, log, label):
        found = [m for m in self.markers(log)["markers"] if m["label"] == label]
        self.assertEqual(len(found), 1, "markers labelled %r in %s: %s" % (label, log, found))
        return found[0]

    def diff(self, old, new, *options, expect=0):
        data = self.json_of("diff", old, new, "--format", "json", *options, expect=expect)
        self.assertEqual(data["format"], "heapsnap-diff")
        self.assertEqual(data["version"], 1)
        return data

    def dump(self, log):
        return parse_dump(self.heapsnap("dump", log).stdout)

    def snapshot(self, source, *options):
        """`heapsnap snapshot SOURCE options`; returns the path it printed."""
        result = self.heapsnap("snapshot", source, *options)
        lines = result.stdout.strip().splitlines()
        self.assertEqual(len(lines), 1, "snapshot printed: %r" % result.stdout)
        path = lines[0]
        if not os.path.isabs(path):
            path = os.path.join(self.tmp, path)
        self.assertTrue(os.path.isfile(path), "snapshot %s does not exist" % path)
        return path

    # ---- assertions ---------------------------------------------------------

    def entry(self, diff, function):
        found = entries_with(diff, function)
        self.assertEqual(len(found), 1, "entries with %s: %s" % (function, json.dumps(found, indent=1)))
        return found[0]

    def assert_entry(self, diff, function, bytes_delta, blocks_delta, old_bytes=None, old_blocks=None):
        e = self.entry(diff, function)
        got = (e["bytes_delta"], e["blocks_delta"])
        self.assertEqual(got, (bytes_delta, blocks_delta), "entry of %s: %s" % (function, json.dumps(e, indent=1)))
        if old_bytes is not None:
            self.assertEqual((e["old_bytes"], e["new_bytes"]), (old_bytes, old_bytes + bytes_delta))
        if old_blocks is not None:
            self.assertEqual((e["old_blocks"], e["new_blocks"]), (old_blocks, old_blocks + blocks_delta))
        return e

    def assert_frame(self, frame, function, source, line, inlined=False):
        self.assertTrue(function_matches(frame["function"], function), "frame %s is not %s" % (frame, function))
        self.assertEqual(os.path.basename(frame["file"] or ""), source, "frame %s" % frame)
        self.assertEqual(frame["line"], line, "frame %s" % frame)
        self.assertEqual(bool(frame["inlined"]), inlined, "frame %s" % frame)

    def assert_site(self, diff, function, source, site, bytes_delta, blocks_delta, inlined=False, **kw):
        """The one entry through `function` has these deltas, and its first
        frame is `function` at the @site line of `source`."""
        e = self.assert_entry(diff, function, bytes_delta, blocks_delta, **kw)
        self.assertEqual(e.get("kind", "heap"), "heap")
        self.assert_frame(e["frames"][0], function, source, site_line(source, site), inlined=inlined)
        return e

    def assert_no_recorder_frames(self, diff):
        for e in diff["entries"]:
            for f in e["frames"]:
                self.assertNotIn("libheapsnap_preload", f.get("module") or "", "recorder frame shown: %s" % e)

    def assert_error(self, args, needle, status=1, env=None, streams=False):
        """A clean failure: the status, nothing on stdout (unless the command
        `streams` its output as it reads), and exactly one line on stderr,
        'heapsnap: error: ...' containing `needle`."""
        result = self.heapsnap(*args, expect=None, env=env)
        self.assertEqual(result.returncode, status, "heapsnap %s\nstderr: %s" % (" ".join(map(str, args)), result.stderr))
        if not streams:
            self.assertEqual(result.stdout, "", "stdout of a failed command")
        lines = result.stderr.strip("\n").splitlines()
        if status == 1:
            self.assertEqual(len(lines), 1, "expected one error line, got:\n" + result.stderr)
        self.assertTrue(lines and lines[0].startswith("heapsnap: error: "), "stderr: " + result.stderr)
        self.assertIn(needle, result.stderr)
        return result


def main():
    unittest.main(verbosity=2)
