// The one error type of the CLI side. Everything that can go wrong with
// input (files, PIDs, options) throws heapsnap::Error with a message meant
// for the user; the CLI boundary prints it as one line,
// "heapsnap: error: <message>", and exits with status 1.
// The recorder never throws (it runs inside someone else's process).
#pragma once

#include <stdexcept>
#include <string>

namespace heapsnap {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace heapsnap
