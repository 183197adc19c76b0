// `heapsnap markers LOG`: one row per marker with the live heap at that
// moment (from a replay) and what the recorder measured then. JSON schema:
// formats/markers-json.md.
#include <fmt/format.h>

#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/options.h"
#include "replay/marker_select.h"
#include "util/human.h"
#include "util/text.h"

namespace heapsnap::cli {
namespace {

struct MarkersOptions {
    std::string log;
    std::string format = "text";
    bool bytes = false;
};

int markers(const MarkersOptions& o) {
    MarkerListing listing = list_markers(o.log);
    if (o.format == "json") {
        nlohmann::json rows = nlohmann::json::array();
        for (const MarkerRow& r : listing.rows)
            rows.push_back({{"index", r.marker.index},
                            {"time_s", r.time_s},
                            {"label", r.marker.label},
                            {"cause", marker_cause_name(r.marker.cause)},
                            {"live_bytes", r.live_bytes},
                            {"live_blocks", r.live_blocks},
                            {"mmap_bytes", r.mmap_bytes},
                            {"mmap_regions", r.mmap_regions},
                            {"rss_bytes", r.marker.rss_kb * 1024},
                            {"events", r.marker.events},
                            {"unrecorded", r.marker.unrecorded},
                            {"threads", r.marker.threads}});
        nlohmann::json doc = {{"format", "heapsnap-markers"},
                              {"version", 1},
                              {"log", o.log},
                              {"pid", listing.process.pid},
                              {"exe", listing.process.exe},
                              {"sample_bytes", listing.process.sample_bytes},
                              {"complete", listing.complete},
                              {"truncated", listing.truncated},
                              {"unrecorded", listing.unrecorded},
                              {"markers", std::move(rows)}};
        std::cout << json_text(doc) << "\n";
    } else {
        auto size = [&](uint64_t v) { return o.bytes ? std::to_string(v) : human_bytes(v); };
        std::cout << fmt::format("{:>4}  {:>10}  {:<20}  {:>12}  {:>11}  {:>12}  {:>12}  {:>7}\n", "#", "time (s)",
                                 "label", "live bytes", "live blocks", "RSS", "events", "threads");
        for (const MarkerRow& r : listing.rows)
            std::cout << fmt::format("{:>4}  {:>10.3f}  {:<20}  {:>12}  {:>11}  {:>12}  {:>12}  {:>7}\n",
                                     r.marker.index, r.time_s, terminal_safe(r.marker.label), size(r.live_bytes),
                                     r.live_blocks, size(r.marker.rss_kb * 1024), r.marker.events, r.marker.threads);
        if (listing.rows.empty()) std::cout << "(no markers)\n";
        if (listing.process.sample_bytes) std::cout << sampling_note(listing.process.sample_bytes) << "\n";
    }
    if (listing.truncated)
        warn(o.log + ": the log ends inside a frame; markers up to the last complete frame are shown");
    if (listing.unrecorded)
        warn(fmt::format("{}: {} event{} could not be recorded: the live figures may miss {}", o.log,
                         listing.unrecorded, listing.unrecorded == 1 ? "" : "s",
                         listing.unrecorded == 1 ? "it" : "them"));
    return kExitOk;
}

}  // namespace

void setup_markers(CLI::App& app, Action& action) {
    auto o = std::make_shared<MarkersOptions>();
    CLI::App* sub = app.add_subcommand("markers", "List the markers of a log with the live heap at each");
    sub->add_option("log", o->log, "The .hslog file")->required();
    sub->add_option("--format", o->format, "text or json")->check(one_of({"text", "json"}))->default_val("text");
    sub->add_flag("--bytes", o->bytes, "Exact byte counts instead of human-readable sizes");
    sub->footer(
        "Examples:\n  heapsnap markers app.hslog\n  heapsnap markers app.hslog --format json | jq '.markers[] | "
        "{label, live_bytes}'");
    sub->callback([o, &action] { action = [o] { return markers(*o); }; });
}

}  // namespace heapsnap::cli
