/* libctor_alloc — a shared library whose constructor allocates and frees
 * 100 blocks of 32 bytes at one place (@site:ctor_alloc). ld.so runs it at
 * startup from _dl_start_user, code no FDE covers, where libunwind ends the
 * stack because rbp is 0: the recorder's walk must end it there too,
 * without handing the stack to the full CFI walk (src/recorder/frame_rules.h,
 * NoInfo). ctor_host links it.
 */
#include <stdlib.h>

static void *volatile sink;
static int blocks;

__attribute__((constructor)) static void allocate_at_load(void) {
    for (int i = 0; i < 100; ++i) {
        sink = malloc(32); /* @site:ctor_alloc */
        free(sink);
        blocks++;
    }
}

int ctor_alloc_blocks(void) { return blocks; }
