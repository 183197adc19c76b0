// The client side of the control channel (formats/control.md): how
// `heapsnap snapshot PID` and `heapsnap ps` talk to the recorder inside a
// running process.
//
// Who may ask is decided twice, the same way: root, or a caller whose uid
// is the process's current real or effective uid. The client reads those
// from the `Uid:` line of /proc/PID/status, not from the owner of
// /proc/PID: a process that changed uid is no longer dumpable, and the
// kernel then gives its /proc directory to root. The recorder checks the
// caller again with SO_PEERCRED.
//
// And who answers is checked: anyone may bind the abstract name
// `@heapsnap.<pid>` before the recorder does (a process that is not
// recorded has none; a recorder that finds it taken listens on
// `@heapsnap.<pid>.<n>`), so after connecting to each of the names in turn
// the client asks the kernel (SO_PEERCRED) which process listens there,
// sends nothing to one that is not the target (its pid, and its uid or
// root's: the recorder binds the name as the process started, possibly as
// root before a uid change), and goes on to the next name.
//
// One exchange is bounded by one deadline, connecting included: a stopped
// process still accepts connections (the kernel queues them) but never
// answers, and a full backlog makes a non-blocking connect fail with
// EAGAIN until there is room.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "util/error.h"
#include "util/files.h"

namespace heapsnap::cli {

// The uids of a process, as the Uid: line of /proc/PID/status gives them.
struct ProcessUids {
    uid_t real = 0;
    uid_t effective = 0;
    uid_t saved = 0;
    uid_t fs = 0;
};

// The Uid: line of the text of a /proc/PID/status; nullopt without one.
std::optional<ProcessUids> parse_status_uids(std::string_view status);
// Of a running process; nullopt when there is no process `pid`.
std::optional<ProcessUids> process_uids(pid_t pid);
// Root, or the process's current real or effective uid.
bool may_control(const ProcessUids& uids, uid_t caller);

// The abstract names the recorder of `pid` may listen on, in the order it
// tries them: "heapsnap.<pid>", then "heapsnap.<pid>.1" to
// ".<kMaxAlternateNames>" when the first is taken by another process
// (recorder/control.cpp). A client tries them in that order.
inline constexpr unsigned kMaxAlternateNames = 16;
std::vector<std::string> control_socket_names(pid_t pid);

// The pids of the recorders listening in the text of /proc/net/unix: the
// listening stream sockets named @heapsnap.<pid> or @heapsnap.<pid>.<n>,
// each pid once, in ascending order.
std::vector<pid_t> parse_listening_recorders(std::string_view net_unix);

// Undoes the escapes of a path in a reply: \xHH for control bytes, DEL and
// the backslash. Nullopt for a malformed escape.
std::optional<std::string> unescape_reply_field(std::string_view text);

// The replies are small: a longer one is refused.
inline constexpr size_t kMaxReplyBytes = 16384;

class ControlError : public Error {
public:
    enum class Kind {
        NotRecorded,  // nothing listens at @heapsnap.<pid>
        NotOurs,      // someone else listens there
        Timeout,      // no complete answer within the deadline
        Malformed,    // too long, or descriptors where none belong
        System,       // socket(2) and the like
    };
    ControlError(Kind kind, const std::string& message) : Error(message), kind(kind) {}
    Kind kind;
};

struct ControlAnswer {
    std::string text;  // everything the recorder sent before closing
    UniqueFd fd;       // a descriptor it passed (SCM_RIGHTS), if any
};

// Connects to the recorder of `pid` (the first of control_socket_names
// whose listener is the process, checked against `uids`), sends `request` (one line, newline included) and reads until the
// recorder closes the connection, all within `timeout_s` seconds. On
// timeout the message says "process N did not <waiting_for> within T s (is
// it stopped?)". Throws ControlError.
ControlAnswer control_exchange(pid_t pid, const ProcessUids& uids, const std::string& request, double timeout_s,
                               const std::string& waiting_for);

// "error <text>\n": the text; nullopt for any other answer.
std::optional<std::string> refusal_of(const std::string& answer);

struct SnapshotAnswer {
    uint32_t marker = 0;  // the marker's 1-based index in the log
    std::string log;      // the log's path, as the recorder names it
};
// "ok <index>\n<path>\n"; nullopt for anything else.
std::optional<SnapshotAnswer> parse_snapshot_answer(const std::string& answer);

struct InfoAnswer {
    pid_t pid = 0;
    uid_t uid = 0;          // real
    uid_t euid = 0;         // effective
    uint64_t since_ns = 0;  // CLOCK_REALTIME at the start of the log, ns since the epoch
    uint64_t events = 0;
    std::string exe;
    std::string log;
};
// "ok info\n" and its fields; nullopt for anything else.
std::optional<InfoAnswer> parse_info_answer(const std::string& answer);

}  // namespace heapsnap::cli
