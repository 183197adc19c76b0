// `heapsnap diff OLD NEW`: which call sites grew between two moments.
// OLD and NEW are .hsnap files or LOG@MARKER. Output formats: text
// (UMDH-like), json (formats/diff-json.md), csv, folded and svg (flame
// graph of the growth, report/flame.h).
//
// `heapsnap diff S1 S2 S3 ...` (three or more moments) and `LOG@*` (every
// marker of the log) show a trend instead: the series of every call site
// and its leak confidence (report/trend.h, formats/trend-json.md).
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <memory>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/options.h"
#include "format/hslog.h"
#include "format/snapshot_file.h"
#include "replay/marker_select.h"
#include "replay/replay.h"
#include "report/diff.h"
#include "report/flame.h"
#include "report/render.h"
#include "report/trend.h"
#include "symbolize/symbol_cache.h"
#include "util/error.h"
#include "util/human.h"

namespace heapsnap::cli {
namespace {

struct DiffCliOptions {
    std::string old_arg;
    std::string new_arg;
    std::vector<std::string> more;  // a trend: the third moment on
    std::string format = "text";
    std::string group_by = "stack";
    size_t top = 0;
    uint64_t min_bytes = 0;
    std::vector<std::string> exclude;
    int64_t fail_above = -1;
    std::string color = "auto";
    double fail_on_leak_confidence = -1;
    bool bytes = false;
};

}  // namespace

// Shared with `maps`: a .hsnap, or LOG@MARKER.
Snapshot load_moment(const std::string& arg) {
    std::string log, moment;
    if (looks_like_snapshot(arg)) return read_snapshot(arg);
    if (split_log_at(arg, &log, &moment)) {
        if (looks_like_snapshot(log)) throw Error(arg + ": a snapshot file has one moment; drop @" + moment);
        return snapshot_at(log, parse_moment(moment));
    }
    if (looks_like_log(arg)) throw Error(arg + " is a log: name a moment, e.g. " + arg + "@exit or " + arg + "@1");
    // LOG@MARKER whose LOG does not exist: name the file, not the whole argument.
    if (size_t at = arg.rfind('@'); at != std::string::npos && at > 0 && access(arg.c_str(), F_OK) != 0)
        return read_snapshot(arg.substr(0, at));
    return read_snapshot(arg);  // reports the file's problem
}

namespace {

// "LOG@*": every marker of LOG.
bool is_every_marker(const std::string& arg, std::string* log) {
    std::string moment;
    return arg.size() > 2 && arg.compare(arg.size() - 2, 2, "@*") == 0 && split_log_at(arg, log, &moment) &&
           moment == "*";
}

GroupBy group_by_of(const std::string& name) {
    static const std::pair<const char*, GroupBy> kGroups[] = {{"stack", GroupBy::Stack},
                                                              {"function", GroupBy::Function},
                                                              {"line", GroupBy::Line},
                                                              {"module", GroupBy::Module}};
    for (const auto& [n, value] : kGroups)
        if (name == n) return value;
    return GroupBy::Stack;
}

std::vector<std::regex> exclude_of(const std::vector<std::string>& patterns) {
    std::vector<std::regex> out;
    for (const std::string& re : patterns) {
        try {
            out.emplace_back(re, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            throw Error("--exclude '" + re + "': bad regular expression: " + e.what());
        }
    }
    return out;
}

std::string describe_for_picture(const Snapshot& s) {
    return "\"" + s.marker.label + "\" (" + fmt::format("{:.3f}", s.time_s()) + " s)";
}

// Grouping and filtering, shared by the two-moment diff and the trend.
template <class Options>
Options selection_of(const DiffCliOptions& o) {
    Options options;
    options.group_by = group_by_of(o.group_by);
    options.top = o.top;
    options.min_bytes = o.min_bytes;
    options.exclude = exclude_of(o.exclude);
    return options;
}

int run_trend(const DiffCliOptions& o) {
    std::vector<std::string> args{o.old_arg};
    if (!o.new_arg.empty()) args.push_back(o.new_arg);
    args.insert(args.end(), o.more.begin(), o.more.end());
    std::vector<Snapshot> moments;
    for (const std::string& arg : args) {
        std::string log;
        if (is_every_marker(arg, &log)) {
            std::vector<Snapshot> all = snapshot_every_marker(log);
            if (all.empty()) throw Error(log + ": the log has no markers");
            for (Snapshot& s : all) moments.push_back(std::move(s));
        } else {
            moments.push_back(load_moment(arg));
        }
    }
    if (moments.size() < 2) throw Error(o.old_arg + " has only one marker; a trend needs at least two moments");
    auto options = selection_of<TrendOptions>(o);
    Symbolizer symbolizer(symbol_cache_dir_from_environment());
    TrendResult result = trend(moments, options, symbolizer);
    for (const std::string& w : result.warnings) warn(w);
    bool color = color_wanted(o.color);
    if (o.format == "json") {
        std::cout << json_text(trend_to_json(moments, result)) << "\n";
    } else if (o.format == "csv") {
        std::cout << render_trend_csv(moments, result);
    } else if (o.format == "folded") {
        std::cout << render_folded(flame_stacks_of_trend(result));
    } else if (o.format == "svg") {
        FlameSvgOptions svg;
        svg.palette = FlamePalette::Growth;
        svg.title = "Growth of " + moments.front().process.exe.substr(moments.front().process.exe.rfind('/') + 1) +
                    " from " + describe_for_picture(moments.front()) + " to " + describe_for_picture(moments.back());
        std::vector<FlameStack> stacks = flame_stacks_of_trend(result);
        uint64_t grown = 0;
        for (const FlameStack& st : stacks) grown += st.value;
        svg.subtitle = fmt::format("{} moments; drawn: the {} call sites that grew from the first to the last, {}",
                                   moments.size(), stacks.size(), human_bytes_signed(static_cast<int64_t>(grown)));
        std::cout << render_flame_svg(stacks, svg);
    } else {
        std::cout << render_trend_text(moments, result, o.bytes, color);
    }
    std::cout.flush();
    auto total = [](const Snapshot& s) { return static_cast<int64_t>(s.totals.live_bytes + s.totals.mmap_bytes); };
    int64_t growth = total(moments.back()) - total(moments.front());
    if (o.fail_above >= 0 && growth > o.fail_above) {
        std::cerr << "heapsnap: growth of " << growth << " bytes exceeds --fail-above " << o.fail_above << "\n";
        return kExitThreshold;
    }
    if (o.fail_on_leak_confidence >= 0) {
        for (const TrendEntry& e : result.entries) {
            if (e.leak_confidence < o.fail_on_leak_confidence) continue;
            std::cerr << "heapsnap: a call site has leak confidence " << e.leak_confidence
                      << ", at or above --fail-on-leak-confidence " << o.fail_on_leak_confidence << "\n";
            return kExitThreshold;
        }
    }
    return kExitOk;
}

int run_diff(const DiffCliOptions& o) {
    std::string log;
    if (!o.more.empty() || is_every_marker(o.old_arg, &log) || is_every_marker(o.new_arg, &log)) return run_trend(o);
    Snapshot a = load_moment(o.old_arg);
    Snapshot b = load_moment(o.new_arg);
    auto options = selection_of<DiffOptions>(o);
    Symbolizer symbolizer(symbol_cache_dir_from_environment());
    DiffResult result = diff(a, b, options, symbolizer);
    for (const std::string& w : result.warnings) warn(w);
    bool color = color_wanted(o.color);
    if (o.format == "json")
        std::cout << json_text(diff_to_json(a, b, result)) << "\n";
    else if (o.format == "csv")
        std::cout << render_diff_csv(result) << render_freed_before_csv(a, b);
    else if (o.format == "folded")
        std::cout << render_folded(flame_stacks_of_growth(result));
    else if (o.format == "svg") {
        FlameSvgOptions svg;
        svg.palette = FlamePalette::Growth;
        svg.title = "Growth of " + b.process.exe.substr(b.process.exe.rfind('/') + 1) + " from " +
                    describe_for_picture(a) + " to " + describe_for_picture(b);
        std::vector<FlameStack> stacks = flame_stacks_of_growth(result);
        uint64_t grown = 0;
        for (const FlameStack& st : stacks) grown += st.value;
        svg.subtitle = "net " + human_bytes_signed(result.bytes_delta) + "; drawn: the " +
                       std::to_string(stacks.size()) + " call sites that grew, " + human_bytes_signed(grown);
        std::cout << render_flame_svg(stacks, svg);
    } else
        write_diff_text(std::cout, a, b, result, color);
    std::cout.flush();
    if (o.fail_above >= 0 && result.bytes_delta > o.fail_above) {
        std::cerr << "heapsnap: growth of " << result.bytes_delta << " bytes exceeds --fail-above " << o.fail_above
                  << "\n";
        return kExitThreshold;
    }
    return kExitOk;
}

}  // namespace

void setup_diff(CLI::App& app, Action& action) {
    auto o = std::make_shared<DiffCliOptions>();
    CLI::App* sub = app.add_subcommand(
        "diff", "Compare two moments call site by call site; three or more (or LOG@*): a trend with leak confidence");
    sub->add_option("old", o->old_arg, "OLD: a .hsnap file or LOG@MARKER; LOG@* for every marker (a trend)")
        ->required();
    sub->add_option("new", o->new_arg, "NEW: a .hsnap file or LOG@MARKER");
    sub->add_option("more", o->more, "Further moments: three or more make a trend");
    sub->add_option("--format", o->format, "text, json, csv, folded (flame graph input) or svg (flame graph)")
        ->check(one_of({"text", "json", "csv", "folded", "svg"}))
        ->default_val(o->format);
    sub->add_option("--group-by", o->group_by, "stack, function, line or module")
        ->check(one_of({"stack", "function", "line", "module"}))
        ->default_val(o->group_by);
    sub->add_option("--top", o->top, "Show only the first N entries")->check(count_in(0, UINT64_MAX));
    sub->add_option("--min-bytes", o->min_bytes,
                    "Hide entries whose growth or shrinkage is below BYTES (suffixes K, M, G, T: 1024 each)")
        ->transform(bytes_in(0, UINT64_MAX));
    sub->add_option("--exclude", o->exclude, "Drop frames whose function matches REGEX (repeatable)");
    sub->add_option("--fail-above", o->fail_above,
                    "Exit with status 3 if the total growth exceeds BYTES (suffixes K, M, G, T: 1024 each)")
        ->transform(bytes_in(0, INT64_MAX));
    sub->add_option("--fail-on-leak-confidence", o->fail_on_leak_confidence,
                    "Trend: exit with status 3 if a call site's leak confidence is at least X (0..1)")
        ->check(number_in(0, 1, ""));
    sub->add_flag("--bytes", o->bytes, "Trend text: exact byte counts instead of human-readable sizes");
    sub->add_option("--color", o->color, "auto, always or never")
        ->check(one_of({"auto", "always", "never"}))
        ->default_val(o->color);
    sub->footer(
        "Examples:\n  heapsnap diff before.hsnap after.hsnap\n  heapsnap diff app.hslog@warm-up app.hslog@exit "
        "--format json\n"
        "  heapsnap diff a.hsnap b.hsnap --group-by function --top 10 --fail-above 1048576\n"
        "  heapsnap diff a.hsnap b.hsnap --format svg > growth.svg\n"
        "  heapsnap diff a.hsnap b.hsnap --format folded | flamegraph.pl > growth.svg\n"
        "Trends (three or more moments, or every marker of a log):\n"
        "  heapsnap diff s1.hsnap s2.hsnap s3.hsnap s4.hsnap\n"
        "  heapsnap diff 'app.hslog@*' --fail-on-leak-confidence 0.9 --min-bytes 4096");
    sub->callback([o, &action] {
        std::string log;
        bool trend = !o->more.empty() || is_every_marker(o->old_arg, &log) || is_every_marker(o->new_arg, &log);
        // A LOG@* whose LOG does not exist is still meant as a trend: let
        // the run say which file is missing instead of "new is required".
        bool every = o->old_arg.size() > 2 && o->old_arg.compare(o->old_arg.size() - 2, 2, "@*") == 0;
        if (o->new_arg.empty() && !trend && !every) throw CLI::RequiredError("new");
        if (o->fail_on_leak_confidence >= 0 && !trend)
            throw CLI::ValidationError("--fail-on-leak-confidence",
                                       "needs a trend: three or more moments, or LOG@* (every marker of a log)");
        action = [o] { return run_diff(*o); };
    });
}

}  // namespace heapsnap::cli
