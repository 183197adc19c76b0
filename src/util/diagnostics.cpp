#include "util/diagnostics.h"

#include <iostream>

#include "util/text.h"

namespace heapsnap {

// Warnings name files and quote what they hold: one line, whatever those
// bytes are (util/text.h).
void warn(const std::string& text) { std::cerr << "heapsnap: warning: " << terminal_safe(text) << "\n"; }

}  // namespace heapsnap
