/* static_idle — linked statically (-static): no dynamic loader, so
 * `heapsnap attach` must refuse it. Prints "ready pid=<pid>", then waits
 * for stdin to close. */
#include <stdio.h>
#include <unistd.h>

int main(void) {
    printf("ready pid=%d\n", (int)getpid());
    fflush(stdout);
    char c;
    while (read(0, &c, 1) > 0) {
    }
    return 0;
}
