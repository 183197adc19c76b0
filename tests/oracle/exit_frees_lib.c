/* The shared library of exit_frees: 1 000 bytes from its constructor,
 * freed by its destructor, which _dl_fini runs after the executable's. */
#include <stdlib.h>

static void* block;

void exit_frees_lib_touch(void) {}

__attribute__((constructor)) static void take(void) { block = malloc(1000); }
__attribute__((destructor)) static void give_back(void) { free(block); }
