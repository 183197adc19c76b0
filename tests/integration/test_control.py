"""The control channel (formats/control.md) as live servers use it.

- `heapsnap ps` lists the recorded processes the caller may snapshot, with
  their exact pid, user, executable, log, start and event count.
- A process started as root that switches to its own user (setuid,
  setresuid: memcached -u, nginx's workers) is snapshotted by root and by
  that user, nobody else; its log is given to that user at the switch, and
  given back if the switch fails.
- The client believes only the process it asked: a socket named
  @heapsnap.<pid> held by anyone else is refused before a request is sent,
  and a reply that is too long, or comes with the wrong descriptors, is
  refused. --timeout bounds the whole exchange, the connect included.

The tests that switch users run as root (the CI does), creating the user
heapsnap-other when it does not exist; they skip otherwise.
"""

import ctypes
import datetime
import grp
import json
import os
import pwd
import re
import signal
import socket
import stat
import struct
import subprocess
import time
import unittest

from harness import HEAPSNAP, TIMEOUT, Growth, HeapsnapTest, main, program, site_line

# A Python for processes that run as another user (the interpreter running
# the tests may live under root's home).
SYSTEM_PYTHON = "/usr/bin/python3"
OTHER_USER = "heapsnap-other"
GROW_BYTES, GROW_BLOCKS = 6 * 3001, 6  # uid_drop.c, "grow"
IN_ATTRIB = 0x4
ISO_UTC = "%Y-%m-%dT%H:%M:%SZ"


def is_root():
    return os.geteuid() == 0


def other_user():
    """(uid, gid) of heapsnap-other, created as a system user if needed."""
    try:
        pw = pwd.getpwnam(OTHER_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                       check=True, capture_output=True)
        pw = pwd.getpwnam(OTHER_USER)
    return pw.pw_uid, pw.pw_gid


def as_user(name, args):
    """`args` run as user `name` with that user's group and no others."""
    group = grp.getgrgid(pwd.getpwnam(name).pw_gid).gr_name
    return ["setpriv", "--reuid=" + name, "--regid=" + group, "--clear-groups", *args]


def raw_client(pid, request):
    """A Python program that sends `request` to @heapsnap.PID without the CLI
    and prints the answer."""
    return ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect('\\0heapsnap.%d')\n"
            "try:\n    s.sendall(%r)\nexcept OSError:\n    pass\n"
            "sys.stdout.write(s.recv(4096).decode())\n" % (pid, request))


class AttribWatch:
    """Counts the attribute changes (chown, chmod) of one file: inotify's
    IN_ATTRIB, which writes to the file do not raise."""

    def __init__(self, test, path):
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        test.assertGreaterEqual(self.fd, 0, os.strerror(ctypes.get_errno()))
        test.addCleanup(os.close, self.fd)
        test.assertGreaterEqual(self.libc.inotify_add_watch(self.fd, path.encode(), IN_ATTRIB), 0)

    def count(self):
        """IN_ATTRIB events since the last call."""
        n = 0
        while True:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return n
            at = 0
            while at < len(data):
                _, mask, _, length = struct.unpack_from("iIII", data, at)
                n += bool(mask & IN_ATTRIB)
                at += 16 + length


class ControlTest(HeapsnapTest):
    def ps(self, pid, *prefix):
        """`heapsnap ps --format json`, run after `prefix`: its rows of `pid`
        and its warnings about `pid`. Only those: recorded processes of
        other tests on the machine may be listed too (a stopped one with a
        warning)."""
        r = self.run_cmd([*prefix, HEAPSNAP, "ps", "--format", "json"], expect=0)
        for line in r.stderr.splitlines():
            self.assertTrue(line.startswith("heapsnap: warning: "), r.stderr)
        about = re.compile(r"\bprocess %d\b" % pid)
        return [p for p in json.loads(r.stdout) if p["pid"] == pid], [w for w in r.stderr.splitlines() if about.search(w)]

    def ps_entry(self, pid, *prefix):
        rows, warnings = self.ps(pid, *prefix)
        self.assertEqual((len(rows), warnings), (1, []), "ps rows of %d: %s" % (pid, rows))
        return rows[0]

    def assert_not_listed(self, pid, *prefix):
        self.assertEqual(self.ps(pid, *prefix), ([], []))

    def sleeper(self):
        """An unrecorded process that waits."""
        proc = subprocess.Popen(["sleep", "600"])
        self.addCleanup(lambda: (proc.kill(), proc.wait()))
        return proc

    def fake_recorder(self, name_pid, answer_code):
        """A Python process listening on @heapsnap.NAME_PID (its own pid when
        NAME_PID is None) that prints "listening <pid>", then for each
        connection runs `answer_code` with the accepted socket as `c` and
        shuts its side down, then prints what the client sent (repr) once
        the client has gone."""
        code = ("import os, socket, sys\n"
                "s = socket.socket(socket.AF_UNIX)\n"
                "s.bind('\\0heapsnap.%%d' %% (%s or os.getpid()))\n"
                "s.listen(8)\n"
                "print('listening', os.getpid(), flush=True)\n"
                "while True:\n"
                "    c, _ = s.accept()\n"
                "    try:\n"
                "%s\n"
                "        c.shutdown(socket.SHUT_WR)\n"
                "    except OSError:\n"
                "        pass\n"
                "    got = b''\n"
                "    try:\n"
                "        while True:\n"
                "            b = c.recv(4096)\n"
                "            if not b: break\n"
                "            got += b\n"
                "    except ConnectionResetError:\n"  # closed with our answer unread
                "        pass\n"
                "    print(repr(got), flush=True)\n"
                "    c.close()\n") % (name_pid, "\n".join("        " + line for line in answer_code.splitlines()))
        proc = subprocess.Popen([SYSTEM_PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
        self.addCleanup(lambda: (proc.kill(), proc.wait(), proc.stdout.close()))
        line = proc.stdout.readline().split()
        self.assertEqual(line[0], "listening")
        return proc, int(line[1])


class PsTest(ControlTest):
    def test_ps_lists_a_recorded_process(self):
        before = time.time()
        growth = Growth(self)
        after = time.time()
        growth.send("phase1", "phase1 done")
        # A snapshot's marker writes every event so far: the count ps then
        # reports is the marker's.
        self.snapshot(str(growth.pid), "--label", "now", "-o", self.path("now.hsnap"))
        log = self.path("heapsnap.growth.%d.hslog" % growth.pid)
        events = self.marker(log, "now")["events"]
        self.assertGreater(events, 0)
        user = pwd.getpwuid(os.geteuid()).pw_name
        exe = os.path.realpath(program("growth"))

        row = self.ps_entry(growth.pid)
        since = row.pop("since")
        since_s = row.pop("since_s")
        self.assertEqual(row, {"pid": growth.pid, "user": user, "uid": os.geteuid(), "euid": os.geteuid(),
                               "exe": exe, "log": log, "events": events})
        self.assertLessEqual(int(before), since_s)
        self.assertLessEqual(since_s, after)
        self.assertEqual(since, time.strftime(ISO_UTC, time.gmtime(since_s)))

        text = self.heapsnap("ps").stdout.splitlines()
        self.assertEqual(text[0].split(), ["PID", "USER", "SINCE", "EVENTS", "EXE", "LOG"])
        mine = [line.split() for line in text[1:] if line.split()[0] == str(growth.pid)]
        self.assertEqual(mine, [[str(growth.pid), user, since, str(events), exe, log]])

        # An unrecorded process is not listed; nor is one whose recording ended.
        sleeper = self.sleeper()
        self.assert_not_listed(sleeper.pid)
        growth.finish()
        self.assert_not_listed(growth.pid)

    @unittest.skipUnless(is_root(), "needs root for a network namespace of its own")
    def test_ps_with_nothing_recorded(self):
        # A fresh network namespace has no abstract sockets at all.
        r = self.run_cmd(["unshare", "--net", HEAPSNAP, "ps"], expect=0)
        self.assertEqual((r.stdout, r.stderr), ("    PID  USER  SINCE                       EVENTS  EXE  LOG\n", ""))
        r = self.run_cmd(["unshare", "--net", HEAPSNAP, "ps", "--format", "json"], expect=0)
        self.assertEqual((r.stdout, r.stderr), ("[]\n", ""))

    def test_ps_warns_of_a_squatter(self):
        sleeper = self.sleeper()
        squatter, squatter_pid = self.fake_recorder(sleeper.pid, "pass")
        self.assertEqual(self.ps(sleeper.pid),
                         ([], ["heapsnap: warning: process %d: the control socket @heapsnap.%d is held by another "
                               "process (pid %d, uid %d); refusing its answer; left out"
                               % (sleeper.pid, sleeper.pid, squatter_pid, os.geteuid())]))
        self.assertEqual(squatter.stdout.readline(), "b''\n")  # asked nothing

    def test_ps_answers_it_cannot_use(self):
        """Processes that answer for themselves: a refusal leaves them out
        silently, a recorder without `info` or a garbled answer with a
        warning."""
        cases = [
            (r"c.sendall(b'error permission denied: only root and the user the process runs as may connect\n')", []),
            (r"c.sendall(b'error malformed request\n')",
             ["heapsnap: warning: process {pid}: its recorder does not know 'info' (is it older than this heapsnap?); "
              "left out"]),
            (r"c.sendall(b'ok info\npid 1\n')", ["heapsnap: warning: process {pid}: malformed reply to 'info'; left out"]),
        ]
        for answer, warnings in cases:
            with self.subTest(answer=answer):
                fake, pid = self.fake_recorder(None, answer)
                self.assertEqual(self.ps(pid), ([], [w.format(pid=pid) for w in warnings]))
                self.assertEqual(fake.stdout.readline(), "b'info\\n'\n")
                fake.kill()  # out of the next listing
                fake.wait()


class PeerCheckTest(ControlTest):
    def test_squatter_refused(self):
        """Someone binds the name of a process that is not recorded: the
        client refuses its answer before sending it anything."""
        sleeper = self.sleeper()
        squatter, squatter_pid = self.fake_recorder(sleeper.pid, r"c.sendall(b'ok 1\n/etc/passwd\n')")
        r = self.heapsnap("snapshot", sleeper.pid, "-o", self.path("x.hsnap"), expect=1)
        self.assertEqual(r.stdout, "")
        self.assertEqual(r.stderr, "heapsnap: error: process %d: the control socket @heapsnap.%d is held by another "
                                   "process (pid %d, uid %d); refusing its answer\n"
                         % (sleeper.pid, sleeper.pid, squatter_pid, os.geteuid()))
        self.assertEqual(squatter.stdout.readline(), "b''\n")
        self.assertFalse(os.path.exists(self.path("x.hsnap")))

    def test_bad_replies_refused(self):
        """A process that answers for itself, wrongly: the peer check passes
        (it is the process), and what it says is refused."""
        cases = [
            (r"c.sendall(b'ok 1\n' + b'/' * 20000 + b'\n')",
             "process {pid}: malformed reply (longer than 16384 bytes)"),
            (r"c.sendall(b'ok 1\n/etc/passwd\n')",
             "process {pid}: the recorder passed no descriptor of its log (is it older than this heapsnap?)"),
            ("f1 = open('/etc/passwd', 'rb'); f2 = open('/etc/group', 'rb')\n"
             r"socket.send_fds(c, [b'ok 1\n/etc/passwd\n'], [f1.fileno(), f2.fileno()])",
             "process {pid}: malformed reply (more than one descriptor)"),
            (r"c.sendall(b'ok one\n/etc/passwd\n')", "process {pid}: malformed reply"),
            ("pass", "process {pid} ended before the marker was written"),
        ]
        for answer, message in cases:
            with self.subTest(answer=answer):
                fake, pid = self.fake_recorder(None, answer)
                r = self.heapsnap("snapshot", pid, "--label", "L", "-o", self.path("x.hsnap"), expect=1)
                self.assertEqual(r.stderr, "heapsnap: error: %s\n" % message.format(pid=pid))
                self.assertEqual(fake.stdout.readline(), "b'snapshot L\\n'\n")
                self.assertFalse(os.path.exists(self.path("x.hsnap")))

    def test_flooding_and_silent_servers(self):
        """The process answers without end, or never: the client stops
        reading past 16 KiB at once, and waits no longer than --timeout."""
        flood, pid = self.fake_recorder(None, "while True:\n    c.sendall(b'ok 1\\n' * 65536)")
        start = time.monotonic()
        r = self.heapsnap("snapshot", pid, "--timeout", "5", "-o", self.path("x.hsnap"), expect=1)
        self.assertLess(time.monotonic() - start, 2.0)
        self.assertEqual(r.stderr, "heapsnap: error: process %d: malformed reply (longer than 16384 bytes)\n" % pid)
        silent, pid = self.fake_recorder(None, "import time\ntime.sleep(60)")
        start = time.monotonic()
        r = self.heapsnap("snapshot", pid, "--timeout", "1", "-o", self.path("x.hsnap"), expect=1)
        elapsed = time.monotonic() - start
        self.assertEqual(r.stderr, "heapsnap: error: process %d did not write the marker within 1 s (is it stopped?)\n"
                         % pid)
        self.assertGreaterEqual(elapsed, 1.0)
        self.assertLess(elapsed, 3.0)
        r = self.heapsnap("ps", "--timeout", "1", expect=0)
        self.assertIn("heapsnap: warning: process %d did not answer within 1 s (is it stopped?); left out\n" % pid,
                      r.stderr)
        self.assertFalse(os.path.exists(self.path("x.hsnap")))

    @staticmethod
    def thread_state(task):
        with open(os.path.join(task, "stat")) as f:
            return f.read().rsplit(")", 1)[1].split()[0]

    def test_timeout_bounds_the_connect(self):
        """A stopped process with a full backlog: connect itself would wait
        for ever; --timeout ends the wait."""
        growth = Growth(self)
        os.kill(growth.pid, signal.SIGSTOP)
        self.addCleanup(lambda: growth.proc.poll() is None and os.kill(growth.pid, signal.SIGCONT))
        # Every thread, the recorder's writer included, stopped: none accepts.
        tasks = "/proc/%d/task" % growth.pid
        deadline = time.monotonic() + TIMEOUT
        while not all(self.thread_state(os.path.join(tasks, t)) == "T" for t in os.listdir(tasks)):
            self.assertLess(time.monotonic(), deadline, "growth did not stop")
            time.sleep(0.01)
        fillers = []
        while True:  # the recorder's backlog (8) and one more, as the kernel allows
            s = socket.socket(socket.AF_UNIX)
            s.setblocking(False)
            try:
                s.connect("\0heapsnap.%d" % growth.pid)
            except BlockingIOError:
                s.close()
                break
            fillers.append(s)
        self.addCleanup(lambda: [s.close() for s in fillers])
        self.assertEqual(len(fillers), 9)
        start = time.monotonic()
        r = self.heapsnap("snapshot", growth.pid, "--timeout", "1", "-o", self.path("x.hsnap"), expect=1)
        elapsed = time.monotonic() - start
        self.assertEqual(r.stderr, "heapsnap: error: process %d did not write the marker within 1 s (is it stopped?)\n"
                         % growth.pid)
        self.assertGreaterEqual(elapsed, 1.0)
        self.assertLess(elapsed, 10.0)


@unittest.skipUnless(is_root(), "needs root to start a process that switches users")
class PrivilegeDropTest(ControlTest):
    def setUp(self):
        super().setUp()
        self.nobody = pwd.getpwnam("nobody").pw_uid
        self.nogroup = grp.getgrnam("nogroup").gr_gid
        self.other = other_user()
        os.chmod(self.tmp, 0o711)
        # The log's directory is root's alone: nobody cannot even reach the
        # log by its path, only through the descriptor the recorder passes.
        self.logs = self.path("logs")
        os.mkdir(self.logs, 0o700)
        self.out = self.path("out")
        os.mkdir(self.out, 0o700)
        os.chown(self.out, self.nobody, self.nogroup)

    def start(self):
        proc = subprocess.Popen([HEAPSNAP, "run", "--", program("uid_drop"), str(self.nobody), str(self.nogroup)],
                                cwd=self.logs, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, bufsize=1)
        self.addCleanup(lambda: proc.poll() is None and (proc.kill(), proc.communicate()))
        ready = proc.stdout.readline().strip()
        self.assertTrue(ready.startswith("ready pid="), ready)
        self.proc = proc
        self.pid = int(ready.split("=")[1])
        self.log = os.path.join(self.logs, "heapsnap.uid_drop.%d.hslog" % self.pid)
        self.assertEqual(os.stat(self.log).st_uid, 0)
        return AttribWatch(self, self.log)

    def send(self, command, answer):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        self.assertEqual(self.proc.stdout.readline().strip(), answer, "answer to %r" % command)

    def uids(self):
        with open("/proc/%d/status" % self.pid) as f:
            return [line.split()[1:] for line in f if line.startswith("Uid:")][0]

    def snapshot_as(self, user, name, expect=0):
        args = [HEAPSNAP, "snapshot", str(self.pid), "--label", name, "-o", os.path.join(self.out, name + ".hsnap")]
        r = self.run_cmd(as_user(user, args) if user != "root" else args, expect=expect)
        if expect == 0:
            self.assertEqual(r.stdout, os.path.join(self.out, name + ".hsnap") + "\n")
        return r

    def assert_grown(self, old, new):
        diff = self.diff(os.path.join(self.out, old + ".hsnap"), os.path.join(self.out, new + ".hsnap"))
        self.assert_site(diff, "grow", "uid_drop.c", "grow", GROW_BYTES, GROW_BLOCKS)
        self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"]), (GROW_BYTES, GROW_BLOCKS))

    def assert_refused_for_others(self, owner_uid):
        r = self.run_cmd(as_user(OTHER_USER, [HEAPSNAP, "snapshot", str(self.pid), "-o", "/tmp/never.hsnap"]),
                         expect=1)
        self.assertEqual(r.stderr, "heapsnap: error: process %d belongs to another user (uid %d); only root and that "
                                   "user may snapshot it\n" % (self.pid, owner_uid))
        r = self.run_cmd(as_user(OTHER_USER, [SYSTEM_PYTHON, "-c", raw_client(self.pid, b"snapshot evil\n")]))
        self.assertEqual(r.stdout, "error permission denied: only root and the user the process runs as may connect\n",
                         r.stderr)
        self.assert_not_listed(self.pid, *as_user(OTHER_USER, []))

    def finish(self, labels):
        self.send("quit", "bye")
        _, err = self.proc.communicate(timeout=TIMEOUT)
        self.assertEqual(self.proc.returncode, 0, err)
        self.assertEqual(self.logs_of(err), [self.log])
        self.assertEqual([m["label"] for m in self.markers(self.log)["markers"]], labels)

    def test_setuid(self):
        attrib = self.start()
        self.send("setuid", "dropped")
        self.assertEqual(self.uids(), [str(self.nobody)] * 4)
        # The log was given to nobody once, at the switch; still 0600.
        self.assertEqual(attrib.count(), 1)
        st = os.stat(self.log)
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (self.nobody, 0o600))

        self.snapshot_as("root", "a")
        self.send("grow", "grown")
        self.snapshot_as("nobody", "b")
        self.send("grow", "grown")
        self.snapshot_as("root", "c")
        self.assert_grown("a", "b")
        self.assert_grown("b", "c")
        # nobody's snapshot is nobody's file; nobody wrote no checkpoint
        # (the log's directory is not theirs), root did, and that cost the
        # snapshot nothing.
        self.assertEqual(os.stat(os.path.join(self.out, "b.hsnap")).st_uid, self.nobody)
        self.assertEqual(os.stat(self.log + ".checkpoint").st_uid, 0)

        row = self.ps_entry(self.pid, *as_user("nobody", []))
        self.assertEqual((row["user"], row["uid"], row["euid"], row["exe"], row["log"]),
                         ("nobody", self.nobody, self.nobody, os.path.realpath(program("uid_drop")), self.log))
        self.assertEqual(self.ps_entry(self.pid)["user"], "nobody")
        self.assert_refused_for_others(self.nobody)
        self.assertEqual(attrib.count(), 0)
        self.finish(["a", "b", "c", "exit"])

    def test_setresuid(self):
        attrib = self.start()
        self.snapshot_as("root", "a")
        self.assert_refused_for_others(0)
        self.send("setresuid", "dropped")
        self.assertEqual(self.uids(), [str(self.nobody)] * 4)
        self.assertEqual(attrib.count(), 1)
        self.assertEqual(os.stat(self.log).st_uid, self.nobody)
        self.send("grow", "grown")
        self.snapshot_as("nobody", "b")
        self.assert_grown("a", "b")
        self.assert_refused_for_others(self.nobody)
        self.finish(["a", "b", "exit"])

    def test_failed_setuid_gives_the_log_back(self):
        attrib = self.start()
        self.send("deny-setuid", "denied")
        self.send("setuid", "failed errno=1")
        self.assertEqual(self.uids(), ["0"] * 4)
        # Given to nobody before the call, given back after it failed: two
        # changes, which inotify reports as one (it merges an event with an
        # identical one still unread), and root's file as before.
        self.assertEqual(attrib.count(), 1)
        self.assertEqual(os.stat(self.log).st_uid, 0)
        r = self.snapshot_as("nobody", "never", expect=1)
        self.assertEqual(r.stderr, "heapsnap: error: process %d belongs to another user (uid 0); only root and that "
                                   "user may snapshot it\n" % self.pid)
        self.snapshot_as("root", "a")
        self.finish(["a", "exit"])


if __name__ == "__main__":
    main()
