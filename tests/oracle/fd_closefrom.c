/* fd_closefrom MODE DIR — closes every descriptor from 3 on, then opens
 * 1 000 files DIR/f0..f999 and writes its own line into each, allocating
 * between the opens; prints the first and last descriptor it got.
 *
 * MODE "closefrom": glibc's closefrom(3), which makes the close_range
 * system call itself. MODE "raw": the close_range system call made
 * directly, which no hook sees: the recorder loses its descriptors.
 * Either way nothing but the program's line may reach its files.
 * Keeps 3 x malloc(777) to the end (2 331 bytes in 3 blocks), then sleeps
 * a second with nothing to do, and prints on stderr the CPU time the
 * process (the recorder's thread included) used meanwhile: "idle_ms N".
 * stdout's buffer (4 096 bytes) is live at exit too.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

static void* volatile kept[3];

int main(int argc, char** argv) {
    if (argc != 3) return 2;
    if (strcmp(argv[1], "closefrom") == 0)
        closefrom(3);
    else if (syscall(SYS_close_range, 3u, ~0u, 0) != 0)
        return 2;
    int first = -1, last = -1;
    for (int i = 0; i < 1000; ++i) {
        char path[4096], line[64];
        snprintf(path, sizeof path, "%s/f%d", argv[2], i);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0) return 3;
        if (i == 0) first = fd;
        last = fd;
        int n = snprintf(line, sizeof line, "file %d\n", i);
        if (write(fd, line, (size_t)n) != n) return 4;
        free(malloc(100 + (size_t)i));
    }
    for (int i = 0; i < 3; ++i) kept[i] = malloc(777);
    struct rusage before, after;
    getrusage(RUSAGE_SELF, &before);
    sleep(1);
    getrusage(RUSAGE_SELF, &after);
    long us = (after.ru_utime.tv_sec - before.ru_utime.tv_sec + after.ru_stime.tv_sec - before.ru_stime.tv_sec) *
                  1000000L +
              (after.ru_utime.tv_usec - before.ru_utime.tv_usec) + (after.ru_stime.tv_usec - before.ru_stime.tv_usec);
    fprintf(stderr, "idle_ms %ld\n", us / 1000);
    printf("first %d last %d\n", first, last);
    return 0;
}
