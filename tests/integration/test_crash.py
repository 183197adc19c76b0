"""Logs of processes that did not end normally: SIGKILL from inside
(sigkill_self.c) and outside, logs cut at any byte, logs read while the
process still writes them. A log reads back up to its last complete frame;
frames are cut right after each marker and every 100 ms while events wait."""

import collections
import os
import shutil
import signal
import time

from harness import HeapsnapTest, Growth, main

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
HEADER = 16


class CrashTest(HeapsnapTest):
    def wait_for_marker(self, log, label, timeout=10):
        """Markers reach the disk shortly after heapsnap_marker() returns."""
        deadline = time.monotonic() + timeout
        while True:
            if os.path.exists(log):
                result = self.heapsnap("markers", log, "--format", "json", expect=None)
                if result.returncode == 0 and ('"label":"%s"' % label) in result.stdout.replace(" ", ""):
                    return self.markers(log)
            if time.monotonic() > deadline:
                self.fail("marker %r not in %s after %ds" % (label, log, timeout))
            time.sleep(0.05)

    def test_sigkill_self(self):
        log = self.single_log("sigkill_self", expect=128 + signal.SIGKILL)
        data = self.markers(log)
        self.assertFalse(data["complete"])
        self.assertEqual([m["label"] for m in data["markers"]], ["before-kill"])
        m = data["markers"][0]
        self.assertEqual((m["index"], m["cause"]), (1, "user"))
        self.assertEqual((m["live_bytes"], m["live_blocks"]), (12345, 1))
        kinds = [kind for kind, _ in self.dump(log)]
        self.assertNotIn("end", kinds)
        self.assertEqual(kinds.count("marker"), 1)

        snap = self.snapshot(log, "--at", "before-kill", "-o", self.path("killed.hsnap"))
        diff = self.diff(snap, log + "@1")
        self.assertEqual(diff["entries"], [])
        self.assertEqual((diff["old"]["live_bytes"], diff["old"]["live_blocks"]), (12345, 1))
        self.assertEqual(diff["old"]["label"], "before-kill")

    def test_sigkill_from_outside(self):
        growth = Growth(self)
        log = self.path("heapsnap.growth.%d.hslog" % growth.pid)
        growth.send("phase1", "phase1 done")
        growth.send("mark A", "marked A 1")
        growth.send("phase2", "phase2 done")
        # No marker after phase 2: its events reach the disk with the next
        # periodic frame cut (every 100 ms).
        time.sleep(0.5)
        os.kill(growth.pid, signal.SIGKILL)
        _, err = growth.proc.communicate(timeout=60)
        self.assertEqual(growth.proc.returncode, 128 + signal.SIGKILL, err)
        self.assertEqual(self.logs_of(err), [log])

        data = self.markers(log)
        self.assertFalse(data["complete"])
        self.assertEqual([m["label"] for m in data["markers"]], ["A"])
        self.assertEqual((data["markers"][0]["live_bytes"], data["markers"][0]["live_blocks"]), (20340, 16))
        records = self.dump(log)
        sizes = [int(f["size"]) for kind, f in records if kind == "alloc"]
        self.assertEqual(sizes.count(1234), 7)
        self.assertEqual(sizes.count(64), 1000)
        # The last thing phase 2 did, freeing the five 2048-byte blocks, is on disk too.
        # Small blocks are named by allocation info (one size each), large
        # ones by address; untracked frees name addresses never allocated.
        count, size = collections.Counter(), {}
        for kind, f in records:
            name = f.get("info") or f.get("addr")
            if kind == "alloc":
                count[name] += 1
                size[name] = int(f["size"])
            elif kind == "free" and count[name] > 0:
                count[name] -= 1
        self.assertEqual(sum(n * size[name] for name, n in count.items() if n), 38157)
        self.assertEqual(sum(count.values()), 27)
        # The moment of most live heap bytes: just inside the churn loop.
        peak = self.snapshot(log, "--at", "peak", "-o", self.path("peak.hsnap"))
        diff = self.diff(log + "@A", peak)
        self.assertEqual((diff["new"]["live_bytes"], diff["new"]["live_blocks"]), (48461, 33))
        self.assertEqual(diff["total"]["bytes_delta"], 48461 - 20340)

    def test_log_read_while_running(self):
        growth = Growth(self)
        log = self.path("heapsnap.growth.%d.hslog" % growth.pid)
        growth.send("phase1", "phase1 done")
        growth.send("mark A", "marked A 1")
        data = self.wait_for_marker(log, "A")
        self.assertFalse(data["complete"])
        m = next(m for m in data["markers"] if m["label"] == "A")
        self.assertEqual((m["live_bytes"], m["live_blocks"]), (20340, 16))
        growth.send("phase2", "phase2 done")
        growth.send("mark B", "marked B 1")
        self.wait_for_marker(log, "B")
        diff = self.diff(log + "@A", log + "@B")
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), (17817, 11))
        self.assertEqual(growth.finish(), [log])
        self.assertTrue(self.markers(log)["complete"])

    def cut(self, log, size, name):
        path = self.path(name)
        shutil.copyfile(log, path)
        os.truncate(path, size)
        return path

    def test_truncated_logs(self):
        log = self.single_log("alloc_pattern")
        data = open(log, "rb").read()
        last_frame = data.rfind(ZSTD_MAGIC)
        self.assertGreater(last_frame, HEADER)
        # The End record sits in the last frame, cut after the exit marker's.
        for size, name in ((len(data) - 1, "minus1"), (last_frame + 6, "in-last-header"),
                           ((last_frame + len(data)) // 2, "mid-last")):
            cut = self.cut(log, size, name + ".hslog")
            markers = self.markers(cut)
            self.assertTrue(markers["truncated"], name)
            self.assertFalse(markers["complete"], name)
            exit_marker = [m for m in markers["markers"] if m["label"] == "exit"]
            self.assertEqual(len(exit_marker), 1, name)
            self.assertEqual((exit_marker[0]["live_bytes"], exit_marker[0]["live_blocks"]), (20348, 9), name)
            self.assertNotIn("end", [kind for kind, _ in self.dump(cut)])
        # A cut exactly between two frames is a clean, if incomplete, log.
        cut = self.cut(log, last_frame, "between.hslog")
        markers = self.markers(cut)
        self.assertFalse(markers["truncated"])
        self.assertFalse(markers["complete"])
        self.assertEqual(markers["markers"][0]["live_bytes"], 20348)
        # Before the first complete frame there is nothing to read.
        cut = self.cut(log, HEADER + 20, "first-frame.hslog")
        self.assert_error(["markers", cut], "truncated")
        self.assert_error(["dump", cut], "truncated", streams=True)


if __name__ == "__main__":
    main()
