// The files a module's names come from, for the symbol cache
// (symbol_cache.h): a cached name stays right while none of them changes.
//
// libdwfl reads the module, then looks for a separate debug file: by
// build-id under /usr/lib/debug/.build-id, then by the module's
// .gnu_debuglink name (or "<file>.debug") next to the module, in its
// .debug directory and under /usr/lib/debug (elfutils'
// dwfl_standard_find_debuginfo). A debug file made by dwz names an alt
// file too. Every one of these places is listed, present or not: a debug
// package installed later gives other names, and must be noticed.
#pragma once

#include <elfutils/libdwfl.h>

#include <vector>

#include "symbolize/symbol_cache.h"

namespace heapsnap {

// `module` as libdwfl opened it (its lookups done), and `file`, the module
// file's identity when it was opened: `file` first, then every other
// place, each once.
std::vector<FileIdentity> debug_sources(Dwfl_Module* module, const FileIdentity& file);

}  // namespace heapsnap
