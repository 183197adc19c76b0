#include "report/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>
#include <unordered_map>

#include "replay/marker_select.h"
#include "report/render.h"
#include "util/error.h"
#include "util/human.h"
#include "util/files.h"
#include "util/read_budget.h"
#include "util/text.h"

namespace heapsnap {
namespace {

// A frame's identity, as diff matches frames: its symbol when it has one,
// else module and offset.
std::string frame_key(const SymbolFrame& f) {
    if (!f.function.empty())
        return fmt::format("F\x1f{}\x1f{}\x1f{}\x1f{}", f.function, f.file, f.line, f.inlined ? 1 : 0);
    return fmt::format("A\x1f{}\x1f{:x}", f.module, f.offset);
}

uint64_t since_start(const Snapshot& s, uint64_t t) { return t >= s.process.start_ns ? t - s.process.start_ns : 0; }

// Sites of a snapshot's entries, merged by symbolized stack (equal frame
// identities frame by frame, as diff matches them), in identity order: by
// those identities in turn, then kind. A site's frames are a node of
// `tree`, which the moment, the peak and the temporaries share.
std::vector<ReportSite> collect_sites(const Snapshot& snap, StackSymbols& symbols,
                                      const std::shared_ptr<CallTree>& tree, bool with_age,
                                      const std::vector<StackActivity>* activity,
                                      const StackTable* more_stacks = nullptr) {
    symbols.use(snap, more_stacks);
    SiteIndex index(*tree);
    std::vector<ReportSite> sites;
    for (const SnapshotEntry& e : snap.entries) {
        CallTree::Node node = symbols.node(e.stack);
        bool fresh = false;
        size_t at = index.find_or_add(node, e.kind, &fresh);
        if (fresh) {
            // Its frames are a node of the tree, which charged each of its
            // nodes and distinct frames once.
            budget_take_memory(sizeof(ReportSite), "call sites");
            ReportSite& site = sites.emplace_back();
            site.kind = e.kind;
            site.frames = FrameList(tree, node);
            site.oldest_ns = e.oldest_ns;
            site.newest_ns = e.newest_ns;
        }
        ReportSite& site = sites[at];
        site.bytes += e.bytes;
        site.blocks += e.blocks;
        site.has_age = with_age;
        site.oldest_ns = std::min(site.oldest_ns, e.oldest_ns);
        site.newest_ns = std::max(site.newest_ns, e.newest_ns);
        if (activity && e.kind == EntryKind::Heap) {
            site.has_activity = true;
            if (e.stack < activity->size()) {
                site.allocations += (*activity)[e.stack].allocations;
                site.temporary += (*activity)[e.stack].temporary;
            }
        }
    }
    std::vector<ReportSite> out;
    out.reserve(sites.size());
    for (size_t at : index.identity_order()) out.push_back(std::move(sites[at]));
    return out;
}

void sort_by_bytes(std::vector<ReportSite>& v) {
    std::stable_sort(v.begin(), v.end(), [](const ReportSite& a, const ReportSite& b) {
        return std::tie(b.bytes, b.blocks) < std::tie(a.bytes, a.blocks);
    });
}

enum class GroupKind { Function, Module };

std::vector<ReportGroup> group_sites(const std::vector<ReportSite>& sites, GroupKind kind) {
    std::map<std::pair<std::string, EntryKind>, ReportGroup> groups;
    for (const ReportSite& site : sites) {
        const SymbolFrame* at = allocating_frame(site.frames);
        SymbolFrame shown;
        std::string key;
        if (at && kind == GroupKind::Function) {
            shown = *at;
            shown.line = 0;
            shown.inlined = false;
            if (!shown.function.empty()) shown.offset = 0;
            key = shown.function.empty() ? frame_key(shown) : "F\x1f" + shown.function;
        } else if (at) {
            shown.module = at->module;
            // A frame of no module (the paused site) keeps its name.
            if (at->module.empty()) shown.function = at->function;
            key = "M\x1f" + at->module;
        }
        auto [it, fresh] = groups.try_emplace({key, site.kind});
        if (fresh) {
            it->second.kind = site.kind;
            it->second.frame = shown;
        }
        it->second.bytes += site.bytes;
        it->second.blocks += site.blocks;
        it->second.sites++;
    }
    std::vector<ReportGroup> out;
    for (auto& [key, g] : groups) out.push_back(std::move(g));
    std::stable_sort(out.begin(), out.end(), [](const ReportGroup& a, const ReportGroup& b) {
        return std::tie(b.bytes, b.blocks) < std::tie(a.bytes, a.blocks);
    });
    return out;
}

// ---- text -------------------------------------------------------------------

struct Palette {
    bool on;
    std::string paint(const std::string& s, const char* code) const {
        return on ? fmt::format("\x1b[{}m{}\x1b[0m", code, s) : s;
    }
    std::string dim(const std::string& s) const { return paint(s, "2"); }
    std::string bold(const std::string& s) const { return paint(s, "1"); }
};

std::string human_duration(uint64_t ns) {
    if (ns < 1000) return fmt::format("{} ns", ns);
    double v = static_cast<double>(ns);
    if (ns < 1000000) return fmt::format("{:.1f} us", v / 1e3);
    if (ns < 1000000000) return fmt::format("{:.1f} ms", v / 1e6);
    if (ns < 60000000000ull) return fmt::format("{:.2f} s", v / 1e9);
    if (ns < 3600000000000ull) return fmt::format("{:.1f} min", v / 60e9);
    return fmt::format("{:.1f} h", v / 3600e9);
}

std::string location(const SymbolFrame& f) {
    if (f.file.empty()) return "";
    return terminal_safe(f.line ? fmt::format("{}:{}", basename_of(f.file), f.line) : basename_of(f.file));
}

// "leak_malloc  growth.c:66  (growth)": the allocating frame of a site.
std::string site_line(const FrameList& frames, const Palette& p) {
    const SymbolFrame* f = allocating_frame(frames);
    if (!f) return "[unknown]";
    std::string s = terminal_safe(frame_label(*f));
    if (f->inlined) s += " [inlined]";
    std::string loc = location(*f);
    if (!loc.empty()) s += "  " + p.dim(loc);
    if (!f->module.empty()) s += "  " + p.dim("(" + terminal_safe(basename_of(f->module)) + ")");
    return s;
}

std::string bar(uint64_t part, uint64_t whole, size_t width) {
    if (!whole || !part) return "";
    size_t n =
        static_cast<size_t>(static_cast<double>(part) * static_cast<double>(width) / static_cast<double>(whole) + 0.5);
    return std::string(std::max<size_t>(n, 1), '#');
}

// The line without trailing blanks (an empty bar column), with its newline.
std::string trimmed(std::string line) {
    line.erase(line.find_last_not_of(' ') + 1);
    return line + "\n";
}

size_t shown(size_t n, size_t top) { return top && top < n ? top : n; }

std::string kind_name(EntryKind k) { return k == EntryKind::Heap ? "heap" : "mmap"; }

// ---- json -------------------------------------------------------------------

nlohmann::json frames_json(const FrameList& frames) {
    nlohmann::json out = nlohmann::json::array();
    for (const SymbolFrame& f : frames) out.push_back(frame_json(f));
    return out;
}

nlohmann::json site_json(uint64_t at, const ReportSite& s) {
    auto age = [&](uint64_t t) {
        return s.has_age ? nlohmann::json(static_cast<double>(at > t ? at - t : 0) / 1e9) : nlohmann::json(nullptr);
    };
    return {{"bytes", s.bytes},
            {"blocks", s.blocks},
            {"kind", kind_name(s.kind)},
            {"age_oldest_s", age(s.oldest_ns)},
            {"age_newest_s", age(s.newest_ns)},
            {"allocations", s.has_activity ? nlohmann::json(s.allocations) : nlohmann::json(nullptr)},
            {"temporary", s.has_activity ? nlohmann::json(s.temporary) : nlohmann::json(nullptr)},
            {"frames", frames_json(s.frames)}};
}

nlohmann::json group_json(const ReportGroup& g) {
    return {{"bytes", g.bytes},
            {"blocks", g.blocks},
            {"kind", kind_name(g.kind)},
            {"sites", g.sites},
            {"frame", frame_json(g.frame)}};
}

}  // namespace

const SymbolFrame* allocating_frame(const FrameList& frames) {
    for (const SymbolFrame& f : frames)
        if (!is_allocation_frame(f)) return &f;
    return frames.empty() ? nullptr : &frames.back();
}

std::vector<RateBucket> rate_buckets(const AllocationTimeline& t, uint64_t end_offset_ns, size_t buckets) {
    std::vector<RateBucket> out;
    if (!buckets || !t.slice_ns) return out;
    size_t used = std::max<size_t>(t.counts.size(), end_offset_ns / t.slice_ns + 1);
    size_t per = (used + buckets - 1) / buckets;
    for (size_t start = 0; start < used; start += per) {
        size_t end = std::min(start + per, used);
        RateBucket b;
        for (size_t i = start; i < end && i < t.counts.size(); ++i) b.allocations += t.counts[i];
        b.start_s = static_cast<double>(start * t.slice_ns) / 1e9;
        b.end_s = static_cast<double>(end * t.slice_ns) / 1e9;
        b.per_second = static_cast<double>(b.allocations) / (b.end_s - b.start_s);
        out.push_back(b);
    }
    return out;
}

std::string size_class_label(size_t k) {
    if (k == 0) return "0 B";
    auto pow2 = [](size_t e) {
        static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
        return fmt::format("{} {}", uint64_t{1} << (e % 10), units[e / 10]);
    };
    return k < 64 ? fmt::format("[{}, {})", pow2(k - 1), pow2(k)) : fmt::format("[{}, 16 EiB)", pow2(k - 1));
}

Report build_report(const Snapshot& moment, const LogHistory* history, const ReportOptions& options,
                    Symbolizer& symbolizer) {
    Report r;
    r.at_ns = since_start(moment, moment.marker.time_ns);
    auto tree = std::make_shared<CallTree>();
    StackSymbols symbols(moment, symbolizer, options.exclude, *tree);
    r.sites = collect_sites(moment, symbols, tree, true, history ? &history->activity : nullptr,
                            history ? history->stacks.get() : nullptr);
    r.functions = group_sites(r.sites, GroupKind::Function);
    r.modules = group_sites(r.sites, GroupKind::Module);
    sort_by_bytes(r.sites);
    for (size_t i = 0; i < r.sites.size(); ++i) r.by_blocks.push_back(i);
    std::stable_sort(r.by_blocks.begin(), r.by_blocks.end(), [&](size_t a, size_t b) {
        return std::tie(r.sites[b].blocks, r.sites[b].bytes) < std::tie(r.sites[a].blocks, r.sites[a].bytes);
    });
    if (history) {
        r.from_log = true;
        r.sizes = history->sizes;
        for (size_t k = SizeHistogram::class_of(kLargeBlockBytes); k < SizeHistogram::kClasses; ++k) {
            r.large_blocks += r.sizes.blocks[k];
            r.large_bytes += r.sizes.bytes[k];
        }
        r.heap_allocations = history->heap_allocations;
        r.temporary = history->temporary;
        r.rate = rate_buckets(history->timeline, since_start(moment, moment.marker.time_ns), 20);
        r.peak_blocks = history->peak.totals.live_blocks;
        if (history->peak.totals.live_bytes) {
            r.peak_sites = collect_sites(history->peak, symbols, tree, false, nullptr, history->stacks.get());
            sort_by_bytes(r.peak_sites);
        }
        r.temporary_sites =
            collect_sites(history->temporary_stacks, symbols, tree, false, &history->activity, history->stacks.get());
        std::stable_sort(r.temporary_sites.begin(), r.temporary_sites.end(),
                         [](const ReportSite& a, const ReportSite& b) {
                             return std::tie(b.temporary, b.allocations) < std::tie(a.temporary, a.allocations);
                         });
    }
    tree->seal();
    r.warnings = symbolizer.warnings();
    return r;
}

namespace {

// The text report, one method per section.
class TextReport {
public:
    TextReport(const Snapshot& s, const Report& r, const ReportRender& how) : s_(s), r_(r), how_(how), p_{how.color} {}

    std::string render() {
        header();
        totals();
        sites_by_bytes();
        sites_by_blocks();
        groups(r_.functions, "allocating functions", false);
        groups(r_.modules, "allocating modules", true);
        sizes();
        peak();
        temporaries();
        rate();
        return std::move(out_);
    }

private:
    std::string size(uint64_t v) const { return how_.exact_bytes ? std::to_string(v) : human_bytes(v); }
    size_t rows(size_t n) const { return shown(n, how_.top); }
    double seconds(uint64_t t) const { return static_cast<double>(since_start(s_, t)) / 1e9; }
    void title(const std::string& text, const std::string& note = "") {
        out_ += "\n" + p_.bold(text) + (note.empty() ? "" : p_.dim(" " + note)) + "\n";
    }
    void columns(const std::string& text) { out_ += p_.dim(text) + "\n"; }

    void header() {
        out_ += p_.bold("heapsnap report") + "\n";
        std::string label = terminal_safe(s_.marker.label);
        std::string what = s_.marker.index ? fmt::format("marker {} \"{}\"", s_.marker.index, label)
                                           : fmt::format("moment \"{}\"", label);
        out_ += fmt::format("  pid {}  {}  {} at {:.3f} s\n", s_.process.pid,
                            terminal_safe(basename_of(s_.process.exe)), what, s_.time_s());
        if (s_.process.sample_bytes) out_ += "  " + sampling_note(s_.process.sample_bytes) + "\n";
        if (r_.from_log)
            out_ += fmt::format("  from the log {}\n", s_.source);
        else
            out_ += fmt::format("  from the snapshot {}{}\n", how_.input,
                                s_.source.empty() ? std::string() : " (of " + s_.source + ")");
    }

    void totals() {
        const SnapshotTotals& t = s_.totals;
        title("Totals");
        out_ += fmt::format("  live heap         {} in {} blocks\n", size(t.live_bytes), t.live_blocks);
        out_ += fmt::format("  live mmap         {} in {} regions\n", size(t.mmap_bytes), t.mmap_regions);
        if (t.peak_bytes)
            out_ += fmt::format("  peak heap         {} at {:.3f} s\n", size(t.peak_bytes), seconds(t.peak_time_ns));
        out_ += fmt::format("  allocations       {} (malloc family and mmap calls up to the moment)\n", t.allocations);
        if (r_.from_log)
            out_ += fmt::format("  temporary         {} ({:.1f} % of {} heap allocations)\n", r_.temporary,
                                percent(r_.temporary, r_.heap_allocations), r_.heap_allocations);
        else
            out_ += "  temporary         not available for a snapshot\n";
        out_ += fmt::format("  untracked frees   {}\n", t.untracked_frees);
        if (s_.process.attached)
            out_ += fmt::format("  freed, allocated before recording  {} blocks, {} bytes (usable sizes)\n",
                                t.freed_before_blocks, t.freed_before_bytes);
    }

    void sites_by_bytes() {
        size_t n = rows(r_.sites.size());
        title(fmt::format("Top {} of {} call sites by live bytes", n, r_.sites.size()));
        if (r_.sites.empty()) {
            out_ += "  nothing is live\n";
            return;
        }
        columns(fmt::format("  {:>3}  {:>10}  {:>8}  {:>10}  {:>10}  {}", "#", "bytes", "blocks", "oldest", "newest",
                            "(age of the oldest and newest live block)"));
        auto age = [&](uint64_t t) { return human_duration(r_.at_ns > t ? r_.at_ns - t : 0); };
        for (size_t i = 0; i < n; ++i) {
            const ReportSite& site = r_.sites[i];
            out_ += fmt::format("  {:>3}  {:>10}  {:>8}  {:>10}  {:>10}  {}\n", i + 1, size(site.bytes), site.blocks,
                                age(site.oldest_ns), age(site.newest_ns), kind_name(site.kind));
            for (const SymbolFrame& f : site.frames) {
                std::string name = terminal_safe(frame_label(f));
                if (f.inlined) name += " [inlined]";
                std::string where = location(f);
                out_ += fmt::format("        {:<40}  {:<32}  {}\n", name, where.empty() ? "" : p_.dim(where),
                                    p_.dim(terminal_safe(basename_of(f.module))));
            }
        }
    }

    void sites_by_blocks() {
        size_t n = rows(r_.by_blocks.size());
        if (!n) return;
        title(fmt::format("Top {} call sites by live blocks", n));
        columns(fmt::format("  {:>3}  {:>8}  {:>10}  {}", "#", "blocks", "bytes", "allocating frame"));
        for (size_t i = 0; i < n; ++i) {
            const ReportSite& site = r_.sites[r_.by_blocks[i]];
            out_ += fmt::format("  {:>3}  {:>8}  {:>10}  {}\n", i + 1, site.blocks, size(site.bytes),
                                site_line(site.frames, p_));
        }
    }

    void groups(const std::vector<ReportGroup>& v, const char* what, bool modules) {
        size_t n = rows(v.size());
        if (!n) return;
        title(fmt::format("Top {} {}", n, what), "(first frame outside the allocator)");
        columns(fmt::format("  {:>3}  {:>10}  {:>8}  {:>6}  {:>5}  {}", "#", "bytes", "blocks", "%", "sites",
                            modules ? "module" : "function"));
        for (size_t i = 0; i < n; ++i) {
            const ReportGroup& g = v[i];
            // A frame of no module (the paused site) is its own module row.
            bool named = modules && !g.frame.module.empty();
            std::string name = terminal_safe(named ? basename_of(g.frame.module) : frame_label(g.frame));
            if (!modules && !g.frame.module.empty())
                name += "  " + p_.dim("(" + terminal_safe(basename_of(g.frame.module)) + ")");
            if (g.kind == EntryKind::Mmap) name += "  [mmap]";
            uint64_t whole = g.kind == EntryKind::Heap ? s_.totals.live_bytes : s_.totals.mmap_bytes;
            out_ += fmt::format("  {:>3}  {:>10}  {:>8}  {:>6.1f}  {:>5}  {}\n", i + 1, size(g.bytes), g.blocks,
                                percent(g.bytes, whole), g.sites, name);
        }
    }

    void sizes() {
        title("Sizes of live heap blocks");
        if (!r_.from_log) {
            out_ += "  not available for a snapshot (report the log instead: heapsnap report LOG@MARKER)\n";
            return;
        }
        if (!s_.totals.live_blocks) {
            out_ += "  no live heap blocks\n";
            return;
        }
        uint64_t live = s_.totals.live_bytes;
        columns(fmt::format("  {:<22}  {:>8}  {:>10}  {:>6}", "size", "blocks", "bytes", "%"));
        for (size_t k = 0; k < SizeHistogram::kClasses; ++k) {
            if (!r_.sizes.blocks[k]) continue;
            out_ += trimmed(fmt::format("  {:<22}  {:>8}  {:>10}  {:>6.1f}  {:<30}{}", size_class_label(k),
                                        r_.sizes.blocks[k], size(r_.sizes.bytes[k]), percent(r_.sizes.bytes[k], live),
                                        bar(r_.sizes.bytes[k], live, 30),
                                        SizeHistogram::class_min(k) >= kLargeBlockBytes ? "  large" : ""));
        }
        out_ += fmt::format(
            "  large blocks (>= 128 KiB, glibc's default M_MMAP_THRESHOLD: each is its own mmap): "
            "{} blocks, {}, {:.1f} % of live bytes\n",
            r_.large_blocks, size(r_.large_bytes), percent(r_.large_bytes, live));
    }

    void peak() {
        title("Peak");
        const SnapshotTotals& t = s_.totals;
        if (!t.peak_bytes) {
            out_ += "  no heap allocation before the moment\n";
        } else if (!r_.from_log) {
            out_ += fmt::format("  {} at {:.3f} s; call sites at the peak: not available for a snapshot\n",
                                size(t.peak_bytes), seconds(t.peak_time_ns));
        } else {
            out_ += fmt::format("  {} in {} blocks at {:.3f} s\n", size(t.peak_bytes), r_.peak_blocks,
                                seconds(t.peak_time_ns));
            columns(fmt::format("  {:>3}  {:>10}  {:>8}  {}", "#", "bytes", "blocks", "allocating frame"));
            for (size_t i = 0; i < rows(r_.peak_sites.size()); ++i) {
                const ReportSite& site = r_.peak_sites[i];
                out_ += fmt::format("  {:>3}  {:>10}  {:>8}  {}\n", i + 1, size(site.bytes), site.blocks,
                                    site_line(site.frames, p_));
            }
        }
    }

    void temporaries() {
        title("Temporary allocations", "(freed before the thread's next allocation)");
        if (!r_.from_log) {
            out_ += "  not available for a snapshot\n";
            return;
        }
        if (r_.temporary_sites.empty()) {
            out_ += "  none\n";
            return;
        }
        columns(fmt::format("  {:>3}  {:>10}  {:>11}  {}", "#", "temporary", "allocations", "allocating frame"));
        for (size_t i = 0; i < rows(r_.temporary_sites.size()); ++i) {
            const ReportSite& site = r_.temporary_sites[i];
            out_ += fmt::format("  {:>3}  {:>10}  {:>11}  {}\n", i + 1, site.temporary, site.allocations,
                                site_line(site.frames, p_));
        }
    }

    void rate() {
        title("Allocation rate", "(malloc family and mmap calls per second)");
        if (!r_.from_log) {
            out_ += "  not available for a snapshot\n";
            return;
        }
        uint64_t most = 0;
        for (const RateBucket& b : r_.rate) most = std::max(most, b.allocations);
        // Enough decimals that consecutive bucket edges differ.
        double width = r_.rate.empty() ? 1 : r_.rate.front().end_s - r_.rate.front().start_s;
        int decimals = std::clamp(static_cast<int>(std::ceil(-std::log10(width))) + 1, 3, 9);
        columns(fmt::format("  {:>12}  {:>12}  {:>10}  {:>12}", "from s", "to s", "calls", "per second"));
        for (const RateBucket& b : r_.rate)
            out_ += trimmed(fmt::format("  {:>12.{}f}  {:>12.{}f}  {:>10}  {:>12.0f}  {}", b.start_s, decimals, b.end_s,
                                        decimals, b.allocations, b.per_second, bar(b.allocations, most, 30)));
    }

    const Snapshot& s_;
    const Report& r_;
    const ReportRender& how_;
    Palette p_;
    std::string out_;
};

}  // namespace

std::string render_report_text(const Snapshot& s, const Report& r, const ReportRender& how) {
    return TextReport(s, r, how).render();
}

nlohmann::json report_to_json(const Snapshot& s, const Report& r, size_t top) {
    auto sites = [&](const std::vector<ReportSite>& v) {
        nlohmann::json out = nlohmann::json::array();
        for (size_t i = 0; i < shown(v.size(), top); ++i) out.push_back(site_json(r.at_ns, v[i]));
        return out;
    };
    auto groups = [&](const std::vector<ReportGroup>& v) {
        nlohmann::json out = nlohmann::json::array();
        for (size_t i = 0; i < shown(v.size(), top); ++i) out.push_back(group_json(v[i]));
        return out;
    };
    nlohmann::json by_blocks = nlohmann::json::array();
    for (size_t i = 0; i < shown(r.by_blocks.size(), top); ++i)
        by_blocks.push_back(site_json(r.at_ns, r.sites[r.by_blocks[i]]));
    nlohmann::json totals = {
        {"live_bytes", s.totals.live_bytes},
        {"live_blocks", s.totals.live_blocks},
        {"mmap_bytes", s.totals.mmap_bytes},
        {"mmap_regions", s.totals.mmap_regions},
        {"allocations", s.totals.allocations},
        {"untracked_frees", s.totals.untracked_frees},
        {"freed_before_recording", s.process.attached ? nlohmann::json{{"blocks", s.totals.freed_before_blocks},
                                                                       {"bytes", s.totals.freed_before_bytes}}
                                                      : nlohmann::json(nullptr)},
        {"peak_bytes", s.totals.peak_bytes},
        {"peak_time_s", s.totals.peak_bytes
                            ? nlohmann::json(static_cast<double>(since_start(s, s.totals.peak_time_ns)) / 1e9)
                            : nlohmann::json(nullptr)},
        {"sites", r.sites.size()}};
    nlohmann::json sizes = nullptr;
    nlohmann::json history = nullptr;
    if (r.from_log) {
        nlohmann::json classes = nlohmann::json::array();
        for (size_t k = 0; k < SizeHistogram::kClasses; ++k) {
            if (!r.sizes.blocks[k]) continue;
            classes.push_back({{"min", SizeHistogram::class_min(k)},
                               {"max", SizeHistogram::class_max(k)},
                               {"blocks", r.sizes.blocks[k]},
                               {"bytes", r.sizes.bytes[k]},
                               {"large", SizeHistogram::class_min(k) >= kLargeBlockBytes}});
        }
        sizes = {{"classes", std::move(classes)},
                 {"large_threshold", kLargeBlockBytes},
                 {"large_blocks", r.large_blocks},
                 {"large_bytes", r.large_bytes}};
        nlohmann::json rate = nlohmann::json::array();
        for (const RateBucket& b : r.rate)
            rate.push_back({{"start_s", b.start_s},
                            {"end_s", b.end_s},
                            {"allocations", b.allocations},
                            {"per_second", b.per_second}});
        nlohmann::json peak = nullptr;
        if (s.totals.peak_bytes)
            peak = {{"time_s", static_cast<double>(since_start(s, s.totals.peak_time_ns)) / 1e9},
                    {"live_bytes", s.totals.peak_bytes},
                    {"live_blocks", r.peak_blocks},
                    {"sites", sites(r.peak_sites)}};
        history = {{"heap_allocations", r.heap_allocations},
                   {"temporary_allocations", r.temporary},
                   {"rate", std::move(rate)},
                   {"peak", std::move(peak)},
                   {"sites_by_temporary", sites(r.temporary_sites)}};
    }
    return {{"format", "heapsnap-report"},   {"version", 1},
            {"moment", moment_json(s)},      {"source_kind", r.from_log ? "log" : "snapshot"},
            {"totals", std::move(totals)},   {"sites_by_bytes", sites(r.sites)},
            {"sites_by_blocks", by_blocks},  {"functions", groups(r.functions)},
            {"modules", groups(r.modules)},  {"sizes", std::move(sizes)},
            {"history", std::move(history)}, {"warnings", r.warnings}};
}

std::string render_report_csv(const Report& r, ReportTable table, size_t top) {
    std::string out;
    auto stack_text = [](const FrameList& frames) {
        std::string s;
        for (const SymbolFrame& f : frames) s += (s.empty() ? "" : ";") + frame_label(f);
        return s;
    };
    auto opt = [](bool has, uint64_t v) { return has ? std::to_string(v) : std::string(); };
    switch (table) {
        case ReportTable::Sites:
            out = "bytes,blocks,kind,age_oldest_s,age_newest_s,allocations,temporary,allocating_frame,stack\n";
            for (size_t i = 0; i < shown(r.sites.size(), top); ++i) {
                const ReportSite& s = r.sites[i];
                const SymbolFrame* f = allocating_frame(s.frames);
                auto age = [&](uint64_t t) {
                    return fmt::format("{:.6f}", static_cast<double>(r.at_ns > t ? r.at_ns - t : 0) / 1e9);
                };
                out +=
                    fmt::format("{},{},{},{},{},{},{},{},{}\n", s.bytes, s.blocks, kind_name(s.kind), age(s.oldest_ns),
                                age(s.newest_ns), opt(s.has_activity, s.allocations), opt(s.has_activity, s.temporary),
                                csv_field(f ? frame_label(*f) : ""), csv_field(stack_text(s.frames)));
            }
            break;
        case ReportTable::Functions:
        case ReportTable::Modules: {
            bool functions = table == ReportTable::Functions;
            const std::vector<ReportGroup>& v = functions ? r.functions : r.modules;
            out = functions ? "bytes,blocks,kind,sites,function,file,module\n" : "bytes,blocks,kind,sites,module\n";
            for (size_t i = 0; i < shown(v.size(), top); ++i) {
                const ReportGroup& g = v[i];
                out += fmt::format("{},{},{},{},", g.bytes, g.blocks, kind_name(g.kind), g.sites);
                if (functions) out += csv_field(frame_label(g.frame)) + "," + csv_field(g.frame.file) + ",";
                bool named = functions || !g.frame.module.empty();
                out += csv_field(named ? g.frame.module : frame_label(g.frame)) + "\n";
            }
            break;
        }
        case ReportTable::Sizes:
            if (!r.from_log) throw Error("the size table is not available for a snapshot: report the log (LOG@MARKER)");
            out = "min,max,blocks,bytes,large\n";
            for (size_t k = 0; k < SizeHistogram::kClasses; ++k) {
                if (!r.sizes.blocks[k]) continue;
                out += fmt::format("{},{},{},{},{}\n", SizeHistogram::class_min(k), SizeHistogram::class_max(k),
                                   r.sizes.blocks[k], r.sizes.bytes[k],
                                   SizeHistogram::class_min(k) >= kLargeBlockBytes ? 1 : 0);
            }
            break;
        case ReportTable::Rate:
            if (!r.from_log) throw Error("the rate table is not available for a snapshot: report the log (LOG@MARKER)");
            out = "start_s,end_s,allocations,per_second\n";
            for (const RateBucket& b : r.rate)
                out += fmt::format("{:.6f},{:.6f},{},{:.1f}\n", b.start_s, b.end_s, b.allocations, b.per_second);
            break;
    }
    return out;
}

std::vector<FlameStack> flame_stacks_of_live(const Report& r) {
    std::vector<FlameStack> out;
    for (const ReportSite& s : r.sites) out.push_back(flame_stack(s.frames, s.kind, s.bytes));
    return out;
}

}  // namespace heapsnap
