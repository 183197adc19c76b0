#include "util/human.h"

#include <fmt/format.h>

namespace heapsnap {

double percent(uint64_t part, uint64_t whole) {
    return whole == 0 ? 0.0 : 100.0 * static_cast<double>(part) / static_cast<double>(whole);
}

std::string human_bytes(uint64_t bytes) {
    static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    constexpr int kLastUnit = 6;
    if (bytes < 1024) return fmt::format("{} B", bytes);
    int unit = 0;
    long double value = static_cast<long double>(bytes);
    while (value >= 1024.0L && unit < kLastUnit) {
        value /= 1024.0L;
        ++unit;
    }
    std::string number = fmt::format("{:.1f}", static_cast<double>(value));
    // 1023.96 KiB rounds to "1024.0": print it as the next unit instead.
    if (number == "1024.0" && unit < kLastUnit) {
        number = "1.0";
        ++unit;
    }
    return fmt::format("{} {}", number, units[unit]);
}

std::string sampling_note(uint64_t sample_bytes) {
    if (!sample_bytes) return "";
    return "sampled: one sample per " + human_bytes(sample_bytes) +
           " allocated; heap bytes and blocks are estimates";
}

std::string human_bytes_signed(int64_t bytes) {
    if (bytes == 0) return "0 B";
    // Negate in unsigned arithmetic so INT64_MIN has a magnitude too.
    uint64_t magnitude = bytes < 0 ? 0 - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
    return (bytes < 0 ? "-" : "+") + human_bytes(magnitude);
}

}  // namespace heapsnap
