// growth_cpp — C++ allocation sites between two markers: new[], new, and a
// std::vector growing by reallocation. Frame 0 of each of these stacks is
// libstdc++'s operator new; the tests look for this file's functions below
// it, with their demangled names.
//
// Runs straight through: marker "A", the growth, marker "B", exit 0.
// Expected diff A -> B (requested bytes):
//   leak_array_new   2 x new int[250]          +2000 bytes  +2 blocks
//   leak_object_new  3 x new Node (48 bytes)    +144         +3
//   grow_vector      1000 x push_back into a global std::vector<int>: the
//                    blocks of capacity 1, 2, 4, ... 512 are freed again,
//                    the last one (1024 ints) stays
//                                              +4096        +1
//   total                                      +6240 bytes  +6 blocks
// The vector is a global: its destructor frees the last block at exit,
// before the "exit" marker.
#include <vector>

#include <heapsnap/heapsnap.h>

namespace {

struct Node {
    long value[6];
};

// Loop bounds the compiler cannot see (no unrolling into several sites).
volatile int n_arrays = 2;
volatile int n_nodes = 3;
volatile int n_pushes = 1000;

int* volatile arrays[2];
Node* volatile nodes[3];
std::vector<int> numbers;

}  // namespace

__attribute__((noinline)) void leak_array_new() {
    for (int i = 0; i < n_arrays; ++i) arrays[i] = new int[250];  // @site:array_new
}

__attribute__((noinline)) void leak_object_new() {
    for (int i = 0; i < n_nodes; ++i) nodes[i] = new Node();  // @site:object_new
}

__attribute__((noinline)) void grow_vector() {
    for (int i = 0; i < n_pushes; ++i) numbers.push_back(i);  // @site:vector_push
}

int main() {
    static_assert(sizeof(Node) == 48);
    heapsnap_marker("A");
    leak_array_new();
    leak_object_new();
    grow_vector();
    heapsnap_marker("B");
    return 0;
}
