/* idle_daemon — a daemon that waits without allocating, as a server's
 * master does between requests.
 *
 * idle_daemon PIDFILE [FROM TO]
 *   main_keep() malloc(3333), kept, in the process started;
 *   with FROM and TO: renames the directory FROM to TO, so that the
 *   daemon cannot create its log where the process started could;
 *   daemon(0, 1): the working directory becomes "/", stdio is kept;
 *   the daemon (daemon's fork child) forks a child that only execs
 *   /bin/true and waits for it, writes its own pid to PIDFILE (write(2),
 *   no stdio buffer, so no allocation), then waits in pause() until a
 *   signal ends it.
 *
 * The daemon allocates nothing after the fork: its log must still exist
 * (opened as fork returned), and `heapsnap snapshot` must reach it. The
 * exec-only child leaves no log of its own before the exec.
 * Exit status: 0 (the starting process, from daemon), 2 if daemon fails;
 * the daemon ends by the signal, or 3 if PIDFILE cannot be written.
 */
#define _DEFAULT_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void* volatile kept;

__attribute__((noinline)) void main_keep(void) {
    kept = malloc(3333); /* @site:main_keep */
}

int main(int argc, char** argv) {
    if (argc != 2 && argc != 4) return 2;
    main_keep();
    if (argc == 4 && rename(argv[2], argv[3]) != 0) return 2;
    if (daemon(0, 1) != 0) return 2;
    pid_t child = fork();
    if (child == 0) {
        execl("/bin/true", "true", (char*)NULL);
        _exit(127);
    }
    int status;
    if (child > 0) waitpid(child, &status, 0);
    char line[32];
    int n = snprintf(line, sizeof line, "%d %d\n", (int)getpid(), (int)child);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, line, (size_t)n) != n) return 3;
    close(fd);
    for (;;) pause();
}
