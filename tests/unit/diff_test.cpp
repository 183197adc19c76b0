// Diffing snapshots: matching, grouping, order, filters and the JSON shape.
// Modules here have no file on disk ("[jit]"), so frames stay module+offset
// and the test does not depend on the symbolizer.
#include <doctest/doctest.h>

#include "report/diff.h"
#include "report/render.h"

using namespace heapsnap;

namespace {

Snapshot snap(uint64_t pid, uint64_t bias_shift) {
    Snapshot s;
    s.process.pid = pid;
    s.process.exe = "/bin/prog";
    s.modules.push_back(SnapshotModule{ModuleRecord{1, 0, bias_shift, 0, 0, "[jit]", ""}, true});
    return s;
}

void add(Snapshot& s, uint32_t stack, std::vector<uint64_t> frames, uint64_t bytes, uint64_t blocks,
         EntryKind kind = EntryKind::Heap) {
    std::vector<StackFrame> f;
    for (uint64_t v : frames) f.push_back(StackFrame{1, v});
    s.stacks[stack] = f;
    s.entries.push_back(SnapshotEntry{stack, kind, bytes, blocks, 0, 0});
    if (kind == EntryKind::Heap) {
        s.totals.live_bytes += bytes;
        s.totals.live_blocks += blocks;
    }
}

}  // namespace

TEST_CASE("diff: stacks match by meaning across runs, sorted by growth, unchanged omitted") {
    Snapshot a = snap(1, 0x1000);
    add(a, 5, {0x10, 0x20}, 1000, 10);  // grows
    add(a, 6, {0x30}, 500, 5);          // unchanged
    add(a, 7, {0x40}, 4096, 1);         // freed
    Snapshot b = snap(2, 0x9000);       // another run: other ids, other load address
    add(b, 1, {0x10, 0x20}, 49000, 1010);
    add(b, 2, {0x30}, 500, 5);
    add(b, 3, {0x50}, 64, 2);
    add(b, 4, {0x60}, 8192, 2, EntryKind::Mmap);
    Symbolizer sym;
    DiffResult d = diff(a, b, DiffOptions{}, sym);
    REQUIRE(d.entries.size() == 4);
    CHECK(d.entries[0].bytes_delta == 48000);
    CHECK(d.entries[0].blocks_delta == 1000);
    CHECK(d.entries[0].old_bytes == 1000);
    CHECK(d.entries[0].new_bytes == 49000);
    CHECK(frame_label(d.entries[0].frames[0]) == "[jit]+0x10");
    CHECK(d.entries[1].bytes_delta == 8192);
    CHECK(d.entries[1].kind == EntryKind::Mmap);
    CHECK(d.entries[2].bytes_delta == 64);
    CHECK(d.entries[3].bytes_delta == -4096);
    CHECK(d.entries[3].blocks_delta == -1);
    CHECK(d.bytes_delta == 48000 + 8192 + 64 - 4096);
    CHECK(d.blocks_delta == 1000 + 2 + 2 - 1);

    nlohmann::json j = diff_to_json(a, b, d);
    CHECK(j["format"] == "heapsnap-diff");
    CHECK(j["version"] == 1);
    CHECK(j["total"]["bytes_delta"] == 52160);
    CHECK(j["entries"][0]["frames"][0]["module"] == "[jit]");
    CHECK(j["entries"][0]["frames"][0]["offset"] == 0x10);
    CHECK(j["entries"][0]["frames"][0]["function"].is_null());
    CHECK(j["entries"][3]["kind"] == "heap");
    CHECK(j["address_space"].is_null());

    std::string csv = render_diff_csv(d);
    CHECK(csv.substr(0, csv.find('\n')) ==
          "bytes_delta,blocks_delta,old_bytes,new_bytes,old_blocks,new_blocks,kind,top_frame,stack");
    CHECK(csv.find("48000,1000,1000,49000,10,1010,heap,[jit]+0x10,[jit]+0x10;[jit]+0x20\n") != std::string::npos);
}

TEST_CASE("diff: --top and --min-bytes filter after sorting; totals stay whole") {
    Snapshot a = snap(1, 0);
    Snapshot b = snap(1, 0);
    add(b, 1, {0x10}, 300, 3);
    add(b, 2, {0x20}, 200, 2);
    add(b, 3, {0x30}, 100, 1);
    Symbolizer sym;
    DiffOptions top;
    top.top = 2;
    DiffResult d = diff(a, b, top, sym);
    REQUIRE(d.entries.size() == 2);
    CHECK(d.entries[1].bytes_delta == 200);
    CHECK(d.bytes_delta == 600);
    DiffOptions min;
    min.min_bytes = 150;
    CHECK(diff(a, b, min, sym).entries.size() == 2);
}

TEST_CASE("diff: grouping by module merges stacks; --exclude drops frames") {
    Snapshot a = snap(1, 0);
    Snapshot b = snap(1, 0);
    add(b, 1, {0x10, 0x99}, 300, 3);
    add(b, 2, {0x20, 0x99}, 200, 2);
    Symbolizer sym;
    DiffOptions by_module;
    by_module.group_by = GroupBy::Module;
    DiffResult d = diff(a, b, by_module, sym);
    REQUIRE(d.entries.size() == 1);
    CHECK(d.entries[0].bytes_delta == 500);
    CHECK(d.entries[0].new_blocks == 5);

    DiffOptions exclude;
    exclude.exclude.emplace_back("\\+0x(10|20)$");
    DiffResult e = diff(a, b, exclude, sym);
    REQUIRE(e.entries.size() == 1);  // both stacks are now just [jit]+0x99
    CHECK(e.entries[0].bytes_delta == 500);
    REQUIRE(e.entries[0].frames.size() == 1);
    CHECK(frame_label(e.entries[0].frames[0]) == "[jit]+0x99");
}

TEST_CASE("diff: allocation frames are recognised") {
    SymbolFrame f;
    f.function = "operator new(unsigned long)";
    CHECK(is_allocation_frame(f));
    f.function = "void std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(int const&)";
    CHECK(is_allocation_frame(f));
    f.function = "void leaky<int>(int)";
    CHECK_FALSE(is_allocation_frame(f));
    f.function = "strdup";
    f.module = "/usr/lib/x86_64-linux-gnu/libc.so.6";
    CHECK(is_allocation_frame(f));
    f.function = "leak_here";
    f.module = "/tmp/prog";
    CHECK_FALSE(is_allocation_frame(f));
}
