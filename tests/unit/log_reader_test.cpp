// Reading .hslog files: record decoding with stream state, truncation,
// corruption, versions; and replay exactness on hand-made event orders.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "format/framed_file.h"
#include "format/log_decoder.h"
#include "format/log_reader.h"
#include "log_test_util.h"
#include "replay/marker_select.h"
#include "replay/replay.h"
#include "replay/sampling.h"
#include "util/error.h"

using namespace heapsnap;
using test::LogBuilder;
using test::TempFile;

namespace {

struct Collect : LogVisitor {
    std::vector<std::string> lines;
    void on_process(const ProcessInfo& p) override {
        lines.push_back("process " + std::to_string(p.pid) + " " + p.exe + " argv=" + std::to_string(p.argv.size()));
    }
    void on_stack(uint32_t id, std::span<const StackFrame> f) override {
        lines.push_back("stack " + std::to_string(id) + " n=" + std::to_string(f.size()));
    }
    void on_alloc(const AllocEvent& e) override {
        lines.push_back("alloc t=" + std::to_string(e.time_ns) + " thread=" + std::to_string(e.thread) +
                        " fn=" + hslog::alloc_fn_name(e.fn) + " info=" + std::to_string(e.info) +
                        " addr=" + std::to_string(e.address) + " size=" + std::to_string(e.size) +
                        " stack=" + std::to_string(e.stack));
    }
    void on_free(const FreeEvent& e) override {
        lines.push_back("free t=" + std::to_string(e.time_ns) + " thread=" + std::to_string(e.thread) +
                        " info=" + std::to_string(e.info) + " addr=" + std::to_string(e.address) +
                        (e.untracked ? " untracked" : ""));
    }
    void on_marker(const MarkerRecord& m) override {
        lines.push_back("marker " + std::to_string(m.index) + " " + m.label + " events=" + std::to_string(m.events));
    }
    void on_end(const EndRecord& e) override { lines.push_back("end events=" + std::to_string(e.events)); }
};

std::string expect_error(const std::string& path) {
    Collect c;
    try {
        read_log(path, c);
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

// Appends `records` to `b` as one record run, reads the log back, checks
// that it holds `events` events and returns the last `n` lines read.
std::vector<std::string> read_with(LogBuilder& b, const std::vector<uint8_t>& records, uint64_t events, size_t n) {
    b.raw_record(records);
    b.frame();
    TempFile f{b.write()};
    Collect c;
    ReadSummary s = read_log(f.path, c);
    CHECK(s.events == events);
    REQUIRE(c.lines.size() >= n);
    return std::vector<std::string>(c.lines.end() - static_cast<std::ptrdiff_t>(n), c.lines.end());
}

}  // namespace

TEST_CASE("log reader: records decode with time, address, allocation info and thread state across frames") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}, {0, 0x20}});
    b.alloc(1100000, 0x5000, 100, 1);
    b.thread(1);
    b.alloc(1150000, 0x4000, 8, 1);
    b.frame();
    b.free_(1200000, 0x5000);
    b.alloc(1250000, 0x7000000, 70000, 1);  // large: named by its address, no info
    b.free_(1260000, 0x4000);
    b.free_(1270000, 0x9000);                                // never allocated: an untracked free names its address
    b.alloc(1280000, 0x6000, 8, 1, hslog::AllocFn::Calloc);  // a new triple: calloc is part of it
    b.alloc(1290000, 0x4000, 8, 1);  // a known triple: an AllocInfo record, resolved by the reader
    b.free_(1295000, 0x7000000);     // a FreeAt
    b.marker(1300000, 1, "A");
    b.end(1400000);
    b.frame();
    TempFile f{b.write()};
    Collect c;
    ReadSummary s = read_log(f.path, c);
    CHECK(s.frames == 2);
    CHECK(s.events == 9);
    CHECK(s.complete);
    CHECK_FALSE(s.truncated);
    std::vector<std::string> expected = {
        "process 42 /bin/prog argv=2",
        "stack 1 n=2",
        "alloc t=1100000 thread=0 fn=malloc info=1 addr=0 size=100 stack=1",
        "alloc t=1150000 thread=1 fn=malloc info=2 addr=0 size=8 stack=1",
        "free t=1200000 thread=1 info=1 addr=0",
        "alloc t=1250000 thread=1 fn=malloc info=0 addr=117440512 size=70000 stack=1",
        "free t=1260000 thread=1 info=2 addr=0",
        "free t=1270000 thread=1 info=0 addr=36864 untracked",
        "alloc t=1280000 thread=1 fn=calloc info=3 addr=0 size=8 stack=1",
        "alloc t=1290000 thread=1 fn=malloc info=2 addr=0 size=8 stack=1",
        "free t=1295000 thread=1 info=0 addr=117440512",
        "marker 1 A events=9",
        "end events=9",
    };
    CHECK(c.lines == expected);
}

TEST_CASE("log format: exact bytes of the heap records") {
    uint8_t buf[64];
    codec::Writer w(buf, sizeof buf);
    hslog::put_alloc(w, hslog::AllocFn::Calloc, 100, 3);  // defines an info
    hslog::put_alloc_info(w, 300);
    hslog::put_free(w, 0x1234);
    hslog::put_alloc_at(w, hslog::AllocFn::Malloc, 0x10000, 65536, 1);
    hslog::put_free_at(w, -0x10);
    hslog::put_free_unknown(w, 1, 104);
    std::vector<uint8_t> got(buf, buf + w.size());
    std::vector<uint8_t> expected = {0x31, 0x64, 0x03,                                // Alloc calloc, size 100, stack 3
                                     0x81, 0x2c,                                      // short AllocInfo 300 (0x12c)
                                     0xd2, 0x34,                                      // short Free info 0x1234
                                     0x40, 0x80, 0x80, 0x08, 0x80, 0x80, 0x04, 0x01,  // AllocAt +0x10000, 65536
                                     0x15, 0x1f,                                      // FreeAt -16 (zigzag 31)
                                     0x14, 0x02, 0x68};                               // FreeUnknown +1, usable 104
    CHECK(got == expected);
}

TEST_CASE("log format: an info id takes the short form up to 16383, the long form above") {
    uint8_t buf[64];
    codec::Writer w(buf, sizeof buf);
    hslog::put_alloc_info(w, 1);
    hslog::put_free(w, 1);
    hslog::put_alloc_info(w, 16383);
    hslog::put_free(w, 16383);
    hslog::put_alloc_info(w, 16384);
    hslog::put_free(w, 16384);
    std::vector<uint8_t> got(buf, buf + w.size());
    std::vector<uint8_t> expected = {0x80, 0x01,               // short AllocInfo 1
                                     0xc0, 0x01,               // short Free 1
                                     0xbf, 0xff,               // short AllocInfo 16383: all 14 bits set
                                     0xff, 0xff,               // short Free 16383
                                     0x10, 0x80, 0x80, 0x01,   // AllocInfo 16384 (varint)
                                     0x11, 0x80, 0x80, 0x01};  // Free 16384
    CHECK(got == expected);
}

TEST_CASE("log format: a thread index takes one byte up to 31, the Thread record above") {
    uint8_t buf[32];
    codec::Writer w(buf, sizeof buf);
    hslog::put_thread(w, 0);
    hslog::put_thread(w, 1);
    hslog::put_thread(w, 31);
    hslog::put_thread(w, 32);
    hslog::put_thread(w, 300);
    std::vector<uint8_t> got(buf, buf + w.size());
    std::vector<uint8_t> expected = {0x50,               // ShortThread 0
                                     0x51,               // ShortThread 1
                                     0x6f,               // ShortThread 31
                                     0x05, 0x20,         // Thread 32
                                     0x05, 0xac, 0x02};  // Thread 300 (varint)
    CHECK(got == expected);
}

TEST_CASE("log reader: short and long thread switches set the same thread") {
    auto read = [](const std::vector<uint8_t>& records) {
        LogBuilder b;
        b.process();
        b.stack(1, {{0, 0x10}});
        b.alloc(1100000, 0x5000, 100, 1);  // info 1, on thread 0
        return read_with(b, records, 5, 4);
    };
    std::vector<std::string> got_short = read({
        0x5f, 0x80, 0x01,              // ShortThread 15, short AllocInfo 1
        0x6f, 0xc0, 0x01,              // ShortThread 31, short Free 1
        0x05, 0x20,                    // Thread 32: too large for a ShortThread
        0x80, 0x01, 0x50, 0xc0, 0x01,  // ShortThread 0
    });
    std::vector<std::string> got_long = read({
        0x05,
        0x0f,
        0x80,
        0x01,  // the same with Thread records only
        0x05,
        0x1f,
        0xc0,
        0x01,
        0x05,
        0x20,
        0x80,
        0x01,
        0x05,
        0x00,
        0xc0,
        0x01,
    });
    std::vector<std::string> expected = {
        "alloc t=1100000 thread=15 fn=malloc info=1 addr=0 size=100 stack=1",
        "free t=1100000 thread=31 info=1 addr=0",
        "alloc t=1100000 thread=32 fn=malloc info=1 addr=0 size=100 stack=1",
        "free t=1100000 thread=0 info=1 addr=0",
    };
    CHECK(got_short == expected);
    CHECK(got_long == expected);
}

TEST_CASE("log reader: short and long AllocInfo and Free records decode to the same events") {
    // 16384 triples (sizes 1 to 16384 from one stack) define infos 1 to
    // 16384; the last one is too large for a short record.
    auto defined = [] {
        LogBuilder b;
        b.process();
        b.stack(1, {{0, 0x10}});
        for (uint64_t size = 1; size <= 16384; ++size) b.alloc(1100000, 0x100000 + 16 * size, size, 1);
        return b;
    };
    LogBuilder long_form = defined();
    std::vector<std::string> got_long = read_with(long_form,
                                                  {
                                                      0x10, 0x05,              // AllocInfo 5
                                                      0x11, 0x05,              // Free 5
                                                      0x10, 0xff, 0x7f,        // AllocInfo 16383
                                                      0x11, 0xff, 0x7f,        // Free 16383
                                                      0x10, 0x80, 0x80, 0x01,  // AllocInfo 16384
                                                      0x11, 0x80, 0x80, 0x01,  // Free 16384
                                                  },
                                                  16384 + 6, 6);
    LogBuilder mixed = defined();
    std::vector<std::string> got_mixed = read_with(mixed,
                                                   {
                                                       0x80,
                                                       0x05,  // short AllocInfo 5
                                                       0x11,
                                                       0x05,  // Free 5, long
                                                       0x10,
                                                       0xff,
                                                       0x7f,  // AllocInfo 16383, long
                                                       0xff,
                                                       0xff,  // short Free 16383
                                                       0x10,
                                                       0x80,
                                                       0x80,
                                                       0x01,  // AllocInfo 16384: only the long form names it
                                                       0x11,
                                                       0x80,
                                                       0x80,
                                                       0x01,
                                                   },
                                                   16384 + 6, 6);
    std::vector<std::string> expected = {
        "alloc t=1100000 thread=0 fn=malloc info=5 addr=0 size=5 stack=1",
        "free t=1100000 thread=0 info=5 addr=0",
        "alloc t=1100000 thread=0 fn=malloc info=16383 addr=0 size=16383 stack=1",
        "free t=1100000 thread=0 info=16383 addr=0",
        "alloc t=1100000 thread=0 fn=malloc info=16384 addr=0 size=16384 stack=1",
        "free t=1100000 thread=0 info=16384 addr=0",
    };
    CHECK(got_long == expected);
    CHECK(got_mixed == expected);
}

TEST_CASE("log reader: frees that name no live block are corruption") {
    auto with = [](std::vector<uint8_t> records) {
        LogBuilder b;
        b.process();
        b.stack(1, {{0, 0x10}});
        b.alloc(1100000, 0x5000, 100, 1);  // info 1, one live block
        b.raw_record(records);
        b.frame();
        return b;
    };
    const std::string bad = ": corrupt log: truncated or malformed record in the frame at byte 16";
    for (std::vector<uint8_t> records : {
             std::vector<uint8_t>{0x11, 0x01, 0x11, 0x01},  // a second Free of info 1: none left
             std::vector<uint8_t>{0x11, 0x02},              // Free of info 2: never defined
             std::vector<uint8_t>{0x11, 0x00},              // info 0 is no info
             std::vector<uint8_t>{0x10, 0x02},              // AllocInfo of an undefined info
             std::vector<uint8_t>{0xc0, 0x00},              // short Free of info 0
             std::vector<uint8_t>{0x80, 0x00},              // short AllocInfo of info 0
             std::vector<uint8_t>{0xc0, 0x01, 0xc0, 0x01},  // short Frees: a second one of info 1
             std::vector<uint8_t>{0x80, 0x02},              // short AllocInfo of an undefined info
             std::vector<uint8_t>{0x81, 0x01},              // short AllocInfo 0x101: undefined
             std::vector<uint8_t>{0x80},                    // a short record without its second byte
             std::vector<uint8_t>{0x15, 0x20},              // FreeAt where no addressed block lives
         }) {
        TempFile f{with(records).write()};
        CHECK(expect_error(f.path) == f.path + bad);
    }
    TempFile ok{with({0x10, 0x01, 0x11, 0x01, 0x11, 0x01}).write()};  // two blocks of info 1, two frees
    CHECK(expect_error(ok.path) == "no error");
    TempFile ok_short{with({0x80, 0x01, 0xc0, 0x01, 0xc0, 0x01}).write()};  // the same, short
    CHECK(expect_error(ok_short.path) == "no error");
}

TEST_CASE("log reader: a file cut inside a frame reads up to the last complete frame") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.alloc(1100000, 0x5000, 100, 1);
    b.frame();
    size_t first = b.bytes().size();
    for (int i = 0; i < 50; ++i) b.alloc(1200000 + i, 0x6000 + 16 * i, 16, 1);
    b.frame();
    for (size_t cut : {first, first + 1, first + 7, b.bytes().size() - 1}) {
        std::vector<uint8_t> bytes(b.bytes().begin(), b.bytes().begin() + static_cast<long>(cut));
        TempFile f{b.write(bytes)};
        Collect c;
        ReadSummary s = read_log(f.path, c);
        CHECK(s.frames == 1);
        CHECK(s.events == 1);
        CHECK(s.truncated == (cut != first));
        CHECK_FALSE(s.complete);
        CHECK(s.bytes_read == first);
    }
}

namespace {

struct MarkerCounter : LogVisitor {
    int markers = 0;
    void on_marker(const MarkerRecord&) override { ++markers; }
};

}  // namespace

// Version 8's Marker and End say how many events the recorder could not
// record; versions 6 and 7 have no such field, and read as none.
TEST_CASE("log reader: unrecorded events in version 8, none before") {
    struct Unrecorded : LogVisitor {
        std::vector<uint64_t> markers;
        uint64_t end = UINT64_MAX;
        // A listing keeps markers without their regions: the count too.
        void on_marker(const MarkerRecord& m) override { markers.push_back(without_regions(m).unrecorded); }
        void on_end(const EndRecord& e) override { end = e.unrecorded; }
    };
    for (uint32_t version : {6u, 7u, 8u, 9u}) {
        CAPTURE(version);
        LogBuilder b;
        b.header(version);
        b.process();
        b.marker(1100000, 1, "A");
        b.unrecorded = 3;
        b.marker(1200000, 2, "B");
        b.unrecorded = 5;
        b.end(1300000);
        b.frame();
        TempFile f{b.write()};
        Unrecorded seen;
        ReadSummary summary = read_log(f.path, seen);
        CHECK(summary.version == version);
        CHECK(summary.complete);
        if (version >= 8) {
            CHECK(seen.markers == std::vector<uint64_t>{0, 3});
            CHECK(seen.end == 5);
        } else {
            CHECK(seen.markers == std::vector<uint64_t>{0, 0});
            CHECK(seen.end == 0);
        }
    }
}

TEST_CASE("log reader: bad input is refused with one clear message") {
    TempFile empty{LogBuilder().write(std::vector<uint8_t>{})};
    CHECK(expect_error(empty.path) == empty.path + ": not a heapsnap log (bad magic)");

    TempFile text{LogBuilder().write(
        std::vector<uint8_t>{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd', '!', '!', '!', '!', '!'})};
    CHECK(expect_error(text.path) == text.path + ": not a heapsnap log (bad magic)");

    // Version 5 had no one-byte thread switches: its reader would take
    // tags 0x50-0x6f for unknown ones. Version 4 had no presence byte
    // before a marker's mallinfo2 numbers; version 3 had no short records:
    // its tags 0x80-0xff are unknown, so a version-3 reader could not read
    // version 4's AllocInfo and Free records (formats/hslog.md, Version
    // policy). Version 2 named blocks by reused block ids.
    for (uint32_t version : {2u, 3u, 4u, 5u}) {
        LogBuilder older;
        older.header(version);
        older.process();
        older.frame();
        TempFile f{older.write()};
        CHECK(expect_error(f.path) == f.path + ": unsupported log format version " + std::to_string(version) +
                                          " (this heapsnap reads versions 6 to 10)");
    }

    LogBuilder newer;
    newer.header(11);
    newer.process();
    newer.frame();
    TempFile v11{newer.write()};
    CHECK(expect_error(v11.path) ==
          v11.path + ": unsupported log format version 11 (this heapsnap reads versions 6 to 10)");

    // Version 6 differs from 7 only by the allocator statistics it never
    // has: it is read as it is.
    LogBuilder v6;
    v6.header(6);
    v6.process();
    v6.marker(1100000, 1, "A");
    v6.frame();
    TempFile old6{v6.write()};
    MarkerCounter counted;
    read_log(old6.path, counted);
    CHECK(counted.markers == 1);

    LogBuilder header_only;
    TempFile h{header_only.write()};
    CHECK(expect_error(h.path) == h.path + ": truncated heapsnap log: no complete frame");

    LogBuilder half_header;
    std::vector<uint8_t> cut(half_header.bytes().begin(), half_header.bytes().begin() + 10);
    TempFile hh{half_header.write(cut)};
    CHECK(expect_error(hh.path) == hh.path + ": truncated heapsnap log: the header is incomplete");

    std::vector<uint8_t> garbage = LogBuilder().bytes();
    for (int i = 0; i < 64; ++i) garbage.push_back(static_cast<uint8_t>(i * 37));
    TempFile g{LogBuilder().write(garbage)};
    CHECK(expect_error(g.path).find("corrupt log: bad frame at byte 16") != std::string::npos);

    LogBuilder no_process;
    no_process.stack(1, {{0, 1}});
    no_process.frame();
    TempFile np{no_process.write()};
    CHECK(expect_error(np.path) == np.path + ": corrupt log: no process record first");

    LogBuilder bad_tag;
    bad_tag.process();
    bad_tag.raw_record({0x70});
    bad_tag.frame();
    TempFile bt{bad_tag.write()};
    CHECK(expect_error(bt.path) == bt.path + ": corrupt log: unknown record tag 112");

    LogBuilder cut_record;
    cut_record.process();
    cut_record.raw_record({0x30, 0x05});  // an Alloc (malloc) without its stack
    cut_record.frame();
    TempFile cr{cut_record.write()};
    CHECK(expect_error(cr.path) == cr.path + ": corrupt log: truncated or malformed record in the frame at byte 16");

    CHECK(expect_error("/nonexistent/x.hslog") == "/nonexistent/x.hslog: No such file or directory");
}

TEST_CASE("replay: an address freed on one thread and reused by another replays exactly") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.stack(2, {{0, 0x20}});
    b.thread(0);
    b.alloc(1100000, 0x5000, 100, 1);
    b.free_(1200000, 0x5000);
    b.thread(1);
    b.alloc(1201000, 0x5000, 40, 2);
    b.thread(0);
    b.alloc(1300000, 0x6000, 7, 1);
    b.free_(1400000, 0x7777);  // never allocated: counted, ignored
    b.marker(1500000, 1, "A");
    b.frame();
    TempFile f{b.write()};
    Moment m = parse_moment("A");
    Snapshot s = snapshot_at(f.path, m);
    CHECK(s.totals.live_bytes == 47);
    CHECK(s.totals.live_blocks == 2);
    CHECK(s.totals.untracked_frees == 1);
    REQUIRE(s.entries.size() == 2);
    CHECK(s.entries[0].stack == 1);
    CHECK(s.entries[0].bytes == 7);
    CHECK(s.entries[1].stack == 2);
    CHECK(s.entries[1].bytes == 40);
    CHECK(s.totals.peak_bytes == 100);
}

// Version 9: an attached recorder says so, and an unknown block's free
// carries its usable size; replay counts those frees apart, with their
// bytes. Version 8's FreeUnknown has no size: an untracked free.
TEST_CASE("replay: frees of blocks allocated before recording, version 10 and 8") {
    for (uint32_t version : {8u, 10u}) {
        CAPTURE(version);
        LogBuilder b;
        b.header(version);
        b.process(0, true);
        b.stack(1, {{0, 0x10}});
        b.alloc(1100000, 0x5000, 100, 1);
        b.marker(1200000, 1, "A");
        for (uint64_t i = 0; i < 7; ++i) b.free_(1300000 + i * 1000, 0x9000 + i * 0x70, 104);
        b.free_(1400000, 0x5000);
        b.marker(1500000, 2, "B");
        b.frame();
        TempFile f{b.write()};
        Snapshot a = snapshot_at(f.path, parse_moment("A"));
        Snapshot s = snapshot_at(f.path, parse_moment("B"));
        CHECK(s.process.attached == (version >= 10));
        CHECK(a.totals.freed_before_blocks == 0);
        CHECK(s.totals.live_blocks == 0);
        if (version >= 10) {
            CHECK(s.totals.freed_before_blocks == 7);
            CHECK(s.totals.freed_before_bytes == 728);
            CHECK(s.totals.untracked_frees == 0);
        } else {
            CHECK(s.totals.freed_before_blocks == 0);
            CHECK(s.totals.freed_before_bytes == 0);
            CHECK(s.totals.untracked_frees == 7);
        }
    }
}

TEST_CASE("replay: a free takes the newest live block of its info; totals stay exact") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.alloc(1000000 + 1000000000ull, 0x5000, 100, 1);  // at 1 s: info 1
    b.alloc(1000000 + 2000000000ull, 0x6000, 100, 1);  // at 2 s: info 1 again
    b.alloc(1000000 + 3000000000ull, 0x7000, 100, 1);  // at 3 s
    b.free_(1000000 + 4000000000ull, 0x5000);          // FIFO in the program: the log says "a block of info 1"
    b.marker(1000000 + 5000000000ull, 1, "A");
    b.frame();
    TempFile f{b.write()};
    Snapshot s = snapshot_at(f.path, parse_moment("A"));
    CHECK(s.totals.live_bytes == 200);
    CHECK(s.totals.live_blocks == 2);
    CHECK(s.totals.untracked_frees == 0);
    REQUIRE(s.entries.size() == 1);
    CHECK(s.entries[0].bytes == 200);
    CHECK(s.entries[0].blocks == 2);
    // The block of 3 s is taken as the freed one (LIFO), so the live ones
    // are those of 1 s and 2 s, although the program kept 2 s and 3 s.
    CHECK(s.entries[0].oldest_ns == 1000000000ull);
    CHECK(s.entries[0].newest_ns == 2000000000ull);
}

// Stops at the first marker, as a snapshot at a marker does.
class UpToMarker final : public Replay {
public:
    void on_marker(const MarkerRecord&) override { request_stop(); }
};
class WholeLog final : public Replay {};

TEST_CASE("replay: a read resumed where an earlier one stopped ends where a read from the start does") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.stack(2, {{0, 0x20}});
    b.thread(0);
    b.alloc(1100000, 0x5000, 100, 1);
    b.alloc(1200000, 0x5100, 100, 1);     // info 1 again
    b.alloc(1300000, 0x6000, 300000, 2);  // named by its address
    b.thread(1);
    b.alloc(1400000, 0x7000, 40, 2);  // info 2
    b.marker(1500000, 1, "A");
    b.frame();                 // the marker ends its frame: a stop there can be resumed
    b.free_(1600000, 0x5100);  // frees of an info and an address known before the stop
    b.free_(1700000, 0x6000);
    b.alloc(1800000, 0x8000, 100, 1);
    b.alloc(1900000, 0x9000, 300000, 2);
    b.free_(2000000, 0x7000);
    b.frame();
    TempFile f{b.write()};

    UpToMarker first;
    ReadSummary stop = read_log_as(f.path, first);
    REQUIRE(stop.stopped);
    REQUIRE(stop.resumable);
    CHECK(stop.events == 4);
    CHECK(stop.resume.thread == 1);
    ByteBuffer state;
    first.save_state(state);
    WholeLog resumed;
    codec::Reader r(state.bytes().data(), state.bytes().size());
    resumed.load_state(r);
    REQUIRE(r.ok());
    ReadSummary rest = read_log_as(f.path, resumed, &stop.resume);
    CHECK(rest.events == 5);
    CHECK_FALSE(rest.stopped);

    WholeLog whole;
    ReadSummary all = read_log(f.path, whole);  // through the vtable
    CHECK(all.events == 9);
    for (const Replay* replay : {static_cast<const Replay*>(&resumed), static_cast<const Replay*>(&whole)}) {
        const SnapshotTotals& t = replay->totals();
        CHECK(t.live_bytes == 300200);
        CHECK(t.live_blocks == 3);
        CHECK(t.events == 9);
        CHECK(t.allocations == 6);
        CHECK(t.untracked_frees == 0);
        CHECK(t.peak_bytes == 300240);
        Snapshot s = replay->snapshot(MarkerRecord{}, false);
        REQUIRE(s.entries.size() == 2);
        CHECK(s.entries[0].stack == 1);
        CHECK(s.entries[0].bytes == 200);
        CHECK(s.entries[0].blocks == 2);
        CHECK(s.entries[1].stack == 2);
        CHECK(s.entries[1].bytes == 300000);
        CHECK(s.entries[1].newest_ns == 900000);
    }
}

TEST_CASE("replay: partial munmap splits a mapping") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.mmap(1100000, 0x10000, 0x4000, 1);
    b.munmap(1200000, 0x11000, 0x1000);
    b.marker(1300000, 1, "A");
    b.munmap(1400000, 0x10000, 0x4000);
    b.marker(1500000, 2, "B");
    b.frame();
    TempFile f{b.write()};
    Snapshot a = snapshot_at(f.path, parse_moment("A"));
    CHECK(a.totals.mmap_bytes == 0x3000);
    CHECK(a.totals.mmap_regions == 2);
    REQUIRE(a.entries.size() == 1);
    CHECK(a.entries[0].kind == EntryKind::Mmap);
    CHECK(a.entries[0].blocks == 2);
    Snapshot bsnap = snapshot_at(f.path, parse_moment("2"));
    CHECK(bsnap.totals.mmap_bytes == 0);
    CHECK(bsnap.entries.empty());
}

namespace {

struct MarkerMalloc : LogVisitor {
    std::vector<MarkerRecord> markers;
    void on_marker(const MarkerRecord& m) override { markers.push_back(m); }
};

}  // namespace

TEST_CASE("log reader: a marker's mallinfo2 numbers are there only if its presence byte says so") {
    LogBuilder b;
    b.process();
    b.marker(1100000, 1, "A");
    b.marker(1200000, 2, "exit", hslog::MarkerCause::Exit);
    b.frame();
    TempFile f{b.write()};
    MarkerMalloc seen;
    read_log(f.path, seen);
    REQUIRE(seen.markers.size() == 2);
    CHECK(seen.markers[0].has_malloc);
    CHECK(seen.markers[0].malloc.arena == 3);
    CHECK(seen.markers[0].malloc.keepcost == 9);
    CHECK(seen.markers[0].regions.empty());
    CHECK_FALSE(seen.markers[1].has_malloc);
    CHECK(seen.markers[1].malloc.arena == 0);
    CHECK(seen.markers[1].label == "exit");
    CHECK(snapshot_at(f.path, parse_moment("A")).marker.has_malloc);
    CHECK_FALSE(snapshot_at(f.path, parse_moment("exit")).marker.has_malloc);

    LogBuilder bad;
    bad.process();
    bad.marker(1100000, 1, "A", hslog::MarkerCause::User, 3);
    bad.frame();
    TempFile g{bad.write()};
    CHECK(expect_error(g.path) == g.path + ": corrupt log: truncated or malformed record in the frame at byte 16");
}

TEST_CASE("log reader: another allocator's statistics, field by field") {
    hslog::AllocatorStats jemalloc;
    jemalloc.kind = hslog::AllocatorKind::Jemalloc;
    jemalloc.present = hslog::AllocatorStats::kAllocated | hslog::AllocatorStats::kResident;
    jemalloc.allocated = 1000;
    jemalloc.resident = 40960;
    jemalloc.active = 77;  // not present: neither written nor read
    LogBuilder b;
    b.process();
    b.marker_with(1100000, 1, "A", jemalloc);
    b.frame();
    TempFile f{b.write()};
    MarkerMalloc seen;
    read_log(f.path, seen);
    REQUIRE(seen.markers.size() == 1);
    const MarkerRecord& m = seen.markers[0];
    CHECK_FALSE(m.has_malloc);
    REQUIRE(m.has_allocator);
    CHECK(m.allocator.kind == hslog::AllocatorKind::Jemalloc);
    CHECK(m.allocator.present == (hslog::AllocatorStats::kAllocated | hslog::AllocatorStats::kResident));
    CHECK(m.allocator.allocated == 1000);
    CHECK(m.allocator.resident == 40960);
    CHECK(m.allocator.active == 0);
    Snapshot snap = snapshot_at(f.path, parse_moment("A"));
    CHECK(snap.marker.has_allocator);
    CHECK(snap.marker.allocator.resident == 40960);

    for (auto [kind, present] : {std::pair<uint8_t, uint8_t>{0, 1}, {5, 1}, {2, 32}}) {
        hslog::AllocatorStats wrong;
        wrong.kind = static_cast<hslog::AllocatorKind>(kind);
        wrong.present = present;
        LogBuilder w;
        w.process();
        w.marker_with(1100000, 1, "A", wrong);
        w.frame();
        TempFile g{w.write()};
        CHECK(expect_error(g.path) == g.path + ": corrupt log: truncated or malformed record in the frame at byte 16");
    }
}

TEST_CASE("moments: peak, time offsets, missing markers") {
    LogBuilder b;
    b.process();
    b.stack(1, {{0, 0x10}});
    b.alloc(1000000 + 1000000000ull, 0x5000, 100, 1);  // at 1.0 s
    b.alloc(1000000 + 2000000000ull, 0x6000, 50, 1);   // at 2.0 s
    b.free_(1000000 + 3000000000ull, 0x5000);          // at 3.0 s
    b.marker(1000000 + 4000000000ull, 1, "exit", hslog::MarkerCause::Exit);
    b.frame();
    TempFile f{b.write()};
    CHECK(snapshot_at(f.path, parse_moment("peak")).totals.live_bytes == 150);
    CHECK(snapshot_at(f.path, parse_moment("1.5s")).totals.live_bytes == 100);
    CHECK(snapshot_at(f.path, parse_moment("2.5s")).totals.live_bytes == 150);
    CHECK(snapshot_at(f.path, parse_moment("exit")).totals.live_bytes == 50);
    CHECK(snapshot_at(f.path, parse_moment("end")).totals.live_bytes == 50);
    try {
        snapshot_at(f.path, parse_moment("warm"));
        FAIL("expected an error");
    } catch (const Error& e) {
        CHECK(std::string(e.what()) == f.path + ": no marker \"warm\"; markers: 1 \"exit\"");
    }
    CHECK_THROWS_AS(parse_moment("0"), Error);
}

TEST_CASE("sampling: weights average 1/p, large blocks count once") {
    // p(64) at N = 4096 is 1 - exp(-1/64): 1/p = 64.5026...
    double inverse = 1.0 / -std::expm1(-64.0 / 4096.0);
    double sum = 0;
    for (uint64_t salt = 1; salt <= 200000; ++salt) {
        uint64_t w = sample_weight(64, 4096, salt * 0x9E3779B97F4A7C15ULL);
        CHECK((w == 64 || w == 65));
        sum += static_cast<double>(w);
    }
    CHECK(std::abs(sum / 200000 - inverse) < 0.01);
    CHECK(sample_weight(4096, 4096, 7) == 1);
    CHECK(sample_weight(1 << 20, 4096, 7) == 1);
    CHECK(sample_weight(64, 0, 7) == 1);
}

TEST_CASE("sampling: a sampled log replays to scaled, whole-block estimates") {
    LogBuilder b;
    b.process(4096);
    b.stack(1, {{0, 0x10}});
    b.stack(2, {{0, 0x20}});
    b.alloc(1000000 + 1000, 0x5000, 64, 1);
    b.alloc(1000000 + 2000, 0x9000, 8192, 2);  // >= N: exact
    b.marker(1000000 + 3000, 1, "m", hslog::MarkerCause::User);
    b.free_(1000000 + 4000, 0x5000);
    b.marker(1000000 + 5000, 2, "exit", hslog::MarkerCause::Exit);
    b.frame();
    TempFile f{b.write()};
    uint64_t w = sample_weight(64, 4096, 1);  // salted by its event index, 1
    Snapshot m = snapshot_at(f.path, parse_moment("m"));
    CHECK(m.process.sample_bytes == 4096);
    CHECK(m.totals.live_bytes == 64 * w + 8192);
    CHECK(m.totals.live_blocks == w + 1);
    REQUIRE(m.entries.size() == 2);
    for (const SnapshotEntry& e : m.entries) {
        if (e.stack == 1) CHECK((e.bytes == 64 * w && e.blocks == w));
        if (e.stack == 2) CHECK((e.bytes == 8192 && e.blocks == 1));
    }
    Snapshot exit = snapshot_at(f.path, parse_moment("exit"));
    CHECK(exit.totals.live_bytes == 8192);
    CHECK(exit.totals.live_blocks == 1);
    CHECK(exit.totals.peak_bytes == 64 * w + 8192);
}
