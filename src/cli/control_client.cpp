#include "cli/control_client.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstring>
#include <functional>

#include "cli/recorder_probe.h"

namespace heapsnap::cli {
namespace {

std::vector<std::string_view> split(std::string_view text, char sep) {
    std::vector<std::string_view> parts;
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
        if (i == text.size() || text[i] == sep) {
            parts.push_back(text.substr(start, i - start));
            start = i + 1;
        }
    }
    return parts;
}

std::vector<std::string_view> words(std::string_view line) {
    std::vector<std::string_view> out;
    size_t i = 0;
    while (i < line.size()) {
        while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
        size_t start = i;
        while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
        if (i > start) out.push_back(line.substr(start, i - start));
    }
    return out;
}

// A decimal number without sign or leading zeros (but "0"), at most `max`.
std::optional<uint64_t> parse_decimal(std::string_view s, uint64_t max) {
    if (s.empty() || s.size() > 20 || (s.size() > 1 && s[0] == '0')) return std::nullopt;
    uint64_t v = 0;
    for (char c : s) {
        if (c < '0' || c > '9') return std::nullopt;
        uint64_t digit = static_cast<uint64_t>(c - '0');
        if (v > (max - digit) / 10) return std::nullopt;
        v = v * 10 + digit;
    }
    return v;
}

double seconds_since(const timespec& start) {
    timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return static_cast<double>(now.tv_sec - start.tv_sec) + static_cast<double>(now.tv_nsec - start.tv_nsec) / 1e9;
}

std::string process_name(pid_t pid) { return "process " + std::to_string(pid); }

}  // namespace

std::optional<ProcessUids> parse_status_uids(std::string_view status) {
    for (std::string_view line : split(status, '\n')) {
        if (line.substr(0, 4) != "Uid:") continue;
        std::vector<std::string_view> ids = words(line.substr(4));
        if (ids.size() != 4) return std::nullopt;
        uid_t v[4];
        for (size_t i = 0; i < 4; ++i) {
            std::optional<uint64_t> id = parse_decimal(ids[i], UINT32_MAX);
            if (!id) return std::nullopt;
            v[i] = static_cast<uid_t>(*id);
        }
        return ProcessUids{v[0], v[1], v[2], v[3]};
    }
    return std::nullopt;
}

std::optional<ProcessUids> process_uids(pid_t pid) {
    std::string path = "/proc/" + std::to_string(pid) + "/status";
    UniqueFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return std::nullopt;
    std::string text;
    char buf[4096];
    for (;;) {
        ssize_t n = read(fd.get(), buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buf, static_cast<size_t>(n));
    }
    return parse_status_uids(text);
}

bool may_control(const ProcessUids& uids, uid_t caller) {
    return caller == 0 || caller == uids.real || caller == uids.effective;
}

std::vector<pid_t> parse_listening_recorders(std::string_view net_unix) {
    constexpr uint64_t kAcceptCon = 0x10000;  // __SO_ACCEPTCON: a listening socket
    constexpr std::string_view kPrefix = "@heapsnap.";
    std::vector<pid_t> pids;
    for (std::string_view line : split(net_unix, '\n')) {
        // Num RefCount Protocol Flags Type St Inode Path
        std::vector<std::string_view> f = words(line);
        if (f.size() != 8 || f[7].substr(0, kPrefix.size()) != kPrefix) continue;
        uint64_t flags = 0;
        if (std::from_chars(f[3].data(), f[3].data() + f[3].size(), flags, 16).ec != std::errc() ||
            !(flags & kAcceptCon) || f[4] != "0001")
            continue;
        // "@heapsnap.<pid>", or "@heapsnap.<pid>.<n>" (control_socket_names)
        std::string_view id = f[7].substr(kPrefix.size());
        if (size_t dot = id.find('.'); dot != std::string_view::npos) {
            std::optional<uint64_t> n = parse_decimal(id.substr(dot + 1), kMaxAlternateNames);
            if (!n || *n == 0) continue;
            id = id.substr(0, dot);
        }
        std::optional<uint64_t> pid = parse_decimal(id, INT_MAX);
        if (pid && *pid > 0) pids.push_back(static_cast<pid_t>(*pid));
    }
    std::sort(pids.begin(), pids.end());
    pids.erase(std::unique(pids.begin(), pids.end()), pids.end());
    return pids;
}

std::optional<std::string> unescape_reply_field(std::string_view text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        if (text[i] != '\\') {
            out += text[i];
            continue;
        }
        if (i + 3 >= text.size()) return std::nullopt;
        if (text[i + 1] != 'x') return std::nullopt;
        unsigned value = 0;
        for (char c : text.substr(i + 2, 2)) {
            int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
            if (digit < 0) return std::nullopt;
            value = value * 16 + static_cast<unsigned>(digit);
        }
        out += static_cast<char>(value);
        i += 3;
    }
    return out;
}

std::vector<std::string> control_socket_names(pid_t pid) {
    std::string base = "heapsnap." + std::to_string(pid);
    std::vector<std::string> names{base};
    for (unsigned n = 1; n <= kMaxAlternateNames; ++n) names.push_back(base + "." + std::to_string(n));
    return names;
}

namespace {

// Connects to the recorder of `pid`: the first of its socket names whose
// listener is the process itself (SO_PEERCRED: its pid, and its uid or
// root's). A listener that is someone else gets nothing and is left; a
// name whose queue is full is tried again until the deadline.
UniqueFd connect_to_recorder(pid_t pid, const ProcessUids& uids, const std::function<int()>& remaining_ms,
                             const std::function<ControlError()>& timed_out) {
    using Kind = ControlError::Kind;
    const std::string who = process_name(pid);
    std::vector<std::string> pending = control_socket_names(pid);
    std::optional<std::string> squatted;  // what the first listener that was not the process said
    while (!pending.empty()) {
        std::vector<std::string> busy;
        for (const std::string& name : pending) {
            UniqueFd sock(socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
            if (!sock) throw ControlError(Kind::System, std::string("socket: ") + std::strerror(errno));
            sockaddr_un addr{};
            addr.sun_family = AF_UNIX;
            std::memcpy(addr.sun_path + 1, name.data(), name.size());
            auto len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
            int r;
            do r = connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), len);
            while (r != 0 && errno == EINTR);
            if (r != 0 && errno == EINPROGRESS) {  // not done by Unix sockets today; handled as for TCP
                pollfd p{sock.get(), POLLOUT, 0};
                if (poll(&p, 1, remaining_ms()) <= 0) throw timed_out();
                int err = 0;
                socklen_t err_len = sizeof err;
                getsockopt(sock.get(), SOL_SOCKET, SO_ERROR, &err, &err_len);
                r = err == 0 ? 0 : -1;
                errno = err;
            }
            if (r != 0) {
                // A Unix socket connects at once or not at all; with the
                // listener's backlog full it says EAGAIN: try again later.
                if (errno == EAGAIN) busy.push_back(name);
                continue;
            }
            ucred peer{};
            socklen_t peer_len = sizeof peer;
            if (getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &peer, &peer_len) != 0)
                throw ControlError(Kind::System, std::string("SO_PEERCRED: ") + std::strerror(errno));
            if (peer.pid == pid && (peer.uid == 0 || peer.uid == uids.real || peer.uid == uids.effective)) return sock;
            if (!squatted)
                squatted = who + ": the control socket @" + name + " is held by another process (pid " +
                           std::to_string(peer.pid) + ", uid " + std::to_string(peer.uid) + "); refusing its answer";
        }
        if (busy.empty()) break;
        int wait_ms = std::min(remaining_ms(), 10);
        if (wait_ms == 0) throw timed_out();
        poll(nullptr, 0, wait_ms);
        pending = std::move(busy);
    }
    if (squatted) throw ControlError(Kind::NotOurs, *squatted);
    throw ControlError(Kind::NotRecorded, unreachable_reason(pid));
}

}  // namespace

ControlAnswer control_exchange(pid_t pid, const ProcessUids& uids, const std::string& request, double timeout_s,
                               const std::string& waiting_for) {
    using Kind = ControlError::Kind;
    const std::string who = process_name(pid);
    timespec start;
    clock_gettime(CLOCK_MONOTONIC, &start);
    auto remaining_ms = [&] {
        double left = timeout_s - seconds_since(start);
        return left <= 0 ? 0 : static_cast<int>(left * 1000) + 1;
    };
    auto timed_out = [&] {
        return ControlError(Kind::Timeout, who + " did not " + waiting_for + " within " +
                                               fmt::format("{:g}", timeout_s) + " s (is it stopped?)");
    };
    UniqueFd sock = connect_to_recorder(pid, uids, remaining_ms, timed_out);

    // A refusal may arrive, and the recorder close, before the request is
    // sent: a failed send still reads the answer.
    size_t sent = 0;
    while (sent < request.size()) {
        ssize_t n = send(sock.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            pollfd p{sock.get(), POLLOUT, 0};
            if (poll(&p, 1, remaining_ms()) <= 0) throw timed_out();
            continue;
        }
        break;
    }

    ControlAnswer answer;
    for (;;) {
        int wait_ms = remaining_ms();
        if (wait_ms == 0) throw timed_out();
        pollfd p{sock.get(), POLLIN, 0};
        int r = poll(&p, 1, wait_ms);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char buf[4096];
        alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
        iovec iov{buf, sizeof buf};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        ssize_t n = recvmsg(sock.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        // Descriptors that came are ours to close, whatever happens next.
        std::vector<UniqueFd> passed;
        for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
            size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
            for (size_t i = 0; i < count; ++i) {
                int fd;
                std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                passed.emplace_back(fd);
            }
        }
        if ((msg.msg_flags & MSG_CTRUNC) || passed.size() > 1 || (!passed.empty() && answer.fd))
            throw ControlError(Kind::Malformed, who + ": malformed reply (more than one descriptor)");
        if (!passed.empty()) answer.fd = std::move(passed.front());
        if (n <= 0) break;
        answer.text.append(buf, static_cast<size_t>(n));
        if (answer.text.size() > kMaxReplyBytes)
            throw ControlError(Kind::Malformed,
                               who + ": malformed reply (longer than " + std::to_string(kMaxReplyBytes) + " bytes)");
    }
    return answer;
}

std::optional<std::string> refusal_of(const std::string& answer) {
    if (answer.rfind("error ", 0) != 0) return std::nullopt;
    std::string text = answer.substr(6);
    while (!text.empty() && text.back() == '\n') text.pop_back();
    return text;
}

std::optional<SnapshotAnswer> parse_snapshot_answer(const std::string& answer) {
    if (answer.empty() || answer.back() != '\n') return std::nullopt;
    std::vector<std::string_view> lines = split(std::string_view(answer).substr(0, answer.size() - 1), '\n');
    if (lines.size() != 2 || lines[0].substr(0, 3) != "ok ") return std::nullopt;
    std::optional<uint64_t> index = parse_decimal(lines[0].substr(3), UINT32_MAX);
    std::optional<std::string> log = unescape_reply_field(lines[1]);
    if (!index || *index == 0 || !log || log->empty()) return std::nullopt;
    return SnapshotAnswer{static_cast<uint32_t>(*index), *log};
}

std::optional<InfoAnswer> parse_info_answer(const std::string& answer) {
    if (answer.empty() || answer.back() != '\n') return std::nullopt;
    std::vector<std::string_view> lines = split(std::string_view(answer).substr(0, answer.size() - 1), '\n');
    if (lines.empty() || lines[0] != "ok info") return std::nullopt;
    InfoAnswer info;
    unsigned seen = 0;  // a bit per field
    for (size_t i = 1; i < lines.size(); ++i) {
        std::string_view line = lines[i];
        size_t space = line.find(' ');
        if (space == std::string_view::npos) return std::nullopt;
        std::string_view key = line.substr(0, space);
        std::string_view value = line.substr(space + 1);
        if (key == "pid") {
            std::optional<uint64_t> v = parse_decimal(value, INT_MAX);
            if (!v) return std::nullopt;
            info.pid = static_cast<pid_t>(*v);
            seen |= 1;
        } else if (key == "uid") {
            std::vector<std::string_view> ids = words(value);
            std::optional<uint64_t> real = ids.size() == 2 ? parse_decimal(ids[0], UINT32_MAX) : std::nullopt;
            std::optional<uint64_t> effective = ids.size() == 2 ? parse_decimal(ids[1], UINT32_MAX) : std::nullopt;
            if (!real || !effective) return std::nullopt;
            info.uid = static_cast<uid_t>(*real);
            info.euid = static_cast<uid_t>(*effective);
            seen |= 2;
        } else if (key == "since" || key == "events") {
            std::optional<uint64_t> v = parse_decimal(value, UINT64_MAX);
            if (!v) return std::nullopt;
            (key == "since" ? info.since_ns : info.events) = *v;
            seen |= key == "since" ? 4 : 8;
        } else if (key == "exe" || key == "log") {
            std::optional<std::string> path = unescape_reply_field(value);
            if (!path) return std::nullopt;
            (key == "exe" ? info.exe : info.log) = *path;
            seen |= key == "exe" ? 16 : 32;
        }
        // Other keys: fields a later recorder may add.
    }
    if (seen != 63) return std::nullopt;
    return info;
}

}  // namespace heapsnap::cli
