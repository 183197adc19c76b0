// The writer's side of block ids (formats/hslog.md, "Block ids"): which
// live heap block has which id, and the id allocator the reader mirrors.
//
// A log names heap blocks by small ids instead of addresses, because
// addresses are what made version-1 logs big (a free's address delta is
// nearly random). The reader knows every Alloc's id without reading it,
// since both sides give ids the same way: the most recently freed id first
// (a LIFO free list), else one above the highest so far. So the writer
// must see every Alloc and Free in log order and keep its allocator in
// step with what it writes; the writer thread is the only user (under the
// writer lock).
//
// Memory: an open-addressing table address -> id at most half full (16
// bytes an entry, so 32-64 bytes per live block with doubling) plus 4
// bytes per id ever given out for the free list; all from raw_map, so
// markers count it in the recorder's own row. Nothing here calls malloc.
// In a fork child the parent's table is unmapped when the child's log
// opens (writer_open): the child's log starts with no known blocks.
#pragma once

#include <cstdint>

namespace heapsnap::recorder {

struct BlockAlloc {
    bool ok = false;        // false: out of memory, the log can no longer be kept in step
    uint32_t id = 0;        // the id the reader will give this block
    uint32_t replaced = 0;  // the id of a block still live at the same address (its free was missed), or 0
};

// A new block at `address`. When `replaced` is set, the caller writes a
// Free of it before the Alloc: the replaced id is freed first, so the new
// block gets it back (LIFO), exactly as the reader computes.
BlockAlloc block_ids_alloc(uint64_t address);

// The id of the live block at `address`, now freed; 0 if the writer never
// saw it allocated (inherited across fork, or older than the log).
uint32_t block_ids_free(uint64_t address);

// Forgets every block: a new log starts with no live blocks and id 1.
void block_ids_reset();

}  // namespace heapsnap::recorder
