"""The launcher keeps a running program's checkpoint current
(replay/keeper.h): after a million events, `heapsnap run` has saved
LOG.checkpoint without any snapshot asking, the snapshots that resume
from it equal ones read from the start, and HEAPSNAP_NO_CHECKPOINT keeps
the launcher from writing one."""

import json
import os
import stat
import time

from harness import Growth, HeapsnapTest, entries_with, main

# Twice the keeper's minimum of a million events (CheckpointKeeper::kMinEvents).
CHURN = 1_000_000
# The keeper starts 1 s after the program and follows the log from then on; a
# loaded machine gets this long before the test gives up on it.
WAIT = 90


class KeeperTest(HeapsnapTest):
    def wait_for(self, path, growth):
        deadline = time.monotonic() + WAIT
        while not os.path.exists(path):
            self.assertLess(time.monotonic(), deadline, "no %s after %d s; stderr: %s" % (
                path, WAIT, growth.stderr_if_dead()))
            time.sleep(0.1)

    def test_checkpoint_kept_while_the_program_runs(self):
        log = self.path("g.hslog")
        growth = Growth(self, "-o", log)
        growth.send("phase1", "phase1 done")
        growth.send("churn %d" % CHURN, "churned %d" % CHURN)
        checkpoint = log + ".checkpoint"
        self.wait_for(checkpoint, growth)
        st = os.lstat(checkpoint)
        self.assertTrue(stat.S_ISREG(st.st_mode))
        self.assertEqual(st.st_mode & 0o7777, 0o600)
        self.assertEqual(st.st_uid, os.geteuid())
        # No snapshot has been taken: the markers are the program's none.
        self.assertEqual(json.loads(self.heapsnap("markers", log, "--format", "json").stdout)["markers"], [])

        growth.send("phase2", "phase2 done")
        kept = self.snapshot(str(growth.pid), "-o", self.path("kept.hsnap"))
        fresh = self.path("fresh.hsnap")
        self.heapsnap("snapshot", str(growth.pid), "-o", fresh, env={"HEAPSNAP_NO_CHECKPOINT": "1"})
        self.assertEqual(growth.finish(), [log])

        # The same live set both ways, down to every call site.
        same = self.diff(kept, fresh)
        self.assertEqual((same["total"]["bytes_delta"], same["total"]["blocks_delta"]), (0, 0))
        self.assertEqual([e for e in same["entries"] if e["bytes_delta"] or e["blocks_delta"]], [])
        # And the right one: phase 1's kept blocks and phase 2's leaks.
        live = self.diff(log + "@0s", kept)
        self.assert_entry(live, "baseline_keep", 10000, 10)
        self.assert_entry(live, "leak_malloc", 8638, 7)
        self.assertEqual(entries_with(live, "churn"), [])

    def test_snapshots_while_the_keeper_follows_the_log(self):
        # The keeper reads each snapshot's marker soon after it is written,
        # often before the client has loaded the checkpoint: whichever
        # comes first, the snapshot is the live set at its marker.
        log = self.path("g.hslog")
        growth = Growth(self, "-o", log)
        growth.send("churn %d" % CHURN, "churned %d" % CHURN)
        self.wait_for(log + ".checkpoint", growth)
        for round, step in enumerate(["phase1", "churn", "phase2"]):
            if step != "churn":
                growth.send(step, step + " done")
            growth.send("churn %d" % CHURN, "churned %d" % CHURN)
            kept = self.snapshot(str(growth.pid), "-o", self.path("kept%d.hsnap" % round))
            fresh = self.path("fresh%d.hsnap" % round)
            self.heapsnap("snapshot", str(growth.pid), "-o", fresh, env={"HEAPSNAP_NO_CHECKPOINT": "1"})
            same = self.diff(kept, fresh)
            self.assertEqual((same["total"]["bytes_delta"], same["total"]["blocks_delta"]), (0, 0), step)
            self.assertEqual([e for e in same["entries"] if e["bytes_delta"] or e["blocks_delta"]], [], step)
        self.assertEqual(growth.finish(), [log])
        live = self.diff(log + "@0s", self.path("kept2.hsnap"))
        self.assert_entry(live, "baseline_keep", 10000, 10)
        self.assert_entry(live, "leak_malloc", 8638, 7)
        self.assertEqual(entries_with(live, "churn"), [])

    def test_no_checkpoint_when_turned_off(self):
        log = self.path("g.hslog")
        growth = Growth(self, "-o", log, env={"HEAPSNAP_NO_CHECKPOINT": "1"})
        growth.send("churn %d" % CHURN, "churned %d" % CHURN)
        time.sleep(8)  # past the keeper's start and a few of its rounds
        self.assertFalse(os.path.exists(log + ".checkpoint"))
        self.assertEqual(growth.finish(), [log])


if __name__ == "__main__":
    main()
