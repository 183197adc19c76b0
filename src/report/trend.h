// Trends: the live bytes of every call site across N moments (oldest
// first), and how sure we are that a site leaks.
//
// Two moments cannot tell a leak from a cache that is still filling, or
// from a site that happened to be busy at the second moment; a series can.
// A leak keeps growing by similar amounts and is still growing at the end;
// a cache grows by a lot, then by less and less (a warm-up) or not at all;
// noise goes up and down around a level. The score looks at the steps
// d_i = s_i - s_(i-1) (i = 1 .. N-1) of a site's series s_0 .. s_(N-1) of
// live bytes:
//
//   typical step r = the median of the d_i
//   persistence  P = sum of i * c_i / sum of i (= N(N-1)/2), where step i
//                    counts c_i = min(1, d_i / r) when it grew (d_i > 0),
//                    else 0; when r <= 0, every step that grew counts 1.
//                    A step counts by how much of a typical step it grew,
//                    so the small late steps of a warm-up count little;
//                    growth at step i weighs i, so late steps count more.
//   net growth   M = (U - D) / U, U = sum of the d_i > 0, D = sum of |d_i < 0|,
//                    0 when D >= U: a site that gave back what it took is
//                    not leaking, however often it grew.
//
//   leak_confidence = P * M, in [0, 1], rounded to 4 decimals (0 when the
//   site never grew).
//
// The yardstick is the median, not the mean or the first steps' slope: a
// leak that has run for half of the window sets it whatever came before
// (the big first steps of a warm-up) or after (one big final allocation).
// Examples over 5 moments: a leak 0,1,2,3,4 scores 1, and so does a leak
// after a warm-up 0,80,90,100,110; a warm-up 0,80,84,86,87 scores 0.6333;
// a cache full at once 0,8,8,8,8 scores 0.1; noise 10,12,9,13,10 (U = 6,
// D = 6) scores 0; one late jump 5,5,5,5,9 scores 0.4. A site is flagged
// (text output: LEAK) at kLeakFlag and above. formats/trend-json.md has
// the reasoning and more examples.
//
// A step in which the process did nothing (two moments of one process
// with the same event count, e.g. the "exit" marker of a program that was
// idle after its last marker) says nothing about growth and is left out of
// the score; the series still shows both moments.
//
// Sites are matched across the moments by meaning (as diff matches them,
// with the same --group-by), absent = 0 bytes. Entries are sorted by
// confidence, then bytes_delta (last - first), then blocks_delta, then the
// site's identity, so equal inputs give identical output. JSON:
// formats/trend-json.md.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/snapshot_file.h"
#include "report/diff.h"
#include "report/flame.h"
#include "symbolize/symbolizer.h"

namespace heapsnap {

inline constexpr double kLeakFlag = 0.75;

// The score above, for a series of live bytes (oldest first).
double leak_confidence(std::span<const uint64_t> series);

struct TrendEntry {
    EntryKind kind = EntryKind::Heap;
    std::vector<uint64_t> series;         // live bytes per moment, oldest first
    std::vector<uint64_t> blocks_series;  // live blocks (mappings for mmap) per moment
    double leak_confidence = 0;
    int64_t bytes_delta = 0;  // last - first
    int64_t blocks_delta = 0;
    bool monotonic = false;  // grew and never shrank
    FrameList frames;        // innermost first
};

struct TrendOptions {
    GroupBy group_by = GroupBy::Stack;
    size_t top = 0;          // 0: all
    uint64_t min_bytes = 0;  // keep entries with |bytes_delta| >= min_bytes
    std::vector<std::regex> exclude;
};

struct TrendResult {
    // Sites whose series is not constant, sorted (above), after min_bytes
    // and before top.
    std::vector<TrendEntry> entries;
    size_t shown = 0;  // entries to show: --top applied
    std::vector<std::string> warnings;
};

TrendResult trend(const std::vector<Snapshot>& moments, const TrendOptions& options, Symbolizer& symbolizer);

std::string render_trend_text(const std::vector<Snapshot>& moments, const TrendResult& trend, bool exact_bytes,
                              bool color);
nlohmann::json trend_to_json(const std::vector<Snapshot>& moments, const TrendResult& trend);
std::string render_trend_csv(const std::vector<Snapshot>& moments, const TrendResult& trend);

// Growth from the first to the last moment per site (bytes_delta > 0), for
// folded / svg.
std::vector<FlameStack> flame_stacks_of_trend(const TrendResult& trend);

}  // namespace heapsnap
