// Runs a libFuzzer target without libFuzzer: every file named on the
// command line (directories: every file in them, sorted) goes through
// LLVMFuzzerTestOneInput once. This is how the seed corpus and the inputs
// that once broke a decoder stay regression tests in `meson test` (suite
// fuzz-corpus), with any compiler and without a sanitizer runtime.
//
// The address space is capped first, so an unbounded allocation shows as
// std::bad_alloc (an uncaught exception: the test fails) instead of
// swapping the machine.
#include <sys/resource.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

#if defined(__SANITIZE_ADDRESS__)
#define HEAPSNAP_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define HEAPSNAP_ASAN 1
#endif
#endif

int main(int argc, char** argv) {
#ifndef HEAPSNAP_ASAN
    // (AddressSanitizer reserves terabytes of shadow memory; under it the
    // cap is ASAN_OPTIONS=max_allocation_size_mb, set by the meson test.)
    rlimit limit{heapsnap::fuzz::kMemoryLimit, heapsnap::fuzz::kMemoryLimit};
    setrlimit(RLIMIT_AS, &limit);
#endif
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    std::vector<std::filesystem::path> inputs;
    for (int i = 1; i < argc; ++i) {
        std::filesystem::path p = argv[i];
        if (std::filesystem::is_directory(p)) {
            for (const auto& e : std::filesystem::directory_iterator(p))
                if (e.is_regular_file()) inputs.push_back(e.path());
        } else {
            inputs.push_back(p);
        }
    }
    std::sort(inputs.begin(), inputs.end());
    if (inputs.empty()) {
        std::fprintf(stderr, "%s: no inputs\n", argv[0]);
        return 1;
    }
    for (const auto& p : inputs) {
        std::ifstream f(p, std::ios::binary);
        std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        std::fprintf(stderr, "%s (%zu bytes)\n", p.c_str(), bytes.size());
        LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    }
    std::printf("%zu inputs ran without a finding\n", inputs.size());
    return 0;
}
