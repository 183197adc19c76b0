// `heapsnap report`: one moment of a process explained, the way DebugDiag
// and heaptrack explain a dump — where the live heap is (top call sites by
// bytes and by blocks, top functions and modules), what it is made of
// (sizes, ages), and, when the moment comes from a log, how the process got
// there (peak, allocation counts, temporary allocations, allocation rate).
//
// Two inputs, one report:
// - a .hsnap holds the live heap per call site with the age of its oldest
//   and newest block, and totals (allocations, peak bytes and time) — so
//   the history sections are "not available for a snapshot";
// - LOG@MARKER replays the log once more up to the moment with
//   HistoryReplay (replay/replay.h), which adds the sizes of the live
//   blocks, temporaries per call site, the allocation timeline and the live
//   heap at the peak. The .hsnap format stays as it is: what a snapshot
//   would need to carry all of that is most of the log.
//
// Functions and modules are grouped by the first frame that is not an
// allocation function (is_allocation_frame in diff.h), the frame DebugDiag
// calls "the allocating function", so a leak through strdup or
// std::vector counts for the code that asked. Call sites are whole stacks
// matched by meaning as in diff (two raw stacks that symbolize the same
// are one site).
//
// Orders are total: bytes, then blocks, then the site's identity (its
// symbolized frames), so equal inputs give byte-identical output.
// JSON: formats/report-json.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "format/snapshot_file.h"
#include "replay/marker_select.h"
#include "replay/history.h"
#include "replay/replay.h"
#include "report/diff.h"
#include "report/flame.h"
#include "symbolize/symbolizer.h"

namespace heapsnap {

// glibc's default M_MMAP_THRESHOLD: blocks this large get their own mmap
// (unless the program tuned it, or glibc raised it after such a block was
// freed). The lower bound of SizeHistogram class 18.
inline constexpr uint64_t kLargeBlockBytes = 128 * 1024;

struct ReportOptions {
    std::vector<std::regex> exclude;  // frames whose label matches are dropped, as in diff
};

struct ReportSite {
    EntryKind kind = EntryKind::Heap;
    uint64_t bytes = 0;
    uint64_t blocks = 0;
    bool has_age = false;    // false at the peak (ages are not kept there)
    uint64_t oldest_ns = 0;  // allocation time of the oldest / newest live block, since process start
    uint64_t newest_ns = 0;
    bool has_activity = false;  // log only, not at the peak:
    uint64_t allocations = 0;   //   heap allocations the site made up to the moment
    uint64_t temporary = 0;     //   of those, temporary
    FrameList frames;           // innermost first
};

// A function or a module: the first frame outside the allocator.
struct ReportGroup {
    EntryKind kind = EntryKind::Heap;
    SymbolFrame frame;  // function: function (or module+offset) only; module: module only
    uint64_t bytes = 0;
    uint64_t blocks = 0;
    uint64_t sites = 0;  // call sites in the group
};

struct RateBucket {
    double start_s = 0;  // since process start
    double end_s = 0;
    uint64_t allocations = 0;  // allocation events (malloc family and mmap)
    double per_second = 0;
};

struct Report {
    uint64_t at_ns = 0;                  // the moment, since process start: ages are counted to it
    std::vector<ReportSite> sites;       // every site: bytes, blocks, identity
    std::vector<size_t> by_blocks;       // indices into sites: blocks, bytes, identity
    std::vector<ReportGroup> functions;  // bytes, blocks, identity
    std::vector<ReportGroup> modules;
    bool from_log = false;  // the fields below are set
    SizeHistogram sizes;
    uint64_t large_blocks = 0;  // live blocks of kLargeBlockBytes and more
    uint64_t large_bytes = 0;
    uint64_t heap_allocations = 0;
    uint64_t temporary = 0;
    std::vector<RateBucket> rate;
    uint64_t peak_blocks = 0;
    std::vector<ReportSite> peak_sites;       // heap sites at the peak: bytes, blocks, identity
    std::vector<ReportSite> temporary_sites;  // sites with temporaries: temporary, allocations, identity
    std::vector<std::string> warnings;
};

Report build_report(const Snapshot& moment, const LogHistory* history, const ReportOptions& options,
                    Symbolizer& symbolizer);

// Regroups the timeline's slices into at most `buckets` equal buckets
// covering [0, end_offset_ns] (whole slices, so the last bucket may end a
// little after it).
std::vector<RateBucket> rate_buckets(const AllocationTimeline& timeline, uint64_t end_offset_ns, size_t buckets);

// "[1 KiB, 2 KiB)" for class 11, "0 B" for class 0.
std::string size_class_label(size_t k);

struct ReportRender {
    std::string input;         // what was reported, as named on the command line
    size_t top = 10;           // 0: all
    bool exact_bytes = false;  // --bytes
    bool color = false;
};

std::string render_report_text(const Snapshot& moment, const Report& report, const ReportRender& how);
nlohmann::json report_to_json(const Snapshot& moment, const Report& report, size_t top);

enum class ReportTable { Sites, Functions, Modules, Sizes, Rate };
// One table of the report as CSV. Sizes and Rate throw heapsnap::Error for
// a report of a snapshot.
std::string render_report_csv(const Report& report, ReportTable table, size_t top);

// Live bytes per call site, every site (heap and mmap), for folded / svg.
std::vector<FlameStack> flame_stacks_of_live(const Report& report);

// The first frame that is not an allocation function (the last frame if
// all are); null for no frames.
const SymbolFrame* allocating_frame(const FrameList& frames);

}  // namespace heapsnap
