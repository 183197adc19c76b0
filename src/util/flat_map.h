// An open-addressing hash map from non-zero 64-bit keys (heap addresses) to
// small values, for replay: the live-block table sees one insert or erase
// per event, hundreds of millions of times, so it must not allocate per
// entry the way std::unordered_map does. Linear probing, backward-shift
// deletion (no tombstones, so long churn does not degrade it), grows at
// 7/8 load. Key 0 is the empty marker; callers never insert address 0.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace heapsnap {

template <class Value>
class FlatMap {
public:
    FlatMap() { rehash(1024); }

    size_t size() const { return size_; }

    Value* find(uint64_t key) {
        for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
            if (keys_[i] == key) return &values_[i];
            if (keys_[i] == 0) return nullptr;
        }
    }
    const Value* find(uint64_t key) const { return const_cast<FlatMap*>(this)->find(key); }

    // The value slot for `key`, created (value-initialised) if absent;
    // `fresh` tells which. One probe sequence for "replace or add".
    Value* slot(uint64_t key, bool* fresh) {
        if ((size_ + 1) * 8 > keys_.size() * 7) rehash(keys_.size() * 2);
        for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
            if (keys_[i] == key) {
                *fresh = false;
                return &values_[i];
            }
            if (keys_[i] == 0) {
                keys_[i] = key;
                values_[i] = Value{};
                ++size_;
                *fresh = true;
                return &values_[i];
            }
        }
    }

    // Inserts or overwrites; returns true if the key was new.
    bool insert(uint64_t key, const Value& value) {
        if ((size_ + 1) * 8 > keys_.size() * 7) rehash(keys_.size() * 2);
        for (size_t i = slot_of(key);; i = (i + 1) & mask_) {
            if (keys_[i] == key) {
                values_[i] = value;
                return false;
            }
            if (keys_[i] == 0) {
                keys_[i] = key;
                values_[i] = value;
                ++size_;
                return true;
            }
        }
    }

    // Removes the key; returns its value through `out`. False if absent.
    bool erase(uint64_t key, Value* out) {
        size_t i = slot_of(key);
        for (;; i = (i + 1) & mask_) {
            if (keys_[i] == 0) return false;
            if (keys_[i] == key) break;
        }
        if (out) *out = values_[i];
        // Backward shift: pull later members of the probe run into the hole.
        for (size_t hole = i, j = (i + 1) & mask_;; j = (j + 1) & mask_) {
            if (keys_[j] == 0) {
                keys_[hole] = 0;
                break;
            }
            size_t home = slot_of(keys_[j]);
            bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
            if (movable) {
                keys_[hole] = keys_[j];
                values_[hole] = values_[j];
                hole = j;
            }
        }
        --size_;
        return true;
    }

    template <class Fn>
    void for_each(Fn&& fn) const {
        for (size_t i = 0; i < keys_.size(); ++i)
            if (keys_[i]) fn(keys_[i], values_[i]);
    }

private:
    size_t slot_of(uint64_t key) const {
        key ^= key >> 33;
        key *= 0xff51afd7ed558ccdull;
        key ^= key >> 33;
        return static_cast<size_t>(key) & mask_;
    }

    void rehash(size_t capacity) {
        std::vector<uint64_t> keys(capacity, 0);
        std::vector<Value> values(capacity);
        std::swap(keys, keys_);
        std::swap(values, values_);
        mask_ = capacity - 1;
        size_ = 0;
        for (size_t i = 0; i < keys.size(); ++i)
            if (keys[i]) insert(keys[i], values[i]);
    }

    std::vector<uint64_t> keys_;
    std::vector<Value> values_;
    size_t mask_ = 0;
    size_t size_ = 0;
};

}  // namespace heapsnap
