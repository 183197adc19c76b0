#include "recorder/metadata_queue.h"

#include <cstring>

#include "recorder/raw_alloc.h"

namespace heapsnap::recorder {
namespace {

struct Buffer {
    uint8_t* bytes = nullptr;
    size_t capacity = 0;
    size_t used = 0;
};

// g_buffers[g_active] takes new records; the other one is the writer's
// last batch.
Buffer g_buffers[2];
unsigned g_active = 0;

bool grow(Buffer& b, size_t needed) {
    size_t capacity = b.capacity ? b.capacity : 1 << 20;
    while (capacity < needed) capacity *= 2;
    if (capacity == b.capacity) return true;
    auto* fresh = static_cast<uint8_t*>(raw_map(capacity));
    if (!fresh) return false;
    if (b.used) std::memcpy(fresh, b.bytes, b.used);
    raw_unmap(b.bytes, b.capacity);
    b.bytes = fresh;
    b.capacity = capacity;
    return true;
}

}  // namespace

bool metadata_reserve(size_t max_bytes, codec::Writer* out) {
    Buffer& b = g_buffers[g_active];
    if (!grow(b, b.used + 4 + max_bytes)) return false;
    *out = codec::Writer(b.bytes + b.used + 4, max_bytes);
    return true;
}

void metadata_commit(const codec::Writer& record) {
    Buffer& b = g_buffers[g_active];
    auto n = static_cast<uint32_t>(record.size());
    std::memcpy(b.bytes + b.used, &n, 4);
    b.used += 4 + n;
}

MetadataBatch metadata_take() {
    const Buffer& taken = g_buffers[g_active];
    g_active ^= 1;
    g_buffers[g_active].used = 0;  // the batch taken before, drained by now
    return MetadataBatch{taken.bytes, taken.used};
}

void metadata_clear() {
    g_buffers[0].used = 0;
    g_buffers[1].used = 0;
}

}  // namespace heapsnap::recorder
