// The report: history replay (sizes, temporaries, peak, timeline), the
// grouping and orders of the report, and its JSON, CSV, folded and text.
// Modules have no file on disk ("[jit]", "libc.so.6"), so frames stay
// module+offset and nothing depends on the symbolizer; "libc.so.6" frames
// count as allocation frames (by module name), as libc's malloc would.
#include <doctest/doctest.h>

#include <map>
#include <tuple>

#include "log_test_util.h"
#include "replay/marker_select.h"
#include "replay/replay.h"
#include "report/report.h"
#include "util/error.h"

using namespace heapsnap;
using heapsnap::test::LogBuilder;
using heapsnap::test::TempFile;

namespace {

constexpr uint64_t kStart = 1000;  // process start, ns
constexpr uint64_t us(uint64_t n) { return kStart + n * 1000; }
// LogBuilder's process starts at 1 ms; the log counts time in microseconds.
constexpr uint64_t log_us(uint64_t n) { return 1000000 + n * 1000; }

// The events below name blocks by address, as the recorder's hooks see
// them; these name them the way the log reader would (AllocInfos): a small
// block by the info of its (fn, size, stack), a large one by its address.
struct Blocks {
    std::map<uint64_t, uint32_t> live;  // address -> info id, 0 for an addressed block
    std::map<std::tuple<hslog::AllocFn, uint64_t, uint32_t>, uint32_t> infos;
} g_blocks;

AllocEvent alloc(uint64_t t, uint32_t thread, uint64_t addr, uint64_t size, uint32_t stack,
                 hslog::AllocFn fn = hslog::AllocFn::Malloc) {
    AllocEvent e;
    e.time_ns = t;
    e.thread = thread;
    e.fn = fn;
    if (size >= hslog::kAddressedAllocSize) {
        e.address = addr;
    } else {
        auto [it, fresh] = g_blocks.infos.try_emplace({fn, size, stack}, 0);
        if (fresh) it->second = static_cast<uint32_t>(g_blocks.infos.size());
        e.info = it->second;
    }
    g_blocks.live[addr] = e.info;
    e.size = size;
    e.stack = stack;
    return e;
}

FreeEvent free_of(uint64_t t, uint32_t thread, uint64_t addr) {
    FreeEvent e;
    e.time_ns = t;
    e.thread = thread;
    if (auto it = g_blocks.live.find(addr); it != g_blocks.live.end()) {
        e.info = it->second;
        if (!e.info) e.address = addr;
        g_blocks.live.erase(it);
    } else {
        e.address = addr;
        e.untracked = true;
    }
    return e;
}

// Ten events over three stacks and two threads (see the comments):
// temporaries A (freed at once) and E (freed by its thread after another
// thread allocated); C is resized by realloc, not temporary; B is freed
// after other allocations, not temporary.
void feed(HistoryReplay& r) {
    g_blocks = Blocks{};
    ProcessInfo p;
    p.pid = 7;
    p.exe = "/bin/prog";
    p.start_ns = kStart;
    r.on_process(p);
    r.on_module_load(ModuleRecord{1, 0, 0, 0, 0, "[jit]", ""});
    StackFrame f1{1, 0x10}, f2{1, 0x20}, f3{1, 0x30};
    r.on_stack(1, std::span<const StackFrame>(&f1, 1));
    r.on_stack(2, std::span<const StackFrame>(&f2, 1));
    r.on_stack(3, std::span<const StackFrame>(&f3, 1));
    r.on_alloc(alloc(us(1), 0, 0xa000, 100, 1));                          // 1 A
    r.on_free(free_of(us(2), 0, 0xa000));                                 // 2 A freed: temporary
    r.on_alloc(alloc(us(3), 0, 0xb000, 200000, 2));                       // 3 B, large
    r.on_alloc(alloc(us(4), 0, 0xc000, 10, 3));                           // 4 C
    r.on_free(free_of(us(5), 0, 0xc000));                                 // 5 realloc(C): its Free ...
    r.on_alloc(alloc(us(6), 0, 0xc000, 20, 3, hslog::AllocFn::Realloc));  // 6 ... and Alloc: D
    r.on_alloc(alloc(us(7), 1, 0xe000, 64, 1));                           // 7 E on thread 1: the peak, 200084 bytes
    r.on_alloc(alloc(us(8), 0, 0xf000, 0, 1));                            // 8 F, empty
    r.on_free(free_of(us(9), 1, 0xe000));                                 // 9 E freed: temporary
    r.on_free(free_of(us(10), 0, 0xb000));                                // 10 B freed, not temporary
}

}  // namespace

TEST_CASE("history: temporaries, peak per stack, sizes, stop after N events") {
    HistoryReplay r(9);
    feed(r);
    r.finish();
    CHECK(r.totals().events == 9);  // the 10th was not applied
    CHECK(r.heap_allocations() == 6);
    CHECK(r.temporary() == 2);
    REQUIRE(r.activity().size() >= 4);
    CHECK(r.activity()[1].allocations == 3);
    CHECK(r.activity()[1].temporary == 2);
    CHECK(r.activity()[2].allocations == 1);
    CHECK(r.activity()[2].temporary == 0);
    CHECK(r.activity()[3].allocations == 2);
    CHECK(r.activity()[3].temporary == 0);

    SizeHistogram h = r.live_sizes();  // B 200000, D 20, F 0
    CHECK(h.blocks[0] == 1);
    CHECK(h.bytes[0] == 0);
    CHECK(h.blocks[5] == 1);  // [16, 32)
    CHECK(h.bytes[5] == 20);
    CHECK(h.blocks[18] == 1);  // [128 KiB, 256 KiB): large
    CHECK(h.bytes[18] == 200000);
    uint64_t blocks = 0;
    for (uint64_t b : h.blocks) blocks += b;
    CHECK(blocks == 3);

    Snapshot peak = r.peak();
    CHECK(peak.totals.live_bytes == 200084);
    CHECK(peak.totals.live_blocks == 3);
    CHECK(peak.marker.time_ns == us(7));
    REQUIRE(peak.entries.size() == 3);
    CHECK(peak.entries[0].stack == 1);
    CHECK(peak.entries[0].bytes == 64);
    CHECK(peak.entries[1].stack == 2);
    CHECK(peak.entries[1].bytes == 200000);
    CHECK(peak.entries[2].stack == 3);
    CHECK(peak.entries[2].bytes == 20);
    CHECK(peak.stacks.size() == 3);

    // Timeline: allocations at 1, 3, 4, 6, 7, 8 us, in 1 us slices.
    CHECK(r.timeline().slice_ns == 1000);
    CHECK(r.timeline().counts == std::vector<uint64_t>{0, 1, 0, 1, 1, 0, 1, 1, 1});
}

TEST_CASE("history: every event, B freed") {
    HistoryReplay r(10);
    feed(r);
    r.finish();
    CHECK(r.totals().live_bytes == 20);
    CHECK(r.live_sizes().blocks[18] == 0);
    CHECK(r.temporary() == 2);
    CHECK(r.peak().totals.live_bytes == 200084);  // later frees do not move the peak
}

TEST_CASE("history: the timeline keeps 1024 slices, doubling their width") {
    AllocationTimeline t;
    t.add(0);
    t.add(1023999);  // slice 1023 of 1 us
    CHECK(t.counts.size() == 1024);
    t.add(1024000);  // past the last: slices become 2 us
    CHECK(t.slice_ns == 2000);
    CHECK(t.counts.size() == 513);
    CHECK(t.counts[0] == 1);
    CHECK(t.counts[511] == 1);
    CHECK(t.counts[512] == 1);
    t.add(10000000);  // 10 ms: 2 us -> 4 -> 8 -> 16 us
    CHECK(t.slice_ns == 16000);
    CHECK(t.counts.size() == 626);
    CHECK(t.counts[0] == 1);
    CHECK(t.counts[63] == 1);
    CHECK(t.counts[64] == 1);
    CHECK(t.counts[625] == 1);
}

TEST_CASE("rate buckets: whole slices, at most N buckets up to the moment") {
    AllocationTimeline t;
    t.counts = {0, 1, 0, 1, 1, 0, 1, 1, 1};
    std::vector<RateBucket> b = rate_buckets(t, 10000, 5);  // 11 slices, 3 per bucket
    REQUIRE(b.size() == 4);
    CHECK(b[0].allocations == 1);
    CHECK(b[1].allocations == 2);
    CHECK(b[2].allocations == 3);
    CHECK(b[3].allocations == 0);
    CHECK(b[0].start_s == 0.0);
    CHECK(b[0].end_s == doctest::Approx(3e-6));
    CHECK(b[3].end_s == doctest::Approx(11e-6));
    CHECK(b[2].per_second == doctest::Approx(1e6));
}

TEST_CASE("size classes are named by their bounds") {
    CHECK(size_class_label(0) == "0 B");
    CHECK(size_class_label(1) == "[1 B, 2 B)");
    CHECK(size_class_label(10) == "[512 B, 1 KiB)");
    CHECK(size_class_label(18) == "[128 KiB, 256 KiB)");
    CHECK(size_class_label(64) == "[8 EiB, 16 EiB)");
    CHECK(SizeHistogram::class_of(131071) == 17);
    CHECK(SizeHistogram::class_of(kLargeBlockBytes) == 18);
    CHECK(SizeHistogram::class_min(18) == kLargeBlockBytes);
}

namespace {

// A snapshot with an app module "[jit]" and an allocator "libc.so.6".
Snapshot report_snapshot() {
    Snapshot s;
    s.process.pid = 9;
    s.process.exe = "/bin/prog";
    s.process.start_ns = kStart;
    s.marker.time_ns = kStart + 5000000000ull;  // at 5 s
    s.marker.index = 2;
    s.marker.label = "B";
    s.modules.push_back(SnapshotModule{ModuleRecord{1, 0, 0, 0, 0, "[jit]", ""}, true});
    s.modules.push_back(SnapshotModule{ModuleRecord{2, 0, 0, 0, 0, "libc.so.6", ""}, true});
    auto add = [&](uint32_t stack, std::vector<StackFrame> frames, EntryKind kind, uint64_t bytes, uint64_t blocks,
                   uint64_t oldest_s, uint64_t newest_s) {
        s.stacks[stack] = frames;
        s.entries.push_back(
            SnapshotEntry{stack, kind, bytes, blocks, oldest_s * 1000000000ull, newest_s * 1000000000ull});
        if (kind == EntryKind::Heap) {
            s.totals.live_bytes += bytes;
            s.totals.live_blocks += blocks;
        } else {
            s.totals.mmap_bytes += bytes;
            s.totals.mmap_regions += blocks;
        }
    };
    add(1, {{2, 0x100}, {1, 0x10}, {1, 0x20}}, EntryKind::Heap, 3000, 3, 1, 4);   // via libc, in app+0x10
    add(2, {{2, 0x100}, {1, 0x10}, {1, 0x30}}, EntryKind::Heap, 1000, 10, 2, 3);  // same function, other caller
    add(3, {{1, 0x40}}, EntryKind::Heap, 5000, 1, 3, 3);
    add(4, {{1, 0x50}}, EntryKind::Mmap, 8192, 2, 1, 2);
    add(5, {{1, 0x60}}, EntryKind::Heap, 1000, 10, 4, 4);  // ties site 2 on bytes and blocks
    s.totals.allocations = 40;
    s.totals.peak_bytes = 12000;
    s.totals.peak_time_ns = kStart + 4000000000ull;
    s.source = "prog.hslog";
    return s;
}

std::string label(const SymbolFrame& f) { return frame_label(f); }

}  // namespace

TEST_CASE("report of a snapshot: orders, allocating functions and modules, ages") {
    Snapshot s = report_snapshot();
    Symbolizer sym;
    Report r = build_report(s, nullptr, ReportOptions{}, sym);
    REQUIRE(r.sites.size() == 5);
    CHECK(r.sites[0].kind == EntryKind::Mmap);
    CHECK(r.sites[0].bytes == 8192);
    CHECK(r.sites[1].bytes == 5000);
    CHECK(r.sites[2].bytes == 3000);
    // Sites 2 and 5 tie on bytes and blocks: identity order ("[jit]+0x60"
    // has no libc frame first, and "A\x1f[jit]" sorts before "A\x1flibc").
    CHECK(label(r.sites[3].frames[0]) == "[jit]+0x60");
    CHECK(label(r.sites[4].frames[0]) == "libc.so.6+0x100");
    CHECK(r.sites[2].oldest_ns == 1000000000ull);
    CHECK(r.sites[2].newest_ns == 4000000000ull);
    CHECK(r.sites[2].has_age);
    CHECK_FALSE(r.sites[2].has_activity);

    REQUIRE(r.by_blocks.size() == 5);
    CHECK(r.by_blocks == std::vector<size_t>{3, 4, 2, 0, 1});  // blocks 10 (tie as above), 10, 3, 2, 1

    // The first frame outside the allocator: the libc frame is skipped.
    REQUIRE(r.functions.size() == 4);
    CHECK(r.functions[0].kind == EntryKind::Mmap);
    CHECK(label(r.functions[0].frame) == "[jit]+0x50");
    CHECK(label(r.functions[1].frame) == "[jit]+0x40");
    CHECK(r.functions[1].bytes == 5000);
    CHECK(label(r.functions[2].frame) == "[jit]+0x10");
    CHECK(r.functions[2].bytes == 4000);
    CHECK(r.functions[2].blocks == 13);
    CHECK(r.functions[2].sites == 2);
    CHECK(label(r.functions[3].frame) == "[jit]+0x60");

    REQUIRE(r.modules.size() == 2);
    CHECK(r.modules[0].frame.module == "[jit]");
    CHECK(r.modules[0].kind == EntryKind::Heap);
    CHECK(r.modules[0].bytes == 10000);
    CHECK(r.modules[0].blocks == 24);
    CHECK(r.modules[0].sites == 4);
    CHECK(r.modules[1].kind == EntryKind::Mmap);
    CHECK(r.modules[1].bytes == 8192);

    nlohmann::json j = report_to_json(s, r, 2);
    CHECK(j["format"] == "heapsnap-report");
    CHECK(j["version"] == 1);
    CHECK(j["source_kind"] == "snapshot");
    CHECK(j["moment"]["label"] == "B");
    CHECK(j["totals"]["live_bytes"] == 10000);
    CHECK(j["totals"]["peak_bytes"] == 12000);
    CHECK(j["totals"]["peak_time_s"] == doctest::Approx(4.0));
    CHECK(j["totals"]["sites"] == 5);
    REQUIRE(j["sites_by_bytes"].size() == 2);
    CHECK(j["sites_by_bytes"][0]["kind"] == "mmap");
    CHECK(j["sites_by_bytes"][1]["age_oldest_s"] == doctest::Approx(2.0));  // allocated at 3 s, moment at 5 s
    CHECK(j["sites_by_bytes"][1]["allocations"].is_null());
    CHECK(j["sites_by_bytes"][1]["frames"][0]["offset"] == 0x40);
    REQUIRE(j["sites_by_blocks"].size() == 2);
    CHECK(j["sites_by_blocks"][0]["frames"][0]["offset"] == 0x60);
    CHECK(j["sites_by_blocks"][1]["frames"][0]["offset"] == 0x100);
    CHECK(j["functions"][1]["frame"]["module"] == "[jit]");
    CHECK(j["functions"][1]["sites"] == 1);
    CHECK(j["sizes"].is_null());
    CHECK(j["history"].is_null());

    CHECK(render_report_csv(r, ReportTable::Sites, 2) ==
          "bytes,blocks,kind,age_oldest_s,age_newest_s,allocations,temporary,allocating_frame,stack\n"
          "8192,2,mmap,4.000000,3.000000,,,[jit]+0x50,[jit]+0x50\n"
          "5000,1,heap,2.000000,2.000000,,,[jit]+0x40,[jit]+0x40\n");
    CHECK(render_report_csv(r, ReportTable::Functions, 1) ==
          "bytes,blocks,kind,sites,function,file,module\n8192,2,mmap,1,[jit]+0x50,,[jit]\n");
    CHECK(render_report_csv(r, ReportTable::Modules, 0) ==
          "bytes,blocks,kind,sites,module\n10000,24,heap,4,[jit]\n8192,2,mmap,1,[jit]\n");
    CHECK_THROWS_AS(render_report_csv(r, ReportTable::Sizes, 0), Error);
    CHECK_THROWS_AS(render_report_csv(r, ReportTable::Rate, 0), Error);

    // Folded: live bytes per stack, outermost first, lines sorted.
    CHECK(render_folded(flame_stacks_of_live(r)) ==
          "[jit]+0x20;[jit]+0x10;libc.so.6+0x100 3000\n"
          "[jit]+0x30;[jit]+0x10;libc.so.6+0x100 1000\n"
          "[jit]+0x40 5000\n"
          "[jit]+0x50;[mmap] 8192\n"
          "[jit]+0x60 1000\n");

    ReportRender how;
    how.top = 3;
    how.exact_bytes = true;
    std::string text = render_report_text(s, r, how);
    CHECK(text.find("Top 3 of 5 call sites by live bytes") != std::string::npos);
    CHECK(text.find("  live heap         10000 in 24 blocks\n") != std::string::npos);
    CHECK(text.find("  temporary         not available for a snapshot\n") != std::string::npos);
    CHECK(text.find("  not available for a snapshot (report the log instead") != std::string::npos);
    CHECK(text.find("  12000 at 4.000 s; call sites at the peak: not available for a snapshot\n") != std::string::npos);
    CHECK(text.find("\n    1        8192         2      4.00 s      3.00 s  mmap\n") != std::string::npos);
    CHECK(text.find("\n    3        4000        13    40.0      2  [jit]+0x10  ([jit])\n") != std::string::npos);
}

TEST_CASE("report of a log: sizes, peak sites, temporaries per site, rate") {
    LogBuilder b;
    b.process();
    b.module(1, "[jit]", 0);
    b.stack(1, {{1, 0x10}});
    b.stack(2, {{1, 0x20}});
    b.stack(3, {{1, 0x30}});
    b.thread(0);
    b.alloc(log_us(1), 0xa000, 100, 1);
    b.free_(log_us(2), 0xa000);  // temporary
    b.alloc(log_us(3), 0xb000, 300000, 2);
    b.alloc(log_us(4), 0xc000, 40, 3);
    b.alloc(log_us(5), 0xd000, 40, 3);
    b.free_(log_us(6), 0xb000);  // not temporary: 0xd000 came after it
    b.marker(log_us(7), 1, "A");
    b.alloc(log_us(8), 0xe000, 1, 1);
    b.marker(log_us(9), 2, "exit", hslog::MarkerCause::Exit);
    b.frame();
    TempFile f{b.write()};
    TempFile checkpoint{f.path + ".checkpoint"};

    Snapshot moment = snapshot_at(f.path, parse_moment("A"));
    LogHistory h = replay_history(f.path, moment);
    CHECK(h.heap_allocations == 4);
    CHECK(h.temporary == 1);
    CHECK(h.sizes.blocks[6] == 2);  // [32, 64)
    CHECK(h.sizes.bytes[6] == 80);
    CHECK(h.peak.totals.live_bytes == 300080);
    CHECK(h.temporary_stacks.entries.size() == 1);
    CHECK(h.stacks->contains(h.temporary_stacks.entries[0].stack));

    Symbolizer sym;
    Report r = build_report(moment, &h, ReportOptions{}, sym);
    CHECK(r.from_log);
    REQUIRE(r.sites.size() == 1);
    CHECK(r.sites[0].bytes == 80);
    CHECK(r.sites[0].has_activity);
    CHECK(r.sites[0].allocations == 2);
    REQUIRE(r.peak_sites.size() == 2);
    CHECK(r.peak_sites[0].bytes == 300000);
    CHECK(label(r.peak_sites[0].frames[0]) == "[jit]+0x20");
    CHECK_FALSE(r.peak_sites[0].has_age);
    CHECK(r.peak_blocks == 3);
    REQUIRE(r.temporary_sites.size() == 1);
    CHECK(r.temporary_sites[0].temporary == 1);
    CHECK(r.temporary_sites[0].allocations == 1);
    CHECK(label(r.temporary_sites[0].frames[0]) == "[jit]+0x10");
    // The moment is at 7 us: 8 slices of 1 us, one per bucket.
    REQUIRE(r.rate.size() == 8);
    CHECK(r.rate[1].allocations == 1);
    CHECK(r.rate[2].allocations == 0);
    CHECK(r.rate[3].allocations == 1);
    CHECK(r.rate[4].allocations == 1);
    CHECK(r.rate[5].allocations == 1);
    CHECK(r.rate[7].allocations == 0);

    nlohmann::json j = report_to_json(moment, r, 0);
    CHECK(j["source_kind"] == "log");
    CHECK(j["sizes"]["classes"].size() == 1);
    CHECK(j["sizes"]["classes"][0]["min"] == 32);
    CHECK(j["sizes"]["classes"][0]["max"] == 63);
    CHECK(j["sizes"]["classes"][0]["blocks"] == 2);
    CHECK(j["sizes"]["large_threshold"] == 131072);
    CHECK(j["sizes"]["large_blocks"] == 0);
    CHECK(j["history"]["heap_allocations"] == 4);
    CHECK(j["history"]["temporary_allocations"] == 1);
    CHECK(j["history"]["peak"]["live_bytes"] == 300080);
    CHECK(j["history"]["peak"]["live_blocks"] == 3);
    CHECK(j["history"]["peak"]["time_s"] == doctest::Approx(5e-6));
    CHECK(j["history"]["peak"]["sites"][0]["age_oldest_s"].is_null());
    CHECK(j["history"]["sites_by_temporary"][0]["temporary"] == 1);
    CHECK(j["history"]["rate"].size() == 8);
    CHECK(j["sites_by_bytes"][0]["allocations"] == 2);
    CHECK(j["sites_by_bytes"][0]["temporary"] == 0);

    CHECK(render_report_csv(r, ReportTable::Sizes, 0) == "min,max,blocks,bytes,large\n32,63,2,80,0\n");

    // At exit, with everything: one more allocation of stack 1, 1 byte.
    Snapshot at_exit = snapshot_at(f.path, parse_moment("exit"));
    LogHistory he = replay_history(f.path, at_exit);
    CHECK(he.heap_allocations == 5);
    CHECK(he.sizes.blocks[1] == 1);
}
