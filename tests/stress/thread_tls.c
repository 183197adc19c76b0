/* thread_tls — a thread costs what it costs bare: the recorder adds no TLS
 * module to the process, so glibc's pthread_create allocates the same
 * (its DTV, _dl_allocate_tls's calloc) and lays the new thread's stack out
 * the same (the static TLS block and the TCB at its top).
 *
 * For each of THREADS threads, one after the other, the program's
 * allocator (hostile_alloc.c) traces the mallocs and callocs
 * pthread_create makes, and the thread reports where its TCB
 * (pthread_self()) lies below the top of its stack, once pthread_create
 * has returned (pthread_getattr_np allocates).
 *
 * Output: per thread, "thread N: callocs <sizes> tcb <top - self>", the
 * same bare and recorded; then "thread_tls: 4 threads". Exit status 0.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>

#include "hostile_alloc.h"

enum { THREADS = 4 };

static uintptr_t top_of_stack;
static atomic_int traced;

static void* report(void* arg) {
    (void)arg;
    /* pthread_getattr_np allocates: not while pthread_create is traced. */
    while (!atomic_load(&traced)) sched_yield();
    pthread_attr_t attr;
    void* lo = NULL;
    size_t size = 0;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
        pthread_attr_getstack(&attr, &lo, &size);
        pthread_attr_destroy(&attr);
    }
    top_of_stack = (uintptr_t)lo + size;
    return NULL;
}

int main(void) {
    for (int i = 0; i < THREADS; ++i) {
        hostile_traced = 0;
        atomic_store(&traced, 0);
        hostile_trace = 1;
        pthread_t t;
        int err = pthread_create(&t, NULL, report, NULL);
        hostile_trace = 0;
        atomic_store(&traced, 1);
        if (err) return 2;
        int traced = hostile_traced;
        if (pthread_join(t, NULL)) return 2;
        printf("thread %d: callocs", i);
        for (int j = 0; j < traced; ++j) printf(" %ld", hostile_sizes[j]);
        printf(" tcb %lu\n", (unsigned long)(top_of_stack - (uintptr_t)t));
    }
    printf("thread_tls: %d threads\n", THREADS);
    return 0;
}
