// util/text.h (what a foreign file's text prints as) and util/human.h's
// byte counts as a person writes them.
#include <doctest/doctest.h>

#include "util/human.h"
#include "util/text.h"

using namespace heapsnap;

TEST_CASE("terminal_safe: control characters escaped, printable UTF-8 kept") {
    CHECK(terminal_safe("plain /usr/lib/libc.so.6") == "plain /usr/lib/libc.so.6");
    CHECK(terminal_safe("A\x1b]0;owned\x07\x1b[2J") == "A\\x1b]0;owned\\x07\\x1b[2J");
    CHECK(terminal_safe("line\r\nforged\ttab") == "line\\r\\nforged\\ttab");
    CHECK(terminal_safe(std::string("nul\0end", 7)) == "nul\\x00end");
    CHECK(terminal_safe("del\x7f") == "del\\x7f");
    // C1 controls (CSI is U+009B) and bidirectional overrides as \uXXXX.
    CHECK(terminal_safe("\xc2\x9b"
                        "31m") == "\\u009b31m");
    CHECK(terminal_safe("\xe2\x80\xae"
                        "evil") == "\\u202eevil");
    CHECK(terminal_safe("\xe2\x81\xa6x") == "\\u2066x");
    // Not UTF-8: each byte as \xHH; overlong forms and surrogates too.
    CHECK(terminal_safe("caf\xe9") == "caf\\xe9");
    CHECK(terminal_safe("\xc0\xaf") == "\\xc0\\xaf");
    CHECK(terminal_safe("\xed\xa0\x80") == "\\xed\\xa0\\x80");
    CHECK(terminal_safe("\xe2\x82") == "\\xe2\\x82");
    // Printable UTF-8 as it is: a demangled name, a path in any script.
    CHECK(terminal_safe("std::vector<int>::push_back(int const&)") == "std::vector<int>::push_back(int const&)");
    CHECK(terminal_safe("/home/jos\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac.so \xf0\x9f\x98\x80") ==
          "/home/jos\xc3\xa9/\xe6\x97\xa5\xe6\x9c\xac.so \xf0\x9f\x98\x80");
}

TEST_CASE("csv_field: RFC 4180 quoting of terminal-safe text") {
    CHECK(csv_field("malloc") == "malloc");
    CHECK(csv_field("f(int, int)") == "\"f(int, int)\"");
    CHECK(csv_field("say \"hi\"") == "\"say \"\"hi\"\"\"");
    CHECK(csv_field("two\nlines") == "two\\nlines");
    CHECK(csv_field("\x1b[2J,x") == "\"\\x1b[2J,x\"");
}

TEST_CASE("parse_size: numbers with binary units, nothing else") {
    CHECK(parse_size("0") == 0u);
    CHECK(parse_size("4096") == 4096u);
    CHECK(parse_size("10K") == 10240u);
    CHECK(parse_size("10k") == 10240u);
    CHECK(parse_size("10KiB") == 10240u);
    CHECK(parse_size("10KB") == 10240u);
    CHECK(parse_size("5M") == 5u << 20);
    CHECK(parse_size("1G") == 1u << 30);
    CHECK(parse_size("2T") == uint64_t{2} << 40);
    CHECK(parse_size("1.5K") == 1536u);
    CHECK(parse_size("512B") == 512u);
    CHECK(parse_size("18446744073709551615") == UINT64_MAX);
    for (const char* bad : {"", "-1", "+1", "1x", "K", "1.", ".5", "1..5", "1 K", "1Kb2", "18446744073709551616", "16E",
                            "17179869184G", "1e3", "nan"})
        CHECK_MESSAGE(!parse_size(bad), bad);
}

TEST_CASE("size options: the other way") {
    CHECK(size_option(768u << 20) == "768M");
    CHECK(size_option((1u << 30) + 1) == "2G");
    CHECK(size_option(1000) == "1K");
    CHECK(size_option_or_bytes(4096) == "4K");
    CHECK(size_option_or_bytes(1u << 30) == "1G");
    CHECK(size_option_or_bytes(1536u << 10) == "1536K");
    CHECK(size_option_or_bytes(1000) == "1000");
    CHECK(size_option_or_bytes(0) == "0");
    CHECK(size_option_or_bytes(INT64_MAX) == "9223372036854775807");
}
