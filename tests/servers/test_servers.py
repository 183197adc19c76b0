"""Live servers as they really run, recorded by `heapsnap run` and
snapshotted while they serve: redis-server (Debian links it with
jemalloc), python3's http.server (a thread per request), memcached and
nginx (daemons that leave their launcher, and drop root for their own
user; nginx with a master and two workers).

Each test starts its server on a free localhost port in its own temporary
directory, waits until it answers, snapshots it, drives a bounded load (a
fixed number of requests, every socket operation under a timeout),
snapshots it again and checks the growth at the server's own call sites and
in the address-space summary. Every process a test starts is killed when
the test ends, pass or fail; a pid is only signalled while it still names
the process the test started.

A test skips, saying why, when its server is not installed (tools/test
installs redis-server, memcached and nginx-light) or, for the privilege
drops, when it does not run as root.
"""

import json
import os
import pwd
import signal
import socket
import subprocess
import threading
import time
import unittest

from harness import HEAPSNAP, HeapsnapTest, main

LOCALHOST = "127.0.0.1"
# Hang detectors, not performance bounds: generous on a loaded 2-core
# machine.
STARTUP = 60  # seconds for a server to answer or stop
IO_TIMEOUT = 30  # seconds for one socket operation
PYTHON = "/usr/bin/python3"  # Debian's interpreter; `python3` on PATH may be a wrapper (pyenv)
MIB = 1 << 20


def need(path, package):
    if not os.path.exists(path):
        raise unittest.SkipTest("%s not installed (Debian package %s)" % (path, package))


def need_root(what):
    if os.geteuid() != 0:
        raise unittest.SkipTest("%s: needs root" % what)


def user_ids(name):
    """(uid, gid) of user `name`; skips the test if there is none."""
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        raise unittest.SkipTest("no user %s" % name)
    return entry.pw_uid, entry.pw_gid


def free_port():
    """A localhost TCP port nothing listens on now (the kernel's pick)."""
    with socket.socket() as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def until(check, what, timeout=STARTUP):
    """Polls `check()` until it returns something true, and returns that;
    fails after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("%s: not within %d s" % (what, timeout))
        time.sleep(0.05)


def proc_stat(pid):
    """(state, ppid, start time) from /proc/PID/stat, or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return fields[0], int(fields[1]), int(fields[19])


def children_of(pid):
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            stat = proc_stat(int(name))
            if stat and stat[1] == pid:
                found.append(int(name))
    return sorted(found)


def real_uid(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Uid:"):
                return int(line.split()[1])
    raise AssertionError("process %d: no Uid line" % pid)


def default_sigint():
    """preexec_fn: SIGINT as in a foreground job, even when the tests run
    in the background (which ignores it): http.server stops on it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wchan(pid):
    """Where the process's main thread sleeps in the kernel."""
    try:
        with open("/proc/%d/wchan" % pid) as f:
            return f.read()
    except OSError:
        return ""


class Process:
    """A process a test started, known by pid and start time, so that a
    reused pid is never signalled."""

    def __init__(self, pid):
        self.pid = pid
        stat = proc_stat(pid)
        self.start = stat[2] if stat else None  # gone already: never alive

    def alive(self):
        stat = proc_stat(self.pid)
        return bool(stat) and stat[2] == self.start and stat[0] != "Z"

    def signal(self, sig):
        if self.alive():
            os.kill(self.pid, sig)


def http_get(port, path):
    """GET path over HTTP/1.0; the whole response up to the server's close,
    as (status line, body)."""
    with socket.create_connection((LOCALHOST, port), timeout=IO_TIMEOUT) as s:
        s.sendall(b"GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n" % path.encode())
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


def fetch_concurrently(port, path, body, requests, clients):
    """`requests` GETs of `path` from `clients` threads at once; the answers
    that were not "200 OK" with `body` (their status line, or the error)."""
    failures = []

    def client():
        for _ in range(requests // clients):
            try:
                got = http_get(port, path)
            except OSError as e:
                got = repr(e)
            if got != ("HTTP/1.0 200 OK", body):
                failures.append(got if isinstance(got, str) else got[0])
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def answers(call):
    """call() or None if the server refused or closed the connection (not
    listening yet)."""
    try:
        return call()
    except (ConnectionError, socket.timeout):
        return None


class ServerTest(HeapsnapTest):
    def setUp(self):
        super().setUp()
        self.started = []
        self.launchers = []
        self.addCleanup(self.stop_all)

    def adopt(self, pid):
        """Kills `pid` when the test ends (cleanups run even on failure)."""
        p = Process(pid)
        self.started.append(p)
        return p

    def stop_all(self):
        """SIGKILL to every process the test started that still runs, and
        to their children (nginx's workers, a server not adopted yet)."""
        for launcher in self.launchers:
            if launcher.poll() is None:
                os.killpg(launcher.pid, signal.SIGKILL)  # its own group: start_new_session
        killed, pending = [], list(self.started)
        while pending:
            p = pending.pop()
            if p.alive():
                pending += [Process(c) for c in children_of(p.pid)]
                p.signal(signal.SIGKILL)
                killed.append(p)
        for launcher in self.launchers:
            launcher.wait(timeout=STARTUP)
        until(lambda: not any(p.alive() for p in killed), "killed processes gone", timeout=STARTUP)

    def launch(self, name, argv, cwd=None, env=None):
        """`heapsnap run -o TMP/NAME.%p.hslog -- argv` in the background,
        its output in TMP/NAME.out and TMP/NAME.err. Returns the launcher."""
        full_env = dict(os.environ, **(env or {}))
        with open(self.path(name + ".out"), "wb") as out, open(self.path(name + ".err"), "wb") as err:
            launcher = subprocess.Popen([HEAPSNAP, "run", "-o", self.path(name + ".%p.hslog"), "--", *argv],
                                        cwd=cwd or self.tmp, env=full_env, stdin=subprocess.DEVNULL, stdout=out,
                                        stderr=err, start_new_session=True, preexec_fn=default_sigint)
        self.adopt(launcher.pid)
        self.launchers.append(launcher)
        launcher.name = name
        return launcher

    def launcher_exit(self, launcher):
        """Waits for the launcher; its exit status and stderr."""
        try:
            status = launcher.wait(timeout=STARTUP)
        except subprocess.TimeoutExpired:
            self.fail("heapsnap run -- %s: still running after %d s" % (launcher.name, STARTUP))
        with open(self.path(launcher.name + ".err")) as f:
            return status, f.read()

    def ready(self, launcher, check, what):
        """Polls check() until the server answers; fails at once if the
        launcher ended meanwhile."""
        def answered():
            if launcher.poll() is not None:
                status, err = self.launcher_exit(launcher)
                self.fail("%s ended (status %d) before %s:\n%s" % (launcher.name, status, what, err[-3000:]))
            return answers(check)
        return until(answered, what)

    def daemon_ready(self, daemon, check, what):
        """ready() for a daemon the launcher no longer waits for."""
        def answered():
            self.assertTrue(daemon.alive(), "process %d ended before %s" % (daemon.pid, what))
            return answers(check)
        return until(answered, what)

    def as_user(self, user, argv):
        uid, gid = user_ids(user)
        return ["setpriv", "--reuid=%d" % uid, "--regid=%d" % gid, "--clear-groups", *argv]

    def snapshot_as(self, user, pid, name, label):
        """`heapsnap snapshot PID` run as `user`; the snapshot is `user`'s."""
        path = self.path(name)
        self.run_cmd(self.as_user(user, [HEAPSNAP, "snapshot", str(pid), "-o", path, "--label", label]), expect=0)
        self.assertEqual(os.stat(path).st_uid, user_ids(user)[0])
        return path

    def maps(self, snapshot):
        return self.json_of("maps", snapshot, "--format", "json")

    def entry_through(self, diff, functions):
        """The one entry whose stack starts with `functions`, in order."""
        found = [e for e in diff["entries"]
                 if [f["function"] for f in e["frames"][:len(functions)]] == list(functions)]
        self.assertEqual(len(found), 1, "entries starting %s: %s" % (functions, [
            ([f["function"] for f in e["frames"][:6]], e["bytes_delta"]) for e in diff["entries"]]))
        return found[0]

    def assert_delta(self, entry, bytes_delta, blocks_delta):
        self.assertEqual((entry["bytes_delta"], entry["blocks_delta"]), (bytes_delta, blocks_delta),
                         [f["function"] for f in entry["frames"][:8]])

    def assert_labels(self, log, labels):
        """The log ended by exit and holds these markers, in order."""
        data = self.markers(log)
        self.assertTrue(data["complete"], log)
        self.assertEqual([m["label"] for m in data["markers"]], labels + ["exit"], log)


# ---- redis ------------------------------------------------------------------


class Redis:
    """One RESP connection to redis-server."""

    def __init__(self, port):
        self.sock = socket.create_connection((LOCALHOST, port), timeout=IO_TIMEOUT)
        self.replies = self.sock.makefile("rb")

    def close(self):
        self.replies.close()
        self.sock.close()

    @staticmethod
    def encode(*args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        return b"".join(out)

    def reply(self):
        line = self.replies.readline()
        if line.startswith(b"$"):
            size = int(line[1:])
            return None if size < 0 else self.replies.read(size + 2)[:-2]
        line = line.rstrip(b"\r\n").decode()
        return line[1:] if line.startswith("+") else line  # a simple string's text

    def call(self, *args):
        self.sock.sendall(self.encode(*args))
        return self.reply()


class RedisTest(ServerTest):
    SETS = 10000
    VALUE = 1000

    def test_set_growth_at_redis_call_sites(self):
        need("/usr/bin/redis-server", "redis-server")
        port = free_port()
        launcher = self.launch("redis", ["/usr/bin/redis-server", "--port", str(port), "--bind", LOCALHOST,
                                         "--save", "", "--appendonly", "no", "--dir", self.tmp])
        # One connection, open from before A to after B: its own buffers are
        # in both snapshots.
        client = self.ready(launcher, lambda: Redis(port), "redis answers on port %d" % port)
        self.addCleanup(client.close)
        self.assertEqual(client.call("PING"), "PONG")
        info = client.call("INFO", "server").decode()
        pid = int(info.split("process_id:")[1].split()[0])
        self.adopt(pid)
        log = self.path("redis.%d.hslog" % pid)
        a = self.snapshot(str(pid), "-o", self.path("a.hsnap"), "--label", "A")

        # SET key:i, 1000 bytes each, pipelined 500 at a time.
        value = b"v" * self.VALUE
        for first in range(0, self.SETS, 500):
            batch = range(first, first + 500)
            client.sock.sendall(b"".join(Redis.encode("SET", "key:%d" % i, value) for i in batch))
            self.assertEqual([client.reply() for _ in batch], ["OK"] * 500)
        b = self.snapshot(str(pid), "-o", self.path("b.hsnap"), "--label", "B")

        diff = self.diff(a, b)
        # Redis 7.0's own call sites, exact: each value an sds of 5 header
        # bytes + 1000 + NUL and its 16-byte robj, made as the command is
        # parsed; each key a 24-byte dict entry and an sds copy of the key
        # (1 header byte + length + NUL), made as it is stored.
        keys = sum(len("key:%d" % i) + 2 for i in range(self.SETS))
        values = self.entry_through(diff, ["zmalloc_usable", "_sdsnewlen", "createStringObject",
                                           "processMultibulkBuffer"])
        self.assertIs(values, diff["entries"][0], "the values are the largest growth")
        self.assert_delta(values, self.SETS * (self.VALUE + 6), self.SETS)
        self.assert_delta(self.entry_through(diff, ["zmalloc", "createObject", "processMultibulkBuffer"]),
                          self.SETS * 16, self.SETS)
        self.assert_delta(self.entry_through(diff, ["zmalloc", "dictAddRaw", "dbAdd"]), self.SETS * 24, self.SETS)
        self.assert_delta(self.entry_through(diff, ["zmalloc_usable", "_sdsnewlen", "dbAdd"]), keys, self.SETS)
        # Beside them: the keyspace's hash table doubling (its old table may
        # still be rehashing at B), the SET command's latency histogram,
        # and what jemalloc's background threads allocate.
        known = self.SETS * (self.VALUE + 6 + 16 + 24) + keys
        self.assertGreaterEqual(diff["total"]["bytes_delta"], known)
        self.assertLess(diff["total"]["bytes_delta"], known + MIB)

        old, new = self.maps(a), self.maps(b)
        for space in (old, new):
            self.assertEqual(space["allocator"]["name"], "jemalloc")
            self.assertIsNotNone(space["allocator"]["allocated_bytes"])
        # jemalloc's count rounds each value up to its 1024-byte class.
        self.assertGreaterEqual(new["allocator"]["allocated_bytes"] - old["allocator"]["allocated_bytes"],
                                self.SETS * (self.VALUE + 6))
        # The values were written: that many bytes of jemalloc's own
        # mappings became resident, and they count as Heap.
        self.assertGreaterEqual(new["categories"]["Heap"]["rss_bytes"] - old["categories"]["Heap"]["rss_bytes"],
                                self.SETS * self.VALUE)

        self.assertEqual(client.call("GET", "key:%d" % (self.SETS - 1)), value)
        self.assertEqual(client.call("DBSIZE"), ":%d" % self.SETS)
        client.sock.sendall(Redis.encode("SHUTDOWN", "NOSAVE"))
        self.assertEqual(client.replies.read(), b"", "SHUTDOWN closes the connection")
        status, err = self.launcher_exit(launcher)
        self.assertEqual(status, 0, err)
        self.assertEqual(self.logs_of(err), [log])
        self.assert_labels(log, ["A", "B"])


# ---- python3 -m http.server ---------------------------------------------------


class HttpServerTest(ServerTest):
    BODY = bytes(range(256)) * 20  # data.bin, 5120 bytes
    BATCH = 300
    CLIENTS = 4

    def load(self, port):
        """BATCH requests of data.bin from CLIENTS threads at once; each gets
        the whole file."""
        self.assertEqual(fetch_concurrently(port, "/data.bin", self.BODY, self.BATCH, self.CLIENTS), [])

    def idle(self, pid):
        """Waits until every request thread has ended: only the main thread
        and the recorder's writer are left."""
        def threads():
            names = []
            for tid in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/comm" % (pid, tid)) as f:
                    names.append(f.read().strip())
            return sorted(names)
        until(lambda: threads() == ["heapsnap-writer", "python3"], "http.server's request threads end")

    def test_thread_per_request(self):
        need(PYTHON, "python3")
        www = self.path("www")
        os.mkdir(www)
        with open(os.path.join(www, "data.bin"), "wb") as f:
            f.write(self.BODY)
        port = free_port()
        launcher = self.launch("http", [PYTHON, "-m", "http.server", str(port), "--bind", LOCALHOST], cwd=www,
                               env={"PYTHONMALLOC": "malloc"})
        self.ready(launcher, lambda: http_get(port, "/data.bin"), "http.server answers on port %d" % port)
        (pid,) = children_of(launcher.pid)
        server = self.adopt(pid)
        self.assertEqual(os.path.realpath("/proc/%d/exe" % pid), os.path.realpath(PYTHON))

        # The first requests import modules and fill caches, and the
        # recorder's tables take in their new stacks.
        self.load(port)
        snaps = []
        for label in ("A", "B", "C"):
            if snaps:
                self.load(port)
            self.idle(pid)
            snaps.append(self.snapshot(str(pid), "-o", self.path(label + ".hsnap"), "--label", label))
        diff = self.diff(snaps[0], snaps[-1])
        # Python keeps a little per request ('do_' + command strings in its
        # method cache, date strings): 80 to 95 bytes measured. A handler's
        # frame, its socket object or its 8 KiB read buffer kept would be
        # far more.
        requests = 2 * self.BATCH
        self.assertLess(abs(diff["total"]["bytes_delta"]), requests * 256, diff["total"])
        # A thread per request, 600 of them, and the recorder holds hardly
        # more memory than before: their rings (640 KiB each) are reused; a
        # few more are in use when more threads overlap. One kept per
        # thread would be 375 MiB.
        old, new = self.maps(snaps[0]), self.maps(snaps[-1])
        self.assertLess(new["recorder_bytes"] - old["recorder_bytes"], 16 * MIB)
        self.assertLess(new["categories"]["Recorder"]["size_bytes"] - old["categories"]["Recorder"]["size_bytes"],
                        16 * MIB)
        self.assertEqual(new["threads"], old["threads"])

        self.assertEqual(http_get(port, "/data.bin"), ("HTTP/1.0 200 OK", self.BODY))
        server.signal(signal.SIGINT)  # http.server's way out: KeyboardInterrupt, status 0
        status, err = self.launcher_exit(launcher)
        self.assertEqual(status, 0, err)
        log = self.path("http.%d.hslog" % pid)
        self.assertEqual(self.logs_of(err), [log])
        self.assert_labels(log, ["A", "B", "C"])


# ---- memcached ------------------------------------------------------------------


class MemcachedTest(ServerTest):
    ITEMS = 5000
    VALUE = 1000

    def start(self):
        """memcached -d on a free port, as memcache when root. Returns (port,
        the daemon, the log of the process the launcher started)."""
        need("/usr/bin/memcached", "memcached")
        port = free_port()
        # The daemon, already memcache, writes its pid file and log here;
        # snapshots as memcache land here too.
        os.chmod(self.tmp, 0o1777)
        argv = ["/usr/bin/memcached", "-d", "-p", str(port), "-U", "0", "-l", LOCALHOST, "-P",
                self.path("memcached.pid")]
        if os.geteuid() == 0:
            user_ids("memcache")
            argv += ["-u", "memcache"]
        launcher = self.launch("memcached", argv)
        # memcached's first process leaves once the daemon is forked.
        status, err = self.launcher_exit(launcher)
        self.assertEqual(status, 0, err)
        pid = int(until(self.read_pidfile, "memcached.pid written"))
        daemon = self.adopt(pid)
        # The launcher names the daemon's log too if it was made before the
        # first process left.
        first_logs = [log for log in self.logs_of(err) if log != self.path("memcached.%d.hslog" % pid)]
        self.assertEqual(len(first_logs), 1, err)
        self.daemon_ready(daemon, lambda: self.command(port, b"version\r\n"), "memcached answers on port %d" % port)
        return port, daemon, first_logs[0]

    def read_pidfile(self):
        try:
            with open(self.path("memcached.pid")) as f:
                text = f.read()
        except FileNotFoundError:
            return None
        return text.strip() if text.endswith("\n") else None

    @staticmethod
    def command(port, request):
        with socket.create_connection((LOCALHOST, port), timeout=IO_TIMEOUT) as s:
            s.sendall(request)
            return s.makefile("rb").readline()

    def fill(self, port):
        """ITEMS sets of key:i, VALUE bytes each, on one connection."""
        value = b"m" * self.VALUE
        with socket.create_connection((LOCALHOST, port), timeout=IO_TIMEOUT) as s, s.makefile("rb") as replies:
            for first in range(0, self.ITEMS, 500):
                batch = range(first, first + 500)
                s.sendall(b"".join(b"set key:%d 0 0 %d\r\n%s\r\n" % (i, self.VALUE, value) for i in batch))
                self.assertEqual([replies.readline() for _ in batch], [b"STORED\r\n"] * 500)
            s.sendall(b"get key:%d\r\n" % (self.ITEMS - 1))
            self.assertEqual(replies.readline(), b"VALUE key:%d 0 %d\r\n" % (self.ITEMS - 1, self.VALUE))
            self.assertEqual(replies.read(self.VALUE + 7), value + b"\r\nEND\r\n")

    @staticmethod
    def stop(daemon):
        daemon.signal(signal.SIGTERM)
        until(lambda: not daemon.alive(), "memcached exits on SIGTERM")

    def test_items_grow_in_slab_pages(self):
        port, daemon, _ = self.start()
        pid = daemon.pid
        log = self.path("memcached.%d.hslog" % pid)
        a = self.snapshot(str(pid), "-o", self.path("a.hsnap"), "--label", "A")
        self.fill(port)
        b = self.snapshot(str(pid), "-o", self.path("b.hsnap"), "--label", "B")
        diff = self.diff(a, b)
        # Items live in 1 MiB slab pages malloc'd as a class fills: 5000 of
        # about 1070 bytes go in the 1184-byte class, 885 a page, 6 pages.
        # Debian's memcached has no symbols: the frames name the module.
        top = diff["entries"][0]
        self.assert_delta(top, 6 * MIB, 6)
        self.assertEqual(top["frames"][0]["module"], "/usr/bin/memcached")
        self.assertGreaterEqual(diff["total"]["bytes_delta"], 6 * MIB)
        self.assertLess(diff["total"]["bytes_delta"], 6 * MIB + 256 * 1024)
        heap = diff["address_space"]["delta"]["categories"]["Heap"]
        self.assertGreaterEqual(heap["rss_bytes"], self.ITEMS * self.VALUE)
        self.stop(daemon)
        self.assert_labels(log, ["A", "B"])

    def test_snapshot_as_root_and_as_memcache(self):
        need_root("memcached -u memcache")
        _, daemon, first_log = self.start()
        pid = daemon.pid
        memcache = user_ids("memcache")[0]
        self.assertEqual(real_uid(pid), memcache)
        log = self.path("memcached.%d.hslog" % pid)
        # memcached drops root before it forks the daemon: the first
        # process's log was given to memcache at setuid, the daemon's was
        # made by memcache.
        for path in (first_log, log):
            st = os.stat(path)
            self.assertEqual((st.st_uid, st.st_mode & 0o777), (memcache, 0o600), path)
        listed = self.json_of("ps", "--format", "json")
        self.assertEqual([(r["user"], r["exe"], r["log"]) for r in listed if r["pid"] == pid],
                         [("memcache", "/usr/bin/memcached", log)])
        a = self.snapshot_as("root", pid, "root.hsnap", "by-root")
        b = self.snapshot_as("memcache", pid, "memcache.hsnap", "by-memcache")
        self.assertEqual(self.diff(a, b)["new"]["pid"], pid)
        refused = self.run_cmd(self.as_user("nobody", [HEAPSNAP, "snapshot", str(pid), "-o", self.path("n.hsnap")]),
                               expect=1)
        self.assertIn("belongs to another user (uid %d)" % memcache, refused.stderr)
        self.assertFalse(os.path.exists(self.path("n.hsnap")))
        self.stop(daemon)
        self.assert_labels(log, ["by-root", "by-memcache"])


# ---- nginx ------------------------------------------------------------------


class NginxTest(ServerTest):
    WORKERS = 2
    REQUESTS = 300
    BODY = bytes(range(256)) * 80  # big.bin, 20480 bytes

    def start(self):
        """nginx as a daemon: a master and WORKERS workers (nobody when
        root), its files in the test directory. Returns (port, master pid,
        worker pids), all waiting for connections."""
        need("/usr/sbin/nginx", "nginx-light")
        port = free_port()
        os.chmod(self.tmp, 0o1777)  # snapshots as nobody land here
        www = self.path("www")
        os.mkdir(www)
        with open(os.path.join(www, "big.bin"), "wb") as f:
            f.write(self.BODY)
        user = "user nobody %s;\n" % ("nogroup" if self.group_exists("nogroup") else "nobody")
        temp = "".join("    %s_temp_path %s;\n" % (kind, self.path(kind)) for kind in
                       ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        with open(self.path("nginx.conf"), "w") as f:
            f.write("daemon on;\nmaster_process on;\nworker_processes %d;\n%spid %s;\nerror_log %s;\n"
                    "events { worker_connections 64; }\n"
                    "http {\n    access_log %s;\n%s    server {\n        listen %s:%d;\n        root %s;\n"
                    "    }\n}\n" % (self.WORKERS, user if os.geteuid() == 0 else "", self.path("nginx.pid"),
                                    self.path("error.log"), self.path("access.log"), temp, LOCALHOST, port, www))
        launcher = self.launch("nginx", ["/usr/sbin/nginx", "-p", self.tmp, "-c", self.path("nginx.conf"), "-e",
                                         self.path("error.log")])
        status, err = self.launcher_exit(launcher)
        self.assertEqual(status, 0, err)
        with open(self.path("nginx.pid")) as f:
            master = int(f.read())
        daemon = self.adopt(master)
        workers = until(lambda: len(children_of(master)) == self.WORKERS and children_of(master),
                        "nginx starts %d workers" % self.WORKERS)
        for w in workers:
            self.adopt(w)
        self.daemon_ready(daemon, lambda: http_get(port, "/big.bin"), "nginx answers on port %d" % port)
        # Snapshots of a process still starting would see its start-up as
        # growth: wait until each sleeps where it waits for work.
        until(lambda: "sigsuspend" in wchan(master) and all("epoll" in wchan(w) for w in workers),
              "nginx's master in sigsuspend and workers in epoll_wait")
        return port, master, workers

    @staticmethod
    def group_exists(name):
        with open("/etc/group") as f:
            return any(line.split(":")[0] == name for line in f)

    def stop(self, master, workers):
        os.kill(master, signal.SIGTERM)
        until(lambda: not any(p.alive() for p in self.started if p.pid in [master] + workers),
              "nginx's master and workers exit on SIGTERM")

    def test_workers_keep_nothing_per_request(self):
        port, master, workers = self.start()
        pids = [master] + workers
        before = {p: self.snapshot(str(p), "-o", self.path("a.%d.hsnap" % p), "--label", "A") for p in pids}
        for _ in range(self.REQUESTS):
            self.assertEqual(http_get(port, "/big.bin"), ("HTTP/1.1 200 OK", self.BODY))
        after = {p: self.snapshot(str(p), "-o", self.path("b.%d.hsnap" % p), "--label", "B") for p in pids}
        # A request's memory lives in its pools, destroyed as it ends; the
        # client read each response up to nginx's close.
        for p in pids:
            diff = self.diff(before[p], after[p])
            self.assertEqual((diff["total"]["bytes_delta"], diff["total"]["blocks_delta"], diff["entries"]),
                             (0, 0, []), "process %d (master %d)" % (p, master))
        with open(self.path("access.log")) as f:
            self.assertEqual(len(f.readlines()), 1 + self.REQUESTS)  # and the readiness check
        self.stop(master, workers)
        for p in pids:
            self.assert_labels(self.path("nginx.%d.hslog" % p), ["A", "B"])

    def test_workers_as_nobody(self):
        need_root("nginx's user directive")
        _, master, workers = self.start()
        nobody = user_ids("nobody")[0]
        self.assertEqual([real_uid(w) for w in workers], [nobody] * self.WORKERS)
        # Each worker's log was made by root as it forked, and given to
        # nobody as the worker switched; the master's stays root's.
        self.assertEqual(os.stat(self.path("nginx.%d.hslog" % master)).st_uid, 0)
        for w in workers:
            self.assertEqual(os.stat(self.path("nginx.%d.hslog" % w)).st_uid, nobody)

        def rows(listing):
            return sorted((r["pid"], r["user"]) for r in listing if r["pid"] in [master] + workers)
        self.assertEqual(rows(self.json_of("ps", "--format", "json")),
                         sorted([(master, "root")] + [(w, "nobody") for w in workers]))
        as_nobody = self.run_cmd(self.as_user("nobody", [HEAPSNAP, "ps", "--format", "json"]), expect=0)
        self.assertEqual(rows(json.loads(as_nobody.stdout)), [(w, "nobody") for w in workers])
        for w in workers:
            a = self.snapshot_as("root", w, "root.%d.hsnap" % w, "by-root")
            b = self.snapshot_as("nobody", w, "nobody.%d.hsnap" % w, "by-nobody")
            self.assertEqual(self.diff(a, b)["entries"], [], "worker %d, idle" % w)
        refused = self.run_cmd(self.as_user("nobody", [HEAPSNAP, "snapshot", str(master), "-o",
                                                      self.path("master.hsnap")]), expect=1)
        self.assertIn("belongs to another user (uid 0)", refused.stderr)
        self.stop(master, workers)
        for w in workers:
            self.assert_labels(self.path("nginx.%d.hslog" % w), ["by-root", "by-nobody"])
        self.assert_labels(self.path("nginx.%d.hslog" % master), [])


if __name__ == "__main__":
    main()
