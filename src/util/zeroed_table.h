// A table indexed by id whose entries start as all-zero bytes, for the
// replay's tables by stack and by allocation info: they grow an id at a
// time to a size no header announces, and most of a process's run is spent
// in its first pages.
//
// The entries live in an anonymous mapping of their own, grown with mremap:
// the kernel moves page tables, not bytes, and hands out the new pages
// zeroed when they are first touched. A std::vector doubling to the same
// size copies every entry again, zeroes the whole new half at once, and
// faults in every page of the old and the new block, which on a fresh
// process costs more than the lookups the table serves. The pages of the
// entries a growth adds are populated at once (MADV_POPULATE_WRITE): the
// replay's first touch of an entry is a read (`+=`), which would map the
// zero page and fault a second time on the write.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace heapsnap {

// T must be trivially copyable, and all-zero bytes must be its value T{}.
template <class T>
class ZeroedTable {
    static_assert(std::is_trivially_copyable_v<T>);

public:
    ZeroedTable() = default;
    ZeroedTable(const ZeroedTable&) = delete;
    ZeroedTable& operator=(const ZeroedTable&) = delete;
    ZeroedTable(ZeroedTable&& o) noexcept
        : data_(std::exchange(o.data_, nullptr)),
          size_(std::exchange(o.size_, 0)),
          bytes_(std::exchange(o.bytes_, 0)),
          populated_(std::exchange(o.populated_, 0)),
          page_(o.page_) {}
    ZeroedTable& operator=(ZeroedTable&& o) noexcept {
        std::swap(data_, o.data_);
        std::swap(size_, o.size_);
        std::swap(bytes_, o.bytes_);
        std::swap(populated_, o.populated_);
        std::swap(page_, o.page_);
        return *this;
    }
    ~ZeroedTable() {
        if (data_) munmap(data_, bytes_);
    }

    size_t size() const { return size_; }
    T& operator[](size_t i) { return data_[i]; }
    const T& operator[](size_t i) const { return data_[i]; }

    // Makes the table at least `n` entries long; the new ones are T{}.
    // Entries are never written past size(), so what the mapping holds
    // there is still the kernel's zero.
    void grow(size_t n) {
        if (n <= size_) return;
        if (n > bytes_ / sizeof(T)) reserve(n);
        size_ = n;
        size_t used = std::min(bytes_, (n * sizeof(T) + page_ - 1) / page_ * page_);
        if (used > populated_) {
            // Fails on kernels before 5.14; the pages then fault one by one.
            madvise(reinterpret_cast<char*>(data_) + populated_, used - populated_, MADV_POPULATE_WRITE);
            populated_ = used;
        }
    }

private:
    void reserve(size_t n) {
        if (!page_) page_ = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        size_t bytes = std::max({n * sizeof(T), 2 * bytes_, size_t{64} << 10});
        bytes = (bytes + page_ - 1) / page_ * page_;
        void* p = data_ ? mremap(data_, bytes_, bytes, MREMAP_MAYMOVE)
                        : mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw std::bad_alloc();
        data_ = static_cast<T*>(p);
        bytes_ = bytes;
    }

    T* data_ = nullptr;
    size_t size_ = 0;
    size_t bytes_ = 0;      // of the mapping
    size_t populated_ = 0;  // bytes from the start
    size_t page_ = 0;
};

}  // namespace heapsnap
