/* daemonizer — daemon(3): its fork's parent leaves inside it (by _exit,
 * within glibc), the child goes on as the daemon.
 *
 * Parent, before daemon:  parent_keep() malloc(1111), kept.
 * daemon(1, 1):           keeps the working directory and stdio, so the
 *                         daemon's output reaches whoever waits on it.
 * Daemon (the child):     child_keep() malloc(2222), kept; writes
 *                         "daemon done" (write(2): no stdio buffer) and
 *                         exits 0.
 *
 * Live at exit:
 *   the parent's log: 1111 bytes in 1 block (parent_keep), at its exit
 *                     marker, taken as daemon's parent leaves;
 *   the daemon's log: 2222 bytes in 1 block (child_keep).
 * Exit status: 0 (the parent's, from daemon), 2 if daemon fails; the
 * daemon's 3 if its write fails.
 */
#define _DEFAULT_SOURCE
#include <stdlib.h>
#include <unistd.h>

static void* volatile kept[2];

__attribute__((noinline)) void parent_keep(void) {
    kept[0] = malloc(1111); /* @site:parent_keep */
}

__attribute__((noinline)) void child_keep(void) {
    kept[1] = malloc(2222); /* @site:child_keep */
}

int main(void) {
    parent_keep();
    if (daemon(1, 1) != 0) return 2;
    child_keep();
    static const char done[] = "daemon done\n";
    return write(STDOUT_FILENO, done, sizeof done - 1) == sizeof done - 1 ? 0 : 3;
}
