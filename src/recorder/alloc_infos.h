// The writer's side of allocation infos (formats/hslog.md, "Allocation
// infos"): which info each live heap block belongs to, and which info id
// each (fn, size, stack) triple has.
//
// A version-3 log names a small heap block by its allocation info, the
// triple (AllocFn, size, stack): the first Alloc of a triple defines the
// next info id (1, 2, 3...), later ones write only the id, and a Free
// writes the info id of the freed block. Those ids repeat whenever the same
// code allocates and frees the same kind of block, so zstd compresses them
// to almost nothing; version 2's reused block ids did not repeat. The
// reader mirrors the numbering, so the writer must see every Alloc and Free
// in log order; the writer thread is the only user (under the writer lock).
//
// Blocks of hslog::kAddressedAllocSize or more are named by their address
// (AllocAt, FreeAt) and get no info id; this table remembers only that they
// are live, so their free is written by address.
//
// Memory: open-addressing tables, each at most half full: address ->
// info (8 bytes an entry, so 16-32 bytes per live block with doubling;
// a block that is not 16-byte aligned, lies above 2^47, or has an info id
// past two million takes 16 bytes in a side table instead) and triple ->
// info (16 bytes an entry, per distinct triple: like the
// stack table, bounded by the program's call sites and sizes, not by its
// events). All from raw_map, so markers count it in the recorder's own
// row; nothing here calls malloc. In a fork child the parent's tables are
// unmapped when the child's log opens (writer_open): the child's log starts
// with no known blocks and no infos.
#pragma once

#include <cstdint>

#include "format/hslog.h"

namespace heapsnap::recorder {

// What a live block is named by in the log: an info id, or this for a
// block written as AllocAt (named by its address).
inline constexpr uint32_t kAddressedBlock = UINT32_MAX;

struct InfoAlloc {
    bool ok = false;        // false: out of memory, the log can no longer be kept in step
    uint32_t info = 0;      // the block's info id, or kAddressedBlock
    bool fresh = false;     // the triple is new: write a full Alloc, which defines `info`
    uint32_t replaced = 0;  // the name of a block still live at the same address (its free was missed), or 0
};

// A new block at `address`. When `replaced` is set, the caller writes a
// Free (or FreeAt) of it before the Alloc, exactly as the reader must see.
InfoAlloc alloc_infos_alloc(uint64_t address, hslog::AllocFn fn, uint64_t size, uint32_t stack);

// The name of the live block at `address` (an info id, or kAddressedBlock),
// now freed; 0 if the writer never saw it allocated (inherited across fork,
// or older than the log).
uint32_t alloc_infos_free(uint64_t address);

// The bytes of the live blocks: the sum of the sizes of the blocks
// allocated and not freed, as the log says (a block replaced at its
// address counts as freed). The writer's own count, for
// --snapshot-when live> and growth> (steering.h); 2 bytes per info and
// 16 per live block of 64 KiB or more keep it.
uint64_t alloc_infos_live_bytes();

// Starts loading the table lines an upcoming alloc_infos_alloc (alloc) or
// alloc_infos_free will probe first. Both tables are larger than the cache
// on real programs and probed at random: the writer calls this a few events
// ahead, so the misses overlap instead of queueing one after another.
void alloc_infos_prefetch(uint64_t address, bool alloc, hslog::AllocFn fn, uint64_t size, uint32_t stack);

// Forgets every block and every info: a new log starts with none.
void alloc_infos_reset();

}  // namespace heapsnap::recorder
