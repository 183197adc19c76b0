#include "recorder/metadata_queue.h"

#include <cstring>

#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

uint8_t* g_buf = nullptr;
size_t g_capacity = 0;
size_t g_used = 0;

bool grow(size_t needed) {
    size_t capacity = g_capacity ? g_capacity : 1 << 20;
    while (capacity < needed) capacity *= 2;
    if (capacity == g_capacity) return true;
    auto* fresh = static_cast<uint8_t*>(raw_map(capacity));
    if (!fresh) return false;
    if (g_used) std::memcpy(fresh, g_buf, g_used);
    raw_unmap(g_buf, g_capacity);
    g_buf = fresh;
    g_capacity = capacity;
    return true;
}

}  // namespace

bool metadata_reserve(size_t max_bytes, codec::Writer* out) {
    if (!grow(g_used + 4 + max_bytes)) return false;
    *out = codec::Writer(g_buf + g_used + 4, max_bytes);
    return true;
}

void metadata_commit(const codec::Writer& record) {
    auto n = static_cast<uint32_t>(record.size());
    std::memcpy(g_buf + g_used, &n, 4);
    g_used += 4 + n;
}

const uint8_t* metadata_bytes() { return g_buf; }
size_t metadata_used() { return g_used; }
void metadata_clear() { g_used = 0; }

}  // namespace heapsnap::recorder
