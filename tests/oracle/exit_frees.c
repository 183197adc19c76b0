/* exit_frees — frees on its way out, in every way a process may:
 * an atexit handler, an on_exit handler, a handler registered by another
 * handler while exit runs, a thread-local destructor
 * (__cxa_thread_atexit_impl, what C++ thread_local objects use), and the
 * destructor of a shared library (libexit_frees_lib.so, which frees the
 * 1 000 bytes its constructor allocated). Nothing is live at exit: the
 * exit marker and valgrind both say 0 bytes in 0 blocks.
 */
#include <stdlib.h>

extern void* __dso_handle;
int __cxa_thread_atexit_impl(void (*fn)(void*), void* obj, void* dso);
int on_exit(void (*fn)(int, void*), void* arg);
void exit_frees_lib_touch(void);

static void* by_atexit;
static void* by_late;

static void free_late(void) { free(by_late); }
static void free_by_atexit(void) {
    free(by_atexit);
    by_late = malloc(111);
    atexit(free_late);
}
static void free_by_on_exit(int status, void* p) {
    (void)status;
    free(p);
}

int main(void) {
    exit_frees_lib_touch();
    by_atexit = malloc(222);
    atexit(free_by_atexit);
    on_exit(free_by_on_exit, malloc(333));
    __cxa_thread_atexit_impl(free, malloc(444), &__dso_handle);
    return 0;
}
