// Byte counts for people: "512 B", "1.5 KiB", "24.0 MiB", "127.9 TiB".
//
// One format everywhere (maps, diff, markers, verdicts) so a number read in
// one table can be compared by eye with the same number in another. Binary
// units, because every size heapsnap prints is a multiple of a page or a
// malloc chunk, and the kernel and allocator count in powers of two. Exact
// below 1 KiB (where a rounded "0.5 KiB" would hide a 3-byte leak), one
// decimal above; the unit is chosen after rounding, so 1048575 bytes prints
// "1.0 MiB", never "1024.0 KiB".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace heapsnap {

// part as a percentage of whole; 0 when whole is 0.
double percent(uint64_t part, uint64_t whole);

// "0 B", "1023 B", "1.0 KiB", "1.5 MiB", up to EiB.
std::string human_bytes(uint64_t bytes);

// A byte count as a person writes it on a command line: a number with an
// optional binary unit K, M, G, T (or KiB, KB, ... any case; 1K = 1024),
// "1.5G" too. Nullopt for anything else (a sign, junk, more than 2^64 - 1).
std::optional<uint64_t> parse_size(std::string_view text);
// The other way, rounded up to a whole unit: "768M", "4G", "12K".
std::string size_option(uint64_t bytes);
// Exact: "4096", "1G", "1536K": a unit only where it divides the count.
std::string size_option_or_bytes(uint64_t bytes);

// human_bytes with an explicit sign: "+1.5 MiB", "-512 B", and "0 B" for zero.
std::string human_bytes_signed(int64_t bytes);

// The line every text output shows for a log recorded with --sample-bytes
// (empty for an exact one): "sampled: one sample per 64.0 KiB allocated;
// heap bytes and blocks are estimates".
std::string sampling_note(uint64_t sample_bytes);

}  // namespace heapsnap
