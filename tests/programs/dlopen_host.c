/* dlopen_host PLUGIN — dlopen the plugin, call its plugin_leak(), keep the
 * block, dlclose the plugin, exit.
 *
 * Markers: "before-dlopen" at the start of main, "after-dlclose" once the
 * plugin is unloaded. Between them the only block that stays live from this
 * program or the plugin is plugin_leak's 4242 bytes (what dlopen itself
 * allocates is glibc's, and dlclose frees it).
 * Exit status: 0; 2 if the plugin cannot be loaded, 3 if dlclose fails.
 */
#include <dlfcn.h>
#include <string.h>
#include <unistd.h>

#include <heapsnap/heapsnap.h>

static void* volatile leaked;

static void say(const char* s) {
    ssize_t ignored = write(STDERR_FILENO, s, strlen(s));
    (void)ignored;
}

int main(int argc, char** argv) {
    if (argc != 2) {
        say("usage: dlopen_host PLUGIN\n");
        return 2;
    }
    heapsnap_marker("before-dlopen");
    void* plugin = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        say(dlerror());
        say("\n");
        return 2;
    }
    void* (*leak)(void) = (void* (*)(void))dlsym(plugin, "plugin_leak");
    if (!leak) return 2;
    leaked = leak();
    if (dlclose(plugin) != 0) return 3;
    heapsnap_marker("after-dlclose");
    return 0;
}
