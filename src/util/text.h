// Text from a file, made safe to print.
//
// Labels, paths, function and module names and command lines come from
// logs and snapshots, which may come from anyone: printed raw, an ESC
// could retitle the terminal or clear it, a CR or LF forge an output line.
// Every string that came from a file goes through one of these before a
// text or CSV output (JSON output escapes per its own spec: nlohmann).
#pragma once

#include <string>
#include <string_view>

namespace heapsnap {

// `text` with every control character escaped: \n, \r, \t, and \xHH for
// the other C0 bytes and DEL; \u0080-\u009f for the C1 controls and \u202a
// and the like for the bidirectional overrides (which reorder what
// follows on a line); \xHH for each byte that is not UTF-8. Printable
// UTF-8 (a demangled C++ name, a path in any script) is kept as it is.
std::string terminal_safe(std::string_view text);

// A CSV field (RFC 4180): terminal_safe, then in double quotes, with its
// double quotes doubled, if it holds a comma or a double quote.
std::string csv_field(std::string_view text);

// Raw bytes (a build-id) as lowercase hex, two digits a byte.
std::string hex_of(std::string_view bytes);

}  // namespace heapsnap
