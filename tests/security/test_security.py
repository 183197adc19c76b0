"""Nobody else gets in: what SECURITY.md promises, tested.

- Logs, snapshots and checkpoints are created mode 0600 whatever the umask,
  and never through a symlink planted at their name (the recorder takes the
  next free name, or fails cleanly and lets the program run).
- Only root and the user a recorded process runs as can make it write a
  marker: the CLI refuses another user's PID, and the recorder's control
  socket checks SO_PEERCRED itself (a raw client of another user is
  refused). tests/integration/test_control.py covers processes that
  switch users.
- The control channel writes no file of the client's choosing: the label
  is only a label; anything but "snapshot <label>" is refused.
- Setuid/setgid programs are not recorded, and heapsnap says so.
- Garbage in HEAPSNAP_* never crashes the program or changes its exit
  status: each bad value is reported once and replaced by the default.

The tests that need a second (and third) user create them with useradd
(system users heapsnap-sec1 and heapsnap-sec2, kept for later runs) and
skip unless running as root.
"""

import os
import pwd
import re
import shutil
import socket
import stat
import subprocess
import time
import unittest

from harness import HEAPSNAP, PRELOAD, HeapsnapTest, main, program

USERS = ("heapsnap-sec1", "heapsnap-sec2")
# A Python for processes that run as another user (the interpreter running
# the tests may live under root's home).
SYSTEM_PYTHON = "/usr/bin/python3"
ALLOC_PATTERN_LIVE = 20348


def is_root():
    return os.geteuid() == 0


def test_user(name):
    """(uid, gid) of `name`, created as a system user if needed."""
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True,
                       capture_output=True)
        pw = pwd.getpwnam(name)
    return pw.pw_uid, pw.pw_gid


def as_user(uid, gid):
    return {"user": uid, "group": gid, "extra_groups": []}


def zero_umask():
    os.umask(0)


def socket_request(pid, request, timeout=5):
    """Sends `request` to the control socket of `pid`; returns the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect("\0heapsnap.%d" % pid)
        return exchange(s, request)


def exchange(s, request):
    try:
        s.sendall(request)
    except OSError:
        pass  # the recorder may have answered and closed already
    reply = b""
    while True:
        try:
            chunk = s.recv(4096)
        except socket.timeout:
            break
        except ConnectionResetError:
            return None  # closed with our unread bytes pending: the reply may be lost
        if not chunk:
            break
        reply += chunk
    return reply


class FilesTest(HeapsnapTest):
    def assert_owner_only(self, path):
        mode = stat.S_IMODE(os.lstat(path).st_mode)
        self.assertEqual(mode, 0o600, "%s has mode %o" % (path, mode))

    def test_created_owner_only_whatever_the_umask(self):
        """0600 files in 0700 directories, with a umask of 0 and with one
        that takes the owner's write bit (0277): logs, snapshots, the
        replay checkpoint and the symbol cache."""
        for umask in (0, 0o277):
            with self.subTest(umask="%04o" % umask):
                work = self.path("umask%o" % umask)
                os.mkdir(work)
                env = dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache"))
                env.pop("HEAPSNAP_SYMBOL_CACHE", None)
                with_umask = lambda: os.umask(umask)  # noqa: E731
                result = subprocess.run([HEAPSNAP, "run", "--", program("alloc_pattern")], cwd=work,
                                        capture_output=True, text=True, preexec_fn=with_umask, env=env)
                self.assertEqual(result.returncode, 0, result.stderr)
                (log,) = self.logs_of(result.stderr)
                self.assert_owner_only(log)
                snap = os.path.join(work, "a.hsnap")
                r = subprocess.run([HEAPSNAP, "snapshot", log, "--at", "exit", "-o", snap], cwd=work,
                                   capture_output=True, text=True, preexec_fn=with_umask, env=env)
                self.assertEqual((r.returncode, r.stderr), (0, ""))
                self.assert_owner_only(snap)
                # The replay checkpoint next to the log (a cache) too.
                self.assert_owner_only(log + ".checkpoint")
                r = subprocess.run([HEAPSNAP, "report", snap], cwd=work, capture_output=True, text=True,
                                   preexec_fn=with_umask, env=env)
                self.assertEqual((r.returncode, r.stderr), (0, ""))
                cache = os.path.join(work, "cache", "heapsnap")
                entries = []
                for top, dirs, files in os.walk(cache):
                    mode = stat.S_IMODE(os.lstat(top).st_mode)
                    self.assertEqual(mode, 0o700, "%s has mode %o" % (top, mode))
                    entries += [os.path.join(top, f) for f in files]
                self.assertTrue(entries, "no symbol cache under %s" % cache)
                for entry in entries:
                    self.assert_owner_only(entry)
                # The second report reads the cache it left, silently.
                r = subprocess.run([HEAPSNAP, "report", snap], cwd=work, capture_output=True, text=True,
                                   preexec_fn=with_umask, env=env)
                self.assertEqual((r.returncode, r.stderr), (0, ""))

    def plant(self, link, target):
        os.symlink(target, link)
        return link

    def victim(self, name="victim"):
        path = self.path(name)
        with open(path, "w") as f:
            f.write("precious\n")
        os.chmod(path, 0o644)
        return path

    def assert_untouched(self, victim):
        with open(victim) as f:
            self.assertEqual(f.read(), "precious\n", "%s was written through a symlink" % victim)
        self.assertEqual(stat.S_IMODE(os.stat(victim).st_mode), 0o644)

    def test_log_never_through_a_symlink(self):
        victim = self.victim()
        link = self.plant(self.path("app.hslog"), victim)
        dangling = self.plant(self.path("dangling.hslog"), self.path("never-created"))
        for pattern, expected in ((link, self.path("app-1.hslog")), (dangling, self.path("dangling-1.hslog"))):
            with self.subTest(pattern=os.path.basename(pattern)):
                logs = self.record("alloc_pattern", options=("-o", pattern))
                self.assertEqual(logs, [os.path.realpath(expected)])
                self.assertTrue(os.path.islink(pattern), "the planted symlink was replaced")
                self.assert_owner_only(expected)
                self.assertEqual(self.marker(expected, "exit")["live_bytes"], ALLOC_PATTERN_LIVE)
        self.assert_untouched(victim)
        self.assertFalse(os.path.lexists(self.path("never-created")), "a file was created through a dangling symlink")

    def test_log_in_tmp_never_through_a_symlink(self):
        """The classic attack: another user plants NAME in /tmp, where the
        program writes NAME."""
        victim = self.victim()
        name = "/tmp/heapsnap-sectest-%d-%d.hslog" % (os.getpid(), int(time.time() * 1000))
        self.plant(name, victim)
        self.addCleanup(lambda: [os.unlink(p) for p in (name, name[:-6] + "-1.hslog") if os.path.lexists(p)])
        logs = self.record("alloc_pattern", options=("-o", name))
        self.assertEqual(logs, [name[:-6] + "-1.hslog"])
        self.assert_owner_only(logs[0])
        self.assert_untouched(victim)

    def test_every_name_taken_fails_cleanly(self):
        """With the name and all its -1 ... -999 variants planted, the
        recorder gives up with one message; the program runs as ever."""
        victim = self.victim()
        base = self.path("full.hslog")
        self.plant(base, victim)
        for i in range(1, 1000):
            self.plant(self.path("full-%d.hslog" % i), victim)
        env = dict(os.environ, LD_PRELOAD=PRELOAD, HEAPSNAP_OUTPUT=base)
        r = subprocess.run([program("alloc_pattern"), "7"], cwd=self.tmp, env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 7)
        self.assertEqual(r.stdout, "")
        self.assertIn("heapsnap: cannot create log %s: File exists" % base, r.stderr)
        self.assertIn("File exists; recording disabled", r.stderr)
        self.assert_untouched(victim)

    def test_snapshot_and_checkpoint_never_through_a_symlink(self):
        log = self.single_log("alloc_pattern")
        victim = self.victim()
        victim2 = self.victim("victim2")
        out = self.plant(self.path("out.hsnap"), victim)
        self.plant(log + ".checkpoint", victim2)
        r = self.heapsnap("snapshot", log, "--at", "exit", "-o", out)
        self.assert_untouched(victim)
        self.assert_untouched(victim2)
        self.assertFalse(os.path.islink(out), "the snapshot replaces the symlink, it does not follow it")
        self.assert_owner_only(out)
        # A checkpoint is a cache: something planted at its name is left
        # alone (tests/fuzz/test_hostile_input.py, SpecialFilesTest).
        self.assertTrue(os.path.islink(log + ".checkpoint"))
        self.assertEqual(r.stderr, "heapsnap: warning: %s.checkpoint: not a regular file of yours with mode 0600; left "
                                   "alone, and no checkpoint is used\n" % log)


class EnvironmentTest(HeapsnapTest):
    """Plain LD_PRELOAD with bad HEAPSNAP_* values (heapsnap run always
    sets good ones): alloc_pattern 7 must still exit 7 with its output."""

    def run_preloaded(self, **env):
        full = dict(os.environ, LD_PRELOAD=PRELOAD, HEAPSNAP_OUTPUT=self.path("%e.%p.hslog"))
        for key in [k for k in full if k.startswith("HEAPSNAP_") and k not in ("HEAPSNAP_OUTPUT",)]:
            del full[key]
        full.update(env)
        r = subprocess.run([program("alloc_pattern"), "7"], cwd=self.tmp, env=full, capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, 7, "%s: %s" % (env, r.stderr))
        self.assertEqual(r.stdout, "")
        return r

    def logs(self):
        return sorted(os.path.join(self.tmp, f) for f in os.listdir(self.tmp) if f.endswith(".hslog"))

    def test_bad_values_are_ignored(self):
        cases = [("HEAPSNAP_DEPTH", v, "expected 1 to 256")
                 for v in ("abc", "-5", "99999", "0", "12abc", "0x10", "18446744073709551617", "1e3")]
        cases += [("HEAPSNAP_INTERVAL", v, "expected seconds from 0.001 to 86400")
                  for v in ("nan", "inf", "-1", "0", "1e999", "abc", "0.0001", "86401", "5s")]
        cases += [("HEAPSNAP_UNWIND", v, "expected dwarf") for v in ("bogus", "DWARF", "")]
        cases += [("HEAPSNAP_FOLLOW", v, "expected 0 or 1") for v in ("no", "false", "00", " 0")]
        for name, value, hint in cases:
            if value == "":
                continue  # empty means unset: the default
            with self.subTest(variable=name, value=value):
                for log in self.logs():
                    os.unlink(log)
                r = self.run_preloaded(**{name: value})
                self.assertRegex(r.stderr, r"^heapsnap: ignoring %s=%s \(%s[^)\n]*\)\n$" % (name, re.escape(value), hint))
                (log,) = self.logs()
                data = self.markers(log)
                self.assertTrue(data["complete"])
                self.assertEqual([m["label"] for m in data["markers"]], ["exit"], "no interval markers")
                self.assertEqual(data["markers"][0]["live_bytes"], ALLOC_PATTERN_LIVE)
                process = self.dump(log)[0][1]
                self.assertEqual(process["depth"], "64")

    def test_bad_output(self):
        missing = self.path("no/such/dir/%p.hslog")
        r = self.run_preloaded(HEAPSNAP_OUTPUT=missing)
        self.assertRegex(r.stderr, r"^heapsnap: cannot create log %s/no/such/dir/\d+\.hslog: No such file or directory; "
                                   r"recording disabled\n$" % self.tmp)
        self.assertEqual(self.logs(), [])
        many = "%e" * 2000
        r = self.run_preloaded(HEAPSNAP_OUTPUT=many)
        self.assertIn("heapsnap: log path too long", r.stderr)
        # Odd but usable patterns still record.
        for pattern in ("trailing%", "%%p-%x-%p.hslog"):
            with self.subTest(pattern=pattern):
                for log in os.listdir(self.tmp):
                    os.unlink(self.path(log))
                r = self.run_preloaded(HEAPSNAP_OUTPUT=self.path(pattern), HEAPSNAP_VERBOSE="yes please")
                self.assertRegex(r.stderr, r"^heapsnap: recording to %s/\S+\n"
                                           r"heapsnap: stacks interned: 17 by the writer, 1 in the program's threads\n$"
                                 % self.tmp)
                (name,) = os.listdir(self.tmp)
                self.assertEqual(self.marker(self.path(name), "exit")["live_bytes"], ALLOC_PATTERN_LIVE)

    # A HEAPSNAP_OUTPUT longer than 4095 bytes is refused, never cut: here
    # its first 4095 bytes name DIR/short.hslog, a path nobody asked for.
    def test_overlong_output_refused(self):
        prefix = self.tmp + "/"
        tail = "short.hslog"
        dots = (4095 - len(prefix) - len(tail)) // 2
        cut = prefix + "/" * ((4095 - len(prefix) - len(tail)) % 2) + "./" * dots + tail
        self.assertEqual(len(cut), 4095)
        r = self.run_preloaded(HEAPSNAP_OUTPUT=cut + "/" + "y" * 1000 + "/x.hslog")
        self.assertFalse(os.path.exists(self.path("short.hslog")), "the log went to the cut path")
        self.assertIn("heapsnap: log path too long", r.stderr)

    def test_bad_paths_file(self):
        r = self.run_preloaded(HEAPSNAP_PATHS_FILE=self.path("no/such/paths-file"))
        self.assertEqual(r.stderr, "")
        self.assertEqual(len(self.logs()), 1)


@unittest.skipUnless(is_root(), "needs root to create test users and setuid files")
class OtherUsersTest(HeapsnapTest):
    def setUp(self):
        super().setUp()
        self.a = test_user(USERS[0])
        self.b = test_user(USERS[1])
        os.chmod(self.tmp, 0o711)
        self.adir = self.path("a")
        os.mkdir(self.adir, 0o700)
        os.chown(self.adir, *self.a)

    def start_growth_as_a(self):
        """tests/programs/growth recorded, running as user A."""
        proc = subprocess.Popen([HEAPSNAP, "run", "--", program("growth")], cwd=self.adir, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
                                env={"PATH": "/usr/bin:/bin", "HOME": self.adir}, **as_user(*self.a))
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        ready = proc.stdout.readline().strip()
        self.assertTrue(ready.startswith("ready pid="), "growth said %r: %s" % (ready, proc.stderr.read()
                                                                              if proc.poll() is not None else ""))
        return proc, int(ready.split("=")[1])

    def send(self, proc, command):
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        return proc.stdout.readline().strip()

    def run_as(self, user, args, **kw):
        return subprocess.run(args, cwd="/", capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin"},
                              **as_user(*user), **kw)

    def test_only_root_and_the_owner_get_snapshots(self):
        proc, pid = self.start_growth_as_a()
        self.assertEqual(self.send(proc, "phase1"), "phase1 done")

        # Root may, as the process's own user may.
        self.assertEqual(self.snapshot(str(pid), "--label", "root", "--timeout", "5", "-o", self.path("root.hsnap")),
                         self.path("root.hsnap"))
        # Another user: the CLI refuses before connecting.
        r = self.run_as(self.b, [HEAPSNAP, "snapshot", str(pid), "--timeout", "5", "-o", "/tmp/never.hsnap"],
                        text=True)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertEqual(r.stderr, "heapsnap: error: process %d belongs to another user (uid %d); only root and that "
                                   "user may snapshot it\n" % (pid, self.a[0]))
        # Another user's raw client, without the CLI: the recorder refuses.
        # (The recorder may answer and close before the request is sent.)
        client = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect('\\0heapsnap.%d')\n"
                  "try:\n    s.sendall(b'snapshot evil\\n')\nexcept OSError:\n    pass\n"
                  "sys.stdout.write(s.recv(4096).decode())\n" % pid)
        r = self.run_as(self.b, [SYSTEM_PYTHON, "-c", client], text=True)
        self.assertEqual(r.stdout, "error permission denied: only root and the user the process runs as may connect\n",
                         r.stderr)

        # The owner can.
        r = self.run_as(self.a, [HEAPSNAP, "snapshot", str(pid), "--label", "mine", "-o", self.adir + "/a.hsnap"],
                        text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.send(proc, "quit"), "bye")
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        (log,) = self.logs_of(err)
        # Only root's and the owner's requests left markers.
        self.assertEqual([m["label"] for m in self.markers(log)["markers"]], ["root", "mine", "exit"])
        self.assertEqual(os.stat(log).st_uid, self.a[0])
        self.assertEqual(stat.S_IMODE(os.stat(log).st_mode), 0o600)

    # Binds the abstract names it reads from stdin ("bind NAME..." lines,
    # answered "bound N"), and for every connection on them prints what
    # the client sent, after offering a forged answer.
    SQUATTER = """
import os, resource, select, socket, sys
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
held = {}
while True:
    ready, _, _ = select.select([sys.stdin] + list(held), [], [])
    for s in ready:
        if s is sys.stdin:
            line = sys.stdin.readline()
            if not line:
                sys.exit(0)
            bound = 0
            for name in line.split()[1:]:
                t = socket.socket(socket.AF_UNIX)
                try:
                    t.bind("\\0" + name)
                except OSError:
                    t.close()
                    continue
                t.listen(64)
                t.setblocking(False)
                held[t] = name
                bound += 1
            print("bound", bound, flush=True)
            continue
        try:
            c, _ = s.accept()
        except BlockingIOError:
            continue
        c.settimeout(0.5)
        got = b""
        try:
            c.sendall(b"ok 1\\n/etc/passwd\\n")
            got = c.recv(4096)
        except OSError:
            pass
        print("asked", held[s], repr(got), flush=True)
        c.close()
"""

    def squat(self, squatter, names):
        """Has the squatter bind `names`; keeps what it reported meanwhile."""
        squatter.stdin.write("bind " + " ".join(names) + "\n")
        squatter.stdin.flush()
        while True:
            line = squatter.stdout.readline()
            self.assertTrue(line, "the squatter ended")
            if line.startswith("bound "):
                return
            self.squatter_lines.append(line)

    def start_growth_on_squatted_pid(self, squatter, alternates):
        """Binds @heapsnap.<pid> (and with `alternates` every other name)
        for the next pids, then starts growth as A until it gets one."""
        for _ in range(20):
            with open("/proc/sys/kernel/ns_last_pid") as f:
                last = int(f.read())
            pids = range(last + 1, last + 25)
            names = ["heapsnap.%d" % p for p in pids]
            if alternates:
                names += ["heapsnap.%d.%d" % (p, n) for p in pids for n in range(1, 17)]
            self.squat(squatter, names)
            proc, pid = self.start_growth_as_a()
            if pid in pids:
                return proc, pid
            self.assertEqual(self.send(proc, "quit"), "bye")
            proc.communicate(timeout=60)
        self.skipTest("other processes took every squatted pid")

    def test_squatter_on_the_next_pids(self):
        """User B binds @heapsnap.<pid> for the pids about to be given out,
        and for some every other name the recorder could take. A's
        recorded processes there say so and listen on @heapsnap.<pid>.1;
        A's snapshots reach the right process, or, where B holds every
        name, fail at once; B is never sent a request."""
        squatter = subprocess.Popen([SYSTEM_PYTHON, "-c", self.SQUATTER], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"},
                                    **as_user(*self.b))
        self.addCleanup(lambda: (squatter.kill(), squatter.wait(), squatter.stdout.close(), squatter.stdin.close()))
        self.squatter_lines = []

        proc, pid = self.start_growth_on_squatted_pid(squatter, alternates=False)
        snap = self.adir + "/moved.hsnap"
        r = self.run_as(self.a, [HEAPSNAP, "snapshot", str(pid), "--label", "mine", "--timeout", "5", "-o", snap],
                        text=True)
        self.assertEqual((r.returncode, r.stdout, r.stderr), (0, snap + "\n", ""))
        self.assertEqual(self.send(proc, "quit"), "bye")
        _, err = proc.communicate(timeout=60)
        self.assertIn("heapsnap: control socket name @heapsnap.%d is taken by another process; serving snapshots on "
                      "@heapsnap.%d.1\n" % (pid, pid), err)
        (log,) = self.logs_of(err)
        self.assertEqual([m["label"] for m in self.markers(log)["markers"]], ["mine", "exit"])

        proc, pid = self.start_growth_on_squatted_pid(squatter, alternates=True)
        start = time.monotonic()
        r = self.run_as(self.a, [HEAPSNAP, "snapshot", str(pid), "--timeout", "5", "-o", self.adir + "/never.hsnap"],
                        text=True)
        self.assertLess(time.monotonic() - start, 5)
        self.assertEqual((r.returncode, r.stdout), (1, ""))
        self.assertEqual(r.stderr, "heapsnap: error: process %d: the control socket @heapsnap.%d is held by another "
                                   "process (pid %d, uid %d); refusing its answer\n"
                         % (pid, pid, squatter.pid, self.b[0]))
        self.assertFalse(os.path.exists(self.adir + "/never.hsnap"))
        self.assertEqual(self.send(proc, "quit"), "bye")
        _, err = proc.communicate(timeout=60)
        self.assertIn("heapsnap: control socket names @heapsnap.%d to @heapsnap.%d.16 are all taken by other "
                      "processes; heapsnap snapshot cannot reach this process\n" % (pid, pid), err)

        squatter.stdin.close()
        out = squatter.stdout.read()
        squatter.wait(timeout=60)
        asked = [line.split(" ", 2) for line in self.squatter_lines + out.splitlines()]
        self.assertTrue(asked, "the clients never connected to the squatter")
        for _, name, got in asked:
            self.assertEqual(got.strip(), "b''", "the squatter of @%s was sent a request" % name)

    def test_setuid_program_not_recorded(self):
        bindir = self.path("bin")
        os.mkdir(bindir, 0o755)
        suid = os.path.join(bindir, "alloc_pattern_suid")
        shutil.copy(program("alloc_pattern"), suid)
        os.chown(suid, *self.a)
        os.chmod(suid, 0o4755)
        # heapsnap run: the dynamic linker drops the preload path (secure
        # execution); the program runs as ever and heapsnap says why there is
        # no log.
        r = self.heapsnap("run", "--", suid, "7", expect=7)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr, "heapsnap: warning: %s is setuid/setgid: such programs are not recorded "
                                   "(secure-execution mode); no log was written\n" % suid)
        self.assertEqual([f for f in os.listdir(self.tmp) if f.endswith(".hslog")], [])

    def test_recorder_refuses_secure_execution(self):
        """The recorder itself refuses, where the dynamic linker would load
        it into a setuid program: a setuid-root copy of the library in a
        system directory, named without a slash (ld.so(8), LD_PRELOAD)."""
        libdir = "/usr/lib/x86_64-linux-gnu"
        if not os.path.isdir(libdir):
            self.skipTest("no %s (not a Debian x86-64 system)" % libdir)
        name = "libheapsnap-sectest-%d.so" % os.getpid()
        trusted = os.path.join(libdir, name)
        shutil.copy(PRELOAD, trusted)
        self.addCleanup(os.unlink, trusted)
        os.chmod(trusted, 0o4755)
        suid = self.path("alloc_pattern_suid")
        shutil.copy(program("alloc_pattern"), suid)
        os.chown(suid, *self.a)
        os.chmod(suid, 0o4755)
        env = dict(os.environ, LD_PRELOAD=name, HEAPSNAP_OUTPUT=self.path("suid.%p.hslog"))
        r = subprocess.run([suid, "7"], cwd=self.tmp, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 7)
        self.assertEqual(r.stderr, "heapsnap: refusing to record a setuid/setgid program (secure-execution mode); "
                                   "recording disabled\n")
        self.assertEqual([f for f in os.listdir(self.tmp) if f.endswith(".hslog")], [])
        # The same library records the program's plain copy: it was loaded
        # above, and refused.
        plain = self.path("alloc_pattern_plain")
        shutil.copy(program("alloc_pattern"), plain)
        r = subprocess.run([plain, "7"], cwd=self.tmp, env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((r.returncode, r.stderr), (7, ""))
        self.assertEqual(len([f for f in os.listdir(self.tmp) if f.endswith(".hslog")]), 1)


class ControlChannelTest(HeapsnapTest):
    """The owner's own requests: a label is only a label, anything else is
    refused, and the process goes on as if nothing happened."""

    def test_requests(self):
        proc = subprocess.Popen([HEAPSNAP, "run", "--", program("growth")], cwd=self.tmp, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        pid = int(proc.stdout.readline().strip().split("=")[1])
        log = os.path.realpath(self.path("heapsnap.growth.%d.hslog" % pid))
        before = sorted(os.listdir(self.tmp))

        reply = socket_request(pid, b"snapshot ../../etc/evil-%d\n" % pid)
        self.assertEqual(reply.decode(), "ok 1\n%s\n" % log)
        long_label = b"L" * 400
        self.assertEqual(socket_request(pid, b"snapshot " + long_label + b"\n").decode(), "ok 2\n%s\n" % log)
        # `info` names the process and its log, and writes nothing.
        info = socket_request(pid, b"info\n").decode().splitlines()
        self.assertEqual((info[:3], info[-2:]), (["ok info", "pid %d" % pid, "uid %d %d" % (os.getuid(), os.geteuid())],
                                                  ["exe " + os.path.realpath(program("growth")), "log " + log]))
        for bad in (b"write /tmp/evil\n", b"snapshot\x00/tmp/evil\n", b"SNAPSHOT x\n", b"snapshotx\n",
                    b"info x\n", b"infox\n", b"\xff\xfe\x00garbage\n", b""):
            with self.subTest(request=bad[:40]):
                self.assertEqual(socket_request(pid, bad), b"error malformed request\n")
        # Longer than a request may be: refused unread (the reply may be
        # lost with the reset).
        self.assertIn(socket_request(pid, b"snapshot " + b"y" * 600 + b"\n"), (b"error malformed request\n", None))
        proc.stdin.write("mark after\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline().strip(), "marked after 1")
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        out, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 0, err)
        labels = [m["label"] for m in self.markers(log)["markers"]]
        self.assertEqual(labels, ["../../etc/evil-%d" % pid, "L" * 255, "after", "exit"])
        self.assertFalse(os.path.exists("/etc/evil-%d" % pid))
        self.assertEqual(sorted(os.listdir(self.tmp)), before, "the requests created files")

    # A client of the same user that sends one byte now and then, never a
    # newline, must not hold the writer: the program exits promptly.
    def test_slow_client_does_not_stall_the_program(self):
        proc = subprocess.Popen([HEAPSNAP, "run", "--", program("growth")], cwd=self.tmp, stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        pid = int(proc.stdout.readline().strip().split("=")[1])
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect("\0heapsnap.%d" % pid)
            time.sleep(0.2)  # the writer has accepted it
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            quit_at = time.monotonic()
            ended = None
            for _ in range(10):  # a byte every 0.6 s, never a newline
                try:
                    s.send(b"s")
                except OSError:
                    break
                time.sleep(0.6)
                if proc.poll() is not None:
                    ended = time.monotonic() - quit_at
                    break
        proc.communicate(timeout=60)
        self.assertIsNotNone(ended, "the program did not exit while a client dribbled its request")
        self.assertLess(ended, 3.0)


if __name__ == "__main__":
    main()
