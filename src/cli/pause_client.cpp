#include "cli/pause_client.h"

#include <unistd.h>

#include "cli/control_client.h"
#include "util/error.h"

namespace heapsnap::cli {
namespace {

const char* verb_of(SteerRequest r) { return r == SteerRequest::Pause ? "pause" : "resume"; }

}  // namespace

std::optional<SteerAnswer> parse_steer_answer(SteerRequest request, const std::string& answer) {
    if (answer.empty() || answer.back() != '\n') return std::nullopt;
    size_t nl = answer.find('\n');
    if (nl + 1 == answer.size()) return std::nullopt;  // no path line
    std::string head = answer.substr(0, nl);
    std::string path_line = answer.substr(nl + 1, answer.size() - nl - 2);
    if (path_line.find('\n') != std::string::npos) return std::nullopt;
    std::optional<std::string> log = unescape_reply_field(path_line);
    if (!log || log->empty()) return std::nullopt;
    SteerAnswer out;
    out.log = *log;
    bool pause = request == SteerRequest::Pause;
    if (head == (pause ? "ok already paused" : "ok not paused")) return out;
    std::string done = pause ? "ok paused " : "ok resumed ";
    if (head.rfind(done, 0) != 0) return std::nullopt;
    std::string index = head.substr(done.size());
    if (index.empty() || index.size() > 10 || index[0] == '0' ||
        index.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    uint64_t v = std::stoull(index);
    if (v > UINT32_MAX) return std::nullopt;
    out.changed = true;
    out.marker = static_cast<uint32_t>(v);
    return out;
}

SteerAnswer request_steering(pid_t pid, SteerRequest request, double timeout_s) {
    std::string who = "process " + std::to_string(pid);
    std::optional<ProcessUids> uids = process_uids(pid);
    if (!uids) throw Error("no process with PID " + std::to_string(pid));
    if (!may_control(*uids, geteuid())) {
        std::string ids = "uid " + std::to_string(uids->real);
        if (uids->effective != uids->real) ids += ", effective uid " + std::to_string(uids->effective);
        throw Error(who + " belongs to another user (" + ids + "); only root and that user may " + verb_of(request) +
                    " it");
    }
    ControlAnswer answer =
        control_exchange(pid, *uids, std::string(verb_of(request)) + "\n", timeout_s, "write the marker");
    if (std::optional<std::string> refusal = refusal_of(answer.text)) {
        // A recorder of control protocol 3 or older knows no such request.
        if (*refusal == "malformed request")
            throw Error(who + ": its recorder does not know '" + verb_of(request) +
                        "' (is it older than this heapsnap?)");
        throw Error(who + ": " + *refusal);
    }
    if (answer.text.empty()) throw Error(who + " ended before the marker was written");
    if (answer.fd) throw Error(who + ": malformed reply (a descriptor where none belongs)");
    std::optional<SteerAnswer> reply = parse_steer_answer(request, answer.text);
    if (!reply) throw Error(who + ": malformed reply");
    return *reply;
}

}  // namespace heapsnap::cli
