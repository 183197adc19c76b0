/* main_exit — the main thread leaves with pthread_exit while a worker
 * still runs; the process ends when the worker returns (glibc exits when
 * the last thread does). The recorder's writer thread must not keep the
 * process alive.
 *
 * Live at exit: main_keep 10 bytes and worker_keep 100 bytes.
 * Output: "main_exit: worker done". Exit status 0.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void* volatile kept[2];

__attribute__((noinline)) void* worker_keep(void) {
    return malloc(100); /* @site:worker_keep */
}

__attribute__((noinline)) void* main_keep(void) {
    return malloc(10); /* @site:main_keep */
}

static void* run(void* arg) {
    (void)arg;
    usleep(100000);
    kept[1] = worker_keep();
    printf("main_exit: worker done\n");
    fflush(stdout);
    return NULL;
}

int main(void) {
    pthread_t t;
    kept[0] = main_keep();
    if (pthread_create(&t, NULL, run, NULL) != 0) return 2;
    pthread_exit(NULL);
}
