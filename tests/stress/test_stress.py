"""Stress: the C programs of tests/stress run under `heapsnap run` exactly
as they run alone (same output, same exit status, no hang), and their logs
give the live bytes each program knows it keeps, to the byte.

Threads (16 at once, handoff with realloc across threads, thousands of short
threads, 100 000 threads 8 at a time in bounded recorder memory, what a
thread's creation allocates), fork while other threads allocate, malloc in
a signal handler, mmap and munmap in a signal handler inside the recorder's
hooks, handlers that leave the hooks by siglongjmp, dlopen/dlclose churn,
closing every descriptor, exit() from a thread, _exit (also from a signal
handler), abort/SIGSEGV, vfork+exec, execl, fexecve and execveat.
See each program's header for its numbers. Timeouts are hang detectors (a deadlocked child, a recorder
waiting forever), not performance bounds.
"""

import concurrent.futures
import os
import re
import signal
import struct
import subprocess
import unittest

from harness import PRELOAD, PROGRAMS_DIR, main, program
from unchanged import UnchangedTest, pretty

STRESS_SRC = os.environ.get("STRESS_SRC", "")
# Programs here allocate and free one block until enough signals have
# come (signal_alloc): genuine logs that compress some 20 000 to 1, past
# the decompression a file of their size is granted (util/read_budget.h;
# the budget itself is tested on crafted files, tests/fuzz).
os.environ["HEAPSNAP_READ_VOLUME"] = "unlimited"
CHURN_PLUGIN = os.path.join(PROGRAMS_DIR, "libchurn_plugin.so")


def has_tls(path):
    """Whether the ELF file at `path` has a PT_TLS program header."""
    with open(path, "rb") as f:
        elf = f.read()
    phoff, = struct.unpack_from("<Q", elf, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", elf, 0x36)
    return any(struct.unpack_from("<I", elf, phoff + i * phentsize)[0] == 7 for i in range(phnum))


def needed_libraries(path):
    """The shared libraries `path` loads (ldd), but libc and the loader,
    which every program loads anyway."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    libs = re.findall(r"=> (/\S+)", out)
    return [lib for lib in libs if not re.search(r"/(libc|ld-linux[^/]*)\.so", lib)]


def stress_site(source, site):
    pattern = re.compile(r"@site:%s(?![\w])" % re.escape(site))
    with open(os.path.join(STRESS_SRC, source)) as f:
        lines = [n for n, text in enumerate(f, 1) if pattern.search(text)]
    assert len(lines) == 1, "@site:%s in %s: %s" % (site, source, lines)
    return lines[0]


class StressTest(UnchangedTest):
    def one_log(self, logs):
        self.assertEqual(len(logs), 1, logs)
        return logs[0]

    def assert_site_entry(self, log, old, new, function, source, bytes_, blocks):
        """Between two moments, the stacks through `function` grew by exactly
        bytes_/blocks_, and the allocation is attributed to `function` at
        its @site line."""
        diff = self.diff(log + "@" + old, log + "@" + new, "--group-by", "line")
        entries = [e for e in diff["entries"] if e["frames"] and e["frames"][0].get("function") == function]
        self.assertEqual(len(entries), 1, "entries of %s: %s" % (function, pretty(diff["entries"])))
        e = entries[0]
        self.assertEqual((e["bytes_delta"], e["blocks_delta"]), (bytes_, blocks), pretty(e))
        frame = e["frames"][0]
        self.assertEqual(os.path.basename(frame["file"] or ""), source, pretty(frame))
        self.assertEqual(frame["line"], stress_site(source, function), pretty(frame))
        return e

    # ---- threads ------------------------------------------------------------

    def test_sixteen_threads(self):
        result, logs = self.assert_unchanged([program("stress_threads16")], status=0)
        self.assertEqual(result.stdout, b"threads16: 16 threads, 640 blocks kept\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "started", "joined", "keep_block", "threads16.c", 68800, 640)
        self.assert_site_entry(log, "started", "exit", "keep_block", "threads16.c", 68800, 640)
        # 16 threads, 20000 rounds each, an alloc and a free a round (the
        # realloc rounds record both too), plus the kept blocks.
        events = self.marker(log, "joined")["events"] - self.marker(log, "started")["events"]
        self.assertGreaterEqual(events, 16 * 20000 * 2)

    def test_realloc_handoff_across_threads(self):
        result, logs = self.assert_unchanged([program("stress_realloc_handoff")], status=0)
        self.assertEqual(result.stdout, b"realloc_handoff: 200 kept\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "started", "joined", "grow_block", "realloc_handoff.c", 400600, 200)
        diff = self.diff(log + "@started", log + "@joined", "--group-by", "line")
        self.assertEqual([e for e in diff["entries"] if e["frames"][0].get("function") == "make_block"], [],
                         "make_block's blocks were all reallocated or freed")

    def test_thread_churn(self):
        result, logs = self.assert_unchanged([program("stress_thread_churn")], status=0)
        self.assertEqual(result.stdout, b"thread_churn: 4000 threads\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "started", "done", "churn_keep", "thread_churn.c", 8000, 40)
        kinds = [kind for kind, _ in self.dump(log)]
        self.assertEqual(kinds.count("thread-start"), 4000)
        self.assertEqual(kinds.count("thread-exit"), 4000)

    def test_thread_turnover_memory(self):
        # 100 000 threads, 8 alive at a time: what the recorder keeps per
        # thread is given back at its exit, so its memory does not grow
        # with the threads there were.
        result, logs = self.run_recorded([program("stress_thread_turnover")])
        self.assertEqual(result.returncode, 0, result.stderr[-2000:])
        lines = result.stdout.decode().splitlines()
        self.assertEqual(len(lines), 3, lines)
        rss_kb = {}
        for line in lines[:2]:
            m = re.fullmatch(r"after (\d+) threads: VmRSS (\d+) kB", line)
            self.assertTrue(m, line)
            rss_kb[int(m.group(1))] = int(m.group(2))
        self.assertEqual(sorted(rss_kb), [100, 100000])
        self.assertEqual(lines[2], "thread_turnover: 100000 threads, 100 blocks kept")
        self.assertLessEqual(rss_kb[100000] - rss_kb[100], 16 << 10, rss_kb)
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "started", "last", "turnover_keep", "thread_turnover.c", 12000, 100)
        self.assert_site_entry(log, "started", "exit", "turnover_keep", "thread_turnover.c", 12000, 100)
        self.assertEqual(self.marker(log, "last")["threads"], 1)
        # The address-space summary's Recorder row: what the recorder says
        # it holds follows the threads alive, too.
        held = {label: self.json_of("maps", log + "@" + label, "--format", "json")["recorder_bytes"]
                for label in ("first", "last")}
        self.assertLessEqual(held["last"] - held["first"], 16 << 20, held)

    # ---- processes ----------------------------------------------------------

    def test_fork_while_threads_allocate(self):
        result, logs = self.assert_unchanged([program("stress_fork_busy")], status=0)
        self.assertEqual(result.stdout, b"fork_busy: 30 children exited 7\n")
        self.assertEqual(len(logs), 31, logs)
        by_pid = {int(self.process_of(log)["pid"]): log for log in logs}
        parents = [log for log in logs if int(self.process_of(log)["ppid"]) not in by_pid]
        self.assertEqual(len(parents), 1, logs)
        for log in logs:
            self.assert_replays(log, ended=("exit",))
            if log in parents:
                continue
            # Each child's own log: the one block it kept, and nothing of
            # the parent's threads.
            self.assert_site_entry(log, "0s", "exit", "child_keep", "fork_busy.c", 4321, 1)

    def test_malloc_in_signal_handler(self):
        result, logs = self.assert_unchanged([program("stress_signal_alloc")], status=0)
        self.assertEqual(result.stdout, b"signal_alloc: 2000 signals, 20 kept\n")
        self.assert_replays(self.one_log(logs), ended=("exit",))

    # Every allocation of a signal handler is recorded, also those that
    # interrupted the recorder's own stack capture on the same thread (they
    # get the handler's function as a one-frame stack).
    def test_signal_handler_allocations_recorded(self):
        _, logs = self.run_recorded([program("stress_signal_alloc")])
        log = self.one_log(logs)
        sizes = [int(f["size"]) for kind, f in self.dump(log) if kind == "alloc"]
        self.assertEqual((sizes.count(48), sizes.count(777)), (2001, 20))
        self.assert_site_entry(log, "0s", "done", "handler_keep", "signal_alloc.c", 15540, 20)

    def assert_mappings(self, log, label, regions, size, unrecorded=0):
        m = self.marker(log, label)
        self.assertEqual((m["mmap_regions"], m["mmap_bytes"], m["unrecorded"]), (regions, size, unrecorded), pretty(m))

    # A handler that maps, unmaps and allocates wherever a timer lands:
    # in the recorder's mmap, munmap and malloc hooks too, which once left
    # the process spinning on a lock the interrupted hook held.
    def test_mmap_in_signal_handler(self):
        result, logs = self.assert_unchanged([program("stress_signal_maps")], status=0)
        self.assertEqual(result.stdout, b"signal_maps: 2000 signals, 20 kept\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        for label in ("done", "exit"):
            self.assert_mappings(log, label, 20, 20 * 7 * 4096)
        self.assert_site_entry(log, "0s", "done", "handler_keep", "signal_maps.c", 11100, 20)

    # The same at known points, from inside the allocator the hooks call:
    # a handler's mappings made while its thread is inside malloc are the
    # program's, not the allocator's heap.
    def test_signal_handler_inside_the_allocator(self):
        result, logs = self.assert_unchanged([program("stress_signal_reenter")], status=0)
        self.assertEqual(result.stdout, b"signal_reenter: 300 signals, 30 kept\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        for label in ("done", "exit"):
            self.assert_mappings(log, label, 30, 30 * 7 * 4096)
        self.assert_site_entry(log, "0s", "done", "handler_keep", "signal_reenter.c", 16650, 30)

    # Handlers that leave the hooks by siglongjmp: the thread records on,
    # a mapping made before the jump is in the log, a block the jump took
    # from the hook is counted unrecorded (stress/signal_jump.c).
    def test_siglongjmp_out_of_hooks(self):
        result, logs = self.assert_unchanged([program("stress_signal_jump")], status=0)
        self.assertEqual(result.stdout, b"signal_jump: 50 + 50 + 200 + 200 jumps\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        left = [m for m in self.markers(log)["markers"] if m["label"].startswith("left=")]
        self.assertEqual(len(left), 1, left)
        left_bytes = int(left[0]["label"][len("left="):])
        self.assertEqual((left[0]["mmap_bytes"], left[0]["unrecorded"]), (50 * 5 * 4096 + left_bytes, 50),
                         pretty(left[0]))
        # Part 4's jumps land in the hooks or not: at most one event each.
        unrecorded = self.marker(log, "jumped")["unrecorded"]
        self.assertGreaterEqual(unrecorded, 50)
        self.assertLessEqual(unrecorded, 50 + 200)
        for label in ("done", "exit"):
            self.assert_mappings(log, label, 60, 50 * 5 * 4096 + 10 * 9 * 4096, unrecorded)
        self.assert_site_entry(log, "jumped", "done", "keep_block", "signal_jump.c", 12000, 40)
        listing = self.heapsnap("markers", log)
        self.assertIn("%d events could not be recorded" % unrecorded, listing.stderr)

    # ---- what a thread costs -----------------------------------------------

    # The recorder defines no thread-local variable: a thread's creation
    # allocates what it does bare, less what the recorder's libraries add
    # (a DTV entry of 16 bytes for each with a TLS segment: libunwind's).
    def test_thread_creation_allocates_as_bare(self):
        self.assertFalse(has_tls(PRELOAD), "the recorder has a TLS segment")
        added = [lib for lib in needed_libraries(PRELOAD) if has_tls(lib)]
        argv = [program("stress_thread_tls")]
        bare = self.run_raw(argv)
        recorded, logs = self.run_recorded(argv)
        self.assertEqual((bare.returncode, recorded.returncode), (0, 0), recorded.stderr)
        self.assertEqual(recorded.stderr, b"")
        self.assert_replays(self.one_log(logs), ended=("exit",))
        expected = bare.stdout.decode().splitlines()
        first = re.fullmatch(r"thread 0: callocs -(\d+)(.*)", expected[0])
        self.assertTrue(first, expected[0])
        expected[0] = "thread 0: callocs -%d%s" % (int(first.group(1)) + 16 * len(added), first.group(2))
        self.assertEqual(recorded.stdout.decode().splitlines(), expected, "libraries with TLS: %s" % added)

    def test_dlopen_dlclose_churn(self):
        result, logs = self.assert_unchanged([program("stress_dlopen_churn"), CHURN_PLUGIN], status=0)
        self.assertEqual(result.stdout, b"dlopen_churn: 300 rounds\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "started", "done", "plugin_keep", "churn_plugin.c", 30897, 300)
        loads = [f for kind, f in self.dump(log) if kind == "module" and f["path"].endswith("libchurn_plugin.so")]
        self.assertGreaterEqual(len(loads), 1)

    def test_close_every_fd(self):
        for mode in ("loop", "range"):
            with self.subTest(mode=mode):
                result, logs = self.assert_unchanged([program("stress_close_fds"), mode], status=5)
                self.assertEqual(result.stdout, b"close_fds: closing (%s)\n" % mode.encode())
                log = self.one_log(logs)
                self.assert_replays(log, ended=("exit",))
                self.assert_site_entry(log, "0s", "after-close", "after_close", "close_fds.c", 16665, 3)
                self.assert_site_entry(log, "0s", "exit", "after_close", "close_fds.c", 16665, 3)

    def test_main_thread_pthread_exit_races(self):
        # The last thread's exit hook stops the writer while the worker,
        # 0.1 s later, records its first event and starts it again; runs
        # side by side on two cores make the two overlap. A start racing a
        # stop once made the stop join a writer never told to stop (a hang)
        # or end the log without its End record.
        argv = [program("stress_main_exit")]
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda _: self.run_recorded(argv), range(32)))
        for result, logs in runs:
            self.assertEqual((result.returncode, result.stdout), (0, b"main_exit: worker done\n"),
                             result.stderr[-2000:])
            end = self.end_record(self.one_log(logs))
            self.assertEqual((end or {}).get("reason"), "exit", logs)

    def test_main_thread_pthread_exit(self):
        # The writer thread must not keep the process alive once the
        # program's last thread has gone.
        result, logs = self.assert_unchanged([program("stress_main_exit")], status=0)
        self.assertEqual(result.stdout, b"main_exit: worker done\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "0s", "exit", "worker_keep", "main_exit.c", 100, 1)
        self.assert_site_entry(log, "0s", "exit", "main_keep", "main_exit.c", 10, 1)

    def test_exit_from_a_thread(self):
        result, logs = self.assert_unchanged([program("stress_exit_thread")], status=3)
        self.assertEqual(result.stdout, b"exit_thread: exiting from a thread\n")
        log = self.one_log(logs)
        self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(log, "0s", "exit", "thread_keep", "exit_thread.c", 6060, 2)

    def run_leaving(self, argv, status, said, ended=("exit",)):
        """argv runs as it does alone (exit status, output `said`); returns
        its one log and what the log replays to (assert_replays)."""
        result, logs = self.assert_unchanged(argv, status=status)
        self.assertEqual(result.stdout, said)
        log = self.one_log(logs)
        return log, self.assert_replays(log, ended=ended)

    # _exit runs no destructor: the recorder's _exit hook ends the log as
    # exit does, so nothing recorded is lost (before the hook, "now" lost
    # both blocks: they were still in the thread's ring).
    def test_underscore_exit_ends_the_log(self):
        for mode, markers in (("_exit", ["before-death", "exit"]), ("now", ["exit"])):
            with self.subTest(mode=mode):
                log, data = self.run_leaving([program("stress_dying"), mode], 4, b"dying: %s\n" % mode.encode())
                self.assertEqual([m["label"] for m in data["markers"]], markers)
                self.assert_site_entry(log, "0s", "exit", "doomed_keep", "dying.c", 4936, 2)

    # quick_exit calls _exit inside glibc, past the hook: the recorder's
    # at_quick_exit handler, which runs after the program's, ends the log.
    def test_quick_exit_ends_the_log(self):
        log, data = self.run_leaving([program("stress_dying"), "quick_exit"], 4, b"dying: quick_exit\n")
        self.assertEqual([m["label"] for m in data["markers"]], ["before-death", "exit"])
        self.assert_site_entry(log, "0s", "exit", "doomed_keep", "dying.c", 2468, 1)

    # _exit from a signal handler, wherever the main loop was (the
    # recorder's hooks included): no hang, the program's status, and a log
    # that replays. Where the handler interrupted the recorder on its
    # thread, the log is left without an end (as a killed process's); else
    # it ends as at exit, with every block the handler kept.
    def test_underscore_exit_from_a_signal_handler(self):
        # About half the runs end each way (30 runs: 15 and 15).
        for _ in range(3):
            log, data = self.run_leaving([program("stress_signal_alloc"), "_exit"], 7,
                                         b"signal_alloc: _exit from the handler\n", ended=("exit", None))
            if data["complete"]:
                self.assert_site_entry(log, "0s", "exit", "handler_keep", "signal_alloc.c", 15540, 20)

    # exit in one thread and _exit in another at once: the log is ended
    # once, whole, whichever comes first (the other waits for it).
    def test_exit_and_underscore_exit_at_once(self):
        for _ in range(3):
            log, data = self.run_leaving([program("stress_exit_thread"), "race"], 3,
                                         b"exit_thread: exiting from a thread\n")
            self.assertEqual([m["label"] for m in data["markers"]], ["exit"])
            self.assert_site_entry(log, "0s", "exit", "thread_keep", "exit_thread.c", 6060, 2)

    def test_deaths_without_exit(self):
        for mode, status in (("abort", 128 + signal.SIGABRT), ("segv", 128 + signal.SIGSEGV)):
            with self.subTest(mode=mode):
                result, logs = self.assert_unchanged([program("stress_dying"), mode], status=None)
                self.assertEqual(result.returncode, status)
                self.assertEqual(result.stdout, b"dying: %s\n" % mode.encode())
                log = self.one_log(logs)
                data = self.assert_replays(log, ended=(None,))
                self.assertFalse(data["complete"])
                self.assertEqual([m["label"] for m in data["markers"]], ["before-death"])
                self.assert_site_entry(log, "0s", "before-death", "doomed_keep", "dying.c", 4936, 2)
                self.assert_site_entry(log, "0s", "end", "doomed_keep", "dying.c", 4936, 2)
                self.assert_error(["snapshot", log, "--at", "exit", "-o", self.path("x.hsnap")],
                                  ': no marker "exit": the log has no end: the process was killed, crashed or is '
                                  'still running — use @end for everything the log holds; '
                                  'markers: 1 "before-death"\n')

    # A process killed before the writer's first timed frame cut still
    # leaves a readable log: the Process record is written when the log is
    # created. (Its last events are lost, formats/hslog.md.)
    def test_quick_death_log_readable(self):
        result, logs = self.assert_unchanged([program("stress_dying"), "abort-now"], status=128 + signal.SIGABRT)
        self.assertEqual(result.stdout, b"dying: abort-now\n")
        log = self.one_log(logs)
        data = self.assert_replays(log, ended=(None,))
        self.assertEqual(data["markers"], [])

    def test_vfork_exec(self):
        result, logs = self.assert_unchanged([program("stress_vfork_exec")], status=0)
        self.assertEqual(result.stdout, b"vfork_exec child: hello\nvfork_exec: child 0, missing 127\n")
        # The parent's log and the exec'd child's; the child that failed to
        # exec shared the parent's memory and recorded nothing.
        self.assertEqual(len(logs), 2, logs)
        info = {log: self.process_of(log) for log in logs}
        parent = next(log for log in logs if info[log]["argv"] == program("stress_vfork_exec"))
        child = next(log for log in logs if log != parent)
        self.assertEqual(info[child]["ppid"], info[parent]["pid"])
        for log in logs:
            self.assert_replays(log, ended=("exit",))
        self.assert_site_entry(parent, "0s", "exit", "parent_keep", "vfork_exec.c", 1111, 1)
        self.assert_site_entry(child, "0s", "exit", "child_keep", "vfork_exec.c", 2222, 1)

    # execl (rebuilt into execve by the hooks), and fexecve and execveat,
    # which glibc runs past execve: the log of the image before the exec
    # ends with its End record and keeps its block (before fexecve and
    # execveat had hooks, that log lost every event and had no end).
    def test_exec_ends_the_log(self):
        for call in ("execl", "fexecve", "execveat"):
            with self.subTest(call=call):
                self.assert_exec_ends_the_log(call)

    def assert_exec_ends_the_log(self, call):
        result, logs = self.assert_unchanged([program("stress_vfork_exec"), call], status=0)
        self.assertEqual(result.stdout, b"vfork_exec: %s\nvfork_exec child: hello\n" % call.encode())
        self.assertEqual(len(logs), 2, logs)
        before, after = logs
        self.assert_replays(before, ended=("exec",))
        self.assert_site_entry(before, "0s", "end", "exec_keep", "vfork_exec.c", 3333, 1)
        self.assert_error(["snapshot", before, "--at", "exit", "-o", self.path("x.hsnap")],
                          ': no marker "exit": the process called exec, where this log ends (the new program '
                          'records into a log of its own) — use @end for everything the log holds; '
                          'the log has no markers\n')
        self.assert_replays(after, ended=("exit",))
        self.assert_site_entry(after, "0s", "exit", "child_keep", "vfork_exec.c", 2222, 1)

if __name__ == "__main__":
    main()
