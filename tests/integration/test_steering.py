"""Steering a recording while it runs, on tests/programs/warmup.c:

- Warm-up without stacks: `run --stacks-after`, `run --paused` + `heapsnap
  resume PID`, `heapsnap pause`/`resume` of a running process. While
  paused every allocation and free is still recorded, at one site,
  "(allocated while paused)": its bytes and blocks are exact, a block
  allocated while paused and freed after is freed, and the live set at exit
  is the one a run without pause has. Markers note each switch.
- Threshold markers: `run --snapshot-when RULE` for live>, growth> (one
  marker per multiple, labelled growth>S, growth>S#2, ...) and rss>, each
  usable as LOG@RULE.
- What the commands refuse, in one line each.
"""

import json
import os
import pwd
import re
import subprocess
import time

from harness import HEAPSNAP, TIMEOUT, HeapsnapTest, main, parse_dump, program, site_line

SRC = "warmup.c"
PAUSED = "(allocated while paused)"
CACHE = (600 * 200, 600)      # cache_fill
SCRATCH = (100 * 3000, 100)   # warm_scratch, freed by trim
LEAK = (300 * 100, 300)       # leak_request
STEP = 1310720                # grow_step, one block
MIB = 1 << 20
WAIT_S = 30                   # the longest a test waits for a marker to appear


class Warmup:
    """tests/programs/warmup under `heapsnap run OPTIONS -o LOG`, driven by
    commands (see warmup.c)."""

    def __init__(self, test, log, *run_options):
        self.test = test
        self.log = log
        self.proc = subprocess.Popen([HEAPSNAP, "run", "-o", log, *run_options, "--", program("warmup")],
                                     cwd=test.tmp, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1)
        test.addCleanup(self.kill)
        ready = self.proc.stdout.readline()
        m = re.match(r"ready pid=(\d+)$", ready.strip())
        test.assertTrue(m, "warmup said %r" % ready)
        self.pid = int(m.group(1))

    def send(self, command, answer):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.test.assertEqual(self.proc.stdout.readline().rstrip("\n"), answer, "answer to %r" % command)

    def finish(self):
        out, err = self.proc.communicate("quit\n", timeout=TIMEOUT)
        self.test.assertEqual(self.proc.returncode, 0, err)
        self.test.assertEqual(out, "bye\n")
        self.test.assertEqual(self.test.logs_of(err), [self.log])

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate()


class SteeringTest(HeapsnapTest):
    def labels(self, log):
        return [(m["label"], m["cause"]) for m in self.markers(log)["markers"]]

    def wait_for_marker(self, log, label):
        """Waits until the log (still being written) has a marker `label`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            if os.path.exists(log) and any(label == m for m, _ in self.labels(log)):
                return
            time.sleep(0.05)
        self.fail("no marker %r in %s within %d s: %s" % (label, log, WAIT_S, self.labels(log)))

    def report(self, target, *options):
        data = self.json_of("report", target, "--format", "json", "--top", "0", *options)
        self.assertEqual(data["format"], "heapsnap-report")
        return data

    def sites(self, data):
        """{first frame's function: (bytes, blocks)} of a report's sites."""
        out = {}
        for s in data["sites_by_bytes"]:
            name = s["frames"][0]["function"]
            self.assertNotIn(name, out, "two sites with first frame %s" % name)
            out[name] = (s["bytes"], s["blocks"])
        return out

    def paused_site(self, data):
        found = [s for s in data["sites_by_bytes"] if s["frames"][0]["function"] == PAUSED]
        self.assertEqual(len(found), 1, [s["frames"][0] for s in data["sites_by_bytes"]])
        site = found[0]
        # One frame, of no module, no file.
        self.assertEqual(len(site["frames"]), 1, site)
        self.assertEqual((site["frames"][0]["file"], site["frames"][0]["line"]), (None, None))
        return site

    def exit_live(self, log):
        m = self.marker(log, "exit")
        return m["live_bytes"], m["live_blocks"]

    def unpaused_run(self):
        """The same commands without any pause: the live set at exit to match."""
        w = Warmup(self, self.path("plain.hslog"))
        for command, answer in (("fill", "filled"), ("trim", "trimmed"), ("leak", "leaked")):
            w.send(command, answer)
        w.finish()
        return self.exit_live(w.log)

    def assert_warmed_up_while_paused(self, log):
        """fill while paused; trim and leak after the resume."""
        self.assertEqual(self.labels(log), [("pause", "pause"), ("resume", "resume"), ("exit", "exit")])
        at_exit = self.report(log)
        site = self.paused_site(at_exit)
        self.assertEqual((site["bytes"], site["blocks"]), CACHE)
        sites = self.sites(at_exit)
        self.assertEqual(sites["leak_request"], LEAK)
        leak = [s for s in at_exit["sites_by_bytes"] if s["frames"][0]["function"] == "leak_request"][0]
        self.assert_frame(leak["frames"][0], "leak_request", SRC, site_line(SRC, "leak_request"))
        for unwound in ("cache_fill", "warm_scratch", "warm_churn"):
            self.assertNotIn(unwound, sites)
        # From the resume on: the leak grows with its stack, the scratch
        # blocks allocated while paused are freed from the paused site.
        d = self.diff(log + "@resume", log + "@exit")
        self.assert_site(d, "leak_request", SRC, "leak_request", *LEAK, old_bytes=0, old_blocks=0)
        self.assert_entry(d, PAUSED, -SCRATCH[0], -SCRATCH[1], old_bytes=CACHE[0] + SCRATCH[0],
                          old_blocks=CACHE[1] + SCRATCH[1])
        self.assertEqual(len(d["entries"]), 2, [e["frames"][0]["function"] for e in d["entries"]])
        # Exactness: what is live at exit is what a run without pause has.
        self.assertEqual(self.exit_live(log), self.unpaused_run())
        # The paused site is one stack of the log, named in the dump.
        stacks = [f for kind, f in self.dump(log) if kind == "stack" and "site" in f]
        self.assertEqual([(f["frames"], f["site"]) for f in stacks], [("0:0x0", PAUSED)])

    def test_stacks_after(self):
        log = self.path("w.hslog")
        w = Warmup(self, log, "--stacks-after", "3s")
        w.send("fill", "filled")
        # The log starts paused: its first marker is the pause, and the
        # warm-up came well before the resume.
        self.wait_for_marker(log, "pause")
        self.assertEqual(self.labels(log), [("pause", "pause")])
        self.assertEqual(self.marker(log, "pause")["events"], 0)
        self.wait_for_marker(log, "resume")
        w.send("trim", "trimmed")
        w.send("leak", "leaked")
        w.finish()
        self.assert_warmed_up_while_paused(log)
        dumped = [f for kind, f in self.dump(log) if kind == "marker"]
        self.assertGreaterEqual(float(dumped[1]["t"]) - float(dumped[0]["t"]), 2.9)

    def test_paused_until_resume(self):
        log = self.path("w.hslog")
        w = Warmup(self, log, "--paused")
        w.send("fill", "filled")
        r = self.heapsnap("resume", w.pid)
        self.assertEqual(r.stdout, 'process %d: stacks resumed at marker 2 "resume" of %s\n' % (w.pid, log))
        self.assertEqual(r.stderr, "")
        again = self.heapsnap("resume", w.pid)
        self.assertEqual(again.stdout, "process %d: stacks were not paused; nothing changed (%s)\n" % (w.pid, log))
        w.send("trim", "trimmed")
        w.send("leak", "leaked")
        w.finish()
        self.assert_warmed_up_while_paused(log)

    def test_pause_and_resume_a_running_process(self):
        log = self.path("w.hslog")
        w = Warmup(self, log)
        w.send("fill", "filled")
        r = self.heapsnap("pause", w.pid)
        self.assertEqual(r.stdout, 'process %d: stacks paused at marker 1 "pause" of %s\n' % (w.pid, log))
        again = self.heapsnap("pause", w.pid)
        self.assertEqual(again.stdout, "process %d: stacks were already paused; nothing changed (%s)\n" % (w.pid, log))
        w.send("leak", "leaked")
        r = self.heapsnap("resume", w.pid)
        self.assertEqual(r.stdout, 'process %d: stacks resumed at marker 2 "resume" of %s\n' % (w.pid, log))
        w.send("trim", "trimmed")
        # The listing while it runs: both switches, with their causes.
        listing = self.heapsnap("markers", log).stdout
        self.assertRegex(listing, r"(?m)^\s+1\s+\S+\s+pause\s")
        self.assertRegex(listing, r"(?m)^\s+2\s+\S+\s+resume\s")
        w.finish()
        self.assertEqual(self.labels(log), [("pause", "pause"), ("resume", "resume"), ("exit", "exit")])
        # Only the leak was made while paused.
        d = self.diff(log + "@pause", log + "@resume")
        self.assert_entry(d, PAUSED, *LEAK, old_bytes=0, old_blocks=0)
        self.assertEqual(len(d["entries"]), 1)
        at_exit = self.report(log)
        self.assertEqual(self.sites(at_exit)["cache_fill"], CACHE)
        self.assertNotIn("warm_scratch", self.sites(at_exit))
        site = self.paused_site(at_exit)
        self.assertEqual((site["bytes"], site["blocks"]), LEAK)
        # Its own function and its own module row.
        self.assertIn((PAUSED, LEAK[0], LEAK[1], 1),
                      [(g["frame"]["function"], g["bytes"], g["blocks"], g["sites"]) for g in at_exit["functions"]])
        csv = self.heapsnap("report", log, "--format", "csv", "--top", "0").stdout.splitlines()
        self.assertIn("%d,%d,heap" % LEAK, "\n".join(r for r in csv if r.endswith(",%s,%s" % (PAUSED, PAUSED))))
        folded = self.heapsnap("report", log, "--format", "folded").stdout.splitlines()
        self.assertIn("%s %d" % (PAUSED, LEAK[0]), folded)
        text = self.heapsnap("report", log, "--color", "never").stdout
        self.assertIn(PAUSED, text)
        self.assertEqual(self.exit_live(log), self.unpaused_run())

    def test_fork_child_starts_paused(self):
        # forker.c: the parent keeps 2050 bytes in 3 blocks, its child 9999
        # in 3. Both logs begin with their pause marker, and everything in
        # them is at the paused site, exactly.
        logs = self.record("forker", options=("--paused", "-o", "f.%p.hslog"))
        self.assertEqual(len(logs), 2, logs)
        live = []
        for log in logs:
            self.assertEqual(self.labels(log), [("pause", "pause"), ("exit", "exit")])
            self.assertEqual(self.marker(log, "pause")["events"], 0)
            site = self.paused_site(self.report(log))
            self.assertEqual((site["bytes"], site["blocks"]), self.exit_live(log))
            live.append(self.exit_live(log))
        self.assertEqual(sorted(live), [(2050, 3), (9999, 3)])

    def test_refusals(self):
        dead = subprocess.Popen(["true"])
        dead.wait()
        for command in ("pause", "resume"):
            self.assert_error([command, dead.pid], "heapsnap: error: no process with PID %d" % dead.pid)
        plain = subprocess.Popen(["sleep", "60"])
        self.addCleanup(plain.wait)
        self.addCleanup(plain.kill)
        self.assert_error(["pause", plain.pid, "--timeout", "5"],
                          "heapsnap: error: process %d is not recorded by heapsnap (no control socket; start it "
                          "with 'heapsnap run')" % plain.pid)
        for args, needle in (
                (["pause", "abc"], "heapsnap: error: pid: abc is not a count (1 to 2147483647)"),
                (["resume"], "heapsnap: error: pid is required"),
                (["run", "--snapshot-when", "rss<1G", "--", "true"],
                 "heapsnap: error: --snapshot-when: rss<1G is not a rule (rss>SIZE, live>SIZE or growth>SIZE, SIZE "
                 "from 1 to 1024T, such as 512M or 1G)"),
                (["run", "--snapshot-when", "rss>0", "--", "true"], "rss>0 is not a rule"),
                (["run", "--stacks-after", "10x", "--", "true"],
                 "heapsnap: error: --stacks-after: 10x is not a duration (such as 500ms, 30s, 15m or 2h; a bare "
                 "number is seconds)"),
                (["run", "--stacks-after", "0", "--", "true"], "--stacks-after: 0 is out of range (1ms to 720h)"),
                (["run", "--snapshot-when", "rss>1G", "--snapshot-when", "RSS>1024M", "--", "true"],
                 "heapsnap: error: --snapshot-when: rss>1G is given twice"),
                (["run", "--sample-bytes", "64K", "--snapshot-when", "growth>1M", "--", "true"],
                 "heapsnap: error: --snapshot-when: growth>1M cannot be used with --sample-bytes")):
            result = self.heapsnap(*args, expect=None)
            self.assertEqual(result.returncode, 2, "heapsnap %s: %s" % (" ".join(args), result.stderr))
            self.assertEqual(result.stdout, "")
            self.assertEqual(result.stderr.splitlines()[0][:len("heapsnap: error: ")], "heapsnap: error: ")
            self.assertIn(needle, result.stderr.splitlines()[0])

    def test_another_users_process(self):
        if os.geteuid() != 0:
            self.skipTest("needs root to run a process as another user")
        nobody = pwd.getpwnam("nobody").pw_uid
        other = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "sleep", "60"])
        self.addCleanup(other.wait)
        self.addCleanup(other.kill)
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:  # until setpriv has become nobody's sleep
            with open("/proc/%d/status" % other.pid) as f:
                if re.search(r"(?m)^Uid:\s+%d\s" % nobody, f.read()):
                    break
            time.sleep(0.01)
        for command in ("pause", "resume"):
            result = self.run_cmd(["setpriv", "--reuid=daemon", "--regid=daemon", "--clear-groups", HEAPSNAP, command,
                                   str(other.pid)], expect=1)
            self.assertEqual(result.stderr, "heapsnap: error: process %d belongs to another user (uid %d); only root "
                             "and that user may %s it\n" % (other.pid, nobody, command))

    def test_thresholds(self):
        log = self.path("t.hslog")
        w = Warmup(self, log, "--snapshot-when", "live>4M", "--snapshot-when", " GROWTH > 2m",
                   "--snapshot-when", "rss>64M")
        # Each step is one block of 1.25 MiB: the live heap crosses 2 MiB at
        # step 2, 4 MiB at step 4, 6 MiB at step 5.
        for step in range(1, 7):
            w.send("grow", "grown")
            if step in (2, 4, 5):
                self.wait_for_marker(log, {2: "growth>2M", 4: "growth>2M#2", 5: "growth>2M#3"}[step])
        w.send("touch 80", "touched")
        self.wait_for_marker(log, "rss>64M")
        self.wait_for_marker(log, "growth>2M#43")
        w.finish()
        markers = self.markers(log)["markers"]
        labels = [m["label"] for m in markers]
        self.assertEqual(labels[:4], ["growth>2M", "live>4M", "growth>2M#2", "growth>2M#3"])
        self.assertEqual(labels[-1], "exit")
        # The 80 MiB touched: the RSS rule once, and the growth rule at the
        # multiples it saw, up to the 43rd (7.5 MiB + 80 MiB).
        later = labels[4:-1]
        self.assertEqual(later.count("rss>64M"), 1, labels)
        multiples = [int(l.split("#")[1]) for l in later if l != "rss>64M"]
        self.assertTrue(multiples and multiples == sorted(multiples) and multiples[0] > 3 and multiples[-1] == 43,
                        labels)
        for m in markers[:-1]:
            self.assertEqual(m["cause"], "threshold", m)
        by_label = {m["label"]: m for m in markers}
        self.assertEqual(by_label["live>4M"]["live_bytes"] - by_label["growth>2M"]["live_bytes"], 2 * STEP)
        self.assertGreater(by_label["live>4M"]["live_bytes"], 4 * MIB)
        self.assertGreater(by_label["rss>64M"]["rss_bytes"], 64 * MIB)
        # LOG@RULE names the moment; '>' and '#' are part of the label.
        d = self.diff(log + "@growth>2M", log + "@growth>2M#2")
        self.assert_site(d, "grow_step", SRC, "grow_step", 2 * STEP, 2, old_bytes=2 * STEP, old_blocks=2)
        self.assertEqual((d["total"]["bytes_delta"], d["total"]["blocks_delta"]), (2 * STEP, 2))
        self.assertEqual((d["old"]["label"], d["new"]["label"]), ("growth>2M", "growth>2M#2"))
        d = self.diff(log + "@live>4M", log + "@exit")
        self.assert_site(d, "rss_touch", SRC, "rss_touch", 80 * MIB, 80, old_bytes=0, old_blocks=0)
        self.assert_site(d, "grow_step", SRC, "grow_step", 2 * STEP, 2, old_bytes=4 * STEP, old_blocks=4)
        self.assertEqual(len(d["entries"]), 2)


if __name__ == "__main__":
    main()
