/* handoff_threads — blocks allocated on one thread and freed on another,
 * hundreds of thousands of times, so addresses are freed and immediately
 * reused across threads: the case where a replay that orders events wrongly
 * gets the live set wrong.
 *
 * PRODUCERS threads each malloc PER_PRODUCER blocks in produce_block() and
 * push them through one bounded queue; CONSUMERS threads pop and free them,
 * except every KEEP_EVERY-th block of each producer, which the consumer
 * keeps. Block i of producer p has size 16 + 8 * (i % 32), or KEEP_SIZE + p
 * when it is kept (i % KEEP_EVERY == 0).
 *
 * Live heap from produce_block() at the "joined" marker and at exit:
 *   blocks: PRODUCERS * PER_PRODUCER / KEEP_EVERY        = 4 * 100 = 400
 *   bytes:  sum over p of 100 * (KEEP_SIZE + p)          = 100 * (4 * 1000 + 6) = 400600
 * The queue is a static ring: nothing else in this file allocates. glibc
 * itself allocates per created thread (its TLS vector), from stacks that
 * go through pthread_create.
 *
 * Markers: "started" before the first thread is created, "joined" after
 * the last one is joined.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include <heapsnap/heapsnap.h>

enum {
    PRODUCERS = 4,
    CONSUMERS = 4,
    PER_PRODUCER = 100000,
    KEEP_EVERY = 1000,
    KEEP_SIZE = 1000,
    QUEUE_SLOTS = 256,
    KEPT_MAX = PRODUCERS * PER_PRODUCER / KEEP_EVERY,
};

struct block {
    int keep;
};

static struct block* queue[QUEUE_SLOTS];
static unsigned head, tail;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t not_empty = PTHREAD_COND_INITIALIZER;
static pthread_cond_t not_full = PTHREAD_COND_INITIALIZER;

static struct block* kept[KEPT_MAX];
static unsigned kept_count;

static void push(struct block* b) {
    pthread_mutex_lock(&lock);
    while (tail - head == QUEUE_SLOTS) pthread_cond_wait(&not_full, &lock);
    queue[tail++ % QUEUE_SLOTS] = b;
    pthread_cond_signal(&not_empty);
    pthread_mutex_unlock(&lock);
}

static struct block* pop(void) {
    pthread_mutex_lock(&lock);
    while (tail == head) pthread_cond_wait(&not_empty, &lock);
    struct block* b = queue[head++ % QUEUE_SLOTS];
    pthread_cond_signal(&not_full);
    pthread_mutex_unlock(&lock);
    return b;
}

__attribute__((noinline)) struct block* produce_block(size_t size) {
    return malloc(size); /* @site:produce_block */
}

static void* producer(void* arg) {
    uintptr_t p = (uintptr_t)arg;
    for (unsigned i = 0; i < PER_PRODUCER; ++i) {
        int keep = i % KEEP_EVERY == 0;
        struct block* b = produce_block(keep ? KEEP_SIZE + p : 16 + 8 * (i % 32));
        if (!b) abort();
        b->keep = keep;
        push(b);
    }
    return NULL;
}

static void* consumer(void* arg) {
    (void)arg;
    for (;;) {
        struct block* b = pop();
        if (!b) return NULL; /* the end-of-work sentinel */
        if (b->keep) {
            pthread_mutex_lock(&lock);
            kept[kept_count++] = b;
            pthread_mutex_unlock(&lock);
        } else {
            free(b);
        }
    }
}

int main(void) {
    pthread_t producers[PRODUCERS], consumers[CONSUMERS];
    heapsnap_marker("started");
    for (uintptr_t p = 0; p < PRODUCERS; ++p)
        if (pthread_create(&producers[p], NULL, producer, (void*)p) != 0) return 2;
    for (int c = 0; c < CONSUMERS; ++c)
        if (pthread_create(&consumers[c], NULL, consumer, NULL) != 0) return 2;
    for (int p = 0; p < PRODUCERS; ++p) pthread_join(producers[p], NULL);
    for (int c = 0; c < CONSUMERS; ++c) push(NULL);
    for (int c = 0; c < CONSUMERS; ++c) pthread_join(consumers[c], NULL);
    heapsnap_marker("joined");
    return kept_count == KEPT_MAX ? 0 : 3;
}
