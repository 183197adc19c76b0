/* A library whose one job is to be a TLS module, as libunwind.so.8 is: 16
 * bytes of thread-local storage (libunwind's are unw_backtrace's per-thread
 * trace cache pointer and its "destroyed" flag, in Ltrace.o). Preloaded
 * under valgrind, it gives the program the same thread descriptors
 * (glibc's DTV, one 16-byte entry per TLS module) the recorder's libunwind
 * gives it under heapsnap. */
__thread void* tls_module_slot[2];

void** tls_module_touch(void) { return tls_module_slot; }
