// `heapsnap snapshot`: freeze the live heap of a moment into a .hsnap.
//
// Of a running process (PID): connect to its recorder's control socket
// (abstract "heapsnap.<pid>", formats/control.md, cli/control_client.h),
// ask for a marker, wait until the recorder says the marker's frame is on
// disk, then replay the log up to that marker, through the descriptor of
// the log the recorder passed along. Of a log (LOG): replay up to --at.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <iostream>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "cli/options.h"
#include "cli/control_client.h"
#include "format/snapshot_file.h"
#include "replay/marker_select.h"
#include "util/error.h"
#include "util/text.h"

namespace heapsnap::cli {
namespace {

struct SnapshotOptions {
    std::string target;
    std::string output;
    std::string at = "exit";
    std::string label = "snapshot";
    double timeout = 30;
};

bool is_pid(const std::string& s) {
    struct stat st;
    return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos && stat(s.c_str(), &st) != 0;
}

std::string sanitize(const std::string& label) {
    std::string out;
    for (char c : label) out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '_';
    return out.empty() ? "moment" : out.substr(0, 64);
}

// The program's name as part of a file name. The log says what it is, so
// only letters, digits and - _ . + are kept, the rest becomes '_'.
std::string exe_name(const Snapshot& s) {
    size_t slash = s.process.exe.rfind('/');
    std::string name = slash == std::string::npos ? s.process.exe : s.process.exe.substr(slash + 1);
    for (char& c : name)
        if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.' && c != '+') c = '_';
    return name.empty() || name[0] == '.' ? "program" + name : name;
}

struct Requested {
    uint32_t marker = 0;
    std::string log;  // as the recorder names it: for messages and the checkpoint
    UniqueFd log_fd;  // the log, passed by the recorder: what is read
};

// "process N belongs to another user (uid U)", or "(uid R, effective uid E)"
// when they differ.
std::string other_user(pid_t pid, const ProcessUids& uids) {
    std::string ids = "uid " + std::to_string(uids.real);
    if (uids.effective != uids.real) ids += ", effective uid " + std::to_string(uids.effective);
    return "process " + std::to_string(pid) + " belongs to another user (" + ids +
           "); only root and that user may snapshot it";
}

// Sends "snapshot <label>" and reads "ok <index>\n<log path>\n" with the
// log's descriptor, or "error <text>\n" (formats/control.md).
Requested request_marker(pid_t pid, const std::string& label, double timeout_s) {
    std::optional<ProcessUids> uids = process_uids(pid);
    if (!uids) throw Error("no process with PID " + std::to_string(pid));
    if (!may_control(*uids, geteuid())) throw Error(other_user(pid, *uids));
    ControlAnswer answer = control_exchange(pid, *uids, "snapshot " + label + "\n", timeout_s, "write the marker");
    std::string who = "process " + std::to_string(pid);
    if (std::optional<std::string> refusal = refusal_of(answer.text)) throw Error(who + ": " + *refusal);
    if (answer.text.empty()) throw Error(who + " ended before the marker was written");
    std::optional<SnapshotAnswer> reply = parse_snapshot_answer(answer.text);
    if (!reply) throw Error(who + ": malformed reply");
    if (!answer.fd)
        throw Error(who + ": the recorder passed no descriptor of its log (is it older than this heapsnap?)");
    struct stat st;
    if (fstat(answer.fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
        throw Error(who + ": the descriptor it passed is not a regular file");
    return Requested{reply->marker, reply->log, std::move(answer.fd)};
}

int snapshot(const SnapshotOptions& o) {
    Snapshot snap;
    std::string output = o.output;
    if (is_pid(o.target)) {
        auto pid = static_cast<pid_t>(std::strtol(o.target.c_str(), nullptr, 10));
        Requested reply = request_marker(pid, o.label, o.timeout);
        Moment moment;
        moment.kind = Moment::Kind::Index;
        moment.index = reply.marker;
        moment.text = std::to_string(reply.marker);
        snap = snapshot_at(LogFile{reply.log, reply.log_fd.get()}, moment);
        // The peer is the process (control_exchange checked), and its log
        // names it: anything else is not the snapshot that was asked for.
        if (snap.process.pid != static_cast<uint64_t>(pid))
            throw Error("process " + std::to_string(pid) + ": the log it passed is of another process (pid " +
                        std::to_string(snap.process.pid) + ")");
        if (output.empty())
            output = "heapsnap." + exe_name(snap) + "." + std::to_string(pid) + "." + std::to_string(reply.marker) +
                     ".hsnap";
    } else {
        snap = snapshot_at(o.target, parse_moment(o.at));
        if (output.empty()) {
            std::string base = o.target;
            if (size_t slash = base.rfind('/'); slash != std::string::npos) base = base.substr(slash + 1);
            if (base.size() > 6 && base.compare(base.size() - 6, 6, ".hslog") == 0) base.resize(base.size() - 6);
            output = base + "." + sanitize(o.at) + ".hsnap";
        }
    }
    write_snapshot(output, snap);
    std::cout << terminal_safe(output) << "\n";
    return kExitOk;
}

}  // namespace

void setup_snapshot(CLI::App& app, Action& action) {
    auto o = std::make_shared<SnapshotOptions>();
    CLI::App* sub =
        app.add_subcommand("snapshot", "Freeze the live heap of a running process (PID) or of a log moment");
    sub->add_option("target", o->target, "PID of a recorded process, or a .hslog file")->required();
    sub->add_option("-o,--output", o->output, "Snapshot file to write (default: derived from the process or log)");
    sub->add_option("--at", o->at, "With a LOG: label, 1-based index, exit, peak, end, or a time like 12.5s")
        ->default_val(o->at);
    sub->add_option("--label", o->label, "With a PID: label of the marker written")->default_val(o->label);
    sub->add_option("--timeout", o->timeout, "With a PID: seconds to wait for the marker")
        ->check(number_in(0.1, 3600, "s"))
        ->default_val(o->timeout);
    sub->footer(
        "Examples:\n  heapsnap snapshot 4242 -o before.hsnap\n  heapsnap snapshot heapsnap.app.4242.hslog --at peak");
    sub->callback([o, &action] { action = [o] { return snapshot(*o); }; });
}

}  // namespace heapsnap::cli
