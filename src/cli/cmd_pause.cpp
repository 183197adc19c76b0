// `heapsnap pause PID` and `heapsnap resume PID`: stop and restart the
// capture of stacks in a recorded process (recorder/steering.h). While
// paused, allocations and frees are still recorded, without stacks, so the
// live set stays exact; each switch leaves a marker ("pause", "resume").
// A process that already is in the state asked for is left as it is, and
// the command says so and succeeds (exit 0): the goal, a process in that
// state, holds either way.
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/pause_client.h"
#include "util/text.h"

namespace heapsnap::cli {
namespace {

struct PauseOptions {
    uint64_t pid = 0;
    double timeout = 30;
};

int steer_process(const PauseOptions& o, SteerRequest request) {
    auto pid = static_cast<pid_t>(o.pid);
    SteerAnswer answer = request_steering(pid, request, o.timeout);
    bool pause = request == SteerRequest::Pause;
    std::string who = "process " + std::to_string(pid);
    if (answer.changed)
        std::cout << who << ": stacks " << (pause ? "paused" : "resumed") << " at marker " << answer.marker << " \""
                  << (pause ? "pause" : "resume") << "\" of " << terminal_safe(answer.log) << "\n";
    else
        std::cout << who << ": stacks were " << (pause ? "already paused" : "not paused") << "; nothing changed ("
                  << terminal_safe(answer.log) << ")\n";
    return kExitOk;
}

void add_command(CLI::App& app, Action& action, SteerRequest request) {
    auto o = std::make_shared<PauseOptions>();
    bool pause = request == SteerRequest::Pause;
    CLI::App* sub =
        app.add_subcommand(pause ? "pause" : "resume",
                           pause ? "Stop recording stacks in a running recorded process (allocations are still counted)"
                                 : "Record stacks again in a paused process");
    sub->add_option("pid", o->pid, "PID of a recorded process")->required()->check(count_in(1, INT32_MAX));
    sub->add_option("--timeout", o->timeout, "Seconds to wait for the marker")
        ->check(number_in(0.1, 3600, "s"))
        ->default_val(o->timeout);
    sub->footer(pause ? "Example:\n  heapsnap pause 4242; ...warm-up...; heapsnap resume 4242"
                      : "Example:\n  heapsnap resume 4242\n  heapsnap diff 'app.hslog@resume' app.hslog@exit");
    sub->callback([o, &action, request] { action = [o, request] { return steer_process(*o, request); }; });
}

}  // namespace

void setup_pause(CLI::App& app, Action& action) {
    add_command(app, action, SteerRequest::Pause);
    add_command(app, action, SteerRequest::Resume);
}

}  // namespace heapsnap::cli
