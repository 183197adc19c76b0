"""Threads: blocks handed from producer to consumer threads hundreds of
thousands of times (handoff_threads.c), and threads leaking between two
markers (threads_growth.c). The live sets must come out exact."""

import collections

from harness import HeapsnapTest, frame_index, main, site_line

# handoff_threads.c
PRODUCERS, CONSUMERS, PER_PRODUCER, KEEP_EVERY, KEEP_SIZE = 4, 4, 100000, 1000, 1000
KEPT_BLOCKS = PRODUCERS * PER_PRODUCER // KEEP_EVERY
KEPT_BYTES = sum((PER_PRODUCER // KEEP_EVERY) * (KEEP_SIZE + p) for p in range(PRODUCERS))
HANDOFF_EVENTS = PRODUCERS * PER_PRODUCER * 2 - KEPT_BLOCKS

# threads_growth.c
THREADS = 4
LEAK_BLOCKS = sum(10 + t for t in range(THREADS))
LEAK_BYTES = sum((10 + t) * 64 * (t + 1) for t in range(THREADS))


class ThreadsTest(HeapsnapTest):
    def assert_only_thread_bookkeeping(self, diff, own, program_functions):
        """Every entry but `own` is glibc's per-thread allocation (its TLS
        vector), made under pthread_create and never in the program's own
        thread functions."""
        for e in diff["entries"]:
            if e is own:
                continue
            functions = [f.get("function") or "" for f in e["frames"]]
            self.assertTrue(any("pthread_create" in f or "allocate_tls" in f for f in functions),
                            "unexpected entry: %s" % e)
            for name in program_functions:
                self.assertEqual(frame_index(e, name), -1, "unexpected entry: %s" % e)

    def test_handoff_exact(self):
        self.assertEqual((KEPT_BLOCKS, KEPT_BYTES), (400, 400600))
        log = self.single_log("handoff_threads")
        markers = {m["label"]: m for m in self.markers(log)["markers"]}
        self.assertEqual(list(markers), ["started", "joined", "exit"])
        self.assertEqual((markers["started"]["live_bytes"], markers["started"]["live_blocks"]), (0, 0))
        self.assertGreaterEqual(markers["joined"]["events"] - markers["started"]["events"], HANDOFF_EVENTS)
        # Nothing is freed after the join.
        for key in ("live_bytes", "live_blocks"):
            self.assertEqual(markers["exit"][key], markers["joined"][key])

        diff = self.diff(log + "@started", log + "@joined")
        own = self.assert_site(diff, "produce_block", "handoff_threads.c", "produce_block", KEPT_BYTES, KEPT_BLOCKS,
                               old_bytes=0, old_blocks=0)
        self.assertGreaterEqual(frame_index(own, "producer"), 1)
        self.assert_only_thread_bookkeeping(diff, own, ("producer", "consumer", "produce_block"))
        self.assert_no_recorder_frames(diff)
        self.assertEqual(diff["total"]["bytes_delta"], markers["joined"]["live_bytes"])
        self.assertEqual(diff["total"]["blocks_delta"], markers["joined"]["live_blocks"])
        self.assertEqual(diff["total"]["bytes_delta"], sum(e["bytes_delta"] for e in diff["entries"]))

    def test_handoff_thread_records(self):
        log = self.single_log("handoff_threads")
        records = self.dump(log)
        kinds = collections.Counter(kind for kind, _ in records)
        # The program's 8 threads; the recorder's own writer thread is not one.
        self.assertEqual(kinds["thread-start"], PRODUCERS + CONSUMERS)
        self.assertEqual(kinds["thread-exit"], PRODUCERS + CONSUMERS)
        started = [f["thread"] for kind, f in records if kind == "thread-start"]
        self.assertEqual(len(set(started)), len(started))
        self.assertNotIn("0", started, "thread 0 is the main thread")
        tids = [f["tid"] for kind, f in records if kind == "thread-start"]
        self.assertEqual(len(set(tids)), len(tids))
        # Allocations of 16..264 bytes come from the producers only, frees
        # from the consumers only.
        # A free names the allocation info of its block (log versions 3 and 4).
        producers, consumers = set(), set()
        live = collections.Counter()
        for kind, f in records:
            if kind == "alloc" and f["fn"] == "malloc":
                producers.add(f["thread"])
                live[f.get("info")] += 1
            elif kind == "free" and live[f.get("info")] > 0:
                consumers.add(f["thread"])
                live[f["info"]] -= 1
        self.assertTrue(producers.isdisjoint(consumers), (producers, consumers))
        self.assertEqual(len(consumers), CONSUMERS)

    def test_threads_leak_between_markers(self):
        self.assertEqual((LEAK_BLOCKS, LEAK_BYTES), (46, 7680))
        log = self.single_log("threads_growth")
        for group in ("stack", "function", "line"):
            diff = self.diff(log + "@A", log + "@B", "--group-by", group)
            own = self.assert_entry(diff, "thread_leak", LEAK_BYTES, LEAK_BLOCKS, old_bytes=0, old_blocks=0)
            if group == "function":
                self.assertEqual(own["frames"][0]["function"], "thread_leak")
            else:
                self.assert_frame(own["frames"][0], "thread_leak", "threads_growth.c",
                                  site_line("threads_growth.c", "thread_leak"))
            if group == "stack":
                self.assert_only_thread_bookkeeping(diff, own, ("worker", "thread_leak"))
            self.assert_no_recorder_frames(diff)
        diff = self.diff(log + "@A", log + "@B")
        self.assertGreaterEqual(frame_index(self.entry(diff, "thread_leak"), "worker"), 1)


if __name__ == "__main__":
    main()
