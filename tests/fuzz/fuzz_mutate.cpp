// Runs a fuzz target on a fixed number of structure-aware mutations
// (mutator.h) of its seed corpus, without libFuzzer: the bounded share of
// tools/fuzz that `meson test` (suite fuzz) runs on every build.
//
//   fuzz_<kind>_mutations CORPUS_DIR CASES SEED
//
// Each case takes a seed file (whole files only: the 'R' raw inputs are
// libFuzzer's), mutates it one to three times and runs the target on the
// result. The address space is capped as in fuzz_main.cpp; a finding
// aborts, and the case's bytes are written to fuzz-finding-<kind>-<case>
// first, to be kept in tests/fuzz/corpus/<kind>/ once fixed.
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_input.h"
#include "mutator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

namespace {

std::string g_case_file;

void save_case(const heapsnap::fuzz::Bytes& bytes) {
    std::ofstream f(g_case_file, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

}  // namespace

int main(int argc, char** argv) {
    if (argc != 4) {
        std::fprintf(stderr, "usage: %s CORPUS_DIR CASES SEED\n", argv[0]);
        return 2;
    }
#if !defined(__SANITIZE_ADDRESS__)
    rlimit limit{heapsnap::fuzz::kMemoryLimit, heapsnap::fuzz::kMemoryLimit};
    setrlimit(RLIMIT_AS, &limit);
#endif
    if (LLVMFuzzerInitialize) LLVMFuzzerInitialize(&argc, &argv);
    bool log = std::string(argv[0]).find("fuzz_log") != std::string::npos;
    std::vector<heapsnap::fuzz::Bytes> seeds;
    std::vector<std::filesystem::path> paths;
    for (const auto& e : std::filesystem::directory_iterator(argv[1]))
        if (e.is_regular_file() && e.path().filename().string().rfind("raw-", 0) != 0) paths.push_back(e.path());
    std::sort(paths.begin(), paths.end());
    for (const auto& p : paths) {
        std::ifstream f(p, std::ios::binary);
        heapsnap::fuzz::Bytes bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
        if (!bytes.empty() && bytes[0] != 'R') seeds.push_back(std::move(bytes));
    }
    if (seeds.empty()) {
        std::fprintf(stderr, "%s: no seed files in %s\n", argv[0], argv[1]);
        return 1;
    }
    unsigned long cases = std::strtoul(argv[2], nullptr, 10);
    heapsnap::fuzz::Rng rng(std::strtoull(argv[3], nullptr, 10));
    unsigned long mutated = 0;
    for (unsigned long c = 0; c < cases; ++c) {
        heapsnap::fuzz::Bytes input = seeds[rng() % seeds.size()];
        for (int k = 1 + static_cast<int>(rng() % 3); k > 0; --k) {
            heapsnap::fuzz::Bytes next =
                log ? heapsnap::fuzz::mutate_log(input, rng) : heapsnap::fuzz::mutate_snapshot(input, rng);
            if (next.empty()) break;
            input = std::move(next);
        }
        mutated += input.size() > 0;
        g_case_file = std::string("fuzz-finding-") + (log ? "log-" : "snapshot-") + std::to_string(c);
        save_case(input);
        LLVMFuzzerTestOneInput(input.data(), input.size());
        std::remove(g_case_file.c_str());
    }
    std::printf("%lu mutated cases ran without a finding\n", mutated);
    return 0;
}
