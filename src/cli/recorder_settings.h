// The recorder's settings as `heapsnap run` and `heapsnap attach` take
// them: one set of options, turned into the HEAPSNAP_* variables the
// recorder reads (README, "Without the launcher"). `run` puts them in the
// program's environment; `attach` hands the same NAME=value strings to
// the recorder it loads (src/cli/inject.h), which reads them in place of
// the environment. A new recorder setting is one option here and one
// variable in recorder_variables, and both commands have it.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace heapsnap::cli {

struct RecorderSettings {
    std::string output = "heapsnap.%e.%p.hslog";
    std::string unwind = "auto";
    unsigned depth = 64;
    uint64_t sample_bytes = 0;
};

// -o/--output, --unwind, --depth, --sample-bytes on `sub`.
void add_recorder_options(CLI::App* sub, RecorderSettings& s);

// The variables, in order; an empty value means "unset" (the default).
// The output pattern is made absolute from the current directory.
std::vector<std::pair<std::string, std::string>> recorder_variables(const RecorderSettings& s);

// The absolute path of libheapsnap_preload.so: HEAPSNAP_PRELOAD_LIB, next
// to the binary (build tree), or <prefix>/lib[/<multiarch>]/heapsnap.
std::string find_preload_library();

}  // namespace heapsnap::cli
