// What reading a log or a snapshot may cost, whoever wrote it.
//
// Logs and snapshots are zstd-compressed, and a record repeated until its
// frame is full compresses to almost nothing: a genuine 25 KB log of a
// loop can describe ten million live blocks, a crafted 12 KB one a hundred
// million, or a billion events to chew through. Checking each count
// against the bytes of its frame (codec::Reader::count) keeps one record
// honest, not the file. So every reader is held to two budgets, set by the
// size of the files the command was given:
//
//   memory: what readers hold (live blocks, allocation infos, stacks,
//     mappings, markers, snapshots): at most kBaseMemory, or
//     kMemoryPerInputByte per byte of input if that is more;
//   volume: what zstd may hand out (log frames, snapshot bodies), and the
//     scans of the live set a snapshot at every marker makes (two live
//     blocks for a byte: a scan costs a third of decoding): at most
//     kBaseVolume, or kVolumePerInputByte per byte of input.
//
// With the defaults no input under 1 MB makes a command hold more than
// 192 MiB or decompress more than 512 MiB (about 3 s of replay). A genuine
// file beyond that (a loop that left 10^8 blocks live in a 76 KB log)
// is read with HEAPSNAP_READ_MEMORY / HEAPSNAP_READ_VOLUME raised, which
// the error message names.
//
// Charges are estimates of the resident bytes of each structure, made
// where it grows (SECURITY.md lists them, measured). Memory charged by an
// owner that frees it (a replay) is given back by its MemoryCharge; the
// rest (snapshots, which a command keeps to the end) stays charged.
// Process-wide and single-threaded, like the CLI.
#pragma once

#include <cstdint>
#include <string>

#include "util/error.h"

namespace heapsnap {

inline constexpr uint64_t kBaseMemory = uint64_t{192} << 20;
inline constexpr uint64_t kMemoryPerInputByte = 64;
inline constexpr uint64_t kBaseVolume = uint64_t{512} << 20;
inline constexpr uint64_t kVolumePerInputByte = 512;

// Thrown when a budget is spent: "needs more than ...". read_log_as and
// the snapshot reader put "<path>: reading it " in front; the CLI boundary
// "reading the input " where no reader did (a diff's symbols).
class BudgetExceeded : public Error {
public:
    using Error::Error;
};

// A file is read (`fd`, a regular file): its size raises both
// allowances, once per file however often a command reads it (a trend of
// LOG@1 LOG@2 LOG@3 reads one log three times, and may not do three times
// the work).
void budget_add_input(int fd);
// `bytes` more decompressed; throws BudgetExceeded past the allowance.
void budget_take_volume(uint64_t bytes);
// `bytes` more held, for `what` ("live blocks"); throws BudgetExceeded.
void budget_take_memory(uint64_t bytes, const char* what);
void budget_give_back_memory(uint64_t bytes);
// No limit from now on, for reads of files the process itself vouches
// for (the launcher's checkpoint keeper, replay/keeper.h, reading the log
// of the program it started); charges are still counted.
void budget_lift();
// Forgets every input and charge, for programs that read input after
// input in one process (the fuzz targets).
void budget_reset();

// Memory charged by one owner, given back when it goes.
class MemoryCharge {
public:
    MemoryCharge() = default;
    MemoryCharge(MemoryCharge&& other) noexcept : held_(other.held_) { other.held_ = 0; }
    MemoryCharge(const MemoryCharge&) = delete;
    MemoryCharge& operator=(const MemoryCharge&) = delete;
    ~MemoryCharge() { give_back(); }

    void give_back() {
        budget_give_back_memory(held_);
        held_ = 0;
    }

    void take(uint64_t bytes, const char* what) {
        budget_take_memory(bytes, what);
        held_ += bytes;
    }
    uint64_t held() const { return held_; }

private:
    uint64_t held_ = 0;
};

// Charges in steps, for structures that grow one element at a time on a
// hot path: take() is a compare and an add until a step's worth is due.
class SteppedCharge {
public:
    SteppedCharge(MemoryCharge& to, uint64_t element_bytes, const char* what)
        : to_(to), element_bytes_(element_bytes), what_(what) {}
    // `count` elements exist now (never fewer than before).
    void reach(uint64_t count) {
        if (count > charged_) [[unlikely]]
            grow(count);
    }

private:
    static constexpr uint64_t kStep = 4096;
    void grow(uint64_t count) {
        uint64_t target = (count + kStep - 1) / kStep * kStep;
        to_.take((target - charged_) * element_bytes_, what_);
        charged_ = target;
    }
    MemoryCharge& to_;
    uint64_t element_bytes_;
    const char* what_;
    uint64_t charged_ = 0;
};

}  // namespace heapsnap
