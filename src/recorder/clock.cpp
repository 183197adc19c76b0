#include "recorder/clock.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

namespace heapsnap::recorder {

bool g_clock_is_tsc = false;

namespace {

uint64_t g_base_ticks = 0;
uint64_t g_base_ns = 0;
// Nanoseconds per tick, as a 32.32 fixed-point number so conversion is an
// integer multiply.
std::atomic<uint64_t> g_rate_fp{1ull << 32};

bool clocksource_is_tsc() {
    int fd = open("/sys/devices/system/clocksource/clocksource0/current_clocksource", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[32] = {};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n >= 3 && strncmp(buf, "tsc", 3) == 0 && (n == 3 || buf[3] == '\n');
}

void set_rate(uint64_t ticks, uint64_t ns) {
    if (ticks <= g_base_ticks || ns <= g_base_ns) return;
    unsigned __int128 fp = (static_cast<unsigned __int128>(ns - g_base_ns) << 32) / (ticks - g_base_ticks);
    g_rate_fp.store(static_cast<uint64_t>(fp), std::memory_order_relaxed);
}

}  // namespace

void init_clock() {
    g_clock_is_tsc = clocksource_is_tsc();
    g_base_ns = now_ns();
    g_base_ticks = now_ticks();
    if (!g_clock_is_tsc) return;
    uint64_t until = g_base_ns + 200000;
    uint64_t ns;
    while ((ns = now_ns()) < until) {
    }
    set_rate(now_ticks(), ns);
}

uint64_t ticks_to_ns(uint64_t ticks) {
    if (!g_clock_is_tsc) return ticks;
    if (ticks <= g_base_ticks) return g_base_ns;
    unsigned __int128 delta =
        static_cast<unsigned __int128>(ticks - g_base_ticks) * g_rate_fp.load(std::memory_order_relaxed);
    return g_base_ns + static_cast<uint64_t>(delta >> 32);
}

void recalibrate_clock() {
    if (!g_clock_is_tsc) return;
    uint64_t ticks = now_ticks();
    uint64_t ns = now_ns();
    // Only once the interval makes the estimate better than at start.
    if (ns - g_base_ns > 10000000) set_rate(ticks, ns);
}

}  // namespace heapsnap::recorder
