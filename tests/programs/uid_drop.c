/* uid_drop — a server that starts as root and switches to its own user,
 * as memcached -u and nginx's workers do: the recorded process must stay
 * reachable by root and by that user (formats/control.md).
 *
 * Usage: uid_drop UID GID   (run as root), then commands on stdin, one per
 * line; each answered with one line on stdout once it is done:
 *   (at start)   -> "ready pid=<pid>"
 *   setuid       -> setgroups(0), setgid(GID), setuid(UID)
 *   setresuid    -> setgroups(0), setresgid(GID x3), setresuid(UID x3)
 *                   each -> "dropped" or "failed errno=<n>"
 *   deny-setuid  -> a seccomp filter makes setuid and setresuid fail with
 *                   EPERM in every thread -> "denied" or "failed errno=<n>"
 *   grow         -> 6 x malloc(3001) in grow(), kept: +18006 bytes
 *                   +6 blocks -> "grown"
 *   quit / EOF   -> "bye", exit 0
 *   other        -> "unknown command"
 * Only read(2)/write(2) are used for I/O: stdio would allocate its buffers.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

static volatile int n_grow = 6;
static void* volatile grown[600];
static int grown_count;

__attribute__((noinline)) void grow(void) {
    for (int i = 0; i < n_grow && grown_count < 600; ++i) grown[grown_count++] = malloc(3001); /* @site:grow */
}

static void say(const char* a, const char* b) {
    char line[256];
    int n = snprintf(line, sizeof line, "%s%s\n", a, b);
    for (int done = 0; done < n;) {
        ssize_t w = write(STDOUT_FILENO, line + done, (size_t)(n - done));
        if (w <= 0) exit(4);
        done += (int)w;
    }
}

static void say_result(int r) {
    char err[32];
    snprintf(err, sizeof err, "%d", errno);
    if (r == 0)
        say("dropped", "");
    else
        say("failed errno=", err);
}

static int deny_setuid(void) {
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_setuid, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_setresuid, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    /* Every thread (the recorder's writer too): glibc's setuid makes the
     * call in each thread and must see the same result in all. */
    long r = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
    return r == 0 ? 0 : -1;
}

/* Reads one line into buf without its newline; false at end of input. */
static int read_line(char* buf, size_t cap) {
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(STDIN_FILENO, &c, 1);
        if (r <= 0) {
            buf[n] = 0;
            return n > 0;
        }
        if (c == '\n') break;
        if (n + 1 < cap) buf[n++] = c;
    }
    buf[n] = 0;
    return 1;
}

int main(int argc, char** argv) {
    if (argc != 3) {
        static const char usage[] = "usage: uid_drop UID GID\n";
        if (write(STDERR_FILENO, usage, sizeof usage - 1) < 0) return 2;
        return 2;
    }
    uid_t uid = (uid_t)strtoul(argv[1], NULL, 10);
    gid_t gid = (gid_t)strtoul(argv[2], NULL, 10);
    char pid[32];
    snprintf(pid, sizeof pid, "%d", (int)getpid());
    say("ready pid=", pid);
    char line[256];
    while (read_line(line, sizeof line)) {
        if (strcmp(line, "setuid") == 0) {
            int r = setgroups(0, NULL);
            if (r == 0) r = setgid(gid);
            if (r == 0) r = setuid(uid);
            say_result(r);
        } else if (strcmp(line, "setresuid") == 0) {
            int r = setgroups(0, NULL);
            if (r == 0) r = setresgid(gid, gid, gid);
            if (r == 0) r = setresuid(uid, uid, uid);
            say_result(r);
        } else if (strcmp(line, "deny-setuid") == 0) {
            if (deny_setuid() == 0) {
                say("denied", "");
            } else {
                char err[32];
                snprintf(err, sizeof err, "%d", errno);
                say("failed errno=", err);
            }
        } else if (strcmp(line, "grow") == 0) {
            grow();
            say("grown", "");
        } else if (strcmp(line, "quit") == 0) {
            break;
        } else {
            say("unknown command", "");
        }
    }
    say("bye", "");
    return 0;
}
