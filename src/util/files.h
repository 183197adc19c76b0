// Small file helpers shared by the CLI: whole-file reads and the safe way
// to create output files (never following a symlink, mode 0600, never
// exposing a half-written file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace heapsnap {

// Reads the whole file; throws heapsnap::Error "<path>: <strerror>".
std::vector<uint8_t> read_file(const std::string& path);

// Writes `data` to a fresh temporary file next to `path` (O_EXCL, 0600),
// then renames it over `path`. Throws heapsnap::Error.
void write_file_atomically(const std::string& path, const std::vector<uint8_t>& data);

}  // namespace heapsnap
