"""report, trends and flame graphs on trend.c, whose call sites are a leak
(leak_request), an index that warms up, growing by less and less
(warm_index), a cache that fills in two rounds and then stays flat
(cache_fill), noise that comes and goes (noise_buffers) and a size mix
with one large block (size_mix). Every number below is derived in the
header comment of tests/programs/trend.c."""

import csv
import io
import os
import xml.etree.ElementTree as ET

from harness import HeapsnapTest, main, site_line

SRC = "trend.c"
MOMENTS = ["r1", "r2", "r3", "r4", "r5", "exit"]
# The trend over LOG@*, in its order: function, @site of the allocation,
# @site of the call in main, series, blocks series, leak confidence,
# flagged, monotonic.
TREND = [
    ("leak_request", "leak_request", "call_leak", [10000, 20000, 30000, 40000, 50000, 50000],
     [10, 20, 30, 40, 50, 50], 1, True, True),
    ("warm_index", "warm_index", "call_warm", [98304, 180224, 184320, 186368, 187392, 187392],
     [96, 176, 180, 182, 183, 183], 0.6333, False, True),
    ("cache_fill", "cache_fill", "call_cache", [65536, 131072, 131072, 131072, 131072, 131072],
     [64, 128, 128, 128, 128, 128], 0.1, False, True),
    ("noise_buffers", "noise_buffers", "call_noise", [9000, 0, 9000, 0, 9000, 9000],
     [3, 0, 3, 0, 3, 3], 0, False, False),
]
# libc's start-up frames vary with the system's debug information; without
# them a stack is exactly the program's frames.
NO_LIBC = ("--exclude", "^__libc|^_start")

# The moment r5: call sites by bytes as (function, @site, bytes, blocks,
# allocations up to r5).
R5_LIVE = (587860, 374)
R5_SITES = [
    ("size_mix", "mix_large", 200000, 1, 1),
    ("warm_index", "warm_index", 187392, 183, 183),
    ("cache_fill", "cache_fill", 131072, 128, 128),
    ("leak_request", "leak_request", 50000, 50, 50),
    ("size_mix", "mix_small", 10396, 9, 9),
    ("noise_buffers", "noise_buffers", 9000, 3, 9),
]
R5_BY_BLOCKS = ["warm_index", "cache_fill", "leak_request", "mix_small", "noise_buffers", "mix_large"]
# function, bytes, blocks, sites
R5_FUNCTIONS = [
    ("size_mix", 210396, 10, 2),
    ("warm_index", 187392, 183, 1),
    ("cache_fill", 131072, 128, 1),
    ("leak_request", 50000, 50, 1),
    ("noise_buffers", 9000, 3, 1),
]
# min, max, blocks, bytes, large
R5_SIZES = [
    (16, 31, 4, 96, False),
    (64, 127, 3, 300, False),
    (512, 1023, 50, 50000, False),
    (1024, 2047, 311, 318464, False),
    (2048, 4095, 3, 9000, False),
    (4096, 8191, 2, 10000, False),
    (131072, 262143, 1, 200000, True),
]


def folded_label(frame):
    """A frame as folded output names it: its function, else module+0xOFFSET."""
    if frame["function"]:
        return frame["function"]
    return "%s+0x%x" % (os.path.basename(frame["module"]), frame["offset"])


class TrendProgramTest(HeapsnapTest):
    def record_trend(self):
        log = self.path("t.hslog")
        self.assertEqual(self.single_log("trend", options=("-o", log)), log)
        return log

    def trend(self, *args, expect=0):
        data = self.json_of("diff", *args, "--format", "json", expect=expect)
        self.assertEqual(data["format"], "heapsnap-trend")
        self.assertEqual(data["version"], 2)
        return data

    def report(self, target, *options):
        data = self.json_of("report", target, "--format", "json", *options)
        self.assertEqual(data["format"], "heapsnap-report")
        self.assertEqual(data["version"], 1)
        return data

    def assert_program_frames(self, frames, function, site, caller_site=None):
        self.assert_frame(frames[0], function, SRC, site_line(SRC, site))
        self.assertEqual(os.path.basename(frames[0]["module"]), "trend")
        if caller_site:
            self.assert_frame(frames[1], "main", SRC, site_line(SRC, caller_site))


class TrendTest(TrendProgramTest):
    def assert_trend(self, data, moments):
        n = len(moments)
        self.assertEqual([m["label"] for m in data["moments"]], moments)
        self.assertEqual(len({m["pid"] for m in data["moments"]}), 1)
        self.assertEqual(data["flag_threshold"], 0.75)
        self.assertEqual(data["changed_sites"], len(TREND))
        self.assertEqual(data["warnings"], [])
        self.assertEqual([e["frames"][0]["function"] for e in data["entries"]], [t[0] for t in TREND])
        for e, (function, site, call, series, blocks, confidence, flagged, monotonic) in zip(data["entries"], TREND):
            self.assertEqual(e["series"], series[:n], function)
            self.assertEqual(e["blocks_series"], blocks[:n], function)
            self.assertEqual(e["leak_confidence"], confidence, function)
            self.assertEqual(e["flagged"], flagged, function)
            self.assertEqual(e["monotonic"], monotonic, function)
            self.assertEqual(e["bytes_delta"], series[n - 1] - series[0], function)
            self.assertEqual(e["blocks_delta"], blocks[n - 1] - blocks[0], function)
            self.assertEqual(e["kind"], "heap")
            self.assert_program_frames(e["frames"], function, site, call)
        self.assert_no_recorder_frames(data)

    def test_every_marker(self):
        log = self.record_trend()
        data = self.trend(log + "@*")
        # The exit step is idle (no event after r5): left out of the score,
        # so the leak still scores 1 although its series ends flat.
        self.assert_trend(data, MOMENTS)
        leak, warm, cache, noise = data["entries"]
        self.assertGreaterEqual(leak["leak_confidence"], data["flag_threshold"])
        # The warm-up grew at every step, as the leak did, but by less and
        # less: not flagged.
        self.assertEqual([b - a for a, b in zip(warm["series"], warm["series"][1:5])], [81920, 4096, 2048, 1024])
        self.assertLess(warm["leak_confidence"], data["flag_threshold"])
        self.assertLess(cache["leak_confidence"], warm["leak_confidence"])
        self.assertLess(noise["leak_confidence"], cache["leak_confidence"])
        # --top keeps the first entries, changed_sites counts them all.
        top = self.trend(log + "@*", "--top", "1")
        self.assertEqual(top["changed_sites"], 4)
        self.assertEqual(top["entries"], data["entries"][:1])

    def test_snapshots(self):
        log = self.record_trend()
        snaps = [self.snapshot(log, "--at", label, "-o", self.path(label + ".hsnap")) for label in MOMENTS[:5]]
        self.assert_trend(self.trend(*snaps), MOMENTS[:5])
        # The same moments named in the log: the same document but for the
        # sources.
        named = self.trend(*[log + "@" + label for label in MOMENTS[:5]])
        self.assertEqual(named["entries"], self.trend(*snaps)["entries"])

    def test_fail_on_leak_confidence(self):
        log = self.record_trend()
        every = log + "@*"
        result = self.heapsnap("diff", every, "--fail-on-leak-confidence", "0.75", expect=3)
        self.assertEqual(result.stderr,
                         "heapsnap: a call site has leak confidence 1, at or above --fail-on-leak-confidence 0.75\n")
        self.assertTrue(result.stdout.startswith("heapsnap trend: 6 moments"), result.stdout[:200])
        self.heapsnap("diff", every, "--fail-on-leak-confidence", "1", expect=3)
        # Without the leak (--min-bytes 40001 leaves the warm-up, +89088
        # bytes at 0.6333, and the cache, +65536 at 0.1), the gate at 0.75
        # passes; only a gate at or below 0.6333 fails.
        gated = self.trend(every, "--min-bytes", "40001", "--fail-on-leak-confidence", "0.75")
        self.assertEqual([(e["frames"][0]["function"], e["leak_confidence"]) for e in gated["entries"]],
                         [("warm_index", 0.6333), ("cache_fill", 0.1)])
        self.heapsnap("diff", every, "--min-bytes", "40001", "--fail-on-leak-confidence", "0.6334", expect=0)
        result = self.heapsnap("diff", every, "--min-bytes", "40001", "--fail-on-leak-confidence", "0.6333", expect=3)
        self.assertIn("leak confidence 0.6333, at or above", result.stderr)
        # A two-moment diff has no confidence: a usage error.
        result = self.heapsnap("diff", log + "@r1", log + "@r5", "--fail-on-leak-confidence", "0.5", expect=2)
        self.assertIn("--fail-on-leak-confidence: needs a trend", result.stderr)

    def test_every_marker_of_missing_log(self):
        # A missing LOG in LOG@* is named, as for LOG@MARKER, not taken for
        # a missing NEW argument.
        self.assert_error(["diff", "nope.hslog@*"], "nope.hslog: No such file or directory")

    def test_text_bytes(self):
        log = self.record_trend()
        lines = self.heapsnap("diff", log + "@*", "--bytes", "--color", "never", *NO_LIBC).stdout.splitlines()
        self.assertEqual(lines[0], "heapsnap trend: 6 moments, 4 call sites changed, 1 flagged as leaking "
                                   "(confidence >= 0.75)")
        self.assertRegex(lines[5], r'^    5  pid \d+  trend  marker 5 "r5" at \d+\.\d{3} s  live 587860 in 374 blocks$')
        self.assertRegex(lines[6], r'^    6  pid \d+  trend  marker 6 "exit" at \d+\.\d{3} s  live 587860 in 374 blocks$')
        self.assertEqual(lines[8], "LEAK  confidence 1.00      +40000 (+40 blocks)  heap  monotonic")
        self.assertEqual(lines[9], "      live: 10000 -> 20000 -> 30000 -> 40000 -> 50000 -> 50000")
        self.assertEqual(lines[10].split()[0], "leak_request")
        self.assertTrue(lines[10].split()[1].endswith("/trend.c:%d" % site_line(SRC, "leak_request")), lines[10])
        self.assertEqual(lines[11].split()[0], "main")
        self.assertEqual(lines[13], "      confidence 0.63      +89088 (+87 blocks)  heap  monotonic")
        self.assertEqual(lines[14], "      live: 98304 -> 180224 -> 184320 -> 186368 -> 187392 -> 187392")
        self.assertEqual(lines[15].split()[0], "warm_index")
        self.assertEqual(lines[18], "      confidence 0.10      +65536 (+64 blocks)  heap  monotonic")
        self.assertEqual(lines[19], "      live: 65536 -> 131072 -> 131072 -> 131072 -> 131072 -> 131072")
        self.assertEqual(lines[23], "      confidence 0.00           0 (0 blocks)  heap")
        self.assertEqual(lines[24], "      live: 9000 -> 0 -> 9000 -> 0 -> 9000 -> 9000")

    def test_csv(self):
        log = self.record_trend()
        out = self.heapsnap("diff", log + "@*", "--format", "csv", *NO_LIBC).stdout
        self.assertEqual(out.splitlines(), [
            "leak_confidence,bytes_delta,blocks_delta,monotonic,kind,allocating_frame,stack,"
            "bytes_1,bytes_2,bytes_3,bytes_4,bytes_5,bytes_6",
            "1.0000,40000,40,1,heap,leak_request,leak_request;main,10000,20000,30000,40000,50000,50000",
            "0.6333,89088,87,1,heap,warm_index,warm_index;main,98304,180224,184320,186368,187392,187392",
            "0.1000,65536,64,1,heap,cache_fill,cache_fill;main,65536,131072,131072,131072,131072,131072",
            "0.0000,0,0,0,heap,noise_buffers,noise_buffers;main,9000,0,9000,0,9000,9000",
        ])

    def test_folded(self):
        log = self.record_trend()
        growth = ["main;cache_fill 65536", "main;leak_request 40000", "main;warm_index 89088"]
        out = self.heapsnap("diff", log + "@r1", log + "@r5", "--format", "folded", *NO_LIBC).stdout
        self.assertEqual(out.splitlines(), growth)
        # A trend draws the growth from its first to its last moment.
        out = self.heapsnap("diff", log + "@*", "--format", "folded", *NO_LIBC).stdout
        self.assertEqual(out.splitlines(), growth)
        # With every frame: outermost first, exactly the frames of the JSON
        # diff reversed.
        diff = self.diff(log + "@r1", log + "@r5")
        leak = self.entry(diff, "leak_request")
        self.assertEqual(leak["bytes_delta"], 40000)
        expected = ";".join(folded_label(f) for f in reversed(leak["frames"])) + " 40000"
        self.assertTrue(expected.endswith(";main;leak_request 40000"), expected)
        out = self.heapsnap("diff", log + "@r1", log + "@r5", "--format", "folded").stdout.splitlines()
        self.assertEqual(len(out), 3, out)
        self.assertEqual(out[1], expected)

    def svg_titles(self, text):
        root = ET.fromstring(text)
        self.assertEqual(root.tag, "{http://www.w3.org/2000/svg}svg")
        self.assertEqual([e for e in root.iter() if e.tag.endswith("script")], [])
        return [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]

    def test_svg(self):
        log = self.record_trend()
        titles = self.svg_titles(self.heapsnap("diff", log + "@r1", log + "@r5", "--format", "svg").stdout)
        self.assertEqual(titles[0], "all (194624 bytes, 190.1 KiB, 100.00%)")
        self.assertIn("leak_request (40000 bytes, 39.1 KiB, 20.55%)", titles)
        self.assertIn("cache_fill (65536 bytes, 64.0 KiB, 33.67%)", titles)
        self.assertIn("warm_index (89088 bytes, 87.0 KiB, 45.77%)", titles)
        self.assertFalse([t for t in titles if t.startswith("noise_buffers")], titles)
        titles = self.svg_titles(self.heapsnap("diff", log + "@*", "--format", "svg").stdout)
        self.assertIn("leak_request (40000 bytes, 39.1 KiB, 20.55%)", titles)
        text = self.heapsnap("report", log + "@r5", "--format", "svg").stdout
        self.assertIn("Live heap of trend at &quot;r5&quot;", text)
        titles = self.svg_titles(text)
        self.assertEqual(titles[0], "all (587860 bytes, 574.1 KiB, 100.00%)")
        self.assertIn("leak_request (50000 bytes, 48.8 KiB, 8.51%)", titles)
        self.assertIn("size_mix (210396 bytes, 205.5 KiB, 35.79%)", titles)


class ReportTest(TrendProgramTest):
    def assert_r5_sites(self, data, with_activity):
        self.assertEqual(data["totals"]["sites"], len(R5_SITES))
        sites = data["sites_by_bytes"]
        self.assertEqual(len(sites), len(R5_SITES))
        for s, (function, site, size, blocks, allocations) in zip(sites, R5_SITES):
            self.assertEqual((s["bytes"], s["blocks"], s["kind"]), (size, blocks, "heap"), function)
            self.assertEqual(s["allocations"], allocations if with_activity else None, function)
            self.assertEqual(s["temporary"], 0 if with_activity else None, function)
            self.assert_program_frames(s["frames"], function, site)
            self.assertGreaterEqual(s["age_oldest_s"], s["age_newest_s"])
            self.assertGreater(s["age_newest_s"], 0)
        # The leak keeps allocating: its oldest block is from round 1, its
        # newest from round 5. The large block is one block.
        leak, large = sites[3], sites[0]
        self.assertGreater(leak["age_oldest_s"], leak["age_newest_s"])
        self.assertEqual(large["age_oldest_s"], large["age_newest_s"])
        self.assertEqual([s["frames"][0]["line"] for s in data["sites_by_blocks"]],
                         [site_line(SRC, name) for name in R5_BY_BLOCKS])
        self.assertEqual([(g["frame"]["function"], g["bytes"], g["blocks"], g["sites"]) for g in data["functions"]],
                         R5_FUNCTIONS)
        self.assertEqual(len(data["modules"]), 1)
        module = data["modules"][0]
        self.assertEqual(os.path.basename(module["frame"]["module"]), "trend")
        self.assertEqual((module["bytes"], module["blocks"], module["sites"]), R5_LIVE + (len(R5_SITES),))

    def assert_r5_totals(self, data):
        t = data["totals"]
        self.assertEqual((t["live_bytes"], t["live_blocks"]), R5_LIVE)
        self.assertEqual((t["mmap_bytes"], t["mmap_regions"]), (0, 0))
        self.assertEqual(t["allocations"], 530)
        self.assertEqual(t["untracked_frees"], 0)
        # The last noise block of round 5 makes the peak.
        self.assertEqual(t["peak_bytes"], R5_LIVE[0])
        self.assertLessEqual(t["peak_time_s"], data["moment"]["time_s"])
        self.assertEqual((data["moment"]["label"], data["moment"]["marker_index"]), ("r5", 5))

    def test_log_moment(self):
        log = self.record_trend()
        data = self.report(log + "@r5", "--top", "0")
        self.assertEqual(data["source_kind"], "log")
        self.assertEqual(data["warnings"], [])
        self.assert_r5_totals(data)
        self.assert_r5_sites(data, with_activity=True)
        sizes = data["sizes"]
        self.assertEqual([(c["min"], c["max"], c["blocks"], c["bytes"], c["large"]) for c in sizes["classes"]],
                         R5_SIZES)
        self.assertEqual((sizes["large_threshold"], sizes["large_blocks"], sizes["large_bytes"]), (131072, 1, 200000))
        h = data["history"]
        self.assertEqual((h["heap_allocations"], h["temporary_allocations"]), (530, 150))
        self.assertEqual((h["peak"]["live_bytes"], h["peak"]["live_blocks"]), R5_LIVE)
        self.assertEqual(h["peak"]["time_s"], data["totals"]["peak_time_s"])
        temporary = h["sites_by_temporary"]
        self.assertEqual([(s["temporary"], s["allocations"], s["bytes"], s["blocks"]) for s in temporary],
                         [(150, 150, 0, 0)])
        self.assert_program_frames(temporary[0]["frames"], "noise_buffers", "noise_churn", "call_noise")
        self.assertEqual(sum(b["allocations"] for b in h["rate"]), 530)
        self.assertLessEqual(len(h["rate"]), 20)
        # --top 1 keeps one row per list.
        top = self.report(log + "@r5", "--top", "1")
        self.assertEqual(top["functions"], data["functions"][:1])
        self.assertEqual(top["sites_by_bytes"], data["sites_by_bytes"][:1])
        self.assertEqual(top["totals"], data["totals"])

    def test_history_up_to_the_moment(self):
        log = self.record_trend()
        data = self.report(log + "@r2", "--top", "0")
        # 10 mix + 20 leak + 128 cache + 176 warm + 30 churn + 3 noise
        # allocations; the peak was before round 2 freed the noise blocks,
        # with one churn block live.
        self.assertEqual(data["totals"]["allocations"], 367)
        self.assertEqual((data["totals"]["live_bytes"], data["totals"]["live_blocks"]), (541692, 334))
        h = data["history"]
        self.assertEqual((h["heap_allocations"], h["temporary_allocations"]), (367, 30))
        self.assertEqual((h["peak"]["live_bytes"], h["peak"]["live_blocks"]), (550756, 338))
        peak = [(s["frames"][0]["line"], s["bytes"], s["blocks"], s["age_oldest_s"], s["allocations"])
                for s in h["peak"]["sites"]]
        self.assertEqual(peak, [(site_line(SRC, site), size, blocks, None, None) for site, size, blocks in (
            ("mix_large", 200000, 1), ("warm_index", 180224, 176), ("cache_fill", 131072, 128), ("leak_request", 20000, 20),
            ("mix_small", 10396, 9), ("noise_buffers", 9000, 3), ("noise_churn", 64, 1))])
        # A log without @ is its exit: everything, as at r5.
        at_exit = self.report(log)
        self.assertEqual(at_exit["moment"]["label"], "exit")
        self.assertEqual((at_exit["totals"]["live_bytes"], at_exit["history"]["heap_allocations"]), (587860, 530))

    def test_snapshot(self):
        log = self.record_trend()
        snap = self.snapshot(log, "--at", "r5", "-o", self.path("r5.hsnap"))
        data = self.report(snap, "--top", "0")
        self.assertEqual(data["source_kind"], "snapshot")
        self.assertIsNone(data["sizes"])
        self.assertIsNone(data["history"])
        self.assert_r5_totals(data)
        self.assert_r5_sites(data, with_activity=False)
        text = self.heapsnap("report", snap, "--bytes", "--color", "never").stdout.splitlines()
        self.assertIn("  temporary         not available for a snapshot", text)
        self.assertIn("  not available for a snapshot (report the log instead: heapsnap report LOG@MARKER)", text)
        self.assertEqual(sum("not available for a snapshot" in line for line in text), 5, "\n".join(text))
        for table, name in (("sizes", "size"), ("rate", "rate")):
            self.assert_error(["report", snap, "--format", "csv", "--table", table],
                              "the %s table is not available for a snapshot" % name)
        # The tables a snapshot has.
        rows = self.heapsnap("report", snap, "--format", "csv", "--table", "functions").stdout.splitlines()
        self.assertEqual(rows[0], "bytes,blocks,kind,sites,function,file,module")
        self.assertEqual([",".join(r[:5]) for r in csv.reader(rows[1:])],
                         ["%d,%d,heap,%d,%s" % (b, n, s, f) for f, b, n, s in R5_FUNCTIONS])

    def test_csv(self):
        log = self.record_trend()
        out = self.heapsnap("report", log + "@r5", "--format", "csv", "--top", "0", *NO_LIBC).stdout
        rows = list(csv.reader(io.StringIO(out)))
        self.assertEqual(",".join(rows[0]),
                         "bytes,blocks,kind,age_oldest_s,age_newest_s,allocations,temporary,allocating_frame,stack")
        self.assertEqual([(r[0], r[1], r[2], r[5], r[6], r[7], r[8]) for r in rows[1:]],
                         [(str(b), str(n), "heap", str(a), "0", f, f + ";main") for f, _, b, n, a in R5_SITES])
        out = self.heapsnap("report", log + "@r5", "--format", "csv", "--table", "sizes").stdout
        self.assertEqual(out.splitlines(), ["min,max,blocks,bytes,large"] + [
            "%d,%d,%d,%d,%d" % (lo, hi, n, b, large) for lo, hi, n, b, large in R5_SIZES])

    def test_folded(self):
        log = self.record_trend()
        out = self.heapsnap("report", log + "@r5", "--format", "folded", *NO_LIBC).stdout
        # size_mix's two sites are one stack once libc's frames are gone.
        self.assertEqual(out.splitlines(), ["main;cache_fill 131072", "main;leak_request 50000",
                                            "main;noise_buffers 9000", "main;size_mix 210396",
                                            "main;warm_index 187392"])

    def test_text(self):
        log = self.record_trend()
        text = self.heapsnap("report", log + "@r5", "--bytes", "--color", "never").stdout.splitlines()
        for line in ("  live heap         587860 in 374 blocks",
                     "  live mmap         0 in 0 regions",
                     "  allocations       530 (malloc family and mmap calls up to the moment)",
                     "  temporary         150 (28.3 % of 530 heap allocations)",
                     "  untracked frees   0",
                     "Top 6 of 6 call sites by live bytes",
                     "    1      210396        10    35.8      2  size_mix  (trend)",
                     "    4       50000        50     8.5      1  leak_request  (trend)",
                     "  [512 B, 1 KiB)                50       50000     8.5  ###",
                     "  large blocks (>= 128 KiB, glibc's default M_MMAP_THRESHOLD: each is its own mmap): "
                     "1 blocks, 200000, 34.0 % of live bytes"):
            self.assertIn(line, text)
        self.assertIn("  587860 in 374 blocks at ", "\n".join(text))
        large = [line for line in text if line.startswith("  [128 KiB, 256 KiB)")]
        self.assertEqual(len(large), 1, text)
        self.assertEqual(large[0].split()[4:7], ["1", "200000", "34.0"])
        self.assertTrue(large[0].endswith("  large"), large[0])
        # Without --bytes, sizes are human-readable.
        text = self.heapsnap("report", log + "@r5", "--color", "never").stdout.splitlines()
        self.assertIn("  live heap         574.1 KiB in 374 blocks", text)
        self.assertIn("    3        50    48.8 KiB  leak_request  trend.c:%d  (trend)" % site_line(SRC, "leak_request"), text)


class ManySitesTest(HeapsnapTest):
    def test_report_of_many_deep_sites_within_the_default_budget(self):
        # many_sites: 8192 live blocks, each at the end of a call chain of
        # its own, 64 frames deep, from a log of some 100 KB (the read
        # budget's floor, 192 MiB, applies). The report holds each site's
        # frames as pointers into one table of distinct frames; while it was
        # charged as if each site copied its frames, the default budget
        # refused this log ("needs more than 192.0 MiB of memory (call
        # sites)"), and a compiler's genuine exit the same way.
        log = self.path("m.hslog")
        self.assertEqual(self.single_log("many_sites", options=("-o", log)), log)
        data = self.json_of("report", log, "--format", "json", "--top", "0")
        leaf = site_line("many_sites.c", "many_sites_leaf")
        deep = [s for s in data["sites_by_bytes"] if s["frames"][0]["line"] == leaf]
        self.assertEqual(len(deep), 8192)
        self.assertEqual({(s["bytes"], s["blocks"]) for s in deep}, {(16, 1)})
        self.assertEqual({s["frames"][0]["function"] for s in deep}, {"descend"})
        # 129 frames below main, cut at the default depth; the last 32
        # levels still hold all 13 bits of a path.
        self.assertEqual({len(s["frames"]) for s in deep}, {64})
        # The same sites as CSV, and the text report's header line.
        rows = list(csv.reader(io.StringIO(self.heapsnap("report", log, "--format", "csv", "--top", "0").stdout)))
        self.assertEqual(len(rows) - 1, len(data["sites_by_bytes"]))


if __name__ == "__main__":
    main()
