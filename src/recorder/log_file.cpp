#include "recorder/log_file.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

#include "recorder/lifecycle.h"
#include "recorder/modules.h"
#include "recorder/own_fds.h"

namespace heapsnap::recorder {

// Expands %p (pid), %e (executable name) and %% in the pattern.
bool expand_pattern(const char* pattern, char* out, size_t cap) {
    const char* exe = exe_path();
    const char* slash = strrchr(exe, '/');
    const char* exe_name = slash ? slash + 1 : exe;
    if (!*exe_name) exe_name = "unknown";
    size_t n = 0;
    auto put = [&](const char* s) {
        for (; *s; ++s) {
            if (n + 1 >= cap) return false;
            out[n++] = *s;
        }
        return true;
    };
    char pid[24];
    format_uint(static_cast<uint64_t>(getpid()), pid);
    for (const char* p = pattern; *p; ++p) {
        char one[2] = {*p, 0};
        bool ok = true;
        if (*p == '%' && p[1] == 'p') {
            ok = put(pid);
            ++p;
        } else if (*p == '%' && p[1] == 'e') {
            ok = put(exe_name);
            ++p;
        } else if (*p == '%' && p[1] == '%') {
            ok = put("%");
            ++p;
        } else {
            ok = put(one);
        }
        if (!ok) return false;
    }
    out[n] = 0;
    return true;
}

bool make_absolute(char* path, size_t cap) {
    if (path[0] == '/') return true;
    char cwd[kMaxPathLen];
    if (!getcwd(cwd, sizeof cwd)) return false;
    size_t a = strlen(cwd), b = strlen(path);
    if (a + 1 + b + 1 > cap) return false;
    memmove(path + a + 1, path, b + 1);
    memcpy(path, cwd, a);
    path[a] = '/';
    return true;
}

// O_EXCL: never reuse or follow someone else's file; if the name is taken
// (a re-exec of the same program with the same pid), add -1, -2, ...
// O_RDWR: the descriptor is also handed to snapshot clients, who read the
// log through it (control.cpp). O_APPEND: every write lands at the end
// whatever the file offset; the writer's writes (writer.cpp, write_all)
// never depend on the offset.
constexpr int kLogFlags = O_RDWR | O_APPEND | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;

// Mode 0600 whatever the umask: one that takes the owner's write bit
// would leave a log heapsnap refuses as not the user's own.
static int open_new(const char* path) {
    int fd = open(path, kLogFlags, 0600);
    if (fd >= 0) fchmod(fd, 0600);
    return fd;
}

int create_log(char* path, size_t cap) {
    int fd = open_new(path);
    if (fd >= 0 || errno != EEXIST) return fd;
    size_t len = strlen(path);
    const char* dot = strrchr(path, '.');
    const char* slash = strrchr(path, '/');
    size_t stem = (dot && (!slash || dot > slash)) ? static_cast<size_t>(dot - path) : len;
    char ext[64] = "";
    if (len - stem < sizeof ext) memcpy(ext, path + stem, len - stem + 1);
    char base[kMaxPathLen];
    memcpy(base, path, stem);
    base[stem] = 0;
    for (int i = 1; i < 1000; ++i) {
        char num[16];
        int k = 0;
        for (int v = i; v; v /= 10) num[k++] = static_cast<char>('0' + v % 10);
        char candidate[kMaxPathLen];
        size_t m = 0;
        for (size_t j = 0; base[j] && m + 1 < sizeof candidate; ++j) candidate[m++] = base[j];
        if (m + 1 < sizeof candidate) candidate[m++] = '-';
        while (k && m + 1 < sizeof candidate) candidate[m++] = num[--k];
        for (size_t j = 0; ext[j] && m + 1 < sizeof candidate; ++j) candidate[m++] = ext[j];
        candidate[m] = 0;
        fd = open_new(candidate);
        if (fd >= 0) {
            if (m + 1 <= cap) memcpy(path, candidate, m + 1);
            return fd;
        }
        if (errno != EEXIST) return -1;
    }
    return -1;
}

void announce_path(const char* path) {
    if (config().paths_file[0]) {
        int fd = open(config().paths_file, O_WRONLY | O_APPEND | O_CLOEXEC | O_NOFOLLOW);
        if (fd >= 0) {
            size_t n = strlen(path);
            char line[kMaxPathLen + 1];
            memcpy(line, path, n);
            line[n] = '\n';
            ssize_t ignored = write(fd, line, n + 1);
            (void)ignored;
            close_own(fd);
        }
    }
    if (config().verbose) diagnostic("recording to ", path);
}

}  // namespace heapsnap::recorder
