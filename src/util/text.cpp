#include "util/text.h"

#include <fmt/format.h>

#include <cstdint>

namespace heapsnap {
namespace {

// The length of the UTF-8 sequence at text[i] and its code point, or 0
// when the bytes there are not UTF-8 (overlong forms and surrogates
// included).
size_t utf8_at(std::string_view text, size_t i, uint32_t* code) {
    auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
    unsigned char b = byte(i);
    size_t n = b >= 0xf0 && b <= 0xf4 ? 4 : b >= 0xe0 ? (b <= 0xef ? 3 : 0) : b >= 0xc2 && b <= 0xdf ? 2 : 0;
    if (n == 0 || i + n > text.size()) return 0;
    uint32_t c = b & (0x7f >> n);
    for (size_t k = 1; k < n; ++k) {
        if ((byte(i + k) & 0xc0) != 0x80) return 0;
        c = c << 6 | (byte(i + k) & 0x3f);
    }
    if ((n == 3 && c < 0x800) || (n == 4 && (c < 0x10000 || c > 0x10ffff)) || (c >= 0xd800 && c <= 0xdfff)) return 0;
    *code = c;
    return n;
}

bool is_format_control(uint32_t c) {
    return (c >= 0x80 && c <= 0x9f) ||                   // C1 controls (CSI is U+009B)
           (c >= 0x202a && c <= 0x202e) ||               // bidirectional embeddings and overrides
           (c >= 0x2066 && c <= 0x2069) ||               // bidirectional isolates
           c == 0x200e || c == 0x200f || c == 0x061c ||  // direction marks
           c == 0x2028 || c == 0x2029;                   // line and paragraph separators
}

}  // namespace

std::string terminal_safe(std::string_view text) {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
        auto b = static_cast<unsigned char>(text[i]);
        if (b >= 0x20 && b < 0x7f) {
            out += static_cast<char>(b);
            ++i;
        } else if (b == '\n') {
            out += "\\n", ++i;
        } else if (b == '\r') {
            out += "\\r", ++i;
        } else if (b == '\t') {
            out += "\\t", ++i;
        } else if (b < 0x80) {
            out += fmt::format("\\x{:02x}", b), ++i;
        } else {
            uint32_t code = 0;
            size_t n = utf8_at(text, i, &code);
            if (n == 0) {
                out += fmt::format("\\x{:02x}", b), ++i;
            } else if (is_format_control(code)) {
                out += fmt::format("\\u{:04x}", code), i += n;
            } else {
                out.append(text.substr(i, n)), i += n;
            }
        }
    }
    return out;
}

std::string csv_field(std::string_view text) {
    std::string safe = terminal_safe(text);
    if (safe.find_first_of(",\"") == std::string::npos) return safe;
    std::string quoted = "\"";
    for (char c : safe) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
}

std::string hex_of(std::string_view bytes) {
    std::string out;
    for (unsigned char c : bytes) out += fmt::format("{:02x}", c);
    return out;
}

}  // namespace heapsnap
