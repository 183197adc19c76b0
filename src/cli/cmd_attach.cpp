// `heapsnap attach PID` and `heapsnap detach PID`: recording a process
// that was started without heapsnap, from now on, and ending it.
//
// attach loads the recorder into the process (cli/inject.h) with the
// settings `heapsnap run` would pass in the environment
// (cli/recorder_settings.h), prints the log's path and how long the
// thread it used was stopped. From then on the process is recorded as
// under `heapsnap run` (docs/design/attach.md says where it differs).
// detach asks the recorder over the control socket to end the log
// (formats/control.md, `detach`): its hooks are unbound, the log ends
// with the marker `detach`, the process runs on without recording.
#include <unistd.h>

#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/control_client.h"
#include "cli/inject.h"
#include "cli/options.h"
#include "cli/recorder_settings.h"
#include "cli/recording_settings.h"
#include "util/error.h"
#include "util/text.h"

namespace heapsnap::cli {
namespace {

struct AttachOptions {
    pid_t pid = 0;
    RecorderSettings recorder;
    SteeringSettings steering;
};

struct DetachOptions {
    pid_t pid = 0;
    double timeout = 30;
};

int attach(const AttachOptions& o) {
    std::string library = find_preload_library();
    std::vector<std::pair<std::string, std::string>> settings = recorder_variables(o.recorder);
    for (auto& variable : steering_environment(o.steering))
        if (!variable.second.empty()) settings.push_back(std::move(variable));
    Injected done = inject_recorder(o.pid, library, settings);
    std::cerr << "heapsnap: log: " << terminal_safe(done.log) << "\n";
    std::cerr << fmt::format("heapsnap: attached in {:.1f} ms\n", done.stopped_ms);
    return kExitOk;
}

int detach(const DetachOptions& o) {
    check_process(o.pid, "detach from");
    std::optional<ProcessUids> uids = process_uids(o.pid);
    if (!uids) throw AttachRefused(kExitNoProcess, "no process with PID " + std::to_string(o.pid));
    std::string who = "process " + std::to_string(o.pid);
    ControlAnswer answer;
    try {
        answer = control_exchange(o.pid, *uids, "detach\n", o.timeout, "end its log");
    } catch (const ControlError& e) {
        if (e.kind == ControlError::Kind::NotRecorded)
            throw AttachRefused(kExitNotRecorded, who + " is not recorded by heapsnap");
        throw;
    }
    if (std::optional<std::string> refusal = refusal_of(answer.text)) throw Error(who + ": " + *refusal);
    const std::string head = "ok detach\n";
    if (answer.text.compare(0, head.size(), head) != 0 || answer.text.back() != '\n')
        throw Error(who + (answer.text.empty() ? " ended before its log was ended" : ": malformed reply"));
    std::optional<std::string> log =
        unescape_reply_field(answer.text.substr(head.size(), answer.text.size() - head.size() - 1));
    if (!log) throw Error(who + ": malformed reply");
    std::cerr << "heapsnap: log: " << terminal_safe(*log) << "\n";
    return kExitOk;
}

}  // namespace

void setup_attach(CLI::App& app, Action& action) {
    auto o = std::make_shared<AttachOptions>();
    CLI::App* sub = app.add_subcommand("attach", "Start recording a running process (PID) started without heapsnap");
    sub->add_option("pid", o->pid, "The process to record")->required()->check(CLI::PositiveNumber);
    add_recorder_options(sub, o->recorder);
    add_steering_options(*sub, o->steering);
    sub->footer("Example:\n  heapsnap attach 4242\n  heapsnap snapshot 4242 -o a.hsnap\n  heapsnap detach 4242");
    sub->callback([o, &action] {
        check_steering(o->steering, o->recorder.sample_bytes);
        action = [o] { return attach(*o); };
    });

    auto d = std::make_shared<DetachOptions>();
    CLI::App* off = app.add_subcommand("detach", "Stop recording a process recorded since heapsnap attach");
    off->add_option("pid", d->pid, "The attached process")->required()->check(CLI::PositiveNumber);
    off->add_option("--timeout", d->timeout, "Seconds to wait for the log to end")
        ->check(number_in(0.1, 3600, "s"))
        ->default_val(d->timeout);
    off->footer("Example:\n  heapsnap detach 4242");
    off->callback([d, &action] { action = [d] { return detach(*d); }; });
}

}  // namespace heapsnap::cli
