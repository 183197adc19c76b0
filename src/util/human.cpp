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

std::optional<uint64_t> parse_size(std::string_view text) {
    size_t digits = 0;
    while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) ++digits;
    std::string_view number = text.substr(0, digits), unit = text.substr(digits);
    if (number.empty() || number.front() == '.' || number.back() == '.' || number.find('.') != number.rfind('.'))
        return std::nullopt;
    std::string lower;
    for (char c : unit) lower += static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
    int shift = 0;
    if (!lower.empty() && std::string_view("kmgt").find(lower[0]) != std::string_view::npos) {
        shift = 10 * (1 + static_cast<int>(std::string_view("kmgt").find(lower[0])));
        lower.erase(0, 1);
        if (lower == "ib" || lower == "b") lower.clear();
    } else if (lower == "b") {
        lower.clear();
    }
    if (!lower.empty()) return std::nullopt;
    size_t dot = number.find('.');
    std::string_view whole = number.substr(0, dot);
    std::string_view fraction = dot == std::string_view::npos ? std::string_view() : number.substr(dot + 1);
    unsigned __int128 value = 0;
    for (char c : whole) {
        value = value * 10 + static_cast<unsigned>(c - '0');
        if (value > UINT64_MAX) return std::nullopt;
    }
    value <<= shift;
    // The fraction of a unit, rounded down to whole bytes: "1.5K" is 1536.
    unsigned __int128 part = 0, scale = 1;
    for (char c : fraction.substr(0, 18)) {
        part = part * 10 + static_cast<unsigned>(c - '0');
        scale *= 10;
    }
    value += (part << shift) / scale;
    if (value > UINT64_MAX) return std::nullopt;
    return static_cast<uint64_t>(value);
}

std::string size_option(uint64_t bytes) {
    static const char units[] = {'K', 'M', 'G', 'T'};
    int unit = bytes >= (uint64_t{1} << 40)   ? 3
               : bytes >= (uint64_t{1} << 30) ? 2
               : bytes >= (uint64_t{1} << 20) ? 1
                                              : 0;
    uint64_t size = uint64_t{1} << (10 * (unit + 1));
    return std::to_string(bytes / size + (bytes % size ? 1 : 0)) + units[unit];
}

std::string size_option_or_bytes(uint64_t bytes) {
    static const char units[] = {'T', 'G', 'M', 'K'};
    for (int i = 0; i < 4; ++i) {
        uint64_t size = uint64_t{1} << (10 * (4 - i));
        if (bytes && bytes % size == 0) return std::to_string(bytes / size) + units[i];
    }
    return std::to_string(bytes);
}

std::string sampling_note(uint64_t sample_bytes) {
    if (!sample_bytes) return "";
    return "sampled: one sample per " + human_bytes(sample_bytes) + " allocated; heap bytes and blocks are estimates";
}

std::string human_bytes_signed(int64_t bytes) {
    if (bytes == 0) return "0 B";
    // Negate in unsigned arithmetic so INT64_MIN has a magnitude too.
    uint64_t magnitude = bytes < 0 ? 0 - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
    return (bytes < 0 ? "-" : "+") + human_bytes(magnitude);
}

}  // namespace heapsnap
