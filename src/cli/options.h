// The validators every command's options share, so that one kind of
// value reads and fails the same way everywhere: counts are whole numbers
// (never negative), byte counts take the same suffixes (10K, 5M, 1G),
// ranges print as a person writes them ("1 to 1G", "0.1 to 3600 s"), and
// a choice that is off by a typo says which one was meant.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace heapsnap::cli {

// A whole number from `min` to `max`: "--top: -1 is not a count (0 or more)".
CLI::Validator count_in(uint64_t min, uint64_t max);
// A byte count with an optional binary suffix (util/human.h, parse_size),
// from `min` to `max`; the option receives the number of bytes.
CLI::Validator bytes_in(uint64_t min, uint64_t max);
// A number of `unit` (seconds) from `min` to `max`.
CLI::Validator number_in(double min, double max, const char* unit);
// One of `choices`: "--format: jsn is not one of text, json (did you mean json?)".
CLI::Validator one_of(std::vector<std::string> choices);

// The choice nearest to `typed` (edit distance at most a third of its
// length, and at most 3), or "".
std::string nearest(const std::string& typed, const std::vector<std::string>& choices);

// What to add to CLI11's "not expected" error: for each argument of
// `extras` that looks like an option, the nearest option of `app`; for
// `heapsnap run PROGRAM -v`, to put -- before the program. Empty if
// nothing helps.
std::string suggest_for_extras(const CLI::App& app, const std::vector<std::string>& extras);

}  // namespace heapsnap::cli
