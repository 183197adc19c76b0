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

struct Pending {
    int fd;
    uint32_t token;  // take_marker's; the writer maps it to the marker index
};

// An accepted connection whose request line has not fully arrived.
struct Reading {
    int fd;
    uint64_t deadline_ns;
    size_t used;
    char buf[kMaxRequest];
};

int g_listen = -1;
Pending g_pending[kMaxPending];
int g_pending_count = 0;
Reading g_reading[kMaxReading];
int g_reading_count = 0;

void send_line(int fd, const char* a, const char* b = "", const char* c = "") {
    char line[kMaxPathLen + 128];
    size_t n = 0;
    for (const char* s : {a, b, c})
        for (; *s && n + 2 < sizeof line; ++s) line[n++] = *s;
    line[n++] = '\n';
    ssize_t ignored = send(fd, line, n, MSG_NOSIGNAL);
    (void)ignored;
}

void refuse(int fd, const char* text) {
    send_line(fd, "error ", text);
    close(fd);
}

// Parses "snapshot <label>" (the line without its newline); false for
// anything else.
bool parse_request(char* line, char* label, size_t cap) {
    const char* verb = "snapshot";
    size_t verb_len = strlen(verb);
    if (strncmp(line, verb, verb_len) != 0 || (line[verb_len] != ' ' && line[verb_len] != 0)) return false;
    const char* text = line[verb_len] ? line + verb_len + 1 : "";
    size_t len = strnlen(text, cap - 1);
    memcpy(label, text, len);
    label[len] = 0;
    return true;
}

void take_request(int fd, char* line) {
    char label[256];
    if (!parse_request(line, label, sizeof label)) return refuse(fd, "malformed request");
    if (g_pending_count == kMaxPending) return refuse(fd, "too many pending requests");
    uint32_t token = take_marker(hslog::MarkerCause::Request, label[0] ? label : "snapshot");
    if (!token) return refuse(fd, "the recorder is not recording");
    g_pending[g_pending_count++] = Pending{fd, token};
}

// Reads what has arrived; true when the connection is finished with (its
// request taken or refused, or the peer gone).
bool read_some(Reading& r, uint64_t now) {
    for (;;) {
        ssize_t n = recv(r.fd, r.buf + r.used, sizeof r.buf - 1 - r.used, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (n <= 0) {  // the peer is gone or half-closed before a whole line
            if (r.used) send_line(r.fd, "error malformed request");
            close(r.fd);
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

void accept_one(int fd, uint64_t now) {
    ucred peer{};
    socklen_t len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != getuid())
        return refuse(fd, "permission denied: only the owner of the process may request snapshots");
    if (g_reading_count == kMaxReading) return refuse(fd, "too many pending requests");
    Reading& r = g_reading[g_reading_count++];
    r.fd = fd;
    r.deadline_ns = now + kRequestDeadlineNs;
    r.used = 0;
}

void close_reading() {
    for (int i = 0; i < g_reading_count; ++i) close(g_reading[i].fd);
    g_reading_count = 0;
}

}  // namespace

void control_open() {
    if (g_listen >= 0) return;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    char name[64] = "heapsnap.";
    format_uint(static_cast<uint64_t>(getpid()), name + strlen(name));
    size_t name_len = strlen(name);
    memcpy(addr.sun_path + 1, name, name_len);
    socklen_t addr_len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name_len);
    if (bind(fd, reinterpret_cast<sockaddr*>(&addr), addr_len) != 0 || listen(fd, 8) != 0) {
        close(fd);
        return;
    }
    g_listen = move_fd_high(fd);
}

void control_close() {
    if (g_listen >= 0) close(g_listen);
    g_listen = -1;
    close_reading();
    for (int i = 0; i < g_pending_count; ++i) {
        send_line(g_pending[i].fd, "error the process is exiting");
        close(g_pending[i].fd);
    }
    g_pending_count = 0;
}

void control_forget_after_fork() {
    if (g_listen >= 0) close(g_listen);
    g_listen = -1;
    close_reading();
    for (int i = 0; i < g_pending_count; ++i) close(g_pending[i].fd);
    g_pending_count = 0;
}

int control_fd() { return g_listen; }

int control_poll_fds(pollfd* out, int max) {
    int n = 0;
    if (g_listen >= 0 && n < max) out[n++] = pollfd{g_listen, POLLIN, 0};
    for (int i = 0; i < g_reading_count && n < max; ++i) out[n++] = pollfd{g_reading[i].fd, POLLIN, 0};
    return n;
}

bool control_reading() { return g_reading_count > 0; }

void control_poll() {
    if (g_listen < 0) return;
    uint64_t now = now_ns();
    for (;;) {
        int fd = accept4(g_listen, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        accept_one(fd, now);
    }
    int kept = 0;
    for (int i = 0; i < g_reading_count; ++i)
        if (!read_some(g_reading[i], now)) g_reading[kept++] = g_reading[i];
    g_reading_count = kept;
}

void control_reply_durable(uint32_t durable_marker) {
    int kept = 0;
    for (int i = 0; i < g_pending_count; ++i) {
        Pending p = g_pending[i];
        uint32_t marker = writer_marker_index(p.token);
        if (marker && marker <= durable_marker) {
            char index[24];
            format_uint(marker, index);
            send_line(p.fd, "ok ", index);
            send_line(p.fd, writer_log_path());
            close(p.fd);
        } else {
            g_pending[kept++] = p;
        }
    }
    g_pending_count = kept;
}

}  // namespace heapsnap::recorder
