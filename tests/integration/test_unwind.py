"""Exact stacks under every --unwind mode: unwind_shapes.c allocates from
about a thousand distinct call paths (recursion through frames with and
without frame pointers, alloca, realigned frames, twin callers at the same
depth, longjmp, signal handlers, threads) and prints what it allocated from
each path; every path must come back from `heapsnap diff` as exactly one
entry with exactly those bytes and blocks, and nothing else may carry the
program's allocation site."""

import collections
import os
import re
import sys

from harness import HeapsnapTest, main, program

# Debian's interpreters, recorded as they are installed.
PYTHON3 = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
PERL = "/usr/bin/perl"

SITE = "leaf_alloc"
ROOTS = ("main", "worker_main")


def expected_paths(stdout):
    """{(leaf_alloc, ..., root): (bytes, blocks)} from the program's output."""
    paths = {}
    for line in stdout.splitlines():
        bytes_, blocks, *names = line.split()
        paths[tuple(names)] = (int(bytes_), int(blocks))
    return paths


class UnwindTest(HeapsnapTest):
    def record_shapes(self, mode, shapes):
        result = self.heapsnap("run", "--unwind", mode, "--", program("unwind_shapes"), shapes)
        logs = self.logs_of(result.stderr)
        self.assertEqual(len(logs), 1, result.stderr)
        expected = expected_paths(result.stdout)
        self.assertGreater(len(expected), 500 if shapes == "all" else 300)
        return logs[0], expected

    def recorded_paths(self, log, check_outer_frames):
        """The program's frames of every entry that allocated at SITE."""
        exe = os.path.realpath(program("unwind_shapes"))
        diff = self.diff(log + "@start", log + "@end")
        self.assert_no_recorder_frames(diff)
        paths = {}
        outer = collections.defaultdict(set)
        for e in diff["entries"]:
            frames = e["frames"]
            ours = [f["function"] for f in frames if os.path.realpath(f.get("module") or "") == exe]
            if not ours or ours[0] != SITE:
                # glibc's own blocks (thread start); never one of the sites.
                self.assertNotIn(SITE, ours, "site below another frame: %s" % e)
                continue
            roots = [i for i, name in enumerate(ours) if name in ROOTS]
            self.assertTrue(roots, "path without a root: %s" % e)
            key = tuple(ours[:roots[-1] + 1])  # _start, below main, is the program's too
            self.assertNotIn(key, paths, "two entries for one path: %s" % (key,))
            paths[key] = (e["bytes_delta"], e["blocks_delta"])
            self.assertEqual(frames[0]["function"], SITE, "innermost frame: %s" % frames[0])
            if check_outer_frames:
                root = max(i for i, f in enumerate(frames) if f["function"] == key[-1])
                outer[key[-1]].add(tuple(f["function"] for f in frames[root + 1:]))
        if check_outer_frames:
            # Below the root, every stack goes on the same way to its end.
            self.assertEqual(len(outer["main"]), 1, outer["main"])
            self.assertEqual(list(outer["main"])[0][-1], "_start")
            self.assertEqual(len(outer["worker_main"]), 1, outer["worker_main"])
            self.assertEqual(list(outer["worker_main"])[0][0], "start_thread")
        return paths

    def assert_stacks_defined_once(self, log):
        """The recorder interns stacks: each distinct one is defined once."""
        stacks = collections.Counter(fields["frames"] for kind, fields in self.dump(log) if kind == "stack")
        self.assertGreater(len(stacks), 500)
        self.assertEqual([frames for frames, n in stacks.items() if n > 1], [], "stacks defined twice")

    def assert_exact(self, mode, shapes, check_outer_frames=True):
        log, expected = self.record_shapes(mode, shapes)
        self.assert_stacks_defined_once(log)
        recorded = self.recorded_paths(log, check_outer_frames)
        missing = {p: v for p, v in expected.items() if recorded.get(p) != v}
        extra = {p: v for p, v in recorded.items() if expected.get(p) != v}
        self.assertEqual((len(missing), len(extra)), (0, 0),
                         "--unwind %s: expected but not recorded so: %s\nrecorded but not expected so: %s" % (
                             mode, list(missing.items())[:5], list(extra.items())[:5]))

    def test_dwarf(self):
        self.assert_exact("dwarf", "all")

    def test_auto(self):
        self.assert_exact("auto", "all")

    def test_dwarf_frame_pointer_paths(self):
        self.assert_exact("dwarf", "fp")

    def test_fp(self):
        # Frame pointers stop being right below the program's root, where
        # glibc's frames have none: only the program's frames are checked.
        self.assert_exact("fp", "fp", check_outer_frames=False)

    # ---- every stack against libunwind (HEAPSNAP_VERIFY_STACKS) -------------

    def assert_stacks_match_libunwind(self, command, env, minimum):
        """Records `command` with every captured stack unwound again by
        libunwind; none may differ."""
        result = self.heapsnap("run", "--", *command, env=dict(env, HEAPSNAP_VERIFY_STACKS="1"))
        counts = re.findall(r"^heapsnap: verify-stacks: (\d+) stacks checked, (\d+) differ from libunwind$",
                            result.stderr, re.M)
        self.assertEqual(len(counts), 1, result.stderr)
        checked, differing = map(int, counts[0])
        self.assertGreater(checked, minimum, result.stderr)
        self.assertEqual(differing, 0, result.stderr)

    def test_verify_stacks_unwind_shapes(self):
        # Longjmp, signal handlers, realigned frames, threads, rbp as data.
        self.assert_stacks_match_libunwind([program("unwind_shapes"), "all"], {}, 2500)

    def test_verify_stacks_python3(self):
        # Debian's python3, built without frame pointers: its interpreter
        # keeps data in rbp and calls malloc from hundreds of places.
        script = ("import json\n"
                  "keep = []\n"
                  "for r in range(40):\n"
                  "    batch = [{'id': i, 'name': 'item-%d' % i, 'tags': [str(i), str(r)]} for i in range(800)]\n"
                  "    keep.append(json.dumps(batch[r])); keep += [set(b['tags']) for b in batch[::50]]\n"
                  "    text = ' '.join(b['name'] for b in batch).split()\n"
                  "    del batch, text\n")
        self.assert_stacks_match_libunwind([PYTHON3, "-c", script], {"PYTHONMALLOC": "malloc"}, 50000)

    def test_verify_stacks_perl(self):
        if not os.path.exists(PERL):
            self.skipTest("no %s" % PERL)
        script = ("my %h; for my $i (1 .. 20000) { $h{\"k$i\"} = [$i, 'v' x ($i % 50)]; }"
                  " for my $i (1 .. 20000) { delete $h{\"k$i\"} if $i % 3 == 0; }"
                  " my $s = join(',', sort keys %h); print length($s) > 0 ? '' : 'empty';")
        self.assert_stacks_match_libunwind([PERL, "-e", script], {}, 20000)


if __name__ == "__main__":
    main()
