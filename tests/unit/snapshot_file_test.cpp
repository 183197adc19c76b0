// .hsnap round trip and refusal of damaged files.
#include <doctest/doctest.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "format/snapshot_file.h"
#include "log_test_util.h"
#include "util/error.h"
#include "util/files.h"
#include "util/read_budget.h"

using namespace heapsnap;

namespace {

Snapshot sample() {
    Snapshot s;
    s.process.pid = 77;
    s.process.exe = "/usr/bin/app";
    s.process.argv = {"app", "--x"};
    s.process.start_ns = 500;
    s.marker.time_ns = 2500000500;
    s.marker.index = 3;
    s.marker.label = "after warm-up";
    s.marker.has_malloc = true;
    s.marker.malloc.uordblks = 1234;
    MapRegion r;
    r.start = 0x1000;
    r.end = 0x3000;
    r.perms = 3;
    r.path = "[heap]";
    r.rss_kb = 8;
    s.marker.regions.push_back(r);
    s.has_marker_data = true;
    s.totals.live_bytes = 4800;
    s.totals.live_blocks = 100;
    s.modules.push_back(
        SnapshotModule{ModuleRecord{1, 0, 0x400000, 0x400000, 0x500000, "/usr/bin/app", "\x01\x02"}, true});
    s.stacks[9] = {StackFrame{1, 0x1234}, StackFrame{1, 0x5678}};
    s.entries.push_back(SnapshotEntry{9, EntryKind::Heap, 4800, 100, 10, 20});
    return s;
}

std::string error_of(const std::string& path) {
    try {
        read_snapshot(path);
    } catch (const Error& e) {
        return e.what();
    }
    return "no error";
}

}  // namespace

TEST_CASE("snapshot: another allocator's statistics are kept") {
    test::TempFile f{"/tmp/heapsnap-snapshot-allocator.hsnap"};
    Snapshot in = sample();
    in.marker.has_malloc = false;
    in.marker.has_allocator = true;
    in.marker.allocator.kind = hslog::AllocatorKind::Tcmalloc;
    in.marker.allocator.present = hslog::AllocatorStats::kAllocated | hslog::AllocatorStats::kMapped;
    in.marker.allocator.allocated = 4242;
    in.marker.allocator.mapped = 1u << 20;
    write_snapshot(f.path, in);
    Snapshot s = read_snapshot(f.path);
    CHECK_FALSE(s.marker.has_malloc);
    REQUIRE(s.marker.has_allocator);
    CHECK(s.marker.allocator.kind == hslog::AllocatorKind::Tcmalloc);
    CHECK(s.marker.allocator.present == (hslog::AllocatorStats::kAllocated | hslog::AllocatorStats::kMapped));
    CHECK(s.marker.allocator.allocated == 4242);
    CHECK(s.marker.allocator.mapped == 1u << 20);
    CHECK(s.marker.label == "after warm-up");
}

TEST_CASE("snapshot: an attached recording's frees from before it are kept") {
    test::TempFile f{"/tmp/heapsnap-snapshot-attached.hsnap"};
    Snapshot in = sample();
    in.process.attached = true;
    in.totals.untracked_frees = 2;
    in.totals.freed_before_blocks = 7;
    in.totals.freed_before_bytes = 728;
    write_snapshot(f.path, in);
    Snapshot s = read_snapshot(f.path);
    CHECK(s.process.attached);
    CHECK(s.totals.untracked_frees == 2);
    CHECK(s.totals.freed_before_blocks == 7);
    CHECK(s.totals.freed_before_bytes == 728);
    CHECK(s.entries.size() == 1);
}

// Version 4 is version 5 without the Process record's `attached` byte and
// the two totals after peak_time_ns: made here from a version-5 body.
TEST_CASE("snapshot: version 4 is still read") {
    test::TempFile f{"/tmp/heapsnap-snapshot-v4.hsnap"};
    Snapshot in = sample();
    in.totals.peak_time_ns = 300;
    ByteBuffer process;
    put_process(process, in.process);
    write_snapshot(f.path, in);
    MemoryCharge held;
    std::vector<uint8_t> body = read_framed_file(f.path, FileKind{"HSNAPSHT", kSnapshotVersion, "snapshot"}, held);
    // The body starts with the Process section; its last byte is `attached`.
    size_t attached_at = process.bytes().size() - 1;
    REQUIRE(body[attached_at] == 0);
    body.erase(body.begin() + static_cast<long>(attached_at));
    // Totals follow the marker and the source: find peak_time_ns 300
    // (varint ac 02) followed by the two zero totals and the module count.
    std::vector<uint8_t> tail = {0xac, 0x02, 0x00, 0x00, 0x01};
    auto at = std::search(body.begin(), body.end(), tail.begin(), tail.end());
    REQUIRE(at != body.end());
    body.erase(at + 2, at + 4);
    write_framed_file(f.path, FileKind{"HSNAPSHT", 4, "snapshot"}, body);
    Snapshot s = read_snapshot(f.path);
    CHECK_FALSE(s.process.attached);
    CHECK(s.totals.freed_before_blocks == 0);
    CHECK(s.totals.peak_time_ns == 300);
    CHECK(s.process.argv == std::vector<std::string>{"app", "--x"});
    REQUIRE(s.entries.size() == 1);
    CHECK(s.entries[0].bytes == 4800);
}

TEST_CASE("snapshot: write then read gives the same content") {
    test::TempFile f{"/tmp/heapsnap-snapshot-test.hsnap"};
    write_snapshot(f.path, sample());
    Snapshot s = read_snapshot(f.path);
    CHECK(s.process.pid == 77);
    CHECK(s.process.argv == std::vector<std::string>{"app", "--x"});
    CHECK(s.marker.label == "after warm-up");
    CHECK(s.time_s() == doctest::Approx(2.5));
    CHECK(s.marker.malloc.uordblks == 1234);
    REQUIRE(s.marker.regions.size() == 1);
    CHECK(s.marker.regions[0].path == "[heap]");
    CHECK(s.marker.regions[0].end == 0x3000);
    CHECK(s.modules[0].record.build_id == "\x01\x02");
    CHECK(s.stacks.at(9)[1].vaddr == 0x5678);
    REQUIRE(s.entries.size() == 1);
    CHECK(s.entries[0].bytes == 4800);
    CHECK(s.entries[0].blocks == 100);
    CHECK(looks_like_snapshot(f.path));
}

TEST_CASE("snapshot: damaged files give one clear error") {
    test::TempFile f{"/tmp/heapsnap-snapshot-bad.hsnap"};
    write_snapshot(f.path, sample());
    std::vector<uint8_t> good = read_file(f.path);

    auto put = [&](const std::vector<uint8_t>& bytes) {
        std::ofstream out(f.path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<long>(bytes.size()));
    };
    put({});
    CHECK(error_of(f.path) == f.path + ": not a heapsnap snapshot (bad magic)");
    put(std::vector<uint8_t>(good.begin(), good.begin() + 12));
    CHECK(error_of(f.path) == f.path + ": truncated snapshot: the header is incomplete");
    put(std::vector<uint8_t>(good.begin(), good.end() - 5));
    CHECK(error_of(f.path) == f.path + ": truncated snapshot");
    std::vector<uint8_t> v9 = good;
    v9[8] = 9;
    put(v9);
    CHECK(error_of(f.path) == f.path + ": unsupported snapshot format version 9 (this heapsnap reads versions 3 to 6)");
    std::vector<uint8_t> flipped = good;
    flipped[flipped.size() / 2] ^= 0xff;
    put(flipped);
    CHECK(error_of(f.path).find(f.path + ": corrupt snapshot") == 0);
    CHECK(error_of("/nonexistent.hsnap") == "/nonexistent.hsnap: No such file or directory");
}
