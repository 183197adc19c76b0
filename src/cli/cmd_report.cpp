// `heapsnap report SNAPSHOT|LOG[@MARKER]`: one moment explained — top call
// sites, functions and modules, sizes and ages of the live blocks, and for
// a log the way there (peak, temporaries, allocation rate). See
// report/report.h; JSON: formats/report-json.md.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/options.h"
#include "format/hslog.h"
#include "format/snapshot_file.h"
#include "replay/marker_select.h"
#include "report/flame.h"
#include "report/render.h"
#include "report/report.h"
#include "symbolize/symbol_cache.h"
#include "util/error.h"
#include "util/files.h"
#include "util/human.h"

namespace heapsnap::cli {
namespace {

struct ReportCliOptions {
    std::string target;
    std::string format = "text";
    size_t top = 10;
    bool bytes = false;
    std::string table = "sites";
    std::vector<std::string> exclude;
    std::string color = "auto";
};

int run_report(const ReportCliOptions& o) {
    // What the target is: a snapshot, LOG@MARKER, or a log (its exit).
    std::string log, moment_text;
    Snapshot moment;
    if (looks_like_snapshot(o.target)) {
        moment = read_snapshot(o.target);
    } else if (split_log_at(o.target, &log, &moment_text)) {
        if (looks_like_snapshot(log)) throw Error(o.target + ": a snapshot file has one moment; drop @" + moment_text);
    } else if (looks_like_log(o.target)) {
        log = o.target;
        moment_text = "exit";
    } else if (access(o.target.c_str(), R_OK) == 0) {
        open_regular_file(o.target);  // a FIFO, a device: says so
        throw Error(o.target + ": neither a heapsnap log nor a snapshot");
    } else if (size_t at = o.target.rfind('@'); at != std::string::npos && at > 0) {
        moment = read_snapshot(o.target.substr(0, at));  // LOG@MARKER: name the missing file
    } else {
        moment = read_snapshot(o.target);  // says why it cannot be read
    }
    bool picture = o.format == "folded" || o.format == "svg";
    std::optional<LogHistory> history;
    if (!log.empty()) {
        Moment at = parse_moment(moment_text);
        if (!picture) history = replay_history_to_marker(log, at, moment);
        if (!history) {
            moment = snapshot_at(log, at);
            if (!picture) history = replay_history(log, moment);
        }
    }

    ReportOptions options;
    for (const std::string& re : o.exclude) {
        try {
            options.exclude.emplace_back(re, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            throw Error("--exclude '" + re + "': bad regular expression: " + e.what());
        }
    }
    Symbolizer symbolizer(symbol_cache_dir_from_environment());
    Report report = build_report(moment, history ? &*history : nullptr, options, symbolizer);
    for (const std::string& w : report.warnings) warn(w);

    if (o.format == "json") {
        std::cout << json_text(report_to_json(moment, report, o.top)) << "\n";
    } else if (o.format == "csv") {
        static const std::pair<const char*, ReportTable> kTables[] = {{"sites", ReportTable::Sites},
                                                                      {"functions", ReportTable::Functions},
                                                                      {"modules", ReportTable::Modules},
                                                                      {"sizes", ReportTable::Sizes},
                                                                      {"rate", ReportTable::Rate}};
        ReportTable table = ReportTable::Sites;
        for (const auto& [name, value] : kTables)
            if (o.table == name) table = value;
        std::cout << render_report_csv(report, table, o.top);
    } else if (o.format == "folded") {
        std::cout << render_folded(flame_stacks_of_live(report));
    } else if (o.format == "svg") {
        FlameSvgOptions svg;
        svg.palette = FlamePalette::Live;
        svg.title = "Live heap of " + basename_of(moment.process.exe) + " at \"" + moment.marker.label + "\"";
        svg.subtitle = "pid " + std::to_string(moment.process.pid) + ", " + human_bytes(moment.totals.live_bytes) +
                       " in " + std::to_string(moment.totals.live_blocks) + " blocks, " +
                       human_bytes(moment.totals.mmap_bytes) + " mmapped";
        std::cout << render_flame_svg(flame_stacks_of_live(report), svg);
    } else {
        ReportRender how;
        how.input = o.target;
        how.top = o.top;
        how.exact_bytes = o.bytes;
        how.color = color_wanted(o.color);
        std::cout << render_report_text(moment, report, how);
    }
    std::cout.flush();
    return kExitOk;
}

}  // namespace

void setup_report(CLI::App& app, Action& action) {
    auto o = std::make_shared<ReportCliOptions>();
    CLI::App* sub = app.add_subcommand(
        "report", "One moment explained: top call sites, functions, modules, sizes, ages, peak, temporaries, rate");
    sub->add_option("target", o->target, "A .hsnap file, LOG@MARKER, or LOG (its exit: leaks at exit)")->required();
    sub->add_option("--format", o->format, "text, json, csv, folded (flame graph input) or svg (flame graph)")
        ->check(one_of({"text", "json", "csv", "folded", "svg"}))
        ->default_val(o->format);
    sub->add_option("--top", o->top, "Rows per list (0: all; folded and svg always show every call site)")
        ->check(count_in(0, UINT64_MAX))
        ->default_val(o->top);
    sub->add_flag("--bytes", o->bytes, "Exact byte counts instead of human-readable sizes (text)");
    sub->add_option("--table", o->table, "The table --format csv prints: sites, functions, modules, sizes or rate")
        ->check(one_of({"sites", "functions", "modules", "sizes", "rate"}))
        ->default_val(o->table);
    sub->add_option("--exclude", o->exclude, "Drop frames whose function matches REGEX (repeatable)");
    sub->add_option("--color", o->color, "auto, always or never")
        ->check(one_of({"auto", "always", "never"}))
        ->default_val(o->color);
    sub->footer(
        "A .hsnap holds the live heap per call site with ages; a log adds the sizes of the live blocks,\n"
        "the peak and its call sites, temporary allocations and the allocation rate (one more replay).\n\n"
        "Examples:\n"
        "  heapsnap report app.hslog                      leaks at exit\n"
        "  heapsnap report app.hslog@warm-up --top 20     the live heap at marker \"warm-up\"\n"
        "  heapsnap report app.hslog@peak                 the moment of most live heap\n"
        "  heapsnap report after.hsnap --bytes            a snapshot, exact byte counts\n"
        "  heapsnap report app.hslog --format json | jq '.functions[0]'\n"
        "  heapsnap report app.hslog --format csv --table sizes\n"
        "  heapsnap report app.hslog --format svg > live.svg\n"
        "  heapsnap report app.hslog --format folded | flamegraph.pl > live.svg");
    sub->callback([o, &action] { action = [o] { return run_report(*o); }; });
}

}  // namespace heapsnap::cli
