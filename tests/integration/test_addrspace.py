"""The address-space summary (`heapsnap maps`, and the address_space part
of `heapsnap diff`) on addrspace.c, which grows one category at a time:
thread stacks, an anonymous mmap, a shared file mapping, a malloc'd large
block. Each step must land in its category with the exact virtual size the
program mapped, and the verdict must name it."""

import re
import subprocess

from harness import HeapsnapTest, main, program

MIB = 1 << 20
CATEGORIES = ["Heap", "Stack", "Image", "MappedFile", "Anonymous", "Other", "Free"]


class AddressSpaceTest(HeapsnapTest):
    def setUp(self):
        super().setUp()
        result = self.heapsnap("run", "--", program("addrspace"), self.path("scratch.bin"))
        self.log = self.logs_of(result.stderr)[0]
        m = re.match(r"stack=(\d+) guard=(\d+)", result.stdout)
        self.stack, self.guard = int(m.group(1)), int(m.group(2))

    def step(self, old, new):
        diff = self.diff("%s@%s" % (self.log, old), "%s@%s" % (self.log, new))
        return diff["address_space"]

    def test_json_shape(self):
        space = self.step("A", "B")
        for side in ("old", "new", "delta"):
            for name in CATEGORIES:
                self.assertEqual(sorted(space[side]["categories"][name]),
                                 ["private_dirty_bytes", "pss_bytes", "regions", "rss_bytes", "size_bytes",
                                  "swap_bytes"], name)
            for key in ("threads", "tracked_live_bytes", "malloc_in_use_bytes", "malloc_free_bytes",
                        "reserved_bytes", "committed_bytes"):
                self.assertIn(key, space[side])

    def test_thread_stacks(self):
        space = self.step("A", "B")
        stack = space["delta"]["categories"]["Stack"]
        self.assertEqual(stack["size_bytes"], 3 * (self.stack + self.guard))
        self.assertEqual(space["delta"]["threads"], 3)
        self.assertEqual(space["delta"]["reserved_bytes"], 3 * self.guard)
        self.assertEqual(space["delta"]["categories"]["Anonymous"]["size_bytes"], 0)
        self.assertTrue(space["verdict"].startswith("growth is thread stacks: +3 threads, +"), space["verdict"])

    def test_anonymous_mmap(self):
        space = self.step("B", "C")
        anon = space["delta"]["categories"]["Anonymous"]
        self.assertEqual(anon["size_bytes"], 4 * MIB)
        self.assertGreaterEqual(anon["rss_bytes"], 1 * MIB)
        self.assertTrue(space["verdict"].startswith("growth is anonymous mmap: +4.0 MiB virtual"), space["verdict"])
        # The recorder knows who mapped it.
        diff = self.diff("%s@B" % self.log, "%s@C" % self.log)
        mmaps = [e for e in diff["entries"] if e["kind"] == "mmap"]
        self.assertEqual(len(mmaps), 1)
        self.assertEqual(mmaps[0]["bytes_delta"], 4 * MIB)
        self.assertEqual(mmaps[0]["frames"][0]["function"], "main")

    def test_mapped_file(self):
        space = self.step("C", "D")
        mapped = space["delta"]["categories"]["MappedFile"]
        self.assertEqual(mapped["size_bytes"], 2 * MIB)
        self.assertEqual(mapped["regions"], 1)
        self.assertEqual(mapped["rss_bytes"], 2 * MIB)
        self.assertTrue(space["verdict"].startswith("growth is mapped files and shared memory: +2.0 MiB virtual"),
                        space["verdict"])

    def test_heap_block(self):
        space = self.step("D", "E")
        self.assertEqual(space["delta"]["tracked_live_bytes"], 3 * MIB)
        heap = space["delta"]["categories"]["Heap"]
        self.assertGreaterEqual(heap["size_bytes"], 3 * MIB)
        self.assertEqual(space["delta"]["categories"]["Anonymous"]["size_bytes"], 0)
        self.assertTrue(space["verdict"].startswith("growth is heap: +"), space["verdict"])

    def test_maps_of_snapshot_and_text(self):
        snap = self.path("e.hsnap")
        self.heapsnap("snapshot", self.log, "--at", "E", "-o", snap)
        data = self.json_of("maps", snap, "--format", "json")
        self.assertEqual(data["format"], "heapsnap-maps")
        self.assertEqual(data["categories"]["MappedFile"]["size_bytes"] >= 2 * MIB, True)
        self.assertIn("Recorder", data["categories"])
        # The Image row per module adds up to the row, and names the program.
        self.assertEqual(sum(m["size_bytes"] for m in data["images"]), data["categories"]["Image"]["size_bytes"])
        self.assertIn(program("addrspace"), [m["path"] for m in data["images"]])
        self.assertEqual(data["tracked_live_bytes"], self.marker(self.log, "E")["live_bytes"])
        text = self.heapsnap("maps", snap).stdout
        for row in CATEGORIES + ["Busy"]:
            self.assertRegex(text, r"(?m)^%s\s+\d+\s" % row)
        self.assertIn("Reconciliation", text)

    def test_malloc_statistics_at_markers_but_exit(self):
        # Marker E follows a 3 MiB malloc: mallinfo2 counts it in use. The
        # exit marker takes no mallinfo2 (it walks every free chunk).
        at_e = self.json_of("maps", "%s@E" % self.log, "--format", "json")
        self.assertGreaterEqual(at_e["malloc_in_use_bytes"], 3 * MIB)
        self.assertIsInstance(at_e["malloc_free_bytes"], int)
        at_exit = self.json_of("maps", "%s@exit" % self.log, "--format", "json")
        for key in ("malloc", "malloc_in_use_bytes", "malloc_free_bytes", "fragmentation"):
            self.assertIsNone(at_exit[key], key)
        self.assertRegex(self.heapsnap("maps", "%s@exit" % self.log).stdout,
                         r"(?m)^  malloc\s+no allocator statistics$")
        space = self.step("E", "exit")
        self.assertIsNone(space["delta"]["malloc_in_use_bytes"])
        self.assertIsInstance(space["old"]["malloc_in_use_bytes"], int)

    def test_maps_of_live_unrecorded_process(self):
        sleeper = subprocess.Popen(["sleep", "30"])
        try:
            data = self.json_of("maps", sleeper.pid, "--format", "json")
            self.assertIsNone(data["tracked_live_bytes"])
            self.assertNotIn("Recorder", data["categories"])
            self.assertGreater(data["categories"]["Image"]["size_bytes"], 0)
            self.assertEqual(data["categories"]["Stack"]["regions"], 1)
            self.assertEqual(data["threads"], 1)
        finally:
            sleeper.kill()
            sleeper.wait()

    def test_maps_errors(self):
        self.assert_error(["maps", "999999999"], "no process with PID 999999999")
        self.assert_error(["maps", self.path("missing.hsnap")], "No such file or directory")


if __name__ == "__main__":
    main()
