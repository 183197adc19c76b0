/* leaky_plugin — a shared object that dlopen_host loads, calls and unloads.
 * plugin_leak() allocates 4242 bytes and hands them to the host, which
 * keeps them: after dlclose the block is still live, and its stack points
 * into a module that is no longer mapped. The diff must still name
 * plugin_leak at the @site line of this file.
 */
#include <stdlib.h>

__attribute__((noinline)) void* plugin_leak(void) {
    return malloc(4242); /* @site:plugin_leak */
}
