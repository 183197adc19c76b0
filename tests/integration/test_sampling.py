"""`heapsnap run --sample-bytes N` on tests/programs/sampled.c: large blocks
and mappings exact, churn exactly zero, small and medium blocks estimated
within 15% (the odds are derived in the program's header comment), and
every output says it is sampled."""

from harness import HeapsnapTest, main, program

SAMPLE = 65536
NO_LIBC = ("--exclude", "^__libc|^_start")
# function, true bytes, true blocks
ESTIMATED = [("small_keep", 64000000, 1000000), ("medium_keep", 64000000, 16000)]
NOTE = "sampled: one sample per 64.0 KiB allocated; heap bytes and blocks are estimates"


class SamplingTest(HeapsnapTest):
    def setUp(self):
        super().setUp()
        self.log = self.single_log("sampled", options=("--sample-bytes", "64K", "-o", self.path("s.hslog")))

    def test_estimates_and_exact_parts(self):
        diff = self.diff(self.log + "@start", self.log + "@kept", *NO_LIBC)
        self.assertEqual(diff["new"]["sample_bytes"], SAMPLE)
        self.assert_entry(diff, "big_keep", 10 << 20, 10, 0, 0)
        map_entry = self.entry(diff, "map_keep")
        self.assertEqual((map_entry["kind"], map_entry["bytes_delta"], map_entry["blocks_delta"]), ("mmap", 2 << 20, 1))
        self.assertEqual(self.entries_with_churn(diff), [])
        for function, true_bytes, true_blocks in ESTIMATED:
            e = self.entry(diff, function)
            with self.subTest(function=function):
                self.assertLess(abs(e["bytes_delta"] - true_bytes), 0.15 * true_bytes, e)
                self.assertLess(abs(e["blocks_delta"] - true_blocks), 0.15 * true_blocks, e)
                # Each site's estimate is whole blocks of its one size.
                self.assertEqual(e["bytes_delta"], e["blocks_delta"] * (true_bytes // true_blocks))
        total = sum(e["bytes_delta"] for e in diff["entries"] if e["kind"] == "heap")
        self.assertEqual(total, diff["new"]["live_bytes"] - diff["old"]["live_bytes"])

    def entries_with_churn(self, diff):
        return [e for e in diff["entries"] if any(f.get("function") == "churn" for f in e["frames"])]

    def test_only_sampled_events_are_in_the_log(self):
        allocs = [f for kind, f in self.dump(self.log) if kind == "alloc"]
        # 1.5 million small allocations recorded as a few thousand at most;
        # every large block is there.
        self.assertLess(len(allocs), 10000)
        self.assertEqual(sum(1 for f in allocs if int(f["size"]) == 1 << 20), 10)

    def test_every_output_says_sampled(self):
        self.assertEqual(self.markers(self.log)["sample_bytes"], SAMPLE)
        self.assertIn(NOTE, self.heapsnap("markers", self.log).stdout)
        self.assertIn(NOTE, self.heapsnap("diff", self.log + "@start", self.log + "@kept").stdout)
        self.assertIn(NOTE, self.heapsnap("report", self.log + "@kept").stdout)
        self.assertEqual(self.json_of("report", self.log + "@kept", "--format", "json")["moment"]["sample_bytes"],
                         SAMPLE)
        snap = self.snapshot(self.log, "--at", "kept", "-o", self.path("kept.hsnap"))
        self.assertIn(NOTE, self.heapsnap("maps", snap).stdout)
        self.assertEqual(self.json_of("maps", snap, "--format", "json")["sample_bytes"], SAMPLE)
        # The snapshot file keeps it: a diff of snapshots says it too.
        self.assertEqual(self.diff(snap, snap)["old"]["sample_bytes"], SAMPLE)

    def test_exact_recording_says_nothing(self):
        log = self.single_log("sampled", options=("-o", self.path("exact.hslog")))
        self.assertEqual(self.markers(log)["sample_bytes"], 0)
        self.assertNotIn("sampled", self.heapsnap("markers", log).stdout)
        diff = self.diff(log + "@start", log + "@kept", *NO_LIBC)
        self.assert_entry(diff, "small_keep", 64000000, 1000000, 0, 0)
        self.assert_entry(diff, "medium_keep", 64000000, 16000, 0, 0)


if __name__ == "__main__":
    main()
