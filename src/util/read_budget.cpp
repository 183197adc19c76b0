#include "util/read_budget.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <set>
#include <string_view>
#include <utility>

#include "util/human.h"

namespace heapsnap {
namespace {

struct Budget {
    uint64_t input = 0;
    uint64_t memory = 0;
    uint64_t volume = 0;
    std::set<std::pair<dev_t, ino_t>> inputs;
    bool lifted = false;
};

Budget g_budget;

// A variable as set: a size ("2G") or "unlimited" (UINT64_MAX); nullopt
// when unset or empty. A bad value is an error the user must see, not a
// silent default. Read at each charge: charges come in steps, and a
// program (a fuzz target) may set it after it started.
std::optional<uint64_t> set_limit(const char* variable) {
    const char* text = std::getenv(variable);
    if (!text || !*text) return std::nullopt;
    if (std::string_view(text) == "unlimited") return UINT64_MAX;
    std::optional<uint64_t> size = parse_size(text);
    if (!size) throw Error(std::string(variable) + "=" + text + ": not a size (such as 512M, 4G or unlimited)");
    return size;
}

// HEAPSNAP_READ_MEMORY / HEAPSNAP_READ_VOLUME where set, else the base or
// the share of the input, whichever is more.
uint64_t allowance(const char* variable, uint64_t base, uint64_t per_input_byte) {
    if (g_budget.lifted) return UINT64_MAX;
    if (std::optional<uint64_t> set = set_limit(variable)) return *set;
    uint64_t scaled = g_budget.input > UINT64_MAX / per_input_byte ? UINT64_MAX : g_budget.input * per_input_byte;
    return std::max(base, scaled);
}

[[noreturn]] void exceeded(const std::string& needs, const char* variable, uint64_t limit) {
    uint64_t more = limit > UINT64_MAX / 4 ? UINT64_MAX : limit * 4;
    throw BudgetExceeded(needs + ", more than " + human_bytes(g_budget.input) +
                         " of input justifies (a crafted file?); if it is genuine, allow more with " + variable + "=" +
                         size_option(more) + " or more (or unlimited)");
}

}  // namespace

void budget_add_input(int fd) {
    struct stat st;
    if (fstat(fd, &st) != 0 || !g_budget.inputs.emplace(st.st_dev, st.st_ino).second) return;
    g_budget.input += static_cast<uint64_t>(st.st_size);
}

void budget_take_volume(uint64_t bytes) {
    uint64_t limit = allowance("HEAPSNAP_READ_VOLUME", kBaseVolume, kVolumePerInputByte);
    if (bytes > limit - std::min(limit, g_budget.volume))
        exceeded("goes through more than " + human_bytes(limit) + " (decompressed)", "HEAPSNAP_READ_VOLUME", limit);
    g_budget.volume += bytes;
}

void budget_take_memory(uint64_t bytes, const char* what) {
    uint64_t limit = allowance("HEAPSNAP_READ_MEMORY", kBaseMemory, kMemoryPerInputByte);
    if (bytes > limit - std::min(limit, g_budget.memory))
        exceeded("needs more than " + human_bytes(limit) + " of memory (" + what + ")", "HEAPSNAP_READ_MEMORY", limit);
    g_budget.memory += bytes;
}

void budget_give_back_memory(uint64_t bytes) { g_budget.memory -= std::min(bytes, g_budget.memory); }

void budget_lift() { g_budget.lifted = true; }

void budget_reset() { g_budget = Budget{}; }

}  // namespace heapsnap
