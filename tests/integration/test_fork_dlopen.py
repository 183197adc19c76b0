"""fork (forker.c: the child gets its own log with its own exact numbers;
with --no-follow, none, and nothing the program execs is recorded) and
dlopen/dlclose (dlopen_host.c + leaky_plugin.c: a leak from an unloaded
plugin still names the plugin's function and line)."""

import collections
import os

from harness import PLUGIN, PRELOAD, HeapsnapTest, main, program


class ForkTest(HeapsnapTest):
    def test_child_has_its_own_log(self):
        logs = self.record("forker")
        self.assertEqual(len(logs), 2, logs)
        info = {log: self.markers(log) for log in logs}
        by_pid = {data["pid"]: log for log, data in info.items()}
        self.assertEqual(len(by_pid), 2)
        process = {log: self.dump(log)[0][1] for log in logs}
        parents = [log for log in logs if int(process[log]["ppid"]) not in by_pid]
        self.assertEqual(len(parents), 1, process)
        parent = parents[0]
        child = next(log for log in logs if log != parent)
        parent_pid = info[parent]["pid"]
        child_pid = info[child]["pid"]
        self.assertEqual(int(process[child]["ppid"]), parent_pid)
        for log, pid in ((parent, parent_pid), (child, child_pid)):
            self.assertEqual(os.path.basename(log), "heapsnap.forker.%d.hslog" % pid)
            self.assertTrue(info[log]["complete"])

        p = self.marker(parent, "exit")
        self.assertEqual((p["live_bytes"], p["live_blocks"]), (2050, 3))
        c = self.marker(child, "exit")
        self.assertEqual((c["live_bytes"], c["live_blocks"]), (9999, 3))
        self.assertEqual(len(info[child]["markers"]), 1, "the child's markers start from 1, its own")
        self.assertEqual(c["index"], 1)

        # The child's log holds only the child's events: its 3 leaks and the
        # free of an inherited block, which no alloc record precedes.
        records = self.dump(child)
        records = records[:next(i for i, (kind, _) in enumerate(records) if kind == "marker")]
        allocs = [f for kind, f in records if kind == "alloc"]
        self.assertEqual(sorted(int(f["size"]) for f in allocs), [3333] * 3)
        frees = [f for kind, f in records if kind == "free"]
        self.assertEqual(len(frees), 1)
        # A block the child's log never saw allocated: named by address, not by info.
        self.assertNotIn("info", frees[0])
        self.assertIn("addr", frees[0])
        self.assertEqual(frees[0].get("untracked"), "1")
        parent_sizes = sorted(int(f["size"]) for kind, f in self.dump(parent) if kind == "alloc")
        self.assertEqual(parent_sizes, [50, 1000, 1000])

        # Each log makes a self-contained snapshot with its own numbers.
        for log, live in ((parent, (2050, 3)), (child, (9999, 3))):
            snap = self.snapshot(log, "--at", "exit", "-o", self.path(os.path.basename(log) + ".hsnap"))
            diff = self.diff(snap, snap)
            self.assertEqual(diff["entries"], [])
            self.assertEqual((diff["new"]["live_bytes"], diff["new"]["live_blocks"]), live)
            self.assertEqual(diff["new"]["pid"], info[log]["pid"])
        # Attribution in each process: parent's exit against the child's.
        cross = self.diff(parent + "@exit", child + "@exit")
        self.assert_site(cross, "child_leak", "forker.c", "child_leak", 9999, 3, old_bytes=0)
        self.assert_site(cross, "parent_keep", "forker.c", "parent_keep", -2000, -2, old_bytes=2000)
        self.assert_site(cross, "parent_after", "forker.c", "parent_after", -50, -1, old_bytes=50)


class DaemonTest(HeapsnapTest):
    def test_daemon_parent_log_ends(self):
        # daemon(3)'s parent leaves by _exit inside glibc: its log ends
        # all the same, with its exit marker. The daemon keeps the pipes,
        # so the run returns once it has exited too; its log may be
        # opened after the launcher lists the logs, so the folder is read.
        result = self.heapsnap("run", "--", program("daemonizer"))
        self.assertEqual(result.stdout, "daemon done\n")
        logs = sorted(self.path(f) for f in os.listdir(self.tmp) if f.endswith(".hslog"))
        self.assertEqual(len(logs), 2, logs)
        live = {}
        for log in logs:
            data = self.markers(log)
            self.assertTrue(data["complete"], log)
            self.assertEqual([m["label"] for m in data["markers"]], ["exit"], log)
            exit_marker = data["markers"][0]
            live[exit_marker["live_bytes"]] = log
            self.assertEqual(exit_marker["live_blocks"], 1, log)
            kind, end = self.dump(log)[-1]
            self.assertEqual((kind, end["reason"]), ("end", "exit"), log)
        self.assertEqual(sorted(live), [1111, 2222])
        for size, site in ((1111, "parent_keep"), (2222, "child_keep")):
            diff = self.diff(live[size] + "@0s", live[size] + "@exit")
            self.assert_site(diff, site, "daemonizer.c", site, size, 1, old_bytes=0)


class NoFollowTest(HeapsnapTest):
    def process(self, log):
        return self.dump(log)[0][1]

    def test_fork_child_not_recorded(self):
        log = self.single_log("forker", options=("--no-follow",))
        # forker exits 0 only if its child exited 0.
        self.assertEqual(os.path.basename(self.process(log)["exe"]), "forker")
        self.assertTrue(self.markers(log)["complete"])
        p = self.marker(log, "exit")
        self.assertEqual((p["live_bytes"], p["live_blocks"]), (2050, 3))
        sizes = sorted(int(f["size"]) for kind, f in self.dump(log) if kind == "alloc")
        self.assertEqual(sizes, [50, 1000, 1000])

    def script(self):
        """sh runs alloc_pattern (its $1), then prints what env sees of the
        recorder (HEAPSNAP_PRELOAD_LIB, which the suite sets for the
        launcher, aside), and leaves with status 3."""
        with open(self.path("script.sh"), "w") as f:
            f.write('"$1" >/dev/null || exit 9\n'
                    'env | grep -E "^(LD_PRELOAD|HEAPSNAP_)" | grep -v "^HEAPSNAP_PRELOAD_LIB=" | sort\n'
                    'exit 3\n')
        return ["/bin/sh", "script.sh", program("alloc_pattern")]

    def shell(self, *options):
        result = self.heapsnap("run", *options, "--", *self.script(), expect=3)
        exes = [os.path.basename(self.process(log)["exe"]) for log in self.logs_of(result.stderr)]
        return exes, result.stdout

    def test_exec_not_recorded(self):
        exes, env = self.shell("--no-follow")
        self.assertEqual(exes, [os.path.basename(os.path.realpath("/bin/sh"))])
        # Neither the recorder's LD_PRELOAD nor the launcher's variables
        # are passed on.
        self.assertEqual(env, "")

    def test_exec_recorded_by_default(self):
        exes, env = self.shell()
        self.assertIn("alloc_pattern", exes)
        self.assertIn("env", exes)
        lines = env.splitlines()
        self.assertTrue(lines[0].startswith("HEAPSNAP_DEPTH=64"), lines)
        self.assertEqual(lines[-1], "LD_PRELOAD=" + PRELOAD)

    def test_other_preloads_kept(self):
        # Plain LD_PRELOAD (an ASan launcher could not take these entries
        # in front of its runtime): the recorder's entry goes, the others
        # stay in their order.
        env = {"LD_PRELOAD": "libc.so.6 %s:libm.so.6" % PRELOAD, "HEAPSNAP_FOLLOW": "0",
               "HEAPSNAP_OUTPUT": self.path("%e.%p.hslog")}
        result = self.run_cmd(self.script(), expect=3, env=env)
        self.assertEqual(result.stdout, "LD_PRELOAD=libc.so.6:libm.so.6\n")
        logs = [f for f in os.listdir(self.tmp) if f.endswith(".hslog")]
        self.assertEqual(len(logs), 1, logs)
        self.assertEqual(self.process(self.path(logs[0]))["exe"], os.path.realpath("/bin/sh"))


class DlopenTest(HeapsnapTest):
    def leak_diff(self, log, new_marker):
        diff = self.diff(log + "@before-dlopen", log + "@" + new_marker)
        e = self.assert_site(diff, "plugin_leak", "leaky_plugin.c", "plugin_leak", 4242, 1, old_bytes=0, old_blocks=0)
        self.assertEqual(os.path.basename(e["frames"][0]["module"]), os.path.basename(PLUGIN))
        self.assertEqual(e["frames"][1]["function"], "main")
        self.assertEqual(os.path.basename(e["frames"][1]["file"]), "dlopen_host.c")
        return diff

    def test_leak_of_unloaded_plugin(self):
        log = self.single_log("dlopen_host", PLUGIN)
        self.leak_diff(log, "after-dlclose")
        self.leak_diff(log, "exit")
        # Through a snapshot file: self-contained, the plugin's module kept.
        before = self.snapshot(log, "--at", "before-dlopen", "-o", self.path("before.hsnap"))
        after = self.snapshot(log, "--at", "after-dlclose", "-o", self.path("after.hsnap"))
        diff = self.diff(before, after)
        self.assert_site(diff, "plugin_leak", "leaky_plugin.c", "plugin_leak", 4242, 1)

    def test_module_records(self):
        log = self.single_log("dlopen_host", PLUGIN)
        records = self.dump(log)
        plugin = [f for kind, f in records if kind == "module" and os.path.basename(f["path"]) == os.path.basename(PLUGIN)]
        self.assertEqual(len(plugin), 1, "module records of the plugin: %s" % plugin)
        build_id = plugin[0]["build_id"]
        self.assertRegex(build_id, r"^[0-9a-f]{16,}$")
        unloads = [f for kind, f in records if kind == "module-unload" and f["id"] == plugin[0]["id"]]
        self.assertEqual(len(unloads), 1, "the plugin's dlclose is recorded")
        kinds = [kind for kind, f in records]
        marker_after = next(i for i, (kind, f) in enumerate(records) if kind == "marker" and f["label"] == "after-dlclose")
        unload_at = next(i for i, (kind, f) in enumerate(records) if kind == "module-unload" and f["id"] == plugin[0]["id"])
        self.assertLess(unload_at, marker_after, "the unload is recorded before the marker that follows dlclose")
        self.assertEqual(collections.Counter(kinds)["end"], 1)


if __name__ == "__main__":
    main()
