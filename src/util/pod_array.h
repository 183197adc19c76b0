// A growable array of trivially copyable elements in one block from
// malloc, grown with realloc. For the replay's largest tables (one entry
// per live block): past glibc's mmap threshold realloc is mremap, which
// moves page tables, not bytes, so growing never holds the old and the new
// copy at once as std::vector's doubling does (twice the memory at the
// moment of growth), and the capacity not yet written is not resident.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <type_traits>

namespace heapsnap {

template <class T>
class PodArray {
    static_assert(std::is_trivially_copyable_v<T>);

public:
    PodArray() = default;
    PodArray(const PodArray&) = delete;
    PodArray& operator=(const PodArray&) = delete;
    ~PodArray() { std::free(data_); }

    size_t size() const { return size_; }
    T& operator[](size_t i) { return data_[i]; }
    const T& operator[](size_t i) const { return data_[i]; }

    // Appends a value-initialised element and returns it.
    T& push() {
        if (size_ == capacity_) [[unlikely]]
            grow();
        data_[size_] = T{};
        return data_[size_++];
    }

private:
    void grow() {
        size_t capacity = capacity_ ? capacity_ + capacity_ / 2 : 1024;
        void* p = std::realloc(data_, capacity * sizeof(T));
        if (!p) throw std::bad_alloc();
        data_ = static_cast<T*>(p);
        capacity_ = capacity;
    }

    T* data_ = nullptr;
    size_t size_ = 0;
    size_t capacity_ = 0;
};

}  // namespace heapsnap
