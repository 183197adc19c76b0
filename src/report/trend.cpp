#include "report/trend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "report/render.h"
#include "report/report.h"
#include "util/human.h"
#include "util/files.h"
#include "util/flat_map.h"
#include "util/text.h"

namespace heapsnap {
namespace {

// Orders frames as diff orders call sites: frame by frame by their
// identities (compare_frame_identities; the offset of a function group is
// its first member's and means nothing), a prefix first.
int compare_frames(const FrameList& a, const FrameList& b) {
    auto i = a.begin(), j = b.begin();
    for (; i != a.end() && j != b.end(); ++i, ++j)
        if (int c = compare_frame_identities(*i, *j)) return c;
    return (i == a.end() ? 0 : 1) - (j == b.end() ? 0 : 1);
}

// Sites of several moments matched by their frames' identities and kind,
// found by a hash of those and checked frame by frame.
class SiteMatcher {
public:
    // Forgets the frame hashes of the trees seen so far (a tree may be
    // freed, and another take its place).
    void next_moment() { hashed_ = nullptr; }

    // The number of the site of `frames`, or `count` (the number a new
    // one gets, recorded) if there is none among the `count` so far.
    size_t find_or_add(const FrameList& frames, EntryKind kind, const std::vector<TrendEntry>& sites) {
        uint64_t h = hash(frames, kind);
        bool added = false;
        uint32_t* first = first_.slot(h ? h : 1, &added);
        if (!added)
            for (uint32_t at = *first; at != kNone; at = next_[at])
                if (sites[at].kind == kind && compare_frames(sites[at].frames, frames) == 0) return at;
        auto at = static_cast<uint32_t>(next_.size());
        next_.push_back(added ? kNone : *first);
        *first = at;
        return at;
    }

private:
    static constexpr uint32_t kNone = UINT32_MAX;

    uint64_t hash(const FrameList& frames, EntryKind kind) {
        const CallTree* tree = frames.tree();
        if (tree != hashed_) {
            hashed_ = tree;
            frame_hash_.clear();
        }
        uint64_t h = static_cast<uint64_t>(kind) + 1;
        for (CallTree::Node n = frames.node(); n != CallTree::kRoot; n = tree->parent(n)) {
            uint32_t id = tree->frame_id(n);
            if (id >= frame_hash_.size()) frame_hash_.resize(std::max<size_t>(id + 1, tree->frame_count()), 0);
            if (!frame_hash_[id]) frame_hash_[id] = frame_identity_hash(tree->frame(id)) | 1;
            h = (h ^ frame_hash_[id]) * 0x9e3779b97f4a7c15ull;
        }
        return h ^ h >> 29;
    }

    FlatMap<uint32_t> first_;     // by hash: the first site of that hash
    std::vector<uint32_t> next_;  // by site: the next one of the same hash, or kNone
    const CallTree* hashed_ = nullptr;
    std::vector<uint64_t> frame_hash_;  // by frame id of hashed_; 0: not yet
};

std::string kind_name(EntryKind k) { return k == EntryKind::Heap ? "heap" : "mmap"; }

std::string signed_count(int64_t v) { return v > 0 ? fmt::format("+{}", v) : fmt::format("{}", v); }

}  // namespace

double leak_confidence(std::span<const uint64_t> series) {
    if (series.size() < 2) return 0;
    std::vector<double> steps;
    double up = 0, down = 0;
    for (size_t i = 1; i < series.size(); ++i) {
        if (series[i] > series[i - 1]) {
            steps.push_back(static_cast<double>(series[i] - series[i - 1]));
            up += steps.back();
        } else {
            steps.push_back(-static_cast<double>(series[i - 1] - series[i]));
            down -= steps.back();
        }
    }
    if (up <= down) return 0;

    std::vector<double> sorted = steps;
    std::sort(sorted.begin(), sorted.end());
    size_t mid = sorted.size() / 2;
    double typical = sorted.size() % 2 ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2;

    double weight_grown = 0, weight_all = 0;
    for (size_t i = 0; i < steps.size(); ++i) {
        auto w = static_cast<double>(i + 1);
        weight_all += w;
        if (steps[i] > 0) weight_grown += w * (typical > 0 ? std::min(1.0, steps[i] / typical) : 1.0);
    }
    double confidence = (weight_grown / weight_all) * ((up - down) / up);
    return std::round(confidence * 1e4) / 1e4;
}

TrendResult trend(const std::vector<Snapshot>& moments, const TrendOptions& options, Symbolizer& symbolizer) {
    TrendResult result;
    size_t n = moments.size();
    for (const Snapshot& s : moments)
        if (s.process.exe != moments.front().process.exe) {
            result.warnings.push_back(fmt::format("the moments are of different programs ({} and {})",
                                                  moments.front().process.exe, s.process.exe));
            break;
        }

    // Each moment grouped as diff groups it (against nothing), then the
    // groups matched across moments by their frames.
    std::vector<TrendEntry> sites;
    SiteMatcher matcher;
    DiffOptions grouping;
    grouping.group_by = options.group_by;
    grouping.exclude = options.exclude;
    for (size_t i = 0; i < n; ++i) {
        Snapshot nothing;
        nothing.process = moments[i].process;
        DiffResult d = diff(nothing, moments[i], grouping, symbolizer);
        matcher.next_moment();
        for (DiffEntry& e : d.entries) {
            size_t at = matcher.find_or_add(e.frames, e.kind, sites);
            if (at == sites.size()) {
                TrendEntry& t = sites.emplace_back();
                t.kind = e.kind;
                t.frames = std::move(e.frames);
                t.series.assign(n, 0);
                t.blocks_series.assign(n, 0);
            }
            TrendEntry& t = sites[at];
            t.series[i] += e.new_bytes;
            t.blocks_series[i] += e.new_blocks;
        }
    }
    std::vector<size_t> order(sites.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
        int c = compare_frames(sites[x].frames, sites[y].frames);
        return c ? c < 0 : sites[x].kind < sites[y].kind;
    });

    // Steps in which the process did nothing say nothing about growth.
    std::vector<size_t> scored{0};
    for (size_t i = 1; i < n; ++i) {
        const Snapshot& prev = moments[i - 1];
        const Snapshot& cur = moments[i];
        bool idle = prev.process.pid == cur.process.pid && prev.process.start_ns == cur.process.start_ns &&
                    prev.totals.events == cur.totals.events;
        if (!idle) scored.push_back(i);
    }

    for (size_t at : order) {
        TrendEntry& t = sites[at];
        bool constant = std::all_of(t.series.begin(), t.series.end(), [&](uint64_t v) { return v == t.series[0]; }) &&
                        std::all_of(t.blocks_series.begin(), t.blocks_series.end(),
                                    [&](uint64_t v) { return v == t.blocks_series[0]; });
        if (constant) continue;
        std::vector<uint64_t> series;
        for (size_t i : scored) series.push_back(t.series[i]);
        t.leak_confidence = leak_confidence(series);
        t.bytes_delta = static_cast<int64_t>(t.series.back()) - static_cast<int64_t>(t.series.front());
        t.blocks_delta = static_cast<int64_t>(t.blocks_series.back()) - static_cast<int64_t>(t.blocks_series.front());
        t.monotonic = t.bytes_delta > 0 && std::is_sorted(t.series.begin(), t.series.end());
        uint64_t magnitude = static_cast<uint64_t>(t.bytes_delta < 0 ? -t.bytes_delta : t.bytes_delta);
        if (magnitude < options.min_bytes) continue;
        result.entries.push_back(std::move(t));
    }
    std::stable_sort(result.entries.begin(), result.entries.end(), [](const TrendEntry& a, const TrendEntry& b) {
        return std::tie(b.leak_confidence, b.bytes_delta, b.blocks_delta) <
               std::tie(a.leak_confidence, a.bytes_delta, a.blocks_delta);
    });
    result.shown = options.top && options.top < result.entries.size() ? options.top : result.entries.size();
    for (const std::string& w : symbolizer.warnings()) result.warnings.push_back(w);
    return result;
}

std::string render_trend_text(const std::vector<Snapshot>& moments, const TrendResult& t, bool exact_bytes,
                              bool color) {
    auto paint = [&](const std::string& s, const char* code) {
        return color ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
    };
    auto size = [&](uint64_t v) { return exact_bytes ? std::to_string(v) : human_bytes(v); };
    auto signed_size = [&](int64_t v) { return exact_bytes ? signed_count(v) : human_bytes_signed(v); };
    size_t flagged = std::count_if(t.entries.begin(), t.entries.end(),
                                   [](const TrendEntry& e) { return e.leak_confidence >= kLeakFlag; });
    std::string out;
    out += paint("heapsnap trend", "1") +
           fmt::format(": {} moments, {} call sites changed, {} flagged as leaking (confidence >= {:.2f})\n",
                       moments.size(), t.entries.size(), flagged, kLeakFlag);
    for (size_t i = 0; i < moments.size(); ++i) {
        const Snapshot& s = moments[i];
        std::string label = terminal_safe(s.marker.label);
        std::string what = s.marker.index ? fmt::format("marker {} \"{}\"", s.marker.index, label)
                                          : fmt::format("moment \"{}\"", label);
        out += fmt::format("  {:>3}  pid {}  {}  {} at {:.3f} s  live {} in {} blocks\n", i + 1, s.process.pid,
                           terminal_safe(basename_of(s.process.exe)), what, s.time_s(), size(s.totals.live_bytes),
                           s.totals.live_blocks);
    }
    out += "\n";
    if (t.entries.empty()) out += "No call site changed.\n";
    for (size_t i = 0; i < t.shown; ++i) {
        const TrendEntry& e = t.entries[i];
        bool flag = e.leak_confidence >= kLeakFlag;
        std::string head = fmt::format("{:<4}  confidence {:.2f}  {:>10} ({} {})  {}{}", flag ? "LEAK" : "",
                                       e.leak_confidence, signed_size(e.bytes_delta), signed_count(e.blocks_delta),
                                       e.kind == EntryKind::Heap ? "blocks" : "regions", kind_name(e.kind),
                                       e.monotonic ? "  monotonic" : "");
        out += (flag ? paint(head, "1;31") : head) + "\n";
        std::string series;
        for (uint64_t v : e.series) series += (series.empty() ? "" : " -> ") + size(v);
        out += "      live: " + series + "\n";
        for (const SymbolFrame& f : e.frames) {
            std::string name = terminal_safe(frame_label(f));
            if (f.inlined) name += " [inlined]";
            std::string where = terminal_safe(f.file.empty() ? ""
                                              : f.line       ? fmt::format("{}:{}", f.file, f.line)
                                                             : f.file);
            out += fmt::format("        {:<40}  {:<32}  {}\n", name, where.empty() ? "" : paint(where, "2"),
                               paint(terminal_safe(basename_of(f.module)), "2"));
        }
        out += "\n";
    }
    if (t.shown < t.entries.size())
        out += fmt::format("({} more call sites not shown: --top)\n", t.entries.size() - t.shown);
    return out;
}

nlohmann::json trend_to_json(const std::vector<Snapshot>& moments, const TrendResult& t) {
    nlohmann::json ms = nlohmann::json::array();
    for (const Snapshot& s : moments) ms.push_back(moment_json(s));
    nlohmann::json entries = nlohmann::json::array();
    for (size_t i = 0; i < t.shown; ++i) {
        const TrendEntry& e = t.entries[i];
        nlohmann::json frames = nlohmann::json::array();
        for (const SymbolFrame& f : e.frames) frames.push_back(frame_json(f));
        entries.push_back({{"series", e.series},
                           {"blocks_series", e.blocks_series},
                           {"leak_confidence", e.leak_confidence},
                           {"flagged", e.leak_confidence >= kLeakFlag},
                           {"monotonic", e.monotonic},
                           {"bytes_delta", e.bytes_delta},
                           {"blocks_delta", e.blocks_delta},
                           {"kind", kind_name(e.kind)},
                           {"frames", std::move(frames)}});
    }
    return {{"format", "heapsnap-trend"},
            {"version", 2},
            {"moments", std::move(ms)},
            {"flag_threshold", kLeakFlag},
            {"changed_sites", t.entries.size()},
            {"entries", std::move(entries)},
            {"warnings", t.warnings}};
}

std::string render_trend_csv(const std::vector<Snapshot>& moments, const TrendResult& t) {
    std::string out = "leak_confidence,bytes_delta,blocks_delta,monotonic,kind,allocating_frame,stack";
    for (size_t i = 0; i < moments.size(); ++i) out += fmt::format(",bytes_{}", i + 1);
    out += "\n";
    for (size_t i = 0; i < t.shown; ++i) {
        const TrendEntry& e = t.entries[i];
        std::string stack;
        for (const SymbolFrame& f : e.frames) stack += (stack.empty() ? "" : ";") + frame_label(f);
        const SymbolFrame* site = allocating_frame(e.frames);
        out += fmt::format("{:.4f},{},{},{},{},{},{}", e.leak_confidence, e.bytes_delta, e.blocks_delta,
                           e.monotonic ? 1 : 0, kind_name(e.kind), csv_field(site ? frame_label(*site) : ""),
                           csv_field(stack));
        for (uint64_t v : e.series) out += fmt::format(",{}", v);
        out += "\n";
    }
    return out;
}

std::vector<FlameStack> flame_stacks_of_trend(const TrendResult& t) {
    std::vector<FlameStack> out;
    for (size_t i = 0; i < t.shown; ++i) {
        const TrendEntry& e = t.entries[i];
        if (e.bytes_delta > 0) out.push_back(flame_stack(e.frames, e.kind, static_cast<uint64_t>(e.bytes_delta)));
    }
    return out;
}

}  // namespace heapsnap
