"""The symbol cache (formats/symbol-cache.md) on a copy of trend.c's
program: a second diff and report print exactly what the first did
without reading the program's file; a debug file appearing, changing or
going is noticed; a damaged, planted or foreign cache file is ignored
with at most one warning and written anew, the output exact."""

import os
import pwd
import shutil
import stat
import subprocess

from harness import HeapsnapTest, main, program, site_line

SRC = "trend.c"


def zero_in_place(path):
    """The file's bytes made zeros; its inode, size and modification time
    kept, so only a reader of its bytes can tell."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(bytes(st.st_size))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def varint(n):
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def string(b):
    return varint(len(b)) + b


class SymbolCacheTest(HeapsnapTest):
    def setUp(self):
        super().setUp()
        self.cache = self.path("cache")
        self.env = {"HEAPSNAP_SYMBOL_CACHE": self.cache}

    def record_copy(self, strip_to_debuglink=False):
        """trend, copied into the test directory (with its DWARF moved to
        prog.debug, named by a .gnu_debuglink, if asked), recorded; the
        log's path."""
        prog = self.path("prog")
        shutil.copy(program("trend"), prog)
        if strip_to_debuglink:
            for args in (["--only-keep-debug", "prog", "prog.debug"], ["--strip-debug", "prog"],
                         ["--add-gnu-debuglink=prog.debug", "prog"]):
                self.run_cmd(["objcopy"] + args, expect=0)
        log = self.path("t.hslog")
        self.heapsnap("run", "-o", log, "--", prog)
        return log

    def outputs(self, log, cache=None):
        """stdout and stderr of a text diff and a report of the log, with
        the test's cache (or `cache`: "0" for none)."""
        env = {"HEAPSNAP_SYMBOL_CACHE": cache or self.cache}
        runs = [self.heapsnap("diff", log + "@r1", log + "@exit", env=env), self.heapsnap("report", log, env=env)]
        return [(r.stdout, r.stderr) for r in runs]

    def cache_file(self, module):
        """The cache's file of the module at `module` in the log."""
        build_id = next(f["build_id"] for kind, f in self.dump(self.path("t.hslog"))
                        if kind == "module" and f["path"] == module)
        names = [n for n in os.listdir(self.cache) if n.startswith(build_id + "-")]
        self.assertEqual(len(names), 1, os.listdir(self.cache))
        return os.path.join(self.cache, names[0])

    def assert_private(self, path, mode):
        st = os.lstat(path)
        self.assertEqual((st.st_uid, stat.S_IMODE(st.st_mode)), (os.geteuid(), mode), path)

    def test_second_run_reads_no_module_file(self):
        log = self.record_copy()
        first = self.outputs(log)
        line = "%s:%d" % (SRC, site_line(SRC, "leak_request"))
        self.assertIn(line, first[0][0])
        self.assertIn(line, first[1][0])
        self.assert_private(self.cache, 0o700)
        self.assert_private(self.cache_file(self.path("prog")), 0o600)
        zero_in_place(self.path("prog"))

        self.assertEqual(self.outputs(log), first)
        # Without the cache the program's file is unreadable now: the run
        # above never read it.
        self.assertIn(self.path("prog") + ": cannot open: not a valid ELF file", self.outputs(log, "0")[0][1])

    def test_debug_file_appearing_changing_and_going(self):
        log = self.record_copy(strip_to_debuglink=True)
        os.mkdir(self.path("away"))
        os.rename(self.path("prog.debug"), self.path("away/full.debug"))
        self.run_cmd(["objcopy", "--remove-section=.debug_line", "away/full.debug", "away/no_lines.debug"], expect=0)
        line = "%s:%d" % (SRC, site_line(SRC, "leak_request"))
        debug = self.path("prog.debug")
        # The debug file: missing, then there, then rewritten in place
        # without its line table, then gone.
        steps = [(None, False), ("full.debug", True), ("no_lines.debug", False), (None, False)]
        for source, has_lines in steps:
            if source:
                shutil.copyfile(self.path("away/" + source), debug)
            elif os.path.exists(debug):
                os.unlink(debug)
            uncached = self.outputs(log, "0")
            self.assertEqual(line in uncached[0][0], has_lines, source)
            self.assertEqual(self.outputs(log), uncached, source)
            self.assertEqual(self.outputs(log), uncached, source)

    def lying_copy(self, good):
        """A sound cache file like `good` whose frames say LEAK_REQUEST
        where the program has leak_request."""
        body = self.path("body")
        with open(body, "wb") as f:
            f.write(subprocess.run(["zstd", "-d", "-c"], input=good[16:], capture_output=True, check=True).stdout
                    .replace(b"leak_request", b"LEAK_REQUEST"))
        packed = subprocess.run(["zstd", "-q", "--check", "-c", body], capture_output=True, check=True).stdout
        return good[:16] + packed

    def test_damaged_or_planted_cache_files_are_ignored(self):
        log = self.record_copy()
        reference = self.outputs(log)
        target = self.cache_file(self.path("prog"))
        with open(target, "rb") as f:
            good = f.read()
        lying = self.lying_copy(good)
        other = self.cache_file(next(f["path"] for kind, f in self.dump(log)
                                     if kind == "module" and "libc.so" in f["path"]))
        with open(other, "rb") as f:
            foreign = f.read()
        build_id = bytes.fromhex(os.path.basename(target).split("-")[0])
        huge = self.path("huge")
        with open(huge, "wb") as f:
            f.write(string(build_id) + string(self.path("prog").encode()) + b"\x01" + varint(1 << 60))
        huge = good[:16] + subprocess.run(["zstd", "-q", "--check", "-c", huge], capture_output=True,
                                          check=True).stdout
        planted = self.path("planted.hssym")

        def plant_file(data, mode=0o600, owner=None):
            def plant():
                with open(target, "wb") as f:
                    f.write(data)
                os.chmod(target, mode)
                if owner is not None:
                    os.chown(target, owner, -1)
            return plant

        def plant_link():
            with open(planted, "wb") as f:
                f.write(lying)
            os.chmod(planted, 0o600)
            os.symlink(planted, target)

        # The lying file, planted as heapsnap writes its files, is believed:
        # the cases below would show it if they read it.
        plant_file(lying)()
        self.assertIn("LEAK_REQUEST", self.outputs(log)[0][0])

        cases = [("truncated", plant_file(good[:len(good) // 2])),
                 ("wrong magic", plant_file(b"HSNAPSYX" + good[8:])),
                 ("another module's file", plant_file(foreign)),
                 ("huge counts", plant_file(huge)),
                 ("readable by others", plant_file(lying, 0o644)),
                 ("a symlink", plant_link),
                 ("a FIFO", lambda: os.mkfifo(target, 0o600)),
                 ("a directory", lambda: os.mkdir(target, 0o700))]
        if os.geteuid() == 0:
            cases.append(("another user's", plant_file(lying, 0o600, pwd.getpwnam("nobody").pw_uid)))
        for name, plant in cases:
            if os.path.isdir(target) and not os.path.islink(target):
                os.rmdir(target)
            elif os.path.lexists(target):
                os.unlink(target)
            plant()
            # The first command warns and writes the file anew, so the
            # second reads it quietly; a directory stays, and is warned of
            # again.
            got = self.outputs(log)
            for (out, err), (want_out, want_err), warnings in zip(got, reference, [1, int(name == "a directory")]):
                self.assertEqual(out, want_out, name)
                extra = [l for l in err.splitlines() if l not in want_err.splitlines()]
                self.assertEqual(len(extra), warnings, (name, err))
                for line in extra:
                    self.assertTrue(line.startswith("heapsnap: warning: " + target + ": "), (name, extra))
            if name == "a directory":
                continue
            self.assert_private(target, 0o600)
        with open(planted, "rb") as f:
            self.assertEqual(f.read(), lying, "the symlink's target is never written")

    def test_cache_directory_open_to_others_is_not_used(self):
        log = self.record_copy()
        os.mkdir(self.cache, 0o755)
        os.chmod(self.cache, 0o755)
        reference = self.outputs(log, "0")
        got = self.outputs(log)
        for (out, err), (want_out, want_err) in zip(got, reference):
            self.assertEqual(out, want_out)
            self.assertEqual(err, want_err + "heapsnap: warning: %s: not a directory of yours with mode 0700; "
                             "the symbol cache is not used\n" % self.cache)
        self.assertEqual(os.listdir(self.cache), [])

    def test_place_and_turning_off(self):
        log = self.record_copy()
        home = self.path("xdg")
        self.heapsnap("diff", log + "@r1", log + "@exit", env={"HEAPSNAP_SYMBOL_CACHE": "", "XDG_CACHE_HOME": home})
        self.assert_private(os.path.join(home, "heapsnap", "symbols"), 0o700)
        self.assertTrue(os.listdir(os.path.join(home, "heapsnap", "symbols")))
        off = self.path("off")
        result = self.heapsnap("diff", log + "@r1", log + "@exit", env={"HEAPSNAP_SYMBOL_CACHE": "0",
                                                                       "XDG_CACHE_HOME": off})
        self.assertEqual(result.stderr, "")
        self.assertFalse(os.path.exists(off))
        result = self.heapsnap("diff", log + "@r1", log + "@exit", env={"HEAPSNAP_SYMBOL_CACHE": "relative",
                                                                       "XDG_CACHE_HOME": home})
        self.assertEqual(result.stderr, "heapsnap: warning: HEAPSNAP_SYMBOL_CACHE=relative: neither 0 nor an "
                                        "absolute directory; the default cache is used\n")


if __name__ == "__main__":
    main()
