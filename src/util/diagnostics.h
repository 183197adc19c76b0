// Warnings from any part of the CLI side: one line on stderr,
// "heapsnap: warning: <text>", for what a command noticed and went on
// without (a checkpoint it would not trust, a module it could not read).
// Errors are not printed here: they are thrown (util/error.h).
#pragma once

#include <string>

namespace heapsnap {

void warn(const std::string& text);

}  // namespace heapsnap
