// The client side of the control channel's `pause` and `resume` requests
// (formats/control.md), for `heapsnap pause PID` and `heapsnap resume PID`:
// the same checks of who may ask and who answers as `heapsnap snapshot
// PID` (control_client.h), one request, one reply.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace heapsnap::cli {

enum class SteerRequest { Pause, Resume };

struct SteerAnswer {
    bool changed = false;  // false: already paused (pause), not paused (resume)
    uint32_t marker = 0;   // the pause or resume marker's 1-based index, when changed
    std::string log;       // the log's path, as the recorder names it
};

// "ok paused <index>\n<path>\n" (or "ok resumed ...") and "ok already
// paused\n<path>\n" (or "ok not paused ..."); nullopt for anything else.
std::optional<SteerAnswer> parse_steer_answer(SteerRequest request, const std::string& answer);

// Sends the request to the recorder of `pid` and reads its answer, within
// `timeout_s`. Throws heapsnap::Error with the one line the command prints.
SteerAnswer request_steering(pid_t pid, SteerRequest request, double timeout_s);

}  // namespace heapsnap::cli
