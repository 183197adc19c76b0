"""`heapsnap run`, plain LD_PRELOAD recording, `dump` and `markers` on
alloc_pattern, whose every call and live byte is known (alloc_pattern.c)."""

import collections
import os
import re
import shutil
import stat
import time

from harness import FIELD, HEAPSNAP, PAGE, PRELOAD, Growth, HeapsnapTest, main, program, split_argv

# alloc_pattern.c, live at exit.
LIVE_BYTES = 20348
LIVE_BLOCKS = 9
MMAP_BYTES = 6 * PAGE
MMAP_REGIONS = 2
# Requested sizes of the alloc records, by function.
ALLOC_SIZES = {
    "malloc": sorted([100, 200, 60] + [24] * 1000),
    "calloc": [300],
    "realloc": [50, 500],
    "reallocarray": [128, 256],
    "memalign": [1000],
    "posix_memalign": [2000],
    "aligned_alloc": [384, 8192],
    "valloc": [3000],
    "pvalloc": [5000],
}
FREES = 1005
EVENTS = sum(len(v) for v in ALLOC_SIZES.values()) + FREES + 3 + 2


class RunTest(HeapsnapTest):
    def test_exit_status_and_log_path(self):
        log = self.single_log("alloc_pattern", "7", expect=7)
        self.assertEqual(os.path.dirname(log), os.path.realpath(self.tmp))
        pid = self.markers(log)["pid"]
        self.assertEqual(os.path.basename(log), "heapsnap.alloc_pattern.%d.hslog" % pid)
        mode = os.stat(log).st_mode
        self.assertEqual(stat.S_IMODE(mode) & 0o077, 0, "log readable by others: %o" % mode)
        # The normal exit path ran although the status is not 0.
        self.assertEqual(self.marker(log, "exit")["live_bytes"], LIVE_BYTES)

    def test_killed_program_status(self):
        self.single_log("sigkill_self", expect=128 + 9)

    def test_output_pattern(self):
        os.mkdir(self.path("logs"))
        log = self.single_log("alloc_pattern", options=("-o", "logs/%e-%p.hslog"))
        pid = self.markers(log)["pid"]
        self.assertEqual(log, os.path.join(os.path.realpath(self.tmp), "logs", "alloc_pattern-%d.hslog" % pid))

    def test_program_not_found(self):
        result = self.heapsnap("run", "--", self.path("no-such-program"), expect=None)
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no-such-program", result.stderr)

    def test_markers_exact_at_exit(self):
        log = self.single_log("alloc_pattern")
        data = self.markers(log)
        self.assertEqual(data["log"], log)
        self.assertTrue(data["complete"])
        self.assertFalse(data["truncated"])
        self.assertEqual(data["exe"], os.path.realpath(program("alloc_pattern")))
        self.assertEqual(len(data["markers"]), 1, data["markers"])
        m = data["markers"][0]
        self.assertEqual((m["index"], m["label"], m["cause"]), (1, "exit", "exit"))
        self.assertEqual((m["live_bytes"], m["live_blocks"]), (LIVE_BYTES, LIVE_BLOCKS))
        self.assertEqual((m["mmap_bytes"], m["mmap_regions"]), (MMAP_BYTES, MMAP_REGIONS))
        self.assertEqual(m["events"], EVENTS)
        self.assertGreater(m["rss_bytes"], 0)
        self.assertGreaterEqual(m["threads"], 1)
        text = self.heapsnap("markers", log).stdout
        self.assertIn("exit", text)

    def test_dump_quotes_paths(self):
        # A path with a space or a quote comes in double quotes, escaped as
        # a label is; a plain one as it is.
        folder = self.path("dir with space")
        os.mkdir(folder)
        exe = os.path.join(folder, 'alloc "pattern"')
        shutil.copy(program("alloc_pattern"), exe)
        result = self.heapsnap("run", "--", exe, "7", expect=7)
        (log,) = self.logs_of(result.stderr)
        text = self.heapsnap("dump", log).stdout
        escaped = exe.replace('"', '\\"')
        self.assertIn(' exe="%s" ' % escaped, text.splitlines()[0])
        self.assertTrue(text.splitlines()[0].endswith(' argv="%s,7"' % escaped), text.splitlines()[0])
        records = self.dump(log)
        self.assertEqual(records[0][1]["exe"], exe)
        self.assertEqual(records[0][1]["argv"], exe + ",7")
        modules = [f["path"] for kind, f in records if kind == "module"]
        self.assertEqual(modules[0], exe)
        self.assertIn("linux-vdso.so.1", modules)

    def test_dump_argv_commas(self):
        # An argument's own comma is escaped (\x2c) inside quotes, so that
        # splitting argv on commas gives the arguments back; a plain
        # command line stays as it is.
        exe = program("alloc_pattern")
        result = self.heapsnap("run", "--", exe, "5", "a,b", "", "c\\d", expect=5)
        (log,) = self.logs_of(result.stderr)
        first = self.heapsnap("dump", log).stdout.splitlines()[0]
        self.assertTrue(first.endswith(' argv="%s,5,a\\x2cb,,c\\\\d"' % exe), first)
        argv = dict(FIELD.findall(first))["argv"]
        self.assertEqual(split_argv(argv), [exe, "5", "a,b", "", "c\\d"])
        result = self.heapsnap("run", "--", exe, "5", "x", expect=5)
        (log,) = self.logs_of(result.stderr)
        self.assertTrue(self.heapsnap("dump", log).stdout.splitlines()[0].endswith(" argv=%s,5,x" % exe))

    def test_dump_alloc_pattern(self):
        log = self.single_log("alloc_pattern")
        records = self.dump(log)
        kinds = collections.Counter(kind for kind, _ in records)
        self.assertEqual(records[0][0], "process")
        process = records[0][1]
        self.assertEqual(process["exe"], os.path.realpath(program("alloc_pattern")))
        self.assertEqual(process["depth"], "64")
        self.assertEqual(process["version"], "0.1.0")
        self.assertEqual(records[-1][0], "end")
        self.assertEqual(records[-1][1]["reason"], "exit")
        # The End record counts every event, including frees after the exit
        # marker (of blocks allocated before recording began).
        events = sum(1 for kind, _ in records if kind in ("alloc", "free", "mmap", "munmap"))
        self.assertEqual(records[-1][1]["events"], str(events))

        sizes = collections.defaultdict(list)
        for kind, f in records:
            if kind == "alloc":
                sizes[f["fn"]].append(int(f["size"]))
        self.assertEqual({fn: sorted(v) for fn, v in sizes.items()}, {fn: sorted(v) for fn, v in ALLOC_SIZES.items()})
        marker_at = next(i for i, (kind, _) in enumerate(records) if kind == "marker")
        self.assertEqual(sum(1 for kind, _ in records[:marker_at] if kind == "free"), FREES)
        self.assertEqual(kinds["mmap"], 3)
        self.assertEqual(kinds["munmap"], 2)
        self.assertEqual(kinds["marker"], 1)
        self.assertEqual(kinds["end"], 1)
        # A single-threaded program: no thread records, every event on thread 0.
        self.assertEqual(kinds["thread-start"], 0, "the recorder's own threads must not be recorded")
        threads = {f["thread"] for kind, f in records if kind in ("alloc", "free", "mmap", "munmap")}
        self.assertEqual(threads, {"0"})

        mmaps = sorted(int(f["length"]) for kind, f in records if kind == "mmap")
        self.assertEqual(mmaps, [2 * PAGE, 3 * PAGE, 4 * PAGE])
        for kind, f in records:
            if kind == "mmap":
                self.assertEqual((f["prot"], int(f["flags"], 16)), ("3", 0x22))
        self.assertEqual(sorted(int(f["length"]) for kind, f in records if kind == "munmap"), [PAGE, 2 * PAGE])

        marker = next(f for kind, f in records if kind == "marker")
        self.assertEqual((marker["index"], marker["cause"], marker["label"]), ("1", "exit", "exit"))
        self.assertEqual(marker["events"], str(EVENTS))

        # Stacks are defined before use; every free matches a live block
        # (realloc is a free of the old block, then the alloc of the new one).
        # A small block is named by its allocation info (a free frees one
        # live block of the info), a large one by its address.
        defined, modules = set(), set()
        live = collections.Counter()
        exe_module = None
        for kind, f in records[:marker_at]:
            if kind == "module":
                modules.add(f["id"])
                if f["path"] == os.path.realpath(program("alloc_pattern")):
                    exe_module = f["id"]
            elif kind == "stack":
                defined.add(f["id"])
                for frame in f["frames"].split(","):
                    self.assertIn(frame.split(":")[0], modules | {"0"}, "frame of an undefined module")
            elif kind in ("alloc", "mmap"):
                self.assertIn(f["stack"], defined, "stack used before its definition")
            if kind == "alloc":
                name = f.get("info") or f["addr"]
                self.assertFalse(name.startswith("0x") and live[name], "two live blocks at one address")
                live[name] += 1
            elif kind == "free":
                self.assertNotIn("untracked", f, "free of a block the log never saw allocated")
                name = f.get("info") or f["addr"]
                self.assertGreater(live[name], 0, "free of a block that is not live")
                live[name] -= 1
        self.assertEqual(sum(live.values()), LIVE_BLOCKS)
        self.assertIsNotNone(exe_module, "no module record for the program")
        # Frame 0 of the malloc(100) stack is main, in the program itself.
        first = next(f for kind, f in records if kind == "alloc")
        self.assertEqual((first["fn"], first["size"]), ("malloc", "100"))
        stack = next(f for kind, f in records if kind == "stack" and f["id"] == first["stack"])
        self.assertEqual(stack["frames"].split(",")[0].split(":")[0], exe_module)

    def test_preload_without_launcher(self):
        paths_file = self.path("paths")
        open(paths_file, "w").close()
        env = {"LD_PRELOAD": PRELOAD, "HEAPSNAP_OUTPUT": self.path("pre.%e.%p.hslog"), "HEAPSNAP_VERBOSE": "1",
               "HEAPSNAP_PATHS_FILE": paths_file, "HEAPSNAP_DEPTH": "2"}
        result = self.run_cmd([program("alloc_pattern"), "3"], expect=3, env=env)
        lines = [l for l in result.stderr.splitlines() if l.startswith("heapsnap: recording to ")]
        self.assertEqual(len(lines), 1, result.stderr)
        log = lines[0][len("heapsnap: recording to "):]
        with open(paths_file) as f:
            self.assertEqual(f.read(), log + "\n")
        m = self.marker(log, "exit")
        self.assertEqual((m["live_bytes"], m["live_blocks"]), (LIVE_BYTES, LIVE_BLOCKS))
        records = self.dump(log)
        self.assertEqual(records[0][1]["depth"], "2")
        for kind, f in records:
            if kind == "stack":
                self.assertLessEqual(len(f["frames"].split(",")), 2, f)

    def stack_report(self, cmd, verify=False):
        """Runs cmd with the recorder preloaded and HEAPSNAP_VERBOSE set
        (and HEAPSNAP_VERIFY_STACKS if `verify`); returns its stderr lines
        about stacks ("stacks interned: ", "verify-stacks: ") and the whole
        stderr, for the assertion's message."""
        env = {"LD_PRELOAD": PRELOAD, "HEAPSNAP_OUTPUT": self.path("stacks.%p.hslog"), "HEAPSNAP_VERBOSE": "1"}
        if verify:
            env["HEAPSNAP_VERIFY_STACKS"] = "1"
        result = self.run_cmd(cmd, expect=0, env=env)
        prefixes = ("heapsnap: stacks interned: ", "heapsnap: verify-stacks: ")
        return [l for l in result.stderr.splitlines() if l.startswith(prefixes)], result.stderr

    def test_stacks_handed_to_the_writer(self):
        # growth_cpp links libstdc++ dynamically, whose initializer
        # allocates before the recorder's constructor runs. Its main thread
        # interns its first stack itself (no ring yet) and hands the other
        # three (new[], new, the vector's growth) to the writer. While the
        # stack-cache pool had a run-time initializer, the constructor
        # reset the cache that thread owned and it interned all four itself
        # ("0 by the writer, 4 in the program's threads").
        lines, stderr = self.stack_report([program("growth_cpp")])
        self.assertEqual(lines, ["heapsnap: stacks interned: 3 by the writer, 1 in the program's threads"], stderr)

    def test_deep_segments_spare_walks(self):
        # deep_paths allocates at the bottom of a 40-frame recursion through
        # two paths in turn, and through a detour that rewrites the frames
        # 5 levels above the bottom (tests/programs/deep_paths.c). Its
        # second allocation of a round joins the last stack deeper than 32
        # frames: from round 2 on, its segment holds and it needs no walk,
        # so 100 rounds walk 200 times (the thread's first stack in the
        # thread, before its ring). Without segments that deep: 299 and 1.
        # Every stack is also checked against libunwind's.
        lines, stderr = self.stack_report([program("deep_paths"), "100"], verify=True)
        self.assertEqual(lines, ["heapsnap: verify-stacks: 300 stacks checked, 0 differ from libunwind",
                                 "heapsnap: stacks interned: 200 by the writer, 1 in the program's threads"], stderr)

    def test_segments_of_paths_with_one_top_kept_side_by_side(self):
        # shared_tops allocates through two paths in turn whose three
        # innermost frames are the same, at the same sp (tests/programs/
        # shared_tops.c). The first allocation is interned in the thread
        # (no ring yet), the next two walk and keep a segment each, and
        # from then on both segments hold: 2 walks in 100 rounds. While a
        # segment replaced any that started with the same three frames,
        # each evicted the other: "199 by the writer".
        lines, stderr = self.stack_report([program("shared_tops"), "100"], verify=True)
        self.assertEqual(lines, ["heapsnap: verify-stacks: 200 stacks checked, 0 differ from libunwind",
                                 "heapsnap: stacks interned: 2 by the writer, 1 in the program's threads"], stderr)

    def test_constructor_stacks_end_without_the_full_walk(self):
        # ctor_host's library allocates 100 times in its constructor, which
        # ld.so calls from _dl_start_user: no FDE covers it, and its rbp is
        # 0, where libunwind ends the stack. The walk ends it there too: one
        # stack, the thread's first (before its ring), and no stack handed
        # to the full CFI walk (to libunwind, before), which made each of
        # the 100 a stack of its own
        # ("0 by the writer, 100 in the program's threads").
        lines, stderr = self.stack_report([program("ctor_host")], verify=True)
        self.assertEqual(lines, ["heapsnap: verify-stacks: 100 stacks checked, 0 differ from libunwind",
                                 "heapsnap: stacks interned: 0 by the writer, 1 in the program's threads"], stderr)

    def test_frames_without_cfi_follow_the_frame_pointer(self):
        # unwind_shapes thunks allocates 4343 times through five frames no
        # FDE covers, on the main thread and on three threads: on glibc's
        # default stack, on a 1 MiB stack glibc makes and on a 1 MiB stack
        # of the program's own. Three of the frames keep a frame pointer:
        # two assembly thunks in the program (one with a frame of two pages,
        # whose rbp lies off the page the walk reads anyway) and a copy of
        # the small one in anonymous memory, where a JIT's code lies (node's
        # V8). libunwind guesses their callers by rbp, and the walk follows
        # rbp the same way, on every one of these stacks (or within a
        # page). In the other two rbp holds data (1) or lies 0x5000 above
        # sp, as in a JVM's compiled code, and libunwind ends the stack
        # there; so does the walk. No stack goes to the full CFI walk: the main
        # thread's first stack is interned in the thread (the others start
        # with a ring), every other walk by the writer. While all such
        # frames went to libunwind (the full walk now): "28 by the writer, 4047 in the program's
        # threads"; while only the main thread's stack was known, the
        # two-page thunk's stacks on the threads went there (403), and
        # before the program's own stack was, on that thread (213).
        # The walks: at least one for each of the other 7 distinct stacks
        # of the main thread; how many more depends on the order of the
        # paths (a stack that ends at a thunk shares no frame with the
        # others) and on where the segments' tags, which hash addresses,
        # fall in the stack cache's buckets.
        lines, stderr = self.stack_report([program("unwind_shapes"), "thunks"], verify=True)
        self.assertEqual(len(lines), 2, stderr)
        self.assertEqual(lines[0], "heapsnap: verify-stacks: 4343 stacks checked, 0 differ from libunwind", stderr)
        interned = re.fullmatch(r"heapsnap: stacks interned: (\d+) by the writer, 1 in the program's threads", lines[1])
        self.assertIsNotNone(interned, stderr)
        self.assertGreaterEqual(int(interned.group(1)), 7, stderr)

    def test_depth_option(self):
        log = self.single_log("alloc_pattern", options=("--depth", "1"))
        records = self.dump(log)
        self.assertEqual(records[0][1]["depth"], "1")
        self.assertTrue(all(len(f["frames"].split(",")) == 1 for kind, f in records if kind == "stack"))

    def test_event_times_after_idle_gaps(self):
        # One recording thread may reuse its last clock reading while the
        # writer's stamp tick is fresh; after a 20 ms sleep it must not.
        log = self.single_log("idle_gaps")
        bursts = collections.defaultdict(list)
        for kind, f in self.dump(log):
            if kind == "alloc" and 1000 <= int(f["size"]) < 1010:
                bursts[int(f["size"]) - 1000].append(float(f["t"]))
        self.assertEqual(sorted(bursts), list(range(10)))
        self.assertEqual({len(times) for times in bursts.values()}, {2000})
        for b in range(9):
            gap = min(bursts[b + 1]) - max(bursts[b])
            # Event times are exact to 1 ms (formats/hslog.md).
            self.assertGreaterEqual(gap, 0.019, "burst %d starts %.4f s after burst %d" % (b + 1, gap, b))

    def test_interval_markers(self):
        growth = Growth(self, "--interval", "0.05")
        time.sleep(0.5)
        logs = growth.finish()
        self.assertEqual(len(logs), 1)
        markers = self.markers(logs[0])["markers"]
        causes = [m["cause"] for m in markers]
        self.assertGreaterEqual(causes.count("interval"), 4, causes)
        self.assertEqual(causes[-1], "exit")
        self.assertEqual([m["index"] for m in markers], list(range(1, len(markers) + 1)))
        times = [m["time_s"] for m in markers]
        self.assertEqual(times, sorted(times))

    def test_unrecorded_program_runs_unchanged(self):
        # The header's heapsnap_marker() is harmless without the recorder.
        result = self.run_cmd([program("growth"), "--auto"], expect=0)
        self.assertEqual(result.stderr, "")
        result = self.run_cmd([program("growth")], input="mark A\nquit\n", expect=0)
        self.assertEqual(result.stdout.splitlines()[1:], ["marked A 0", "bye"])


class HeaptrackAgreementTest(HeapsnapTest):
    """The acceptance check: for Debian's python3 printing 1, the
    exit marker's live blocks are heaptrack's leaked allocations, and its
    live bytes heaptrack's leaked plus suppressed bytes (which heaptrack_print
    rounds to three digits)."""

    @staticmethod
    def parse_size(text):
        m = re.match(r"([0-9.]+)([KMG]?)B?$", text.strip())
        return float(m.group(1)) * {"": 1, "K": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]

    def test_python_print_agrees_with_heaptrack(self):
        if not shutil.which("heaptrack") or not os.path.exists("/usr/bin/python3"):
            self.skipTest("heaptrack or /usr/bin/python3 not installed")
        env = {"PYTHONMALLOC": "malloc", "PYTHONHASHSEED": "0"}
        cmd = ["/usr/bin/python3", "-c", "print(1)"]
        result = self.run_cmd([HEAPSNAP, "run", "--"] + cmd, expect=0, env=env)
        exit_marker = self.marker(self.logs_of(result.stderr)[0], "exit")
        traced = self.run_cmd(["heaptrack", "-o", self.path("ht")] + cmd, expect=0, env=env)
        leaked_allocations = int(re.search(r"leaked allocations:\s+(\d+)", traced.stdout + traced.stderr).group(1))
        self.assertEqual(exit_marker["live_blocks"], leaked_allocations)
        data = [f for f in os.listdir(self.tmp) if f.startswith("ht")][0]
        printed = self.run_cmd(["heaptrack_print", "-f", self.path(data)], expect=0).stdout
        leaked = self.parse_size(re.search(r"total memory leaked: (\S+)", printed).group(1))
        suppressed = re.search(r"suppressed leaks: (\S+)", printed)
        leaked += self.parse_size(suppressed.group(1)) if suppressed else 0
        self.assertAlmostEqual(exit_marker["live_bytes"], leaked, delta=max(5, leaked * 0.001))


if __name__ == "__main__":
    main()
