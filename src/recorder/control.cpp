#include "recorder/control.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "format/hslog.h"
#include "recorder/lifecycle.h"
#include "recorder/markers.h"
#include "recorder/writer.h"

namespace heapsnap::recorder {
namespace {

constexpr int kMaxPending = 32;
constexpr size_t kMaxRequest = 512;

struct Pending {
    int fd;
    uint32_t token;  // take_marker's; the writer maps it to the marker index
};

int g_listen = -1;
Pending g_pending[kMaxPending];
int g_pending_count = 0;

void send_line(int fd, const char* a, const char* b = "", const char* c = "") {
    char line[kMaxPathLen + 128];
    size_t n = 0;
    for (const char* s : {a, b, c})
        for (; *s && n + 2 < sizeof line; ++s) line[n++] = *s;
    line[n++] = '\n';
    ssize_t ignored = send(fd, line, n, MSG_NOSIGNAL);
    (void)ignored;
}

void format_uint(uint64_t v, char* out) {
    char tmp[24];
    int i = 0;
    do tmp[i++] = static_cast<char>('0' + v % 10);
    while (v /= 10);
    int j = 0;
    while (i) out[j++] = tmp[--i];
    out[j] = 0;
}

// Reads "snapshot <label>\n"; returns false for anything else.
bool read_request(int fd, char* label, size_t cap) {
    char buf[kMaxRequest];
    size_t n = 0;
    while (n < sizeof buf - 1) {
        ssize_t r = recv(fd, buf + n, sizeof buf - 1 - n, 0);
        if (r <= 0) {
            if (r < 0 && errno == EINTR) continue;
            break;
        }
        n += static_cast<size_t>(r);
        if (memchr(buf, '\n', n)) break;
    }
    buf[n] = 0;
    char* nl = strchr(buf, '\n');
    if (!nl) return false;
    *nl = 0;
    const char* verb = "snapshot";
    size_t verb_len = strlen(verb);
    if (strncmp(buf, verb, verb_len) != 0 || (buf[verb_len] != ' ' && buf[verb_len] != 0)) return false;
    const char* text = buf[verb_len] ? buf + verb_len + 1 : "";
    size_t len = strnlen(text, cap - 1);
    memcpy(label, text, len);
    label[len] = 0;
    return true;
}

void handle(int fd) {
    ucred peer{};
    socklen_t len = sizeof peer;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &len) != 0 || peer.uid != getuid()) {
        send_line(fd, "error permission denied: only the owner of the process may request snapshots");
        close(fd);
        return;
    }
    timeval timeout{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    char label[256];
    if (!read_request(fd, label, sizeof label)) {
        send_line(fd, "error malformed request");
        close(fd);
        return;
    }
    if (g_pending_count == kMaxPending) {
        send_line(fd, "error too many pending requests");
        close(fd);
        return;
    }
    uint32_t token = take_marker(hslog::MarkerCause::Request, label[0] ? label : "snapshot");
    if (!token) {
        send_line(fd, "error the recorder is not recording");
        close(fd);
        return;
    }
    g_pending[g_pending_count++] = Pending{fd, token};
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
    for (int i = 0; i < g_pending_count; ++i) {
        send_line(g_pending[i].fd, "error the process is exiting");
        close(g_pending[i].fd);
    }
    g_pending_count = 0;
}

void control_forget_after_fork() {
    if (g_listen >= 0) close(g_listen);
    g_listen = -1;
    for (int i = 0; i < g_pending_count; ++i) close(g_pending[i].fd);
    g_pending_count = 0;
}

int control_fd() { return g_listen; }

void control_poll() {
    if (g_listen < 0) return;
    for (;;) {
        int fd = accept4(g_listen, nullptr, nullptr, SOCK_CLOEXEC);
        if (fd < 0) return;
        handle(fd);
    }
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
