"""Bad input gives exit status 1 and one line 'heapsnap: error: ...' (never
a stack trace, never an abort); bad usage gives exit status 2."""

import os
import struct
import subprocess

from harness import PROGRAMS_SRC, HeapsnapTest, main

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


class InputErrorTest(HeapsnapTest):
    def log(self):
        return self.single_log("alloc_pattern")

    def write(self, name, data):
        path = self.path(name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def assert_log_error(self, path, needle):
        """Every command that reads a log rejects `path` the same way."""
        for args in (["markers", path], ["snapshot", path, "-o", self.path("x.hsnap")],
                     ["diff", path + "@exit", path + "@exit"]):
            self.assert_error(args, needle)
        # dump prints records as it decodes them, up to the bad spot.
        self.assert_error(["dump", path], needle, streams=True)
        self.assertFalse(os.path.exists(self.path("x.hsnap")), "a failed snapshot left a file")

    def test_missing_file(self):
        missing = self.path("nope.hslog")
        self.assert_log_error(missing, missing + ": No such file or directory")
        snap = self.path("nope.hsnap")
        self.assert_error(["diff", snap, snap], snap + ": No such file or directory")

    def test_not_a_log(self):
        self.assert_log_error(self.write("empty.hslog", b""), "not a heapsnap log (bad magic)")
        self.assert_log_error(self.write("text.hslog", b"NOTHEAPSNAP, just some text\n" * 4),
                              "not a heapsnap log (bad magic)")
        self.assert_error(["markers", self.tmp], self.tmp)

    def test_other_version(self):
        data = bytearray(open(self.log(), "rb").read())
        self.assertEqual(bytes(data[:8]), b"HEAPSNAP")
        self.assertEqual(struct.unpack_from("<I", data, 8)[0], 10)
        struct.pack_into("<I", data, 8, 11)
        self.assert_log_error(self.write("v11.hslog", bytes(data)), "unsupported log format version 11")
        # Version 5 logs (two-byte thread switches only), version 4 logs
        # (no presence byte before a marker's mallinfo2), version 3 logs
        # (no short records), version 2 logs (frees by block id) and
        # version 1 logs (addresses in every record) are not read either.
        for version in (5, 4, 3, 2, 1):
            struct.pack_into("<I", data, 8, version)
            self.assert_log_error(self.write("v%d.hslog" % version, bytes(data)),
                                  "unsupported log format version %d (this heapsnap reads versions 6 to 10)" % version)

    def test_truncated_and_corrupt(self):
        data = open(self.log(), "rb").read()
        self.assert_log_error(self.write("header.hslog", data[:10]), "truncated")
        self.assert_log_error(self.write("frame.hslog", data[:40]), "truncated")
        # The last byte of the first frame is part of its checksum.
        second = data.find(ZSTD_MAGIC, 17)
        self.assertGreater(second, 16)
        bad = bytearray(data)
        bad[second - 1] ^= 0xFF
        self.assert_log_error(self.write("checksum.hslog", bytes(bad)), "corrupt")
        # Garbage after the last frame is corruption, not truncation, for
        # whatever reads that far (a snapshot at a marker may stop before).
        garbage = self.write("garbage.hslog", data + b"\x01\x02\x03\x04garbage" * 3)
        self.assert_error(["markers", garbage], "corrupt")
        self.assert_error(["dump", garbage], "corrupt", streams=True)

    def test_bad_snapshots(self):
        log = self.log()
        good = self.snapshot(log, "-o", self.path("good.hsnap"))
        data = open(good, "rb").read()
        cases = {
            "empty.hsnap": b"",
            "magic.hsnap": b"NOTASNAP" + data[8:],
            "half.hsnap": data[: len(data) // 2],
            "header.hsnap": data[:12],
        }
        newer = bytearray(data)
        struct.pack_into("<I", newer, 8, struct.unpack_from("<I", newer, 8)[0] + 1)
        cases["newer.hsnap"] = bytes(newer)
        for name, content in cases.items():
            path = self.write(name, content)
            self.assert_error(["diff", path, good], name)
            self.assert_error(["diff", good, path], name)
        self.assert_error(["diff", self.path("newer.hsnap"), good], "version")
        # A snapshot is not a log.
        self.assert_error(["markers", good], "not a heapsnap log")

    def test_unknown_marker(self):
        log = self.log()
        self.assert_error(["snapshot", log, "--at", "nosuch", "-o", self.path("x.hsnap")], "no marker")
        self.assert_error(["snapshot", log, "--at", "99", "-o", self.path("x.hsnap")], "no marker")
        self.assert_error(["diff", log + "@nosuch", log + "@exit"], "no marker")
        self.assert_error(["diff", log + "@exit", log + "@7"], "no marker")

    def test_snapshot_of_pid(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        self.assert_error(["snapshot", str(dead.pid), "-o", self.path("x.hsnap")], "no process with PID")
        plain = subprocess.Popen(["sleep", "60"])
        self.addCleanup(plain.wait)
        self.addCleanup(plain.kill)
        self.assert_error(["snapshot", str(plain.pid), "-o", self.path("x.hsnap"), "--timeout", "5"],
                          "is not recorded by heapsnap")
        self.assertFalse(os.path.exists(self.path("x.hsnap")))


class UsageErrorTest(HeapsnapTest):
    def test_usage_errors(self):
        for args in ([], ["--bogus"], ["frobnicate"], ["markers"], ["markers", "x.hslog", "--format", "xml"],
                     ["dump"], ["dump", "x.hslog", "--bogus"], ["diff", "a.hsnap"],
                     ["diff", "a.hsnap", "b.hsnap", "--group-by", "nothing"],
                     ["diff", "a.hsnap", "b.hsnap", "--format", "yaml"], ["diff", "a.hsnap", "b.hsnap", "--top", "x"],
                     ["snapshot"], ["run"], ["run", "--depth", "0", "--", "true"],
                     ["run", "--interval", "-1", "--", "true"]):
            result = self.heapsnap(*args, expect=None)
            self.assertEqual(result.returncode, 2, "heapsnap %s: %s" % (" ".join(args), result.stderr))
            self.assertTrue(result.stderr.startswith("heapsnap: error: "), "heapsnap %s: %s" % (" ".join(args),
                                                                                            result.stderr))
            self.assertNotIn("terminate called", result.stderr)

    def usage_error(self, args):
        """The one line (and the usage hint) of a usage error."""
        result = self.heapsnap(*args, expect=2)
        self.assertEqual(result.stdout, "")
        lines = result.stderr.splitlines()
        self.assertEqual(lines[1:], ["Run 'heapsnap --help' for usage."], result.stderr)
        return lines[0]

    def test_exact_options(self):
        """Counts are whole and never negative, every byte count takes the
        same suffixes, ranges read as a person writes them, typos get a
        suggestion."""
        cases = [
            (["diff", "a", "b", "--top", "-1"], "heapsnap: error: --top: -1 is not a count (0 or more)"),
            (["report", "a", "--top", "-3"], "heapsnap: error: --top: -3 is not a count (0 or more)"),
            (["diff", "a", "b", "--fail-above", "-1"],
             "heapsnap: error: --fail-above: -1 is not a byte count (such as 4096, 64K, 5M or 1G)"),
            (["diff", "a", "b", "--fail-above", "9223372036854775808"],
             "heapsnap: error: --fail-above: 9223372036854775808 is out of range (0 to 9223372036854775807)"),
            (["diff", "a", "b", "--min-bytes", "10X"],
             "heapsnap: error: --min-bytes: 10X is not a byte count (such as 4096, 64K, 5M or 1G)"),
            (["run", "--sample-bytes", "2G", "--", "true"], "heapsnap: error: --sample-bytes: 2G is out of range (1 to 1G)"),
            (["run", "--depth", "257", "--", "true"], "heapsnap: error: --depth: 257 is out of range (1 to 256)"),
            (["run", "--interval", "0", "--", "true"],
             "heapsnap: error: --interval: 0 is out of range (0.001 to 86400 s)"),
            (["snapshot", "1", "--timeout", "0"], "heapsnap: error: --timeout: 0 is out of range (0.1 to 3600 s)"),
            (["ps", "--timeout", "abc"], "heapsnap: error: --timeout: abc is not a number (0.1 to 3600 s)"),
            (["diff", "a", "b", "--fail-on-leak-confidence", "2"],
             "heapsnap: error: --fail-on-leak-confidence: 2 is out of range (0 to 1)"),
            (["diff", "a", "b", "--format", "jsn"],
             "heapsnap: error: --format: jsn is not one of text, json, csv, folded, svg (did you mean json?)"),
            (["diff", "a", "b", "--formt", "json"],
             "heapsnap: error: The following argument was not expected: --formt (did you mean --format?)"),
            (["markrs", "x.hslog"], "heapsnap: error: unknown command 'markrs' (did you mean markers?)"),
            (["run", "true", "-v"],
             "heapsnap: error: The following argument was not expected: -v; options after PROGRAM are PROGRAM's only "
             "after --: heapsnap run [OPTIONS] -- PROGRAM [ARGS...]"),
        ]
        for args, line in cases:
            with self.subTest(args=args):
                self.assertEqual(self.usage_error(args), line)

    def test_size_suffixes(self):
        """--min-bytes 10K as --sample-bytes 512K: the same suffixes."""
        log = self.single_log("alloc_pattern")
        base = self.json_of("diff", log + "@0s", log + "@exit", "--format", "json")
        self.assertTrue(base["entries"])
        for value, bytes_ in (("10K", 10240), ("10KiB", 10240), ("1M", 1 << 20), ("0", 0)):
            with self.subTest(value=value):
                kept = self.json_of("diff", log + "@0s", log + "@exit", "--format", "json", "--min-bytes", value)
                self.assertEqual(kept["entries"], [e for e in base["entries"] if abs(e["bytes_delta"]) >= bytes_])
        growth = base["total"]["bytes_delta"]
        self.assertGreater(growth, 1024)
        self.heapsnap("diff", log + "@0s", log + "@exit", "--fail-above", "1K", expect=3)
        self.heapsnap("diff", log + "@0s", log + "@exit", "--fail-above", "1G", expect=0)

    def test_snapshot_with_a_moment(self):
        """A snapshot file is one moment: naming another is an error, not
        a silent fallback to the one it holds."""
        log = self.single_log("alloc_pattern")
        snap = self.path("a.hsnap")
        self.heapsnap("snapshot", log, "--at", "exit", "-o", snap)
        for args in (["diff", snap + "@999", snap], ["diff", snap, snap + "@1"], ["maps", snap + "@exit"],
                     ["report", snap + "@2"]):
            with self.subTest(args=args):
                moment = args[1].split("@")[1] if "@" in args[1] else args[2].split("@")[1]
                self.assert_error(args, "%s@%s: a snapshot file has one moment; drop @%s" % (snap, moment, moment))

    def test_help_and_version(self):
        self.assertIn("snapshot", self.heapsnap("--help").stdout)
        self.assertEqual(self.heapsnap("--version").stdout.strip(), "heapsnap 0.1.0")


class BenchUsageTest(HeapsnapTest):
    """tools/bench's usage is checked before it builds anything: one line
    on stderr, exit status 2 (1 for a COMMAND that is not there), nothing
    run."""

    BENCH = os.path.join(PROGRAMS_SRC, "..", "..", "tools", "bench")

    def assert_bench_error(self, args, line, status=2):
        r = subprocess.run([self.BENCH, *args], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, status, r.stderr)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr, line + "\n")

    def test_command_with_a_builtin_choice(self):
        self.assert_bench_error(["--only", "perl", "--", "true"],
                                "bench: --only and --quick choose among the built-in workloads, not with a COMMAND")
        self.assert_bench_error(["--quick", "--", "true"],
                                "bench: --only and --quick choose among the built-in workloads, not with a COMMAND")

    def test_name_without_command(self):
        self.assert_bench_error(["--name", "mine"], "bench: --name names a COMMAND's row; give one after --")

    def test_missing_command(self):
        self.assert_bench_error(["--", "no-such-command-here"], "bench: no-such-command-here: command not found",
                                status=1)

    def test_no_runs(self):
        self.assert_bench_error(["--runs", "0", "--", "true"], "bench: --runs must be at least 1")
        self.assert_bench_error(["--stop-time", "--runs", "0"], "bench: --runs must be at least 1")

    def test_stop_time_alone(self):
        self.assert_bench_error(["--stop-time", "--quick"], "bench: --stop-time runs alone; it takes only --runs")


if __name__ == "__main__":
    main()
