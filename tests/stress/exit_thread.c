/* exit_thread — exit() called from a thread other than main, while main
 * waits in pthread_join and another thread keeps allocating. exit() runs
 * the atexit handlers and the library destructors (the recorder's exit
 * marker) on the exiting thread while the allocating thread still runs.
 *
 * The exiting thread: thread_keep() keeps 2 x malloc(3030), prints
 * "exit_thread: exiting from a thread", then exit(3).
 * The busy thread mallocs and frees 128-byte blocks until the process ends.
 *
 * Live from thread_keep() at exit: 6060 bytes in 2 blocks.
 * Exit status 3.
 *
 * exit_thread race: the busy thread calls _exit(3) as soon as it sees the
 * exiting thread about to call exit(3): one ends the log (exit marker,
 * End record) while the other waits for it. Same output, status and live
 * blocks. Exit status 2 for any other argument.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void* volatile kept[2];
static volatile int two = 2;

__attribute__((noinline)) void thread_keep(void) {
    for (int i = 0; i < two; ++i) kept[i] = malloc(3030); /* @site:thread_keep */
}

static atomic_int leaving;
static int race;

static void* busy(void* arg) {
    (void)arg;
    for (;;) {
        void* volatile p = malloc(128);
        free(p);
        if (race && atomic_load(&leaving)) _exit(3);
    }
    return NULL;
}

static void* exiting(void* arg) {
    (void)arg;
    usleep(50000); /* the busy thread is well under way */
    thread_keep();
    printf("exit_thread: exiting from a thread\n");
    fflush(stdout);
    atomic_store(&leaving, 1);
    exit(3);
}

int main(int argc, char** argv) {
    if (argc > 2 || (argc == 2 && strcmp(argv[1], "race") != 0)) return 2;
    race = argc == 2;
    pthread_t b, e;
    if (pthread_create(&b, NULL, busy, NULL) != 0) return 2;
    if (pthread_create(&e, NULL, exiting, NULL) != 0) return 2;
    pthread_join(e, NULL);
    return 1; /* not reached: the thread exits the process */
}
