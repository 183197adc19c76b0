"""snapshot and diff on growth.c and growth_cpp.cpp, whose A -> B growth is
known per call site: bytes, blocks, function, file, line, inline frames.
Offline (LOG@MARKER, snapshot LOG --at) and live (snapshot PID)."""

import csv
import io
import os
import stat

from harness import HeapsnapTest, Growth, entries_with, frame_index, main, site_line

SRC = "growth.c"
# function, @site, bytes delta, blocks delta, old bytes, old blocks
GROWTH = [
    ("leak_malloc", "leak_malloc", 8638, 7, 0, 0),
    ("leak_memalign", "leak_memalign", 8192, 2, 0, 0),
    ("realloc_grow", "realloc_grow", 5000, 1, 0, 0),
    ("leak_calloc", "leak_calloc", 3996, 4, 0, 0),
    ("leak_inline", "inline_leak", 2331, 3, 0, 0),
    ("realloc_seed", "realloc_seed", -100, -1, 100, 1),
    ("baseline_drop", "baseline_drop", -10240, -5, 10240, 5),
]
TOTAL = (17817, 11)
A_LIVE = (20340, 16)
B_LIVE = (38157, 27)


class GrowthDiffTest(HeapsnapTest):
    def assert_growth(self, diff, labels=("A", "B")):
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), TOTAL)
        self.assertEqual((diff["old"]["live_bytes"], diff["old"]["live_blocks"]), A_LIVE)
        self.assertEqual((diff["new"]["live_bytes"], diff["new"]["live_blocks"]), B_LIVE)
        self.assertEqual((diff["old"]["label"], diff["new"]["label"]), labels)
        self.assertEqual(diff["old"]["pid"], diff["new"]["pid"])
        self.assertTrue(diff["old"]["exe"].endswith("/growth"), diff["old"]["exe"])
        self.assertLess(diff["old"]["time_s"], diff["new"]["time_s"])
        for function, site, delta, blocks, old_bytes, old_blocks in GROWTH:
            self.assert_site(diff, function, SRC, site, delta, blocks, old_bytes=old_bytes, old_blocks=old_blocks,
                             inlined=function == "leak_inline")
        self.assertEqual(len(diff["entries"]), len(GROWTH), [e["frames"][0]["function"] for e in diff["entries"]])
        # Zero-delta call sites are not entries.
        self.assertEqual(entries_with(diff, "churn"), [])
        self.assertEqual(entries_with(diff, "baseline_keep"), [])
        deltas = [e["bytes_delta"] for e in diff["entries"]]
        self.assertEqual(deltas, sorted(deltas, reverse=True), "sorted by growth, largest first")
        # The inlined helper: its own frame at the malloc line, marked
        # inlined, then the function it was inlined into, at the call.
        e = self.entry(diff, "leak_inline")
        self.assert_frame(e["frames"][0], "leak_inline", SRC, site_line(SRC, "inline_leak"), inlined=True)
        self.assert_frame(e["frames"][1], "leak_inline_caller", SRC, site_line(SRC, "inline_call"))
        # Below the site: phase2, and further down main.
        e = self.entry(diff, "leak_malloc")
        self.assertEqual(e["frames"][1]["function"], "phase2")
        self.assertGreater(frame_index(e, "main"), 1)
        self.assertEqual(os.path.basename(e["frames"][0]["module"]), "growth")
        self.assertIn("old", diff["address_space"])
        self.assertIn("new", diff["address_space"])
        self.assert_no_recorder_frames(diff)

    def test_diff_markers(self):
        log = self.single_log("growth", "--auto")
        self.assert_growth(self.diff(log + "@A", log + "@B"))
        # Markers by 1-based index name the same moments.
        self.assert_growth(self.diff(log + "@1", log + "@2"))
        # Reversed: every delta changes sign.
        back = self.diff(log + "@B", log + "@A")
        self.assertEqual((back["total"]["bytes_delta"], back["total"]["blocks_delta"]), (-TOTAL[0], -TOTAL[1]))
        for function, site, delta, blocks, _, _ in GROWTH:
            self.assert_entry(back, function, -delta, -blocks)

    def test_frame_pointer_unwinding(self):
        # The test programs are built with frame pointers: --unwind fp must
        # give the same sites and the same frames as DWARF, down to main.
        dwarf_log = self.single_log("growth", "--auto")
        fp_log = self.single_log("growth", "--auto", options=("--unwind", "fp", "-o", "fp.%p.hslog"))
        self.assertEqual(self.dump(fp_log)[0][1]["unwind"], "fp")
        fp = self.diff(fp_log + "@A", fp_log + "@B")
        self.assert_growth(fp)
        dwarf = self.diff(dwarf_log + "@A", dwarf_log + "@B")
        for a, b in zip(fp["entries"], dwarf["entries"]):
            names_fp = [(f["function"], f["line"]) for f in a["frames"]]
            names_dwarf = [(f["function"], f["line"]) for f in b["frames"]]
            upto_main = names_dwarf[:[n for n, _ in names_dwarf].index("main") + 1]
            self.assertEqual(names_fp[:len(upto_main)], upto_main)

    def test_snapshot_files(self):
        log = self.single_log("growth", "--auto")
        a = self.snapshot(log, "--at", "A", "-o", self.path("a.hsnap"))
        b = self.snapshot(log, "--at", "2", "-o", self.path("b.hsnap"))
        self.assertEqual((a, b), (self.path("a.hsnap"), self.path("b.hsnap")))
        for path in (a, b):
            self.assertEqual(stat.S_IMODE(os.stat(path).st_mode) & 0o077, 0, "snapshot readable by others")
        self.assert_growth(self.diff(a, b))
        self.assert_growth(self.diff(a, log + "@B"))
        # The default moment is the exit marker; growth frees nothing after B.
        exit_snap = self.snapshot(log, "-o", self.path("exit.hsnap"))
        self.assert_growth(self.diff(a, exit_snap), labels=("A", "exit"))
        # A snapshot does not need the log.
        os.unlink(log)
        self.assert_growth(self.diff(a, b))

    def test_snapshot_at_peak_and_time(self):
        log = self.single_log("growth", "--auto")
        peak = self.snapshot(log, "--at", "peak", "-o", self.path("peak.hsnap"))
        diff = self.diff(log + "@B", peak)
        # Most live bytes: inside the churn loop, one 64-byte block live and
        # the 2048-byte baseline blocks not yet freed.
        self.assertEqual((diff["new"]["live_bytes"], diff["new"]["live_blocks"]), (48461, 33))
        self.assert_site(diff, "churn", SRC, "churn", 64, 1, old_bytes=0)
        self.assert_site(diff, "baseline_drop", SRC, "baseline_drop", 10240, 5, old_bytes=0)
        markers = {m["label"]: m for m in self.markers(log)["markers"]}
        between = (markers["B"]["time_s"] + markers["exit"]["time_s"]) / 2
        moment = self.snapshot(log, "--at", "%.9fs" % between, "-o", self.path("time.hsnap"))
        diff = self.diff(log + "@B", moment)
        self.assertEqual(diff["entries"], [])
        self.assertEqual((diff["new"]["live_bytes"], diff["new"]["live_blocks"]), B_LIVE)

    def test_group_by(self):
        log = self.single_log("growth", "--auto")
        for group in ("function", "line"):
            diff = self.diff(log + "@A", log + "@B", "--group-by", group)
            self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), TOTAL, group)
            for function, site, delta, blocks, _, _ in GROWTH:
                e = self.assert_entry(diff, function, delta, blocks)
                self.assertTrue(e["frames"][0]["function"] == function, (group, e))
                if group == "line":
                    self.assertEqual(e["frames"][0]["line"], site_line(SRC, site), (group, e))
        diff = self.diff(log + "@A", log + "@B", "--group-by", "module")
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), TOTAL)
        self.assertEqual(len(diff["entries"]), 1, diff["entries"])
        e = diff["entries"][0]
        self.assertEqual((e["bytes_delta"], e["blocks_delta"]), TOTAL)
        self.assertEqual(os.path.basename(e["frames"][0]["module"]), "growth")

    def test_filters_and_threshold(self):
        log = self.single_log("growth", "--auto")
        old, new = log + "@A", log + "@B"
        top = self.diff(old, new, "--top", "2")
        self.assertEqual([e["bytes_delta"] for e in top["entries"]], [8638, 8192])
        big = self.diff(old, new, "--min-bytes", "5000")
        self.assertEqual(sorted(abs(e["bytes_delta"]) for e in big["entries"]), [5000, 8192, 8638, 10240])
        rest = self.diff(old, new, "--exclude", "leak_m.*")
        self.assertEqual(entries_with(rest, "leak_malloc"), [])
        self.assertEqual(entries_with(rest, "leak_memalign"), [])
        self.assert_entry(rest, "leak_calloc", 3996, 4)
        self.heapsnap("diff", old, new, "--fail-above", "100000", expect=0)
        result = self.heapsnap("diff", old, new, "--fail-above", "17816", expect=3)
        self.assertIn("leak_malloc", result.stdout)

    def test_text_and_csv(self):
        log = self.single_log("growth", "--auto")
        text = self.heapsnap("diff", log + "@A", log + "@B").stdout
        self.assertIn("leak_malloc", text)
        self.assertIn("%s:%d" % (SRC, site_line(SRC, "leak_malloc")), text)
        self.assertIn("8638", text.replace(",", ""))
        self.assertNotIn("churn", text)
        rows = list(csv.reader(io.StringIO(self.heapsnap("diff", log + "@A", log + "@B", "--format", "csv").stdout)))
        self.assertGreaterEqual(len(rows), 1 + len(GROWTH))
        body = rows[1:]
        leak = [r for r in body if any("leak_malloc" in cell for cell in r)]
        self.assertEqual(len(leak), 1, rows)
        self.assertIn("8638", leak[0])
        self.assertIn("7", leak[0])

    def test_live_snapshots_of_running_process(self):
        growth = Growth(self)
        growth.send("phase1", "phase1 done")
        a = self.snapshot(str(growth.pid), "-o", self.path("a.hsnap"), "--label", "A")
        growth.send("phase2", "phase2 done")
        b = self.snapshot(str(growth.pid), "-o", self.path("b.hsnap"), "--label", "B", "--timeout", "30")
        self.assertEqual((a, b), (self.path("a.hsnap"), self.path("b.hsnap")))
        diff = self.diff(a, b)
        self.assert_growth(diff)
        self.assertEqual(diff["old"]["pid"], growth.pid)
        # Without -o the snapshot still lands somewhere and is printed.
        c = self.snapshot(str(growth.pid))
        self.assertEqual(self.diff(b, c)["entries"], [])
        logs = growth.finish()
        self.assertEqual(logs, [self.path("heapsnap.growth.%d.hslog" % growth.pid)])
        markers = self.markers(logs[0])["markers"]
        self.assertEqual([(m["label"], m["cause"]) for m in markers[:2]], [("A", "request"), ("B", "request")])
        self.assertEqual(markers[-1]["label"], "exit")
        self.assert_growth(self.diff(logs[0] + "@A", logs[0] + "@B"))


class CppGrowthTest(HeapsnapTest):
    def test_new_and_vector(self):
        src = "growth_cpp.cpp"
        log = self.single_log("growth_cpp")
        diff = self.diff(log + "@A", log + "@B")
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), (6240, 6))
        self.assertEqual(len(diff["entries"]), 3, diff["entries"])
        for function, site, delta, blocks in (("leak_array_new", "array_new", 2000, 2),
                                              ("leak_object_new", "object_new", 144, 3),
                                              ("grow_vector", "vector_push", 4096, 1)):
            e = self.assert_entry(diff, function, delta, blocks, old_bytes=0, old_blocks=0)
            # Frame 0 is libstdc++'s operator new; the program's frame below
            # it carries the line of the new expression or push_back.
            self.assertTrue(e["frames"][0]["function"].startswith("operator new"), e["frames"][0])
            i = frame_index(e, function)
            self.assertGreaterEqual(i, 1)
            self.assertEqual(os.path.basename(e["frames"][i]["file"]), src)
            self.assertEqual(e["frames"][i]["line"], site_line(src, site))
        e = self.entry(diff, "grow_vector")
        self.assertTrue(any("push_back" in (f["function"] or "") or "_M_realloc" in (f["function"] or "")
                            for f in e["frames"]), e["frames"])
        markers = {m["label"]: m for m in self.markers(log)["markers"]}
        # The global vector's destructor ran before the exit marker.
        self.assertEqual(markers["exit"]["live_bytes"], markers["B"]["live_bytes"] - 4096)


if __name__ == "__main__":
    main()
