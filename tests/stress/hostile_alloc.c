/* hostile_alloc — a malloc and an mmap that raise a signal from inside
 * themselves, so that a test program's handler runs at a known point
 * inside the recorder's hooks (which call these as the real functions:
 * the program links this library, so it comes after the recorder in the
 * lookup order, and before libc).
 *
 * Each function does its real work first (glibc's __libc_malloc, __mmap,
 * __munmap), so glibc's own state is whole when the handler runs, then
 * raises hostile_signal on every hostile_every-th call of its kind while
 * hostile_signal is not 0. Calls made while the handler runs never raise;
 * a program whose handler leaves by siglongjmp clears hostile_raising.
 *
 * With hostile_mask set, glibc's malloc and free run with every signal
 * blocked: a handler that jumps out of an asynchronous signal leaves
 * glibc's heap whole, wherever else it lands (the recorder's hooks).
 *
 * With hostile_trace set, the sizes of the next mallocs and callocs are
 * kept in hostile_sizes (malloc: the size; calloc: -(n * size)).
 */
/* mmap and mmap64 are both defined below: with _FILE_OFFSET_BITS=64
 * (meson's default) <sys/mman.h> would rename mmap to mmap64. */
#undef _FILE_OFFSET_BITS
#include <signal.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/types.h>

extern void* __libc_malloc(size_t);
extern void __libc_free(void*);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void* __libc_memalign(size_t, size_t);
extern void* __mmap(void*, size_t, int, int, int, off_t);
extern int __munmap(void*, size_t);

int hostile_signal;
int hostile_every = 1;
int hostile_mask;
int hostile_trace;
long hostile_sizes[64];
int hostile_traced;

static void trace(long size) {
    if (hostile_trace && hostile_traced < 64) hostile_sizes[hostile_traced++] = size;
}
/* Calls made so far, and the signals raised, by kind. */
unsigned long hostile_mallocs, hostile_maps, hostile_unmaps;
unsigned long hostile_raised;

volatile int hostile_raising;

static void maybe_raise(unsigned long* calls) {
    if (!hostile_signal || hostile_raising) return;
    if (++*calls % (unsigned long)hostile_every) return;
    hostile_raising = 1;
    hostile_raised++;
    raise(hostile_signal);
    hostile_raising = 0;
}

/* Runs `call` with every signal blocked if hostile_mask is set. */
#define MASKED(call)                                  \
    do {                                              \
        if (!hostile_mask) {                          \
            call;                                     \
            break;                                    \
        }                                             \
        sigset_t all_, old_;                          \
        sigfillset(&all_);                            \
        sigprocmask(SIG_SETMASK, &all_, &old_);       \
        call;                                         \
        sigprocmask(SIG_SETMASK, &old_, NULL);        \
    } while (0)

void* malloc(size_t size) {
    void* p;
    MASKED(p = __libc_malloc(size));
    trace((long)size);
    maybe_raise(&hostile_mallocs);
    return p;
}

void free(void* p) { MASKED(__libc_free(p)); }

void* calloc(size_t n, size_t size) {
    void* p;
    MASKED(p = __libc_calloc(n, size));
    trace(-(long)(n * size));
    return p;
}

void* realloc(void* old, size_t size) {
    void* p;
    MASKED(p = __libc_realloc(old, size));
    return p;
}

void* memalign(size_t align, size_t size) {
    void* p;
    MASKED(p = __libc_memalign(align, size));
    return p;
}

void* mmap(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
    void* p = __mmap(addr, length, prot, flags, fd, offset);
    maybe_raise(&hostile_maps);
    return p;
}

void* mmap64(void* addr, size_t length, int prot, int flags, int fd, off_t offset) {
    return mmap(addr, length, prot, flags, fd, offset);
}

int munmap(void* addr, size_t length) {
    int r = __munmap(addr, length);
    maybe_raise(&hostile_unmaps);
    return r;
}
