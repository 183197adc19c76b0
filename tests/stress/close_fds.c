/* close_fds MODE — a program that closes every descriptor it may have
 * (daemons and sandboxes do), then allocates and exits normally. The
 * recorder's log must survive: the blocks allocated after the close and the
 * exit marker are in it, and the log is complete.
 *
 * MODE "loop": close(fd) for every fd below the RLIMIT_NOFILE soft limit.
 * MODE "range": close_range(0, ~0U, 0).
 *
 * Before closing it prints "close_fds: closing (MODE)" on stdout (the only
 * output, since stdout is closed afterwards). After closing:
 * after_close() keeps 3 x malloc(5555), then a marker "after-close".
 * Live from after_close() at "after-close" and at exit: 16665 bytes in 3
 * blocks. Exit status 5; 2 for a bad MODE or a failing close_range.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

static void* volatile kept[3];
static volatile int three = 3;

__attribute__((noinline)) void after_close(void) {
    for (int i = 0; i < three; ++i) kept[i] = malloc(5555); /* @site:after_close */
}

int main(int argc, char** argv) {
    if (argc != 2 || (strcmp(argv[1], "loop") != 0 && strcmp(argv[1], "range") != 0)) return 2;
    printf("close_fds: closing (%s)\n", argv[1]);
    fflush(stdout);
    if (strcmp(argv[1], "loop") == 0) {
        struct rlimit lim;
        long max = getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY ? (long)lim.rlim_cur : 65536;
        for (long fd = 0; fd < max; ++fd) close((int)fd);
    } else if (close_range(0, ~0U, 0) != 0) {
        return 2;
    }
    after_close();
    heapsnap_marker("after-close");
    return 5;
}
