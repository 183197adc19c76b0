#include "recorder/control.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "format/hslog.h"
#include "recorder/clock.h"
#include "recorder/lifecycle.h"
#include "recorder/markers.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"
#include "recorder/steering.h"
#include "recorder/writer.h"

namespace heapsnap::recorder {
namespace {

constexpr int kMaxPending = 32;
constexpr int kMaxReading = 8;
constexpr size_t kMaxRequest = 512;
// A request must be complete this long after the connection was accepted.
// The writer never waits for a client: sockets are non-blocking and read
// whenever the writer polls, so a client that dribbles or stalls costs
// nothing but its slot.
constexpr uint64_t kRequestDeadlineNs = 1000000000;
// Names "heapsnap.<pid>.1" to ".16" when "heapsnap.<pid>" is taken; the
// client tries as many (cli/control_client.h, kMaxAlternateNames).
constexpr unsigned kMaxAlternateNames = 16;

struct Pending {
    int fd;
    uint32_t token;  // take_marker's; the writer maps it to the marker index
    // The reply's verb: null for `snapshot` ("ok <index>", with the log's
    // descriptor), else "paused" or "resumed" ("ok paused <index>").
    const char* done;
};

// An accepted connection whose request line has not fully arrived.
struct Reading {
    int fd;
    uint64_t deadline_ns;
    size_t used;
    char buf[kMaxRequest];
};

// Its holder (own_fds.h): a dup2 of the program onto it moves it.
std::atomic<int> g_listen{-1};
Pending g_pending[kMaxPending];
int g_pending_count = 0;
Reading g_reading[kMaxReading];
int g_reading_count = 0;

// The client refuses replies longer than this (formats/control.md).
constexpr size_t kMaxReply = 16384;

// A reply is built here, then sent by one sendmsg. Refusals are short, and
// are also sent from program threads (at exit), whose stacks may be small.
template <size_t Capacity>
struct Reply {
    char text[Capacity];
    size_t used = 0;
    bool overflow = false;

    void put(const char* s) {
        for (; *s; ++s) put_byte(*s);
    }
    void put_uint(uint64_t v) {
        char digits[24];
        format_uint(v, digits);
        put(digits);
    }
    // Paths are bytes: control bytes, DEL and the backslash travel as
    // \xHH, so that a reply splits into lines at its newlines.
    void put_escaped(const char* s) {
        static const char kHex[] = "0123456789abcdef";
        for (; *s; ++s) {
            auto c = static_cast<unsigned char>(*s);
            if (c < 0x20 || c == 0x7f || c == '\\') {
                put_byte('\\');
                put_byte('x');
                put_byte(kHex[c >> 4]);
                put_byte(kHex[c & 15]);
            } else {
                put_byte(*s);
            }
        }
    }
    void put_byte(char c) {
        if (used < sizeof text)
            text[used++] = c;
        else
            overflow = true;
    }
};

// Sends the reply (with `pass_fd` attached, SCM_RIGHTS, unless -1) and
// closes the connection.
template <size_t Capacity>
void send_reply(int fd, const Reply<Capacity>& reply, int pass_fd = -1) {
    iovec iov{const_cast<char*>(reply.text), reply.used};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
    if (pass_fd >= 0) {
        memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &pass_fd, sizeof(int));
    }
    OwnFdUse use;
    if (!own_fd_taken(fd)) {
        ssize_t ignored = sendmsg(fd, &msg, MSG_NOSIGNAL);
        (void)ignored;
    }
    close_own(fd);
}

void refuse(int fd, const char* text) {
    Reply<256> reply;
    reply.put("error ");
    reply.put(text);
    reply.put("\n");
    send_reply(fd, reply);
}

enum class Verb { None, Snapshot, Info, Detach };

// Parses "snapshot", "snapshot <label>", "info" or "detach" (the line
// without its newline).
Verb parse_request(const char* line, char* label, size_t cap) {
    if (strcmp(line, "info") == 0) return Verb::Info;
    if (strcmp(line, "detach") == 0) return Verb::Detach;
    const char* verb = "snapshot";
    size_t verb_len = strlen(verb);
    if (strncmp(line, verb, verb_len) != 0 || (line[verb_len] != ' ' && line[verb_len] != 0)) return Verb::None;
    const char* text = line[verb_len] ? line + verb_len + 1 : "";
    size_t len = strnlen(text, cap - 1);
    memcpy(label, text, len);
    label[len] = 0;
    return Verb::Snapshot;
}

// Who the process is and what its log holds so far; answered at once.
void answer_info(int fd) {
    uid_t real = 0, effective = 0, saved = 0;
    getresuid(&real, &effective, &saved);
    LogStatus status = writer_log_status();
    Reply<kMaxReply> reply;
    reply.put("ok info\npid ");
    reply.put_uint(static_cast<uint64_t>(getpid()));
    reply.put("\nuid ");
    reply.put_uint(real);
    reply.put(" ");
    reply.put_uint(effective);
    reply.put("\nsince ");
    reply.put_uint(status.start_realtime_ns);
    reply.put("\nevents ");
    reply.put_uint(status.events);
    reply.put("\nexe ");
    reply.put_escaped(exe_path());
    reply.put("\nlog ");
    reply.put_escaped(writer_log_path());
    reply.put("\n");
    if (reply.overflow) return refuse(fd, "reply too long (paths of more than 16 KiB)");
    send_reply(fd, reply);
}

// ---- detach (formats/control.md): answered by the writer once the log
// has ended (control_reply_detached).
void take_detach(int fd) {
    if (!attached())
        return refuse(fd,
                      "the recorder was not attached (heapsnap run, LD_PRELOAD): it records until the process ends");
    if (!writer_request_detach(fd)) return refuse(fd, "a detach is already under way");
}

// The reply to a pause or resume request that changed nothing: at once,
// "ok already paused" or "ok not paused", and the log's path.
void answer_unchanged(int fd, const char* state) {
    Reply<kMaxReply> reply;
    reply.put("ok ");
    reply.put(state);
    reply.put("\n");
    reply.put_escaped(writer_log_path());
    reply.put("\n");
    if (reply.overflow) return refuse(fd, "reply too long (paths of more than 16 KiB)");
    send_reply(fd, reply);
}

// pause and resume (steering.h): the reply waits for the marker, as a
// snapshot's does.
void take_steering(int fd, SteerVerb verb) {
    if (g_pending_count == kMaxPending) return refuse(fd, "too many pending requests");
    SteerOutcome outcome = steer(verb);
    if (outcome.failed) return refuse(fd, "the recorder is not recording");
    bool pause = verb == SteerVerb::Pause;
    if (outcome.unchanged) return answer_unchanged(fd, pause ? "already paused" : "not paused");
    g_pending[g_pending_count++] = Pending{fd, outcome.token, pause ? "paused" : "resumed"};
}

void take_request(int fd, char* line) {
    if (SteerVerb verb = steer_verb(line); verb != SteerVerb::None) return take_steering(fd, verb);
    char label[256];
    Verb verb = parse_request(line, label, sizeof label);
    if (verb == Verb::None) return refuse(fd, "malformed request");
    if (verb == Verb::Info) return answer_info(fd);
    if (verb == Verb::Detach) return take_detach(fd);
    if (g_pending_count == kMaxPending) return refuse(fd, "too many pending requests");
    uint32_t token = take_marker(hslog::MarkerCause::Request, label[0] ? label : "snapshot");
    if (!token) return refuse(fd, "the recorder is not recording");
    g_pending[g_pending_count++] = Pending{fd, token, nullptr};
}

// Reads what has arrived; true when the connection is finished with (its
// request taken or refused, or the peer gone).
bool read_some(Reading& r, uint64_t now) {
    OwnFdUse use;
    if (own_fd_taken(r.fd)) {  // dup2 of the program onto it (own_fds.h)
        close_own(r.fd);
        return true;
    }
    for (;;) {
        ssize_t n = recv(r.fd, r.buf + r.used, sizeof r.buf - 1 - r.used, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {  // the peer is gone or half-closed before a whole line
            if (r.used)
                refuse(r.fd, "malformed request");
            else
                close_own(r.fd);
            return true;
        }
        r.used += static_cast<size_t>(n);
        r.buf[r.used] = 0;
        if (char* nl = static_cast<char*>(memchr(r.buf, '\n', r.used))) {
            *nl = 0;
            if (strlen(r.buf) != static_cast<size_t>(nl - r.buf))  // a NUL inside the line
                refuse(r.fd, "malformed request");
            else
                take_request(r.fd, r.buf);
            return true;
        }
        if (r.used == sizeof r.buf - 1) {
            refuse(r.fd, "malformed request");
            return true;
        }
    }
    if (now >= r.deadline_ns) {
        refuse(r.fd, "malformed request");
        return true;
    }
    return false;
}

// Root, or the user the process runs as now: its real or effective uid,
// read at each connection, so a process that dropped privileges answers
// the user it became (glibc's setuid family changes every thread's
// credentials, this one's included).
bool peer_allowed(const ucred& peer) {
    uid_t real = 0, effective = 0, saved = 0;
    if (getresuid(&real, &effective, &saved) != 0) return false;
    return peer.uid == 0 || peer.uid == real || peer.uid == effective;
}

void accept_one(int fd, uint64_t now) {
    ucred peer{};
    socklen_t len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || !peer_allowed(peer))
        return refuse(fd, "permission denied: only root and the user the process runs as may connect");
    if (g_reading_count == kMaxReading) return refuse(fd, "too many pending requests");
    Reading& r = g_reading[g_reading_count++];
    r.fd = fd;
    r.deadline_ns = now + kRequestDeadlineNs;
    r.used = 0;
}

void close_reading() {
    for (int i = 0; i < g_reading_count; ++i) close_own(g_reading[i].fd);
    g_reading_count = 0;
}

// Binds `name` (abstract) and listens; -1 and errno on failure.
int listen_on(const char* name) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    size_t name_len = strlen(name);
    memcpy(addr.sun_path + 1, name, name_len);
    socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name_len);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || listen(fd, 8) != 0) {
        int err = errno;
        close_own(fd);
        errno = err;
        return -1;
    }
    return fd;
}

}  // namespace

// "heapsnap.<pid>", or, when another process holds that name (abstract
// names belong to nobody, formats/control.md), "heapsnap.<pid>.<n>" for the
// first free n up to kMaxAlternateNames. A client tries the same names and
// believes only the listener whose SO_PEERCRED pid is the process's, so a
// squatter on any of them gets no request and delays nobody; the process
// says on stderr (and in the system log) where it listens instead.
void control_open() {
    if (g_listen >= 0) return;
    char name[64] = "heapsnap.";
    format_uint(static_cast<uint64_t>(getpid()), name + strlen(name));
    size_t base_len = strlen(name);
    int fd = listen_on(name);
    if (fd < 0 && errno != EADDRINUSE) return;
    for (unsigned n = 1; fd < 0 && n <= kMaxAlternateNames; ++n) {
        name[base_len] = '.';
        format_uint(n, name + base_len + 1);
        fd = listen_on(name);
        if (fd < 0 && errno != EADDRINUSE) return;
    }
    char taken[160] = "@";  // "@heapsnap.<pid>", or the whole range when every name is taken
    memcpy(taken + 1, name, base_len);
    taken[base_len + 1] = 0;
    if (fd < 0) {
        strcat(taken, " to @");
        strcat(taken, name);
        alert("control socket names ", taken,
              " are all taken by other processes; heapsnap snapshot cannot reach this process");
        return;
    }
    if (name[base_len])
        alert("control socket name ", taken, " is taken by another process; serving snapshots on @", name);
    own_fd_adopt(fd, &g_listen);
}

void control_close() {
    if (g_listen >= 0) close_own(g_listen);
    g_listen = -1;
    close_reading();
    for (int i = 0; i < g_pending_count; ++i) refuse(g_pending[i].fd, "the process is exiting");
    g_pending_count = 0;
}

void control_forget_after_fork() {
    if (g_listen >= 0) close_own(g_listen);
    g_listen = -1;
    close_reading();
    for (int i = 0; i < g_pending_count; ++i) close_own(g_pending[i].fd);
    g_pending_count = 0;
}

int control_fd() { return g_listen.load(std::memory_order_acquire); }

int control_poll_fds(pollfd* out, int max) {
    int n = 0;
    int listen = g_listen.load(std::memory_order_acquire);
    if (listen >= 0 && n < max) out[n++] = pollfd{listen, POLLIN, 0};
    for (int i = 0; i < g_reading_count && n < max; ++i)
        if (!own_fd_taken(g_reading[i].fd)) out[n++] = pollfd{g_reading[i].fd, POLLIN, 0};
    return n;
}

bool control_reading() { return g_reading_count > 0; }

void control_poll() {
    OwnFdUse use;
    int listen = g_listen.load(std::memory_order_acquire);
    if (listen < 0) return;
    uint64_t now = now_ns();
    for (;;) {
        int fd = accept4(listen, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        accept_one(own_fd_adopt(fd, nullptr), now);
    }
    int kept = 0;
    for (int i = 0; i < g_reading_count; ++i)
        if (!read_some(g_reading[i], now)) g_reading[kept++] = g_reading[i];
    g_reading_count = kept;
}

void control_reply_detached(int fd) {
    Reply<kMaxReply> reply;
    reply.put("ok detach\n");
    reply.put_escaped(writer_log_path());
    reply.put("\n");
    if (reply.overflow) return refuse(fd, "reply too long (paths of more than 16 KiB)");
    send_reply(fd, reply);
}

void control_reply_durable(uint32_t durable_marker) {
    OwnFdUse use;
    int kept = 0;
    for (int i = 0; i < g_pending_count; ++i) {
        Pending p = g_pending[i];
        uint32_t marker = writer_marker_index(p.token);
        if (marker && marker <= durable_marker) {
            Reply<kMaxReply> reply;
            reply.put("ok ");
            if (p.done) {
                reply.put(p.done);
                reply.put(" ");
            }
            reply.put_uint(marker);
            reply.put("\n");
            reply.put_escaped(writer_log_path());
            reply.put("\n");
            if (reply.overflow)
                refuse(p.fd, "reply too long (paths of more than 16 KiB)");
            else
                send_reply(p.fd, reply, p.done ? -1 : writer_log_fd());
        } else {
            g_pending[kept++] = p;
        }
    }
    g_pending_count = kept;
}

}  // namespace heapsnap::recorder
