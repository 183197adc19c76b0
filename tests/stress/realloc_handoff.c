/* realloc_handoff — a block is allocated on one thread, grown on a second
 * and freed on a third, hundreds of thousands of times: addresses cross
 * threads at every step, and realloc's Free + Alloc pair happens on a
 * thread other than the one that allocated.
 *
 * PIPELINES pipelines, each of three threads joined by two bounded queues:
 *   make_block(size)   (stage 1)  malloc
 *   grow_block(p)      (stage 2)  realloc to twice the size (may move)
 *   stage 3                       free, except every KEEP_EVERY-th item,
 *                                 which it keeps
 * Item i of pipeline p has size 16 + 8 * (i % 64), or 1000 + p when kept.
 *
 * Live at "joined" and at exit, all from grow_block() (realloc owns the
 * kept blocks' final size):
 *   blocks: PIPELINES * ITEMS / KEEP_EVERY           = 4 * 50 = 200
 *   bytes:  50 * sum over p of 2 * (1000 + p)        = 50 * 8012 = 400600
 * Nothing is left live by make_block().
 * Output: "realloc_handoff: 200 kept". Exit status 0.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <heapsnap/heapsnap.h>

enum { PIPELINES = 4, ITEMS = 50000, KEEP_EVERY = 1000, SLOTS = 128 };

struct item {
    size_t size;
    int keep;
};

struct queue {
    struct item* slots[SLOTS];
    unsigned head, tail;
    pthread_mutex_t lock;
    pthread_cond_t changed;
};

static struct queue queues[PIPELINES][2];
static struct item* kept[PIPELINES * ITEMS / KEEP_EVERY];
static unsigned kept_count;
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;

static void push(struct queue* q, struct item* it) {
    pthread_mutex_lock(&q->lock);
    while (q->tail - q->head == SLOTS) pthread_cond_wait(&q->changed, &q->lock);
    q->slots[q->tail++ % SLOTS] = it;
    pthread_cond_broadcast(&q->changed);
    pthread_mutex_unlock(&q->lock);
}

static struct item* pop(struct queue* q) {
    pthread_mutex_lock(&q->lock);
    while (q->tail == q->head) pthread_cond_wait(&q->changed, &q->lock);
    struct item* it = q->slots[q->head++ % SLOTS];
    pthread_cond_broadcast(&q->changed);
    pthread_mutex_unlock(&q->lock);
    return it;
}

__attribute__((noinline)) struct item* make_block(size_t size) {
    return malloc(size); /* @site:make_block */
}

__attribute__((noinline)) struct item* grow_block(struct item* it) {
    return realloc(it, it->size * 2); /* @site:grow_block */
}

static void* stage1(void* arg) {
    uintptr_t p = (uintptr_t)arg;
    for (unsigned i = 0; i < ITEMS; ++i) {
        int keep = i % KEEP_EVERY == 0;
        size_t size = keep ? 1000 + p : 16 + 8 * (i % 64);
        struct item* it = make_block(size);
        if (!it) abort();
        it->size = size;
        it->keep = keep;
        push(&queues[p][0], it);
    }
    push(&queues[p][0], NULL);
    return NULL;
}

static void* stage2(void* arg) {
    uintptr_t p = (uintptr_t)arg;
    for (;;) {
        struct item* it = pop(&queues[p][0]);
        if (it) {
            it = grow_block(it);
            if (!it) abort();
        }
        push(&queues[p][1], it);
        if (!it) return NULL;
    }
}

static void* stage3(void* arg) {
    uintptr_t p = (uintptr_t)arg;
    for (;;) {
        struct item* it = pop(&queues[p][1]);
        if (!it) return NULL;
        if (it->keep) {
            pthread_mutex_lock(&kept_lock);
            kept[kept_count++] = it;
            pthread_mutex_unlock(&kept_lock);
        } else {
            free(it);
        }
    }
}

int main(void) {
    void* (*stages[3])(void*) = {stage1, stage2, stage3};
    pthread_t threads[PIPELINES][3];
    for (int p = 0; p < PIPELINES; ++p)
        for (int q = 0; q < 2; ++q) {
            pthread_mutex_init(&queues[p][q].lock, NULL);
            pthread_cond_init(&queues[p][q].changed, NULL);
        }
    heapsnap_marker("started");
    for (uintptr_t p = 0; p < PIPELINES; ++p)
        for (int s = 0; s < 3; ++s)
            if (pthread_create(&threads[p][s], NULL, stages[s], (void*)p) != 0) return 2;
    for (int p = 0; p < PIPELINES; ++p)
        for (int s = 0; s < 3; ++s) pthread_join(threads[p][s], NULL);
    heapsnap_marker("joined");
    printf("realloc_handoff: %u kept\n", kept_count);
    return kept_count == PIPELINES * ITEMS / KEEP_EVERY ? 0 : 3;
}
