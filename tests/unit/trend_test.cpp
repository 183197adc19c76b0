// Trends: the leak-confidence score (steps measured against the median
// step), and a trend over five moments with a true leak, a cache that
// fills and then stays flat, and noise — only the leak may be flagged. Modules have no file on disk ("[jit]"), so frames
// stay module+offset.
#include <doctest/doctest.h>

#include "report/flame.h"
#include "report/trend.h"

using namespace heapsnap;

namespace {

double score(std::vector<uint64_t> series) { return leak_confidence(series); }

Snapshot moment(uint32_t index, uint64_t events) {
    Snapshot s;
    s.process.pid = 5;
    s.process.exe = "/bin/server";
    s.process.start_ns = 1000;
    s.marker.index = index;
    s.marker.label = "m" + std::to_string(index);
    s.marker.time_ns = 1000 + index * 1000000000ull;
    s.totals.events = events;
    s.modules.push_back(SnapshotModule{ModuleRecord{1, 0, 0, 0, 0, "[jit]", ""}, true});
    return s;
}

void add(Snapshot& s, uint32_t stack, std::vector<uint64_t> frames, uint64_t bytes, uint64_t blocks) {
    std::vector<StackFrame> f;
    for (uint64_t v : frames) f.push_back(StackFrame{1, v});
    s.stacks[stack] = f;
    s.entries.push_back(SnapshotEntry{stack, EntryKind::Heap, bytes, blocks, 0, 0});
    s.totals.live_bytes += bytes;
    s.totals.live_blocks += blocks;
}

// Five moments of one process: a leak (+1000 bytes a step), a cache that
// fills in two steps (0x20), noise (0x30), a site that never changes
// (0x40), and a second leaking stack in the leak's function (0x11).
std::vector<Snapshot> five_moments() {
    const uint64_t leak[] = {1000, 2000, 3000, 4000, 5000};
    const uint64_t cache[] = {0, 4096, 8192, 8192, 8192};
    const uint64_t noise[] = {10240, 12288, 9216, 13312, 10240};
    std::vector<Snapshot> out;
    for (uint32_t i = 0; i < 5; ++i) {
        Snapshot s = moment(i + 1, 100 * (i + 1));
        // Stack ids differ between moments on purpose: sites match by frames.
        add(s, 10 + i, {0x10, 0x99}, leak[i], leak[i] / 100);
        if (cache[i]) add(s, 20 + i, {0x20, 0x99}, cache[i], cache[i] / 1024);
        add(s, 30 + i, {0x30, 0x99}, noise[i], noise[i] / 1024);
        add(s, 40 + i, {0x40, 0x99}, 777, 1);
        add(s, 50 + i, {0x11, 0x98}, 10 * (i + 1), i + 1);
        out.push_back(std::move(s));
    }
    return out;
}

std::string first_label(const TrendEntry& e) { return frame_label(e.frames.at(0)); }

}  // namespace

TEST_CASE("leak confidence: leak, cache, noise, pauses") {
    CHECK(score({0, 1, 2, 3, 4}) == 1.0);
    CHECK(score({1000, 2000, 3000}) == 1.0);
    CHECK(score({0, 4, 8, 8, 8}) == 0.3);
    CHECK(score({0, 8, 8, 8, 8}) == 0.1);
    CHECK(score({10, 12, 9, 13, 10}) == 0.0);  // gives back all it took
    CHECK(score({0, 1, 2, 3, 3}) == 0.6);      // paused in the last step
    CHECK(score({0, 1, 1, 2, 3}) == 0.8);      // paused in the second step
    CHECK(score({0, 100, 90, 190, 290}) == doctest::Approx(0.8 * (290.0 / 300.0)).epsilon(1e-4));
    CHECK(score({100, 120, 90, 130, 125}) == 0.1667);  // (1+3)/10 * 25/60, rounded
    CHECK(score({5, 4, 3}) == 0.0);
    CHECK(score({7, 7, 7}) == 0.0);
    CHECK(score({7}) == 0.0);
    CHECK(score({}) == 0.0);
    CHECK(score({0, 0, 8}) == doctest::Approx(0.6667));
    CHECK(score({0, 8, 8}) == doctest::Approx(0.3333));
    CHECK(score({0, 1, 2, 3, 4}) >= kLeakFlag);
    CHECK(score({0, 1, 1, 2, 3}) >= kLeakFlag);
    CHECK(score({0, 1, 2, 2, 3}) < kLeakFlag);
}

TEST_CASE("leak confidence weighs the size of each step against the median step") {
    const uint64_t kib = 1024;
    // A cache warming up: 98.3 -> 178.1 -> 181.4 -> 181.8 KiB. It grew in
    // every step, but its last step (409 bytes) is 0.12 of the median step
    // (3380): (1 + 2 + 3 * 409/3380) / 6.
    CHECK(score({100659, 182374, 185754, 186163}) == 0.5605);
    CHECK(score({100659, 182374, 185754, 186163}) < kLeakFlag);
    CHECK(score({0, 100, 101}) == 0.3465);  // (1 + 2 * 1/50.5) / 3

    // A steady leak, +10 KiB a step.
    CHECK(score({100 * kib, 110 * kib, 120 * kib, 130 * kib, 140 * kib, 150 * kib}) == 1.0);
    // The same leak after the warm-up's first step: the median step is the
    // leak's, whatever the warm-up before it.
    CHECK(score({100659, 182374, 192614, 202854, 213094}) == 1.0);
    // Noisy growth, steps of 9, 14, 6, 12, 8, 11 KiB (median 10):
    // (0.9 + 2 + 3 * 0.6 + 4 + 5 * 0.8 + 6) / 21.
    CHECK(score({50 * kib, 59 * kib, 73 * kib, 79 * kib, 91 * kib, 99 * kib, 110 * kib}) == 0.8905);
    // With one step down, steps of 12, -2, 11, 9, 10 KiB (median 10):
    // (1 + 3 + 4 * 0.9 + 5) / 15 * 40/42.
    CHECK(score({50 * kib, 62 * kib, 60 * kib, 71 * kib, 80 * kib, 90 * kib}) == 0.8);
    CHECK(score({50 * kib, 59 * kib, 73 * kib, 79 * kib, 91 * kib, 99 * kib, 110 * kib}) >= kLeakFlag);

    // One big final allocation: alone it is one late step of growth (the
    // median step is 0, so each step that grew counts 1); after the
    // warm-up it counts 1 but lifts the median to 27 KiB, against which
    // the warm-up's late steps count little; after a steady leak it does
    // not lift the median.
    CHECK(score({180 * kib, 180 * kib, 180 * kib, 180 * kib, 230 * kib}) == 0.4);
    CHECK(score({100659, 182374, 185754, 186163, 186163 + 50 * kib}) == 0.5293);
    CHECK(score({100 * kib, 110 * kib, 120 * kib, 130 * kib, 140 * kib, 240 * kib}) == 1.0);

    // The examples of formats/trend-json.md.
    CHECK(score({0, 80, 90, 100, 110}) == 1.0);
    CHECK(score({0, 10, 20, 30, 130}) == 1.0);
    CHECK(score({0, 9, 23, 29, 41}) == 0.8571);
    CHECK(score({0, 80, 84, 86, 87}) == 0.6333);
    CHECK(score({0, 80, 84, 86, 136}) == 0.5519);
    CHECK(score({5, 5, 5, 5, 9}) == 0.4);
}

TEST_CASE("trend: only the leak is flagged; the cache and the noise rank below it") {
    std::vector<Snapshot> ms = five_moments();
    Symbolizer sym;
    TrendResult t = trend(ms, TrendOptions{}, sym);
    REQUIRE(t.entries.size() == 4);  // the constant site is left out
    CHECK(t.shown == 4);
    // Two leaks at 1.0: the larger growth first.
    CHECK(first_label(t.entries[0]) == "[jit]+0x10");
    CHECK(t.entries[0].leak_confidence == 1.0);
    CHECK(t.entries[0].series == std::vector<uint64_t>{1000, 2000, 3000, 4000, 5000});
    CHECK(t.entries[0].blocks_series == std::vector<uint64_t>{10, 20, 30, 40, 50});
    CHECK(t.entries[0].bytes_delta == 4000);
    CHECK(t.entries[0].blocks_delta == 40);
    CHECK(t.entries[0].monotonic);
    CHECK(first_label(t.entries[1]) == "[jit]+0x11");
    CHECK(t.entries[1].leak_confidence == 1.0);
    CHECK(first_label(t.entries[2]) == "[jit]+0x20");
    CHECK(t.entries[2].leak_confidence == 0.3);
    CHECK(t.entries[2].series == std::vector<uint64_t>{0, 4096, 8192, 8192, 8192});
    CHECK(t.entries[2].monotonic);
    CHECK(first_label(t.entries[3]) == "[jit]+0x30");
    CHECK(t.entries[3].leak_confidence == 0.0);
    CHECK_FALSE(t.entries[3].monotonic);
    size_t flagged = 0;
    for (const TrendEntry& e : t.entries) flagged += e.leak_confidence >= kLeakFlag;
    CHECK(flagged == 2);

    nlohmann::json j = trend_to_json(ms, t);
    CHECK(j["format"] == "heapsnap-trend");
    CHECK(j["version"] == 2);
    REQUIRE(j["moments"].size() == 5);
    CHECK(j["moments"][0]["pid"] == 5);
    CHECK(j["moments"][0]["exe"] == "/bin/server");
    CHECK(j["moments"][0]["label"] == "m1");
    CHECK(j["moments"][0]["time_s"] == 1.0);
    CHECK(j["moments"][4]["live_bytes"] == 5000 + 8192 + 10240 + 777 + 50);
    CHECK(j["moments"][4]["live_blocks"] == 50 + 8 + 10 + 1 + 5);
    REQUIRE(j["entries"].size() == 4);
    CHECK(j["entries"][0]["series"] == nlohmann::json::array({1000, 2000, 3000, 4000, 5000}));
    CHECK(j["entries"][0]["blocks_series"] == nlohmann::json::array({10, 20, 30, 40, 50}));
    CHECK(j["entries"][0]["leak_confidence"] == 1.0);
    CHECK(j["entries"][0]["flagged"] == true);
    CHECK(j["entries"][0]["bytes_delta"] == 4000);
    CHECK(j["entries"][0]["frames"][0]["offset"] == 0x10);
    CHECK(j["entries"][0]["frames"][1]["offset"] == 0x99);
    CHECK(j["entries"][2]["leak_confidence"] == 0.3);
    CHECK(j["entries"][2]["flagged"] == false);

    CHECK(render_trend_csv(ms, t) ==
          "leak_confidence,bytes_delta,blocks_delta,monotonic,kind,allocating_frame,stack,bytes_1,bytes_2,bytes_3,"
          "bytes_4,bytes_5\n"
          "1.0000,4000,40,1,heap,[jit]+0x10,[jit]+0x10;[jit]+0x99,1000,2000,3000,4000,5000\n"
          "1.0000,40,4,1,heap,[jit]+0x11,[jit]+0x11;[jit]+0x98,10,20,30,40,50\n"
          "0.3000,8192,8,1,heap,[jit]+0x20,[jit]+0x20;[jit]+0x99,0,4096,8192,8192,8192\n"
          "0.0000,0,0,0,heap,[jit]+0x30,[jit]+0x30;[jit]+0x99,10240,12288,9216,13312,10240\n");

    // Growth from the first to the last moment, as a flame graph's input.
    CHECK(render_folded(flame_stacks_of_trend(t)) ==
          "[jit]+0x98;[jit]+0x11 40\n"
          "[jit]+0x99;[jit]+0x10 4000\n"
          "[jit]+0x99;[jit]+0x20 8192\n");

    std::string text = render_trend_text(ms, t, true, false);
    CHECK(text.find("heapsnap trend: 5 moments, 4 call sites changed, 2 flagged as leaking (confidence >= 0.75)\n") ==
          0);
    CHECK(text.find("LEAK  confidence 1.00       +4000 (+40 blocks)  heap  monotonic\n"
                    "      live: 1000 -> 2000 -> 3000 -> 4000 -> 5000\n") != std::string::npos);
    CHECK(text.find("      confidence 0.30       +8192 (+8 blocks)  heap  monotonic\n") != std::string::npos);
}

TEST_CASE("trend: --top, --min-bytes, grouping by module") {
    std::vector<Snapshot> ms = five_moments();
    Symbolizer sym;
    TrendOptions o;
    o.top = 1;
    o.min_bytes = 100;  // the small leak (+40) and the noise (+0) go
    TrendResult t = trend(ms, o, sym);
    CHECK(t.entries.size() == 2);
    CHECK(t.shown == 1);
    CHECK(trend_to_json(ms, t)["entries"].size() == 1);
    CHECK(trend_to_json(ms, t)["changed_sites"] == 2);

    TrendOptions by_module;
    by_module.group_by = GroupBy::Module;
    TrendResult m = trend(ms, by_module, sym);
    REQUIRE(m.entries.size() == 1);  // everything is in [jit]
    CHECK(m.entries[0].series == std::vector<uint64_t>{1000 + 0 + 10240 + 777 + 10, 2000 + 4096 + 12288 + 777 + 20,
                                                       3000 + 8192 + 9216 + 777 + 30, 4000 + 8192 + 13312 + 777 + 40,
                                                       5000 + 8192 + 10240 + 777 + 50});
}

TEST_CASE("trend: a moment after an idle step (same process, same events) does not weaken a leak") {
    std::vector<Snapshot> ms = five_moments();
    Snapshot exit_moment = ms.back();  // "exit" right after the last marker, nothing in between
    exit_moment.marker.index = 6;
    exit_moment.marker.label = "exit";
    ms.push_back(exit_moment);
    Symbolizer sym;
    TrendResult t = trend(ms, TrendOptions{}, sym);
    CHECK(first_label(t.entries[0]) == "[jit]+0x10");
    CHECK(t.entries[0].leak_confidence == 1.0);
    CHECK(t.entries[0].series.size() == 6);

    // The same flat step with events in it is a real pause.
    ms.back().totals.events += 1;
    TrendResult paused = trend(ms, TrendOptions{}, sym);
    CHECK(paused.entries[0].leak_confidence == doctest::Approx(10.0 / 15.0).epsilon(1e-4));
}

TEST_CASE("trend: moments of different programs are compared with a warning") {
    std::vector<Snapshot> ms = five_moments();
    ms[2].process.exe = "/bin/other";
    Symbolizer sym;
    TrendResult t = trend(ms, TrendOptions{}, sym);
    REQUIRE_FALSE(t.warnings.empty());
    CHECK(t.warnings[0] == "the moments are of different programs (/bin/server and /bin/other)");
}
