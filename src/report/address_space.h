// The address-space summary (addrspace/summary.h) as people and scripts
// read it: WinDbg's `!address -summary`-like text, its JSON
// (formats/address-space.md), the delta between two moments and the
// verdict naming the category that grew.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "addrspace/summary.h"

namespace heapsnap::addrspace {

// The `!address -summary`-like report: usage rows sorted by size (largest
// first), type and state tables, largest region per category, then the
// reconciliation. `color` adds ANSI bold to headings.
std::string render_text(const AddressSpaceSummary& s, bool color);

// Shape: formats/address-space.md.
nlohmann::json to_json(const AddressSpaceSummary& s);

// The numeric fields of to_json, each new - old (signed); a field that is
// null on either side is null.
nlohmann::json delta_json(const AddressSpaceSummary& old_s, const AddressSpaceSummary& new_s);

// Category, old size/Rss, new size/Rss, delta Rss, delta size; then a busy
// total row and a line with threads and tracked/malloc changes. Does not
// include verdict(): callers print it where they want it.
std::string render_delta_text(const AddressSpaceSummary& old_s, const AddressSpaceSummary& new_s, bool color);

// One line naming the dominant category of growth (the rule in
// addrspace/summary.h, "Verdict"), e.g. "growth is thread stacks: +3
// threads, +24.0 MiB reserved, +96.0 KiB rss".
std::string verdict(const AddressSpaceSummary& old_s, const AddressSpaceSummary& new_s);

}  // namespace heapsnap::addrspace
