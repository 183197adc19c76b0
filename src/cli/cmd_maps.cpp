// `heapsnap maps PID|SNAPSHOT`: the address-space summary, like WinDbg's
// `!address -summary`. A PID is read live from /proc (any process the user
// may read, recorded or not; without the recorder there are no tracked-bytes
// rows); a snapshot carries what its marker captured.
#include <sys/stat.h>

#include <iostream>
#include <memory>

#include "addrspace/smaps_read.h"
#include "addrspace/summary.h"
#include "report/address_space.h"
#include "cli/commands.h"
#include "cli/options.h"
#include "format/snapshot_file.h"
#include "report/render.h"
#include "util/error.h"
#include "util/human.h"

namespace heapsnap::cli {

Snapshot load_moment(const std::string& arg);

namespace {

struct MapsOptions {
    std::string target;
    std::string format = "text";
};

int maps(const MapsOptions& o) {
    addrspace::AddressSpaceSummary summary;
    uint64_t sample_bytes = 0;  // the tracked figures are estimates when sampled
    struct stat st;
    bool pid = !o.target.empty() && o.target.find_first_not_of("0123456789") == std::string::npos &&
               stat(o.target.c_str(), &st) != 0;
    if (pid) {
        std::string proc = "/proc/" + o.target;
        if (stat(proc.c_str(), &st) != 0) throw Error("no process with PID " + o.target);
        addrspace::SummaryInputs in;
        in.regions = addrspace::read_smaps_file(proc + "/smaps");
        addrspace::ProcessStatus status = addrspace::read_status_file(proc + "/status");
        in.threads = status.threads;
        in.allocator_name = addrspace::allocator_from_regions(in.regions);
        summary = addrspace::summarize(in);
    } else {
        Snapshot s = load_moment(o.target);
        if (!s.has_marker_data)
            throw Error(o.target + ": this moment has no address-space data (only markers capture it)");
        summary = summarize_snapshot(s);
        sample_bytes = s.process.sample_bytes;
    }
    if (o.format == "json") {
        nlohmann::json doc = addrspace::to_json(summary);
        doc["format"] = "heapsnap-maps";
        doc["version"] = 1;
        doc["sample_bytes"] = sample_bytes;
        std::cout << json_text(doc) << "\n";
    } else {
        std::cout << addrspace::render_text(summary, stdout_wants_color());
        if (sample_bytes) std::cout << sampling_note(sample_bytes) << "\n";
    }
    return kExitOk;
}

}  // namespace

void setup_maps(CLI::App& app, Action& action) {
    auto o = std::make_shared<MapsOptions>();
    CLI::App* sub = app.add_subcommand("maps", "Address-space summary of a process or a snapshot (!address -summary)");
    sub->add_option("target", o->target, "PID, .hsnap file, or LOG@MARKER")->required();
    sub->add_option("--format", o->format, "text or json")->check(one_of({"text", "json"}))->default_val("text");
    sub->footer(
        "Examples:\n  heapsnap maps 4242\n  heapsnap maps b.hsnap --format json\n  heapsnap maps app.hslog@exit");
    sub->callback([o, &action] { action = [o] { return maps(*o); }; });
}

}  // namespace heapsnap::cli
