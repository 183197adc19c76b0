/* churn_plugin — loaded and unloaded hundreds of times by dlopen_churn.
 * plugin_work(n) allocates and frees a few scratch blocks and returns
 * plugin_keep(n)'s block, malloc(100 + n % 7), which the host keeps after
 * the plugin is gone.
 */
#include <stdlib.h>

__attribute__((noinline)) void* plugin_keep(unsigned n) {
    return malloc(100 + n % 7); /* @site:plugin_keep */
}

void* plugin_work(unsigned n) {
    for (unsigned i = 0; i < 20; ++i) {
        void* volatile scratch = malloc(24 + i);
        free(scratch);
    }
    return plugin_keep(n);
}
