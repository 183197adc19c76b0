/* fd_dup2 FILE — puts its own file on descriptors 3 to 9 and on the six
 * highest numbers below its RLIMIT_NOFILE soft limit (dup2), allocates and
 * frees from a signal handler raised 200 times, then writes one line
 * through each of those descriptors. FILE must hold exactly those lines:
 * nothing of the recorder's, no byte missing. Keeps malloc(1234) to the
 * end; every other block is freed.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static void* volatile kept;

static void handler(int sig) {
    (void)sig;
    void* p = malloc(200);
    free(p);
}

static int put(int fd, int target) {
    char line[64];
    int n = snprintf(line, sizeof line, "line for %d\n", target);
    return write(fd, line, (size_t)n) == n ? 0 : 1;
}

int main(int argc, char** argv) {
    if (argc != 2) return 2;
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur > 65536) return 2;
    int file = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
    if (file < 0) return 3;
    int targets[13], n = 0;
    for (int fd = 3; fd <= 9; ++fd) targets[n++] = fd;
    for (int fd = (int)lim.rlim_cur - 1; fd >= (int)lim.rlim_cur - 6; --fd) targets[n++] = fd;
    for (int i = 0; i < n; ++i)
        if (targets[i] != file && dup2(file, targets[i]) != targets[i]) return 4;
    signal(SIGUSR1, handler);
    for (int i = 0; i < 200; ++i) {
        raise(SIGUSR1);
        free(malloc(64 + (size_t)i));
    }
    kept = malloc(1234);
    int bad = 0;
    for (int i = 0; i < n; ++i) bad |= put(targets[i], targets[i]);
    return bad ? 5 : 0;
}
