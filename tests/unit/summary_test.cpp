// Address-space summary: the smaps parser (recorder side), its CLI wrapper,
// classification, the numbers of every category, JSON, and the verdict.
//
// fixtures/smaps_demo.txt is a process with: an executable and its .bss, the
// brk heap, a glibc arena with its PROT_NONE reservation, a malloc mmapped
// large block, a thread stack with its guard page, an anonymous mmap (some
// of it swapped), a PROT_NONE reservation of nobody in particular, a region
// the test marks as the recorder's, a data file whose path has a space,
// /dev/shm, a memfd, a SysV segment, shared /dev/zero, the locale archive,
// libc with .bss, a deleted plugin library with .bss, ld.so, a data-only
// shared object, a shared-mapped gconv cache, [stack], [vvar], [vdso] and
// [vsyscall]. Sizes are in the table of expected numbers below (KiB).
#include <doctest/doctest.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <string>
#include <vector>

#include "addrspace/smaps_capture.h"
#include "addrspace/smaps_read.h"
#include "addrspace/summary.h"
#include "report/address_space.h"
#include "util/error.h"
#include "util/human.h"

using namespace heapsnap;
using namespace heapsnap::addrspace;

namespace {

constexpr uint64_t KiB = 1024;
constexpr uint64_t MiB = 1024 * 1024;

const char* const kDemo = "fixtures/smaps_demo.txt";
const char* const kEdge = "fixtures/smaps_edge.txt";

struct Parsed {
    uint64_t start, end, offset, inode;
    uint8_t perms;
    std::string path;
    uint64_t rss, pss, pd, swap;
    bool operator==(const Parsed&) const = default;
};

void collect(const RawRegion& r, void* ctx) {
    static_cast<std::vector<Parsed>*>(ctx)->push_back({r.start, r.end, r.offset, r.inode, r.perms,
                                                       std::string(r.path, r.path_len), r.rss_kb, r.pss_kb,
                                                       r.private_dirty_kb, r.swap_kb});
}

std::vector<Parsed> parse(const char* path, size_t scratch_size, long* count = nullptr) {
    std::vector<char> scratch(scratch_size);
    std::vector<Parsed> out;
    long n = capture_smaps(path, scratch.data(), scratch.size(), collect, &out);
    if (count) *count = n;
    return out;
}

void check_stats(const CategoryStats& s, uint64_t regions, uint64_t size_kb, uint64_t rss_kb, uint64_t pss_kb,
                 uint64_t pd_kb, uint64_t swap_kb) {
    CHECK(s.regions == regions);
    CHECK(s.size_bytes == size_kb * KiB);
    CHECK(s.rss_bytes == rss_kb * KiB);
    CHECK(s.pss_bytes == pss_kb * KiB);
    CHECK(s.private_dirty_bytes == pd_kb * KiB);
    CHECK(s.swap_bytes == swap_kb * KiB);
}

MapRegion* find_region(std::vector<MapRegion>& regions, uint64_t start) {
    for (auto& r : regions)
        if (r.start == start) return &r;
    FAIL("no region at " << start);
    return nullptr;
}

// The demo process as the recorder would describe it at a marker.
SummaryInputs demo_inputs() {
    SummaryInputs in;
    in.regions = read_smaps_file(kDemo);
    find_region(in.regions, 0x7f3a1d400000)->hint = hslog::RegionHint::Recorder;
    in.heap_block_ranges = {{0x7f3a1c000010, 0x7f3a1c100010},   // malloc's mmapped large block
                            {0x7f3a14000900, 0x7f3a14000d00},   // in the thread arena
                            {0x55d0c5e40000, 0x55d0c5e40100}};  // in [heap]
    in.thread_stacks = {{0x7f3a1c201000, 0x7f3a1ca00000}};
    in.tracked = true;
    in.tracked_live_bytes = 1900000;
    in.tracked_live_blocks = 1234;
    in.has_malloc = true;
    in.malloc.arena = 1318912 + 135168;
    in.malloc.uordblks = 1000000;
    in.malloc.fordblks = 250000;
    in.malloc.hblks = 1;
    in.malloc.hblkhd = 1052672;
    in.threads = 2;
    in.recorder_bytes = 1500000;
    return in;
}

MapRegion anon(uint64_t start, uint64_t end, uint8_t perms, uint64_t rss_kb) {
    MapRegion r;
    r.start = start;
    r.end = end;
    r.perms = perms;
    r.rss_kb = rss_kb;
    r.pss_kb = rss_kb;
    r.private_dirty_kb = rss_kb;
    return r;
}

std::vector<std::string> row_names(const std::string& text, const std::string& first_heading) {
    std::vector<std::string> names;
    size_t at = text.find(first_heading);
    REQUIRE(at != std::string::npos);
    at = text.find('\n', at) + 1;
    while (at < text.size() && text[at] != '\n') {
        size_t eol = text.find('\n', at);
        std::string line = text.substr(at, eol - at);
        names.push_back(line.substr(0, line.find(' ')));
        at = eol + 1;
    }
    return names;
}

std::string line_starting(const std::string& text, const std::string& prefix) {
    size_t at = 0;
    while (at < text.size()) {
        size_t eol = text.find('\n', at);
        std::string line = text.substr(at, eol - at);
        if (line.rfind(prefix, 0) == 0) return line;
        at = eol + 1;
    }
    return {};
}

}  // namespace

TEST_CASE("human_bytes: exact below 1 KiB, one decimal above") {
    CHECK(human_bytes(0) == "0 B");
    CHECK(human_bytes(1023) == "1023 B");
    CHECK(human_bytes(1024) == "1.0 KiB");
    CHECK(human_bytes(1536) == "1.5 KiB");
    CHECK(human_bytes(MiB - 1) == "1.0 MiB");
    CHECK(human_bytes(24 * MiB) == "24.0 MiB");
    CHECK(human_bytes(1288 * KiB) == "1.3 MiB");
    CHECK(human_bytes(45532257447936ULL) == "41.4 TiB");
    CHECK(human_bytes(UINT64_MAX) == "16.0 EiB");
    CHECK(human_bytes_signed(1536 * KiB) == "+1.5 MiB");
    CHECK(human_bytes_signed(-512) == "-512 B");
    CHECK(human_bytes_signed(0) == "0 B");
    CHECK(human_bytes_signed(INT64_MIN) == "-8.0 EiB");
}

TEST_CASE("capture_smaps reads every region of a realistic smaps file") {
    long n = 0;
    auto regions = parse(kDemo, 64 * 1024, &n);
    REQUIRE(n == 42);
    REQUIRE(regions.size() == 42);
    CHECK(regions[0] == Parsed{0x55d0c4a00000, 0x55d0c4a02000, 0, 1311, hslog::kRead, "/usr/bin/demo", 8, 8, 0, 0});
    CHECK(regions[1].perms == (hslog::kRead | hslog::kExec));
    CHECK(regions[1].offset == 0x2000);
    // Anonymous region: the header ends with "0 " and has no path.
    CHECK(regions[5] == Parsed{0x55d0c4a08000, 0x55d0c4a0a000, 0, 0, hslog::kRead | hslog::kWrite, "", 8, 8, 8, 0});
    CHECK(regions[6].path == "[heap]");
    // Swap, not SwapPss; Private_Dirty, not Pss_Dirty.
    CHECK(regions[12] ==
          Parsed{0x7f3a1cc00000, 0x7f3a1d000000, 0, 0, hslog::kRead | hslog::kWrite, "", 512, 512, 512, 256});
    CHECK(regions[15].path == "/var/lib/demo/data file.bin");
    CHECK(regions[15].pss == 1024);
    CHECK(regions[16].perms == (hslog::kRead | hslog::kWrite | hslog::kShared));
    CHECK(regions[17].path == "/memfd:jit-cache (deleted)");
    CHECK(regions[27].path == "/opt/demo/lib/libplugin.so (deleted)");
    CHECK(regions[41] == Parsed{0xffffffffff600000, 0xffffffffff601000, 0, 0, hslog::kExec, "[vsyscall]", 0, 0, 0, 0});
}

TEST_CASE("capture_smaps: odd lines, malformed headers, no final newline") {
    long n = 0;
    auto regions = parse(kEdge, 64 * 1024, &n);
    REQUIRE(n == 4);
    REQUIRE(regions.size() == 4);
    // Key lines before the first header and unknown keys are ignored; the path
    // keeps its inner double space and its " (deleted)".
    CHECK(regions[0] == Parsed{0x400000, 0x452000, 0, 173521, hslog::kRead | hslog::kExec,
                               "/tmp/dir with  spaces/my prog (deleted)", 100, 50, 12, 7});
    CHECK(regions[1] == Parsed{0x652000, 0x653000, 0x52000, 173521, hslog::kRead | hslog::kWrite,
                               "/tmp/a/very/long/path/that/does/not/fit/in/a/small/scratch/buffer/at/all.bin", 4, 0, 4,
                               0});
    // "ffff0000-ffff1000 rw-p 0000000g" is dropped together with its Rss line.
    CHECK(regions[2] ==
          Parsed{0x7f0000000000, 0x7f0000001000, 0, 42, hslog::kRead | hslog::kWrite | hslog::kShared, "", 4, 2, 0, 0});
    // The last line has no '\n' and still counts.
    CHECK(regions[3] == Parsed{0x7f0000002000, 0x7f0000003000, 0, 0, 0, "", 0, 0, 0, 4});
}

TEST_CASE("capture_smaps: a tiny scratch gives the same regions, paths cut to the path capacity") {
    CHECK(smaps_path_capacity(64) == 48);
    CHECK(smaps_path_capacity(2) == 1);
    CHECK(smaps_path_capacity(1 << 20) == 4112);
    for (const char* file : {kDemo, kEdge}) {
        auto whole = parse(file, 1 << 20);
        for (size_t size : {2, 3, 5, 7, 16, 31, 64, 100, 257, 4096}) {
            CAPTURE(file);
            CAPTURE(size);
            auto expected = whole;
            for (auto& r : expected) r.path = r.path.substr(0, smaps_path_capacity(size));
            CHECK(parse(file, size) == expected);
        }
    }
    // 64 bytes: reads of 16 bytes split every line; a 48-byte path survives whole.
    auto small = parse(kDemo, 64);
    CHECK(small[32].path == "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    CHECK(small[37].path == "/usr/lib/x86_64-linux-gnu/gconv/gconv-modules.ca");
}

TEST_CASE("capture_smaps and read_status failures") {
    std::vector<char> scratch(64);
    std::vector<Parsed> out;
    errno = 0;
    CHECK(capture_smaps("fixtures/no-such-file", scratch.data(), scratch.size(), collect, &out) == -1);
    CHECK(errno == ENOENT);
    CHECK(capture_smaps(kDemo, scratch.data(), 1, collect, &out) == -1);
    CHECK(out.empty());

    uint64_t rss = 1;
    uint32_t threads = 1;
    CHECK(read_status("fixtures/status_demo.txt", scratch.data(), 7, &rss, &threads));
    CHECK(rss == 18432);
    CHECK(threads == 7);
    CHECK_FALSE(read_status("fixtures/status_nothreads.txt", scratch.data(), scratch.size(), &rss, &threads));
    CHECK(rss == 12);
    CHECK(threads == 0);
    CHECK_FALSE(read_status("fixtures/no-such-file", scratch.data(), scratch.size(), &rss, &threads));
}

TEST_CASE("read_smaps_file / read_status_file") {
    auto regions = read_smaps_file(kDemo);
    REQUIRE(regions.size() == 42);
    CHECK(regions[15].path == "/var/lib/demo/data file.bin");
    CHECK(regions[15].inode == 4242);
    CHECK(regions[15].hint == hslog::RegionHint::None);

    CHECK_THROWS_WITH_AS(read_smaps_file("fixtures/no-such-file"),
                         "cannot read fixtures/no-such-file: No such file or directory", Error);
    CHECK_THROWS_WITH_AS(read_status_file("fixtures/status_nothreads.txt"),
                         "cannot read fixtures/status_nothreads.txt: no VmRSS or Threads field", Error);
    ProcessStatus st = read_status_file("fixtures/status_demo.txt");
    CHECK(st.rss_kb == 18432);
    CHECK(st.threads == 7);

    // The live process: its own executable and libc are images.
    SummaryInputs live;
    live.regions = read_smaps_file("/proc/self/smaps");
    AddressSpaceSummary s = summarize(live);
    CHECK(s[Category::Image].regions >= 4);
    CHECK(s[Category::Stack].regions >= 1);
    CHECK(s[Category::Free].regions == 1);
    CHECK(read_status_file("/proc/self/status").threads >= 1);
}

TEST_CASE("classify: every rule on the demo process") {
    SummaryInputs in = demo_inputs();
    std::vector<Category> cat = classify(in);
    auto at = [&](uint64_t start) {
        return cat[static_cast<size_t>(find_region(in.regions, start) - in.regions.data())];
    };
    CHECK(at(0x55d0c4a02000) == Category::Image);      // exe r-xp
    CHECK(at(0x55d0c4a08000) == Category::Image);      // exe .bss after its rw-p
    CHECK(at(0x55d0c5e3f000) == Category::Heap);       // [heap]
    CHECK(at(0x7f3a14000000) == Category::Heap);       // arena (holds a block)
    CHECK(at(0x7f3a14021000) == Category::Heap);       // its PROT_NONE reservation
    CHECK(at(0x7f3a1c000000) == Category::Heap);       // mmapped large block
    CHECK(at(0x7f3a1c200000) == Category::Stack);      // guard page
    CHECK(at(0x7f3a1c201000) == Category::Stack);      // thread stack
    CHECK(at(0x7f3a1cc00000) == Category::Anonymous);  // direct mmap
    CHECK(at(0x7f3a1d100000) == Category::Anonymous);  // PROT_NONE next to nothing special
    CHECK(at(0x7f3a1d400000) == Category::Recorder);
    CHECK(at(0x7f3a1e000000) == Category::MappedFile);  // data file
    CHECK(at(0x7f3a1f000000) == Category::MappedFile);  // /dev/shm
    CHECK(at(0x7f3a1f400000) == Category::MappedFile);  // memfd
    CHECK(at(0x7f3a1f500000) == Category::MappedFile);  // SysV
    CHECK(at(0x7f3a1f600000) == Category::MappedFile);  // shared /dev/zero
    CHECK(at(0x7f3a1f700000) == Category::MappedFile);  // locale-archive
    CHECK(at(0x7f3a201dc000) == Category::Image);       // libc .bss
    CHECK(at(0x7f3a20200000) == Category::Image);       // deleted plugin, r--p
    CHECK(at(0x7f3a20203000) == Category::Image);       // its .bss
    CHECK(at(0x7f3a20400000) == Category::Image);       // libicudata.so.72, no x mapping
    CHECK(at(0x7f3a20700000) == Category::MappedFile);  // gconv cache, r--s
    CHECK(at(0x7ffd4a3c0000) == Category::Stack);       // [stack]
    CHECK(at(0x7ffd4a3f0000) == Category::Other);       // [vvar]
    CHECK(at(0xffffffffff600000) == Category::Other);   // [vsyscall]

    // Input order does not matter.
    SummaryInputs reversed = in;
    std::reverse(reversed.regions.begin(), reversed.regions.end());
    std::vector<Category> rcat = classify(reversed);
    std::reverse(rcat.begin(), rcat.end());
    CHECK(rcat == cat);
}

TEST_CASE("summarize: exact numbers per category for the demo process") {
    AddressSpaceSummary s = summarize(demo_inputs());
    // clang-format off
    //                                 regions  size KiB  Rss  Pss  Private_Dirty  Swap
    check_stats(s[Category::Heap],           4,  67852, 2288, 2288, 2288,   0);
    check_stats(s[Category::Stack],          3,   8324,   64,   64,   64,   0);
    check_stats(s[Category::Image],         22,   4276, 1884,  443,   84,   0);
    check_stats(s[Category::MappedFile],     7,  25692, 3376, 1699,   88,   0);
    check_stats(s[Category::Anonymous],      2,   5120,  512,  512,  512, 256);
    check_stats(s[Category::Other],          3,     28,    8,    1,    0,   0);
    check_stats(s[Category::Recorder],       1,   2048,  300,  300,  300,   0);
    // clang-format on

    // Free: from the end of [heap] to the arena.
    CHECK(s[Category::Free].regions == 1);
    CHECK(s[Category::Free].size_bytes == 0x7f3a14000000ULL - 0x55d0c5f81000ULL);
    CHECK(s.largest[size_t(Category::Free)].start == 0x55d0c5f81000ULL);

    CHECK(s.busy_bytes == 113340 * KiB);
    // Reserved: arena reservation 65404 + guard 4 + lone PROT_NONE 1024.
    CHECK(s.reserved_bytes == 66432 * KiB);
    CHECK(s.reserved.regions == 3);
    CHECK(s.committed_bytes == (113340 - 66432) * KiB);
    CHECK(s.committed.regions == 39);
    CHECK(s.committed_size[size_t(Category::Heap)] == (67852 - 65404) * KiB);

    check_stats(s.types[size_t(RegionType::Image)], 22, 4276, 1884, 443, 84, 0);
    check_stats(s.types[size_t(RegionType::Mapped)], 7, 25692, 3376, 1699, 88, 0);
    check_stats(s.types[size_t(RegionType::Private)], 13, 83372, 3172, 3165, 3164, 256);

    auto largest = [&](Category c) { return s.largest[size_t(c)]; };
    CHECK(largest(Category::Heap).start == 0x7f3a14021000);
    CHECK(largest(Category::Heap).size_bytes == 65404 * KiB);
    CHECK(largest(Category::Stack).start == 0x7f3a1c201000);
    CHECK(largest(Category::Image).path == "/usr/lib/x86_64-linux-gnu/libicudata.so.72");
    CHECK(largest(Category::MappedFile).path == "/var/lib/demo/data file.bin");
    CHECK(largest(Category::MappedFile).size_bytes == 16 * MiB);
    CHECK(largest(Category::Anonymous).start == 0x7f3a1cc00000);
    CHECK(largest(Category::Other).path == "[vvar]");

    CHECK(s.malloc_in_use_bytes == 1000000 + 1052672);
    CHECK(s.malloc_free_bytes == 250000);
    CHECK(s.fragmentation == doctest::Approx(0.2));
    CHECK(s.threads == 2);
    CHECK(s.tracked_live_bytes == 1900000);
}

TEST_CASE("summarize without recorder data: arenas by shape, the rest anonymous") {
    SummaryInputs in;
    in.regions = read_smaps_file(kDemo);
    AddressSpaceSummary s = summarize(in);
    // [heap], and the arena with its reservation recognised by its 64 MiB shape.
    check_stats(s[Category::Heap], 3, 1288 + 132 + 65404, 1260, 1260, 1260, 0);
    check_stats(s[Category::Stack], 1, 132, 40, 40, 40, 0);
    // Large block, guard, thread stack, direct mmap, lone reservation, recorder.
    check_stats(s[Category::Anonymous], 6, 1028 + 4 + 8188 + 4096 + 1024 + 2048, 1864, 1864, 1864, 256);
    check_stats(s[Category::Recorder], 0, 0, 0, 0, 0, 0);

    nlohmann::json j = to_json(s);
    CHECK(j["categories"].size() == 7);
    CHECK_FALSE(j["categories"].contains("Recorder"));
    CHECK(j["tracked_live_bytes"].is_null());
    CHECK(j["fragmentation"].is_null());
    CHECK(j["malloc_in_use_bytes"].is_null());
}

TEST_CASE("to_json and delta_json") {
    AddressSpaceSummary s = summarize(demo_inputs());
    nlohmann::json j = to_json(s);
    for (const char* name : {"Heap", "Stack", "Image", "MappedFile", "Anonymous", "Other", "Free", "Recorder"})
        CHECK(j["categories"].contains(name));
    CHECK(j["categories"].size() == 8);
    CHECK(j["categories"]["Heap"] == nlohmann::json{{"regions", 4},
                                                    {"size_bytes", 67852 * KiB},
                                                    {"rss_bytes", 2288 * KiB},
                                                    {"pss_bytes", 2288 * KiB},
                                                    {"private_dirty_bytes", 2288 * KiB},
                                                    {"swap_bytes", 0}});
    CHECK(j["categories"]["Free"]["size_bytes"] == 0x7f3a14000000ULL - 0x55d0c5f81000ULL);
    CHECK(j["threads"] == 2);
    CHECK(j["tracked_live_bytes"] == 1900000);
    CHECK(j["malloc_in_use_bytes"] == 2052672);
    CHECK(j["malloc_free_bytes"] == 250000);
    CHECK(j["reserved_bytes"] == 66432 * KiB);
    CHECK(j["committed_bytes"] == 46908 * KiB);
    CHECK(j["busy_bytes"] == 113340 * KiB);
    CHECK(j["types"]["mapped"]["regions"] == 7);
    CHECK(j["states"]["reserved"]["regions"] == 3);
    CHECK(j["largest"]["MappedFile"]["path"] == "/var/lib/demo/data file.bin");
    CHECK(j["largest"]["Free"]["start"] == 0x55d0c5f81000ULL);
    CHECK(j["fragmentation"].get<double>() == doctest::Approx(0.2));
    CHECK(j["malloc"]["fordblks"] == 250000);
    CHECK(j["recorder_bytes"] == 1500000);

    nlohmann::json zero = delta_json(s, s);
    CHECK(zero["categories"]["Heap"]["rss_bytes"] == 0);
    CHECK(zero["threads"] == 0);

    SummaryInputs shrunk = demo_inputs();
    find_region(shrunk.regions, 0x7f3a1cc00000)->rss_kb = 0;  // the direct mmap is paged out
    shrunk.threads = 1;
    shrunk.tracked_live_bytes = 1000000;
    nlohmann::json d = delta_json(s, summarize(shrunk));
    CHECK(d["categories"]["Anonymous"]["rss_bytes"] == -512 * int64_t(KiB));
    CHECK(d["categories"]["Anonymous"]["size_bytes"] == 0);
    CHECK(d["threads"] == -1);
    CHECK(d["tracked_live_bytes"] == -900000);
    CHECK(d["malloc"]["uordblks"] == 0);
    CHECK(d["categories"].size() == 8);
    CHECK_FALSE(d.contains("largest"));
}

TEST_CASE("verdict names the dominant growth") {
    SummaryInputs base = demo_inputs();
    AddressSpaceSummary old_s = summarize(base);

    SUBCASE("three new threads") {
        SummaryInputs in = base;
        for (uint64_t k = 0; k < 3; ++k) {
            uint64_t lo = 0x7f3a30000000 + k * 0x1000000;
            in.regions.push_back(anon(lo, lo + 0x1000, 0, 0));
            in.regions.push_back(anon(lo + 0x1000, lo + 0x800000, hslog::kRead | hslog::kWrite, 32));
            in.thread_stacks.push_back({lo + 0x1000, lo + 0x800000});
        }
        // The heap grows a little too, but far less.
        find_region(in.regions, 0x55d0c5e3f000)->rss_kb += 64;
        in.threads = 5;
        AddressSpaceSummary new_s = summarize(in);
        CHECK(verdict(old_s, new_s) == "growth is thread stacks: +3 threads, +24.0 MiB reserved, +96.0 KiB rss");
        nlohmann::json d = delta_json(old_s, new_s);
        CHECK(d["categories"]["Stack"]["regions"] == 6);
        CHECK(d["categories"]["Stack"]["size_bytes"] == 24 * MiB);
        CHECK(d["categories"]["Stack"]["rss_bytes"] == 96 * KiB);
        CHECK(d["reserved_bytes"] == 12 * KiB);

        std::string text = render_delta_text(old_s, new_s, false);
        CHECK(line_starting(text, "Stack") ==
              "Stack            8.1 MiB   64.0 KiB   32.1 MiB  160.0 KiB   +96.0 KiB   +24.0 MiB");
        CHECK(text.find("threads 2 -> 5 (+3), tracked live 1.8 MiB -> 1.8 MiB (0 B)") != std::string::npos);
    }
    SUBCASE("a heap leak") {
        SummaryInputs in = base;
        MapRegion* heap = find_region(in.regions, 0x55d0c5e3f000);
        heap->end += 1232 * KiB;
        heap->rss_kb += 1232;
        in.tracked_live_bytes += 1150000;
        CHECK(verdict(old_s, summarize(in)) == "growth is heap: +1.2 MiB rss, tracked live bytes +1.1 MiB");
    }
    SUBCASE("direct mmap outgrows the heap") {
        SummaryInputs in = base;
        find_region(in.regions, 0x55d0c5e3f000)->rss_kb += 1024;
        in.regions.push_back(anon(0x7f3a40000000, 0x7f3a40200000, hslog::kRead | hslog::kWrite, 2048));
        CHECK(verdict(old_s, summarize(in)) == "growth is anonymous mmap: +2.0 MiB virtual, +2.0 MiB rss");
    }
    SUBCASE("a reservation alone weighs nothing") {
        SummaryInputs in = base;
        in.regions.push_back(anon(0x7f3a40000000, 0x7f3a48000000, 0, 0));
        CHECK(verdict(old_s, summarize(in)) == "no significant address-space growth");
    }
    SUBCASE("below the threshold, or shrinking") {
        SummaryInputs in = base;
        MapRegion* heap = find_region(in.regions, 0x55d0c5e3f000);
        heap->end += 32 * KiB;
        heap->rss_kb += 32;
        AddressSpaceSummary small = summarize(in);
        CHECK(verdict(old_s, small) == "no significant address-space growth");
        CHECK(verdict(small, old_s) == "no significant address-space growth");
        CHECK(verdict(old_s, old_s) == "no significant address-space growth");
    }
}

TEST_CASE("render_text: rows by size, tables, reconciliation") {
    AddressSpaceSummary s = summarize(demo_inputs());
    std::string text = render_text(s, false);
    CHECK(text.find('\x1b') == std::string::npos);
    CHECK(row_names(text, "Usage") == std::vector<std::string>{"Free", "Heap", "MappedFile", "Stack", "Anonymous",
                                                               "Image", "Recorder", "Other", "Busy"});
    CHECK(line_starting(text, "Heap ") ==
          "Heap              4   66.3 MiB    2.2 MiB    2.2 MiB        2.2 MiB        0 B      59.9%");
    CHECK(line_starting(text, "Free ") ==
          "Free              1   41.4 TiB        0 B        0 B            0 B        0 B");
    CHECK(row_names(text, "Type") == std::vector<std::string>{"image", "mapped", "private"});
    CHECK(line_starting(text, "reserved ") ==
          "reserved          3   64.9 MiB        0 B        0 B            0 B        0 B      58.6%");
    CHECK(line_starting(text, "MappedFile      0x") ==
          "MappedFile      0x7f3a1e000000  16.0 MiB  /var/lib/demo/data file.bin");
    CHECK(line_starting(text, "  fragmentation") == "  fragmentation    20.0% (fordblks / (uordblks + fordblks))");
    CHECK(line_starting(text, "  threads") == "  threads          2");
    CHECK(render_text(s, true).find("\x1b[1m") != std::string::npos);
}

TEST_CASE("classify: glibc's and the program's names for anonymous memory") {
    SummaryInputs in;
    uint8_t rw = hslog::kRead | hslog::kWrite;
    auto named = [&](uint64_t start, uint64_t end, uint8_t perms, const char* name) {
        MapRegion r = anon(start, end, perms, 4);
        r.path = name;
        in.regions.push_back(r);
    };
    named(0x7f0000000000, 0x7f0000021000, rw, "[anon: glibc: malloc arena]");
    named(0x7f0000021000, 0x7f0004000000, 0, "");  // its reservation, unnamed
    named(0x7f0010000000, 0x7f0010101000, rw, "[anon: glibc: malloc]");
    named(0x7f0020000000, 0x7f0020001000, 0, "");  // guard
    named(0x7f0020001000, 0x7f0020800000, rw, "[anon: glibc: pthread stack: 4243]");
    named(0x7f0030000000, 0x7f0030800000, rw, "[anon: glibc: unused stack]");
    named(0x7f0040000000, 0x7f0040100000, rw, "[anon:jit code cache]");
    named(0x7f0040100000, 0x7f0040200000, rw | hslog::kShared, "[anon_shmem:ring]");
    named(0x7f0050000000, 0x7f0050100000, rw, "[anon:my pool]");
    in.heap_block_ranges = {{0x7f0050000100, 0x7f0050000200}};  // a named region holding malloc blocks
    named(0x7f0060000000, 0x7f0060001000, hslog::kRead, "[uprobes]");
    CHECK(classify(in) == std::vector<Category>{Category::Heap, Category::Heap, Category::Heap, Category::Stack,
                                                Category::Stack, Category::Stack, Category::Anonymous,
                                                Category::MappedFile, Category::Heap, Category::Other});
}
