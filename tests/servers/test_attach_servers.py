"""Real servers started without heapsnap, recorded from `heapsnap attach`
on, under a bounded load, then detached while they run on
(docs/design/attach.md): Debian's python3 -m http.server (a non-PIE
executable whose malloc and free are canonical PLT entries, a thread per
request) and redis-server (jemalloc).

Each server runs bare on a free localhost port in the test's temporary
directory and is killed when the test ends, pass or fail (test_servers.py,
ServerTest). A test skips when its server is not installed.
"""

import os
import re
import signal
import subprocess

from harness import main
from test_servers import LOCALHOST, PYTHON, Redis, ServerTest, fetch_concurrently, free_port, http_get, need, until

ATTACHED = re.compile(r"^heapsnap: attached in \d+\.\d ms$")


class AttachedServerTest(ServerTest):
    def start_bare(self, name, argv, cwd=None, env=None):
        """argv without heapsnap, in its own session, its output in
        TMP/NAME.out and TMP/NAME.err."""
        with open(self.path(name + ".out"), "wb") as out, open(self.path(name + ".err"), "wb") as err:
            proc = subprocess.Popen(argv, cwd=cwd or self.tmp, env=dict(os.environ, **(env or {})),
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=err, start_new_session=True)
        self.adopt(proc.pid)
        self.addCleanup(lambda: proc.poll() is None and proc.kill() or proc.wait())
        return proc

    def answering(self, proc, check, what):
        def answered():
            self.assertIsNone(proc.poll(), "the server ended before %s" % what)
            try:
                return check()
            except OSError:
                return None
        return until(answered, what)

    def attach(self, pid, log):
        result = self.heapsnap("attach", str(pid), "-o", log)
        lines = result.stderr.splitlines()
        self.assertEqual(lines[0], "heapsnap: log: %s" % log, result.stderr)
        self.assertRegex(lines[1], ATTACHED)
        self.assertEqual(len(lines), 2, result.stderr)

    def detach(self, pid, log):
        self.assertEqual(self.heapsnap("detach", str(pid)).stderr, "heapsnap: log: %s\n" % log)
        data = self.markers(log)
        self.assertTrue(data["complete"], log)
        return [m["label"] for m in data["markers"]]


class HttpServerAttachTest(AttachedServerTest):
    BODY = bytes(range(256)) * 20  # data.bin, 5120 bytes
    REQUESTS = 200
    CLIENTS = 4

    def load(self, port):
        self.assertEqual(fetch_concurrently(port, "/data.bin", self.BODY, self.REQUESTS, self.CLIENTS), [])

    def test_attach_idle_then_serve(self):
        need(PYTHON, "python3")
        www = self.path("www")
        os.mkdir(www)
        with open(os.path.join(www, "data.bin"), "wb") as f:
            f.write(self.BODY)
        port = free_port()
        server = self.start_bare("http", [PYTHON, "-m", "http.server", str(port), "--bind", LOCALHOST], cwd=www,
                                 env={"PYTHONMALLOC": "malloc"})
        self.answering(server, lambda: http_get(port, "/data.bin"), "http.server answers on port %d" % port)
        # Idle, as in the crash this guards against: its first request
        # after attach called malloc through its own PLT entry.
        until(lambda: len(os.listdir("/proc/%d/task" % server.pid)) == 1, "http.server idle")
        log = self.path("http.hslog")
        self.attach(server.pid, log)
        a = self.snapshot(str(server.pid), "-o", self.path("a.hsnap"), "--label", "A")
        self.load(port)
        until(lambda: len(os.listdir("/proc/%d/task" % server.pid)) == 2, "request threads end")
        b = self.snapshot(str(server.pid), "-o", self.path("b.hsnap"), "--label", "B")
        self.assertEqual(self.detach(server.pid, log), ["A", "B", "detach"])

        diff = self.diff(a, b)
        # What Python keeps of the requests (the 'do_' + command strings of
        # its method cache among them) is named at Python's own functions,
        # in the executable, called from the interpreter loop.
        python = os.path.realpath(PYTHON)
        concat = [e for e in diff["entries"] if [(f["function"], f["module"]) for f in e["frames"][:2]] ==
                  [("PyUnicode_Concat", python), ("_PyEval_EvalFrameDefault", python)]]
        self.assertEqual(len(concat), 1, [[f["function"] for f in e["frames"][:4]] for e in diff["entries"]])
        self.assertGreater(concat[0]["blocks_delta"], 0)
        self.assertEqual(concat[0]["old_blocks"], 0)

        # Detached, it serves as before and leaves as before.
        self.assertEqual(http_get(port, "/data.bin"), ("HTTP/1.0 200 OK", self.BODY))
        self.assertEqual(os.listdir("/proc/%d/task" % server.pid), [str(server.pid)])
        server.send_signal(signal.SIGINT)
        self.assertEqual(server.wait(timeout=60), 0)


class RedisAttachTest(AttachedServerTest):
    SETS = 1000
    VALUE = 1000

    def test_set_growth_after_attach(self):
        need("/usr/bin/redis-server", "redis-server")
        port = free_port()
        server = self.start_bare("redis", ["/usr/bin/redis-server", "--port", str(port), "--bind", LOCALHOST,
                                           "--save", "", "--appendonly", "no", "--dir", self.tmp])
        client = self.answering(server, lambda: Redis(port), "redis answers on port %d" % port)
        self.addCleanup(client.close)
        self.assertEqual(client.call("PING"), "PONG")
        log = self.path("redis.hslog")
        self.attach(server.pid, log)
        a = self.snapshot(str(server.pid), "-o", self.path("a.hsnap"), "--label", "A")
        value = b"v" * self.VALUE
        for first in range(0, self.SETS, 500):
            batch = range(first, first + 500)
            client.sock.sendall(b"".join(Redis.encode("SET", "key:%d" % i, value) for i in batch))
            self.assertEqual([client.reply() for _ in batch], ["OK"] * 500)
        b = self.snapshot(str(server.pid), "-o", self.path("b.hsnap"), "--label", "B")
        self.assertEqual(self.detach(server.pid, log), ["A", "B", "detach"])

        diff = self.diff(a, b)
        # Each value an sds of 5 header bytes + 1000 + NUL, made as the
        # command is parsed: exactly what `heapsnap run` sees.
        values = self.entry_through(diff, ["zmalloc_usable", "_sdsnewlen", "createStringObject",
                                           "processMultibulkBuffer"])
        self.assertIs(values, diff["entries"][0], "the values are the largest growth")
        self.assert_delta(values, self.SETS * (self.VALUE + 6), self.SETS)
        self.assertEqual(self.maps(b)["allocator"]["name"], "jemalloc")

        self.assertEqual(client.call("DBSIZE"), ":%d" % self.SETS)
        self.assertEqual(client.call("GET", "key:%d" % (self.SETS - 1)), value)
        client.sock.sendall(Redis.encode("SHUTDOWN", "NOSAVE"))
        self.assertEqual(client.replies.read(), b"", "SHUTDOWN closes the connection")
        self.assertEqual(server.wait(timeout=60), 0)


if __name__ == "__main__":
    main()
