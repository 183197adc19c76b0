// `heapsnap snapshot`: freeze the live heap of a moment into a .hsnap.
//
// Of a running process (PID): connect to its recorder's control socket
// (abstract "heapsnap.<pid>", formats/control.md), ask for a marker, wait
// until the recorder says the marker's frame is on disk, then replay the
// log up to that marker. Of a log (LOG): replay up to --at.
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "format/snapshot_file.h"
#include "replay/marker_select.h"
#include "util/error.h"

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

std::string exe_name(const Snapshot& s) {
    size_t slash = s.process.exe.rfind('/');
    return slash == std::string::npos ? s.process.exe : s.process.exe.substr(slash + 1);
}

struct Reply {
    uint32_t marker = 0;
    std::string log;
};

// Sends "snapshot <label>" and reads "ok <index>\n<log path>\n" or
// "error <text>\n".
Reply request_marker(pid_t pid, const std::string& label, double timeout_s) {
    std::string proc = "/proc/" + std::to_string(pid);
    struct stat st;
    if (stat(proc.c_str(), &st) != 0) throw Error("no process with PID " + std::to_string(pid));
    if (st.st_uid != getuid() && getuid() != 0)
        throw Error("process " + std::to_string(pid) + " belongs to another user (uid " + std::to_string(st.st_uid) +
                    "); only its owner may snapshot it");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw Error(std::string("socket: ") + std::strerror(errno));
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::string name = "heapsnap." + std::to_string(pid);
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
        close(fd);
        throw Error("process " + std::to_string(pid) +
                    " is not recorded by heapsnap (no control socket; start it with 'heapsnap run')");
    }
    // A refusal (another user) may arrive and close the socket before the
    // request is sent: a failed send still reads the answer.
    std::string request = "snapshot " + label + "\n";
    bool sent = send(fd, request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
    int send_errno = errno;
    std::string answer;
    timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double elapsed = static_cast<double>(now.tv_sec - start.tv_sec) + (now.tv_nsec - start.tv_nsec) / 1e9;
        if (elapsed >= timeout_s) {
            close(fd);
            throw Error("process " + std::to_string(pid) + " did not write the marker within " +
                        fmt::format("{:g}", timeout_s) + " s (is it stopped?)");
        }
        pollfd p{fd, POLLIN, 0};
        int r = poll(&p, 1, static_cast<int>((timeout_s - elapsed) * 1000) + 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char buf[4096];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        answer.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    if (answer.rfind("error ", 0) == 0) {
        std::string text = answer.substr(6);
        while (!text.empty() && text.back() == '\n') text.pop_back();
        throw Error("process " + std::to_string(pid) + ": " + text);
    }
    size_t nl = answer.find('\n');
    if (!sent && answer.empty())
        throw Error("process " + std::to_string(pid) + ": cannot send the request: " + std::strerror(send_errno));
    if (answer.rfind("ok ", 0) != 0 || nl == std::string::npos)
        throw Error("process " + std::to_string(pid) + " ended before the marker was written");
    Reply reply;
    reply.marker = static_cast<uint32_t>(std::strtoul(answer.c_str() + 3, nullptr, 10));
    reply.log = answer.substr(nl + 1);
    while (!reply.log.empty() && reply.log.back() == '\n') reply.log.pop_back();
    if (!reply.marker || reply.log.empty()) throw Error("process " + std::to_string(pid) + ": malformed reply");
    return reply;
}

int snapshot(const SnapshotOptions& o) {
    Snapshot snap;
    std::string output = o.output;
    if (is_pid(o.target)) {
        auto pid = static_cast<pid_t>(std::strtol(o.target.c_str(), nullptr, 10));
        Reply reply = request_marker(pid, o.label, o.timeout);
        Moment moment;
        moment.kind = Moment::Kind::Index;
        moment.index = reply.marker;
        moment.text = std::to_string(reply.marker);
        snap = snapshot_at(reply.log, moment);
        if (output.empty())
            output = "heapsnap." + exe_name(snap) + "." + std::to_string(pid) + "." + std::to_string(reply.marker) + ".hsnap";
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
    std::cout << output << "\n";
    return kExitOk;
}

}  // namespace

void setup_snapshot(CLI::App& app, Action& action) {
    auto o = std::make_shared<SnapshotOptions>();
    CLI::App* sub = app.add_subcommand("snapshot", "Freeze the live heap of a running process (PID) or of a log moment");
    sub->add_option("target", o->target, "PID of a recorded process, or a .hslog file")->required();
    sub->add_option("-o,--output", o->output, "Snapshot file to write (default: derived from the process or log)");
    sub->add_option("--at", o->at, "With a LOG: label, 1-based index, exit, peak, end, or a time like 12.5s")
        ->default_val(o->at);
    sub->add_option("--label", o->label, "With a PID: label of the marker written")->default_val(o->label);
    sub->add_option("--timeout", o->timeout, "With a PID: seconds to wait for the marker")
        ->check(CLI::Range(0.1, 3600.0))
        ->default_val(o->timeout);
    sub->footer(
        "Examples:\n  heapsnap snapshot 4242 -o before.hsnap\n  heapsnap snapshot heapsnap.app.4242.hslog --at peak");
    sub->callback([o, &action] { action = [o] { return snapshot(*o); }; });
}

}  // namespace heapsnap::cli
