// `heapsnap diff OLD NEW`: which call sites grew between two moments.
// OLD and NEW are .hsnap files or LOG@MARKER. Output formats: text
// (UMDH-like), json (formats/diff-json.md), csv.
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "format/hslog.h"
#include "format/snapshot_file.h"
#include "replay/marker_select.h"
#include "report/diff.h"
#include "report/render.h"
#include "util/error.h"

namespace heapsnap::cli {
namespace {

struct DiffCliOptions {
    std::string old_arg;
    std::string new_arg;
    std::string format = "text";
    std::string group_by = "stack";
    size_t top = 0;
    uint64_t min_bytes = 0;
    std::vector<std::string> exclude;
    int64_t fail_above = -1;
    std::string color = "auto";
};

bool is_log(const std::string& path) {
    char head[sizeof hslog::kMagic];
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    return n == static_cast<ssize_t>(sizeof head) && std::memcmp(head, hslog::kMagic, sizeof head) == 0;
}

}  // namespace

// Shared with `maps`: a .hsnap, or LOG@MARKER.
Snapshot load_moment(const std::string& arg) {
    std::string log, moment;
    if (looks_like_snapshot(arg)) return read_snapshot(arg);
    if (split_log_at(arg, &log, &moment) && !looks_like_snapshot(log)) return snapshot_at(log, parse_moment(moment));
    if (is_log(arg)) throw Error(arg + " is a log: name a moment, e.g. " + arg + "@exit or " + arg + "@1");
    return read_snapshot(arg);  // reports the file's problem
}

namespace {

int run_diff(const DiffCliOptions& o) {
    Snapshot a = load_moment(o.old_arg);
    Snapshot b = load_moment(o.new_arg);
    DiffOptions options;
    static const std::pair<const char*, GroupBy> kGroups[] = {
        {"stack", GroupBy::Stack}, {"function", GroupBy::Function}, {"line", GroupBy::Line}, {"module", GroupBy::Module}};
    for (const auto& [name, value] : kGroups)
        if (o.group_by == name) options.group_by = value;
    options.top = o.top;
    options.min_bytes = o.min_bytes;
    for (const std::string& re : o.exclude) {
        try {
            options.exclude.emplace_back(re, std::regex::ECMAScript);
        } catch (const std::regex_error& e) {
            throw Error("--exclude '" + re + "': bad regular expression: " + e.what());
        }
    }
    Symbolizer symbolizer;
    DiffResult result = diff(a, b, options, symbolizer);
    for (const std::string& w : result.warnings) warn(w);
    bool color = o.color == "always" || (o.color == "auto" && stdout_wants_color());
    if (o.format == "json")
        std::cout << diff_to_json(a, b, result).dump(2) << "\n";
    else if (o.format == "csv")
        std::cout << render_diff_csv(result);
    else
        std::cout << render_diff_text(a, b, result, color);
    std::cout.flush();
    if (o.fail_above >= 0 && result.bytes_delta > o.fail_above) {
        std::cerr << "heapsnap: growth of " << result.bytes_delta << " bytes exceeds --fail-above " << o.fail_above << "\n";
        return kExitThreshold;
    }
    return kExitOk;
}

}  // namespace

void setup_diff(CLI::App& app, Action& action) {
    auto o = std::make_shared<DiffCliOptions>();
    CLI::App* sub = app.add_subcommand("diff", "Compare two moments call site by call site");
    sub->add_option("old", o->old_arg, "OLD: a .hsnap file or LOG@MARKER")->required();
    sub->add_option("new", o->new_arg, "NEW: a .hsnap file or LOG@MARKER")->required();
    sub->add_option("--format", o->format, "text, json or csv")
        ->check(CLI::IsMember({"text", "json", "csv"}))
        ->default_val(o->format);
    sub->add_option("--group-by", o->group_by, "stack, function, line or module")
        ->check(CLI::IsMember({"stack", "function", "line", "module"}))
        ->default_val(o->group_by);
    sub->add_option("--top", o->top, "Show only the first N entries");
    sub->add_option("--min-bytes", o->min_bytes, "Hide entries whose growth or shrinkage is below N bytes");
    sub->add_option("--exclude", o->exclude, "Drop frames whose function matches REGEX (repeatable)");
    sub->add_option("--fail-above", o->fail_above, "Exit with status 3 if the total growth exceeds BYTES")
        ->check(CLI::NonNegativeNumber);
    sub->add_option("--color", o->color, "auto, always or never")
        ->check(CLI::IsMember({"auto", "always", "never"}))
        ->default_val(o->color);
    sub->footer(
        "Examples:\n  heapsnap diff before.hsnap after.hsnap\n  heapsnap diff app.hslog@warm-up app.hslog@exit --format json\n"
        "  heapsnap diff a.hsnap b.hsnap --group-by function --top 10 --fail-above 1048576");
    sub->callback([o, &action] { action = [o] { return run_diff(*o); }; });
}

}  // namespace heapsnap::cli
