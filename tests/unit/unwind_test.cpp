// Differential test of the recorder's unwinder (src/recorder/unwind.h):
// on thousands of random stacks built from every frame shape a compiler
// emits, unwind_stack must report exactly what libunwind's unw_backtrace
// reports, and unwind_stack_key must hand out the key of exactly that
// stack. So must unwind_stack in signal handlers that interrupt those
// stacks (and the unwinder itself) at random instructions: its walk down
// to the signal frame, the handoff to the full CFI walk there, a cache busy in
// the interrupted walk. Built -O2 so the shapes are what optimised code
// looks like; the unwinder comes as a library of its own, built like the
// recorder (tests/meson.build).
#include <alloca.h>
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <doctest/doctest.h>
#include <libunwind.h>
#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "recorder/raw_alloc.h"
#include "recorder/stack_table.h"
#include "recorder/unwind.h"

using heapsnap::recorder::is_local_key;
using heapsnap::recorder::kLocalWindow;
using heapsnap::recorder::local_key_index;
using heapsnap::recorder::StackKeyer;
using heapsnap::recorder::unwind_stack;
using heapsnap::recorder::unwind_stack_key;

namespace {

constexpr int kMax = 264;  // the recorder's deepest stack: 256 frames + 8 of its own

uint64_t rng = 88172645463325252ull;
uint64_t next_random() {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

struct Tally {
    long checks = 0;
    long mismatches = 0;
};
Tally g_tally;
volatile int g_sink;

// unw_backtrace from the caller, without the frames of the unwinder's
// library (those unwind_stack leaves out: a signal may interrupt it).
__attribute__((noinline)) std::vector<uint64_t> libunwind_stack() {
    static dl_find_object lib;
    if (!lib.dlfo_map_start) _dl_find_object(reinterpret_cast<void*>(&unwind_stack), &lib);
    void* all[kMax];
    int n = unw_backtrace(all, kMax);
    std::vector<uint64_t> stack;
    for (int i = 1; i < n; ++i)
        if (all[i] < lib.dlfo_map_start || all[i] >= lib.dlfo_map_end)
            stack.push_back(reinterpret_cast<uint64_t>(all[i]));
    return stack;
}

// Both unwinders from the same frame; their first entries are return
// addresses of two different calls in this function, everything after
// must be equal.
__attribute__((noinline)) void compare_here(Tally& tally) {
    uint64_t ours[kMax];
    int n = unwind_stack(ours, kMax);
    std::vector<uint64_t> theirs = libunwind_stack();
    bool same = static_cast<size_t>(n) == theirs.size() && n > 1;
    for (int i = 1; same && i < n; ++i) same = ours[i] == theirs[i];
    ++tally.checks;
    if (!same) ++tally.mismatches;
}

// ---- keys: the key function interns stacks the way the recorder does ----------

std::vector<std::vector<uint64_t>> g_keyed;
long g_key_calls = 0;
long g_wrong_hashes = 0;  // key handed a hash other than stack_hash of its frames

// The token is the key itself: memo_matches compares with the stack it names.
const void* token_of(uint32_t key) { return reinterpret_cast<const void*>(uintptr_t{key}); }
uint32_t key_of(const void* token) { return static_cast<uint32_t>(reinterpret_cast<uintptr_t>(token)); }

uint32_t intern(uint64_t* ips, int n, uint64_t hash, const void** token) {
    ++g_key_calls;
    if (hash != heapsnap::recorder::stack_hash(ips, static_cast<uint32_t>(n))) ++g_wrong_hashes;
    std::vector<uint64_t> stack(ips + 1, ips + n);  // without the return address into compare_key
    for (size_t i = 0; i < g_keyed.size(); ++i) {
        if (g_keyed[i] != stack) continue;
        *token = token_of(static_cast<uint32_t>(i + 1));
        return static_cast<uint32_t>(i + 1);
    }
    g_keyed.push_back(stack);
    *token = token_of(static_cast<uint32_t>(g_keyed.size()));
    return static_cast<uint32_t>(g_keyed.size());
}

bool memo_matches(const void* token, const uint64_t* ips, int n) {
    return g_keyed.at(key_of(token) - 1) == std::vector<uint64_t>(ips + 1, ips + n);
}

// Local keys (unwind.h): with g_local_keys, the keyer hands walked stacks
// on (define_local_key) as the recorder does, and they are kept as its writer keeps
// them, by local_key_index, a newer key overwriting an older one.
bool g_local_keys = false;
struct Defined {
    uint32_t key;
    std::vector<uint64_t> stack;
};
std::vector<Defined> g_defined(kLocalWindow);
long g_define_calls = 0;
// The stack handed on before, whole, and how often define_local_key was told that
// outer frames of the next were known to be its (unwind.h, `known`), and
// told so wrongly.
std::vector<uint64_t> g_last_defined;
long g_known_calls = 0;
long g_wrong_known = 0;

// (The recorder's define_local_key carries only the frames that differ from `last`;
// the integration tests check that, with the writer's side.)
bool define_local_key(const uint64_t* ips, int n, uint64_t hash, uint32_t local, uint32_t known,
                      heapsnap::recorder::DefinedStack&) {
    ++g_define_calls;
    if (hash != heapsnap::recorder::stack_hash(ips, static_cast<uint32_t>(n))) ++g_wrong_hashes;
    if (known) {
        ++g_known_calls;
        if (known > static_cast<uint32_t>(n) || known > g_last_defined.size() ||
            !std::equal(ips + n - known, ips + n, g_last_defined.end() - known))
            ++g_wrong_known;
    }
    g_last_defined.assign(ips, ips + n);
    g_defined[local_key_index(local)] = Defined{local, std::vector<uint64_t>(ips + 1, ips + n)};
    return true;
}

StackKeyer keyer() {
    return g_local_keys ? StackKeyer{intern, nullptr, memo_matches, define_local_key}
                        : StackKeyer{intern, nullptr, memo_matches};
}

// Whether `key` names `expected`: the stack keyed so, or defined so if no
// newer local key took its place since (a key handed out after that is
// stale, and names nothing).
bool names(uint32_t key, const std::vector<uint64_t>& expected) {
    if (!is_local_key(key)) return key != 0 && key <= g_keyed.size() && g_keyed[key - 1] == expected;
    const Defined& d = g_defined[local_key_index(key)];
    return d.key == key && d.stack == expected;
}

Tally g_key_tally;
// The frames unwind_stack_key is asked for: below a stack's depth, its
// key is that of the stack's first g_key_max frames.
int g_key_max = kMax;

// theirs[from..], as far as the first g_key_max frames of a walk whose
// first frame is theirs[from - 1] go.
std::vector<uint64_t> expected_key_stack(const std::vector<uint64_t>& theirs, size_t from) {
    size_t end = std::min(theirs.size(), from - 1 + static_cast<size_t>(g_key_max));
    return std::vector<uint64_t>(theirs.begin() + static_cast<long>(from), theirs.begin() + static_cast<long>(end));
}

__attribute__((noinline)) void compare_key() {
    uint64_t ips[kMax];
    uint32_t key = unwind_stack_key(ips, g_key_max, keyer(), nullptr);
    std::vector<uint64_t> theirs = libunwind_stack();
    std::vector<uint64_t> expected = expected_key_stack(theirs, 1);
    ++g_key_tally.checks;
    if (!names(key, expected)) ++g_key_tally.mismatches;
}

// As a hook calls it: the walk starts with the caller of the frame passed.
__attribute__((noinline)) uint32_t compare_key_from_frame() {
    uint64_t ips[kMax];
    uint32_t key = unwind_stack_key(ips, g_key_max, keyer(), __builtin_frame_address(0));
    std::vector<uint64_t> theirs = libunwind_stack();
    // intern leaves out ips[0], here the return address into at_leaf.
    std::vector<uint64_t> expected = expected_key_stack(theirs, 2);
    ++g_key_tally.checks;
    if (!names(key, expected)) ++g_key_tally.mismatches;
    return key;
}

// Two more places to allocate from, taken in turn on the same stack, as an
// interpreter does: the unwinder keeps what it walked above the shared
// part per place (unwind_segments.h, Segment) and must still hand out exact keys.
__attribute__((noinline)) void key_site_a() {
    compare_key_from_frame();
    g_sink = 1;
}

__attribute__((noinline)) void key_site_b() {
    key_site_a();
    g_sink = 2;
}

// ---- rbp as data ----------------------------------------------------------------------

// Calls fn(arg) with `rbp` in rbp, as code that keeps data in rbp does. Its
// CFI saves the caller's rbp and restores it, so the walk does not depend
// on the value in between: the unwinder does not compare it when it reuses
// a segment (unwind_segments.h, Segment::rbp_unchecked_mask), and the keys must stay exact.
extern "C" void heapsnap_test_call_with_rbp(void (*fn)(int), int arg, uint64_t rbp);
asm(R"(
    .text
    .globl heapsnap_test_call_with_rbp
    .type heapsnap_test_call_with_rbp, @function
heapsnap_test_call_with_rbp:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    mov %rdx, %rbp
    mov %rdi, %rax
    mov %esi, %edi
    call *%rax
    pop %rbp
    .cfi_restore %rbp
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size heapsnap_test_call_with_rbp, .-heapsnap_test_call_with_rbp
)");

// The data put in rbp: one of four addresses inside an array whose words
// all point into it. A signal can interrupt a DRAP function's prologue or
// epilogue, whose CFI reads through rbp, while the caller's data is still
// in it; libunwind then reads through that data, and small numbers sent
// its unw_step to address 0.
uint64_t g_rbp_words[16];

uint64_t rbp_data_value() {
    if (!g_rbp_words[0])
        for (uint64_t& word : g_rbp_words) word = reinterpret_cast<uint64_t>(&g_rbp_words[8]);
    return reinterpret_cast<uint64_t>(&g_rbp_words[4 + next_random() % 4]);
}

// compare_key_from_frame, called through heapsnap_test_call_with_rbp: the
// first frame of the walk holds data in rbp.
__attribute__((noinline)) void compare_key_under_rbp_data(int) {
    uint64_t ips[kMax];
    uint32_t key = unwind_stack_key(ips, g_key_max, {intern, nullptr, memo_matches}, __builtin_frame_address(0));
    std::vector<uint64_t> theirs = libunwind_stack();
    std::vector<uint64_t> expected = expected_key_stack(theirs, 2);
    ++g_key_tally.checks;
    if (key == 0 || key > g_keyed.size() || g_keyed[key - 1] != expected) ++g_key_tally.mismatches;
}

// ... and one frame further down: the frame with data in rbp is the
// second of the walk, its rbp handed on by the first.
__attribute__((noinline)) void key_site_under_rbp_data(int arg) {
    compare_key_under_rbp_data(arg);
    g_sink = 3;
}

// ---- shapes -------------------------------------------------------------------------

// What a leaf does: compare, compare keys, or only unwind (while signals
// arrive: libunwind interrupted by itself slows to a crawl).
enum class Leaf { Compare, CompareKeys, Unwind };
Leaf g_leaf = Leaf::Compare;

__attribute__((noinline)) void unwind_only() {
    uint64_t ips[kMax];
    g_sink = unwind_stack(ips, kMax);
}

void at_leaf() {
    // The same stack several times in a row: the cache's fast path.
    // Keys: places taken in turn on one stack, so segments are met again.
    int repeat = 1 + static_cast<int>(next_random() % (g_leaf == Leaf::CompareKeys ? 8 : 3));
    for (int i = 0; i < repeat; ++i) {
        switch (g_leaf) {
            case Leaf::Compare: compare_here(g_tally); break;
            case Leaf::CompareKeys:
                switch (next_random() % 6) {
                    case 0: compare_key(); break;
                    case 1: compare_key_from_frame(); break;
                    case 2: key_site_a(); break;
                    case 3: key_site_b(); break;
                    // Few values, so that a segment is met again with another one.
                    case 4: heapsnap_test_call_with_rbp(compare_key_under_rbp_data, 0, rbp_data_value()); break;
                    default: heapsnap_test_call_with_rbp(key_site_under_rbp_data, 0, rbp_data_value()); break;
                }
                break;
            case Leaf::Unwind: unwind_only(); break;
        }
    }
}

using Shape = void (*)(int);
extern const Shape kShapes[];
extern const int kShapeCount;

__attribute__((noinline)) void descend(int depth) {
    if (depth <= 0) {
        at_leaf();
        return;
    }
    kShapes[next_random() % kShapeCount](depth - 1);
    g_sink = depth;  // no tail call
}

__attribute__((noinline)) void with_fp(int depth) {
    descend(depth);
    if (next_random() % 4 == 0) at_leaf();  // shorter stack, the old one below it
    g_sink = depth;
}

__attribute__((noinline, optimize("omit-frame-pointer"))) void without_fp(int depth) {
    descend(depth);
    g_sink = depth;
}

__attribute__((noinline)) void with_alloca(int depth) {
    auto* p = static_cast<volatile char*>(alloca(16 + next_random() % 2000));
    p[0] = 1;
    descend(depth);
    g_sink = p[0];
}

__attribute__((noinline, optimize("omit-frame-pointer"))) void big_frame(int depth) {
    volatile char big[9000];
    big[0] = 1;
    descend(depth);
    g_sink = big[0];
}

// An over-aligned local plus alloca: GCC realigns through DRAP, whose CFA
// is a DWARF expression.
__attribute__((noinline)) void realigned(int depth) {
    alignas(64) volatile char aligned[64];
    auto* p = static_cast<volatile char*>(alloca(16 + next_random() % 300));
    aligned[0] = 1;
    p[0] = 1;
    descend(depth);
    g_sink = aligned[0] + p[0];
}

__attribute__((noinline)) void twin_common(int depth) {
    descend(depth);
    g_sink = depth;
}

// Identical frames: the same leaf at the same depth from two callers.
__attribute__((noinline)) void twin_a(int depth) {
    twin_common(depth);
    g_sink = depth;
}

__attribute__((noinline)) void twin_b(int depth) {
    twin_common(depth);
    g_sink = depth;
}

// Data in rbp in the middle of the stack.
__attribute__((noinline)) void rbp_data(int depth) {
    heapsnap_test_call_with_rbp(descend, depth, rbp_data_value());
    g_sink = depth;
}

const Shape kShapes[] = {with_fp, without_fp, with_alloca, big_frame, realigned, twin_a, twin_b, rbp_data};
const int kShapeCount = sizeof kShapes / sizeof kShapes[0];

void random_stacks(int rounds) {
    for (int i = 0; i < rounds; ++i) descend(1 + static_cast<int>(next_random() % 60));
}

// ---- signals --------------------------------------------------------------------------

// The code of every loaded object (its executable PT_LOAD segments), taken
// before the signals start: the handler looks frames up here.
struct CodeRange {
    uint64_t start, end;
};
CodeRange g_code[256];
int g_code_count = 0;

void find_code() {
    g_code_count = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void*) {
            for (int i = 0; i < info->dlpi_phnum && g_code_count < 256; ++i) {
                const ElfW(Phdr)& ph = info->dlpi_phdr[i];
                if (ph.p_type == PT_LOAD && (ph.p_flags & PF_X))
                    g_code[g_code_count++] = {info->dlpi_addr + ph.p_vaddr, info->dlpi_addr + ph.p_vaddr + ph.p_memsz};
            }
            return 0;
        },
        nullptr);
}

bool in_code(uint64_t ip) {
    for (int i = 0; i < g_code_count; ++i)
        if (ip > g_code[i].start && ip <= g_code[i].end) return true;
    return false;
}

// compare_here for a stack interrupted anywhere: a frame stopped inside a
// prologue or an epilogue may have CFI that does not hold there yet or
// any more (GCC's DRAP epilogues), and the caller it gives is then data,
// not a return address into code. Past such a frame both unwinders report
// whatever the data leads them to, differently: the stacks are compared
// up to and including it (`strays` counts the checks cut there).
long g_strays = 0;

__attribute__((noinline)) void compare_to_first_stray(Tally& tally) {
    uint64_t ours[kMax];
    int n = unwind_stack(ours, kMax);
    std::vector<uint64_t> theirs = libunwind_stack();
    int cut = 1;
    while (cut < n && in_code(ours[cut])) ++cut;
    if (cut < n) ++g_strays;
    const int compared = cut < n ? cut + 1 : n;
    bool same = static_cast<int>(theirs.size()) >= compared && n > 1 && (cut < n || theirs.size() == size_t(n));
    for (int i = 1; same && i < compared; ++i) same = ours[i] == theirs[i];
    ++tally.checks;
    if (!same) ++tally.mismatches;
}

Tally g_signal_tally;
timer_t g_signal_timer;

// One shot, armed again when the handler is done: the interrupted code
// runs 500 us between two signals however long a handler takes. A
// periodic timer livelocked here (2026-11-27): libunwind's walk through
// the signal frame, two sigprocmask calls a step, took longer than the
// period, so the next signal was pending when the handler returned and
// the loop below never ran again.
void arm_signal_timer() {
    itimerspec once{{0, 0}, {0, 500000}};
    timer_settime(g_signal_timer, 0, &once, nullptr);
}

void on_alarm(int) {
    compare_to_first_stray(g_signal_tally);
    arm_signal_timer();
}

}  // namespace

TEST_CASE("unwind_stack reports what unw_backtrace reports, on random stacks of every shape") {
    g_tally = {};
    random_stacks(3000);
    CHECK(g_tally.checks > 10000);
    CHECK(g_tally.mismatches == 0);
}

TEST_CASE("unwind_stack in signal handlers that interrupt random stacks anywhere") {
    random_stacks(200);     // rules and caches in place before signals arrive
    g_leaf = Leaf::Unwind;  // the handler may interrupt our unwinder, never libunwind
    g_signal_tally = {};
    g_strays = 0;
    find_code();
    struct sigaction sa {};
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, nullptr);
    // A high-resolution timer aimed at this thread, 500 us after each
    // handler; at most 3 seconds, as libunwind takes milliseconds for a
    // stack through a signal frame (it checks every word it reads with
    // system calls).
    sigevent ev{};
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGALRM;
    ev._sigev_un._tid = gettid();
    REQUIRE(timer_create(CLOCK_MONOTONIC, &ev, &g_signal_timer) == 0);
    arm_signal_timer();
    timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    do {
        random_stacks(10);
        clock_gettime(CLOCK_MONOTONIC, &now);
    } while (g_signal_tally.checks < 1000 && now.tv_sec - start.tv_sec < 3);
    timer_delete(g_signal_timer);
    signal(SIGALRM, SIG_DFL);
    g_leaf = Leaf::Compare;
    CHECK(g_signal_tally.checks >= 100);
    CHECK(g_signal_tally.mismatches == 0);
    CHECK(g_strays * 20 < g_signal_tally.checks);  // a few in a thousand
}

// ---- CFI only the full walk follows (cfi_walk.h) ---------------------------------

// Calls fn() with its own return address kept in rbx, not on the stack
// (DW_CFA_register: rip in rbx), and rbx saved on the stack: the caller
// is found only through a register that fn's frames may save and restore.
extern "C" void heapsnap_test_ra_in_rbx(void (*fn)());
// Calls fn() on a stack realigned to 64 bytes, its CFA kept in r12
// (DW_CFA_def_cfa_register r12), which it saves first.
extern "C" void heapsnap_test_cfa_in_r12(void (*fn)());
// Calls fn() with the CFA and the return address given by DWARF
// expressions: the CFA is "breg3 0; deref; plus_uconst 32" (rbx points at
// a word holding the frame's rsp), rip the value of "lit8; minus; deref"
// on the CFA (DW_CFA_val_expression).
extern "C" void heapsnap_test_cfa_by_expression(void (*fn)());
asm(R"(
    .text
    .globl heapsnap_test_ra_in_rbx
    .type heapsnap_test_ra_in_rbx, @function
heapsnap_test_ra_in_rbx:
    .cfi_startproc
    push %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -16
    mov 8(%rsp), %rbx
    .cfi_register %rip, %rbx
    call *%rdi
    .cfi_offset %rip, -8
    pop %rbx
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size heapsnap_test_ra_in_rbx, .-heapsnap_test_ra_in_rbx

    .globl heapsnap_test_cfa_in_r12
    .type heapsnap_test_cfa_in_r12, @function
heapsnap_test_cfa_in_r12:
    .cfi_startproc
    push %r12
    .cfi_adjust_cfa_offset 8
    .cfi_offset %r12, -16
    mov %rsp, %r12
    .cfi_def_cfa_register %r12
    and $-64, %rsp
    call *%rdi
    mov %r12, %rsp
    .cfi_def_cfa_register %rsp
    pop %r12
    .cfi_adjust_cfa_offset -8
    .cfi_restore %r12
    ret
    .cfi_endproc
    .size heapsnap_test_cfa_in_r12, .-heapsnap_test_cfa_in_r12

    .globl heapsnap_test_cfa_by_expression
    .type heapsnap_test_cfa_by_expression, @function
heapsnap_test_cfa_by_expression:
    .cfi_startproc
    push %rbx
    .cfi_adjust_cfa_offset 8
    .cfi_offset %rbx, -16
    sub $16, %rsp
    .cfi_adjust_cfa_offset 16
    mov %rsp, (%rsp)
    mov %rsp, %rbx
    /* CFA = *(rbx) + 32: DW_OP_breg3 0; DW_OP_deref; DW_OP_plus_uconst 32 */
    .cfi_escape 0x0f, 0x05, 0x73, 0x00, 0x06, 0x23, 0x20
    /* rip = *(CFA - 8), as a value: DW_OP_lit8; DW_OP_minus; DW_OP_deref (the CFA pushed first) */
    .cfi_escape 0x16, 0x10, 0x03, 0x38, 0x1c, 0x06
    call *%rdi
    add $16, %rsp
    .cfi_def_cfa %rsp, 16
    .cfi_offset %rip, -8
    pop %rbx
    .cfi_adjust_cfa_offset -8
    .cfi_restore %rbx
    ret
    .cfi_endproc
    .size heapsnap_test_cfa_by_expression, .-heapsnap_test_cfa_by_expression
)");

Tally g_shape_tally;

// Saves and uses rbx and r12 itself (their CFI says where), so the walk
// must restore them from its frame to step the shape below.
__attribute__((noinline)) void compare_under_shape() {
    asm volatile("" ::: "rbx", "r12", "r13");
    compare_here(g_shape_tally);
    g_sink = 4;
}

// The frames of the stack from a shape's callee outward, for a shape that
// libunwind 1.6 does not follow: return addresses kept in a register
// (DW_CFA_register) it reads from the wrong frame, ending the stack in
// zeros. unwind_stack's frames outside this library, from compare_under_shape's
// caller on.
std::vector<uint64_t> g_under_shape;

__attribute__((noinline)) void walk_under_shape() {
    asm volatile("" ::: "rbx", "r12", "r13");
    uint64_t ips[kMax];
    int n = unwind_stack(ips, kMax);
    g_under_shape.assign(ips + 1, ips + n);
    g_sink = 5;
}

TEST_CASE("unwind_stack through CFI that only the full walk follows: CFA in r12, CFA and rip by expressions") {
    int index = 0;
    for (void (*shape)(void (*)()) : {heapsnap_test_cfa_in_r12, heapsnap_test_cfa_by_expression}) {
        CAPTURE(index++);
        g_shape_tally = {};
        shape(compare_under_shape);
        CHECK(g_shape_tally.checks == 1);
        CHECK(g_shape_tally.mismatches == 0);
    }
}

TEST_CASE("unwind_stack through a return address kept in a register the callee saved") {
    // Outward from this function, as libunwind sees it from here.
    std::vector<uint64_t> outer = libunwind_stack();
    REQUIRE(outer.size() > 2);
    heapsnap_test_ra_in_rbx(walk_under_shape);
    // walk_under_shape's caller is the shape; its caller this function
    // (another return address than outer[0]); then the same frames.
    REQUIRE(g_under_shape.size() == outer.size() + 1);
    auto shape = reinterpret_cast<uint64_t>(&heapsnap_test_ra_in_rbx);
    CHECK(g_under_shape[0] > shape);
    CHECK(g_under_shape[0] < shape + 16);
    CHECK(g_under_shape[1] != outer[0]);
    CHECK(std::vector<uint64_t>(g_under_shape.begin() + 2, g_under_shape.end()) ==
          std::vector<uint64_t>(outer.begin() + 1, outer.end()));
}

TEST_CASE("unwind_stack_key returns the key of exactly the stack unwound, calling key only for a new one") {
    g_leaf = Leaf::CompareKeys;
    g_key_tally = {};
    g_key_calls = 0;
    g_wrong_hashes = 0;
    random_stacks(2000);
    g_leaf = Leaf::Compare;
    CHECK(g_key_tally.checks > 5000);
    CHECK(g_key_tally.mismatches == 0);
    // The stack table trusts the hash it is handed (stack_table.h).
    CHECK(g_wrong_hashes == 0);
    // Repeated leaves and alternating twins reuse keys: key runs far less
    // often than once per stack, but at least once per distinct stack.
    CHECK(g_key_calls >= static_cast<long>(g_keyed.size()));
    CHECK(g_key_calls < g_key_tally.checks);
}

TEST_CASE("unwind_stack_key with local keys: every stack walked handed on, and named exactly") {
    g_leaf = Leaf::CompareKeys;
    g_local_keys = true;
    g_key_tally = {};
    g_key_calls = 0;
    g_define_calls = 0;
    g_wrong_hashes = 0;
    g_known_calls = 0;
    g_wrong_known = 0;
    random_stacks(2000);
    g_local_keys = false;
    g_leaf = Leaf::Compare;
    CHECK(g_key_tally.checks > 5000);
    CHECK(g_key_tally.mismatches == 0);
    CHECK(g_wrong_hashes == 0);
    // Most walks keep the outer part of the stack before, whose frames
    // define_local_key is then told it need not compare: rightly every time.
    CHECK(g_known_calls > g_define_calls / 2);
    CHECK(g_wrong_known == 0);
    // This thread owns its cache: what it walks is handed on (keyed on the
    // spot only where libunwind took over, past a frame without rules),
    // and the last stack and segments hand keys out again without a walk.
    CHECK(g_define_calls > g_key_calls);
    CHECK(g_define_calls + g_key_calls < g_key_tally.checks);
}

namespace {

__attribute__((noinline)) uint32_t local_key_here() {
    uint32_t key = compare_key_from_frame();
    g_sink = 3;
    return key;
}

volatile int g_four = 4;  // a loop the compiler cannot unroll: one call site

// One place, four times, with local keys: before the i-th time, the key
// is aged by skips[i] walks (skip_local_keys). Each time's key and the
// count of stacks handed on after it.
struct FourTimes {
    uint32_t keys[4];
    long defines[4];
};

FourTimes local_keys_four_times(const uint32_t (&skips)[4]) {
    g_local_keys = true;
    g_key_tally = {};
    g_define_calls = 0;
    FourTimes four{};
    for (int i = 0; i < g_four; ++i) {
        heapsnap::recorder::skip_local_keys(skips[i]);
        four.keys[i] = local_key_here();
        four.defines[i] = g_define_calls;
    }
    g_local_keys = false;
    CHECK(g_key_tally.mismatches == 0);
    return four;
}

}  // namespace

TEST_CASE("unwind_stack_key hands a local key out again only within its window") {
    // The last stack again each time, its key aged by as many walks as the
    // window allows, then by one more.
    FourTimes four = local_keys_four_times({0, 0, kLocalWindow - 2, 1});
    CHECK(is_local_key(four.keys[0]));
    CHECK(four.keys[1] == four.keys[0]);
    CHECK(four.keys[2] == four.keys[0]);  // kLocalWindow - 1 walks back: the oldest kept
    CHECK(four.defines[2] == four.defines[0]);
    CHECK(four.keys[3] != four.keys[0]);  // one walk more: walked and handed on again
    CHECK(four.defines[3] == four.defines[0] + 1);
}

TEST_CASE("unwind_stack_key never hands out a local key its 24-bit count has come round to") {
    // 2^24 walks after a key, the count reads as the key's own again: the
    // key must have been dropped on the way, not taken for a fresh one.
    FourTimes four = local_keys_four_times({0, 1u << 24, 0, 0});
    CHECK(is_local_key(four.keys[0]));
    CHECK(four.defines[1] == four.defines[0] + 1);
    CHECK(four.keys[2] == four.keys[1]);
}

namespace {

// Keys with g_key_max = max on the stacks `run` makes (with Leaf::CompareKeys),
// kept apart from other cases' keys: every one that of the stack's first
// max frames, key handed the hash of those, more than min_checks checks.
void check_keys_at_most(int max, void (*run)(), long min_checks) {
    g_keyed.clear();
    g_key_max = max;
    g_key_tally = {};
    g_wrong_hashes = 0;
    run();
    CHECK(g_key_tally.checks > min_checks);
    CHECK(g_key_tally.mismatches == 0);
    CHECK(g_wrong_hashes == 0);
}

}  // namespace

TEST_CASE("unwind_stack_key below the stack's depth: the key of its first max frames") {
    // Random stacks are 10 to 75 frames deep here: most are cut at 24, some
    // at 48. The walk goes on to the stack's end for its cache, and keys,
    // the memo, segments and the last stack's key must still be those of
    // the frames asked for.
    g_leaf = Leaf::CompareKeys;
    for (int max : {24, 48})
        check_keys_at_most(
            max, [] { random_stacks(1000); }, 2500);
    g_key_max = kMax;
    g_keyed.clear();
    g_leaf = Leaf::Compare;
}

namespace {

volatile int g_deep_repeat = 2;

// A stack deeper than the cache whose two variants differ in one frame
// near its top (deep_twin_a or _b, of one frame size) under identical
// frames: the last stack's key may be reused only if that link holds.
__attribute__((noinline)) void straight_down(int depth) {
    if (depth <= 0) {
        // From one place (a loop the compiler cannot unroll, then no tail
        // call): the second call, and the first of the next round, meet
        // the last stack again.
        for (int i = 0; i < g_deep_repeat; ++i) compare_key_from_frame();
        g_sink = depth;
        return;
    }
    straight_down(depth - 1);
    g_sink = depth;
}

__attribute__((noinline)) void deep_twin_common(int top) {
    straight_down(top);
    g_sink = top;
}

__attribute__((noinline)) void deep_twin_a(int top) {
    deep_twin_common(top);
    g_sink = 1;
}

__attribute__((noinline)) void deep_twin_b(int top) {
    deep_twin_common(top);
    g_sink = 2;
}

__attribute__((noinline)) void deep_base(int depth, bool a) {
    if (depth <= 0) {
        (a ? deep_twin_a : deep_twin_b)(10);
        return;
    }
    deep_base(depth - 1, a);
    g_sink = depth;
}

}  // namespace

TEST_CASE("unwind_stack_key on stacks deeper than the cache") {
    // 270 to 350 frames: the walk for the cache stops at 264 frames, and
    // the cache then walks only the frames asked for until a stack ends
    // within them; the last stack's key is reused on its links down to
    // the cut. Keys must stay those of the first max frames.
    g_leaf = Leaf::CompareKeys;
    auto deep_random = [] {
        for (int i = 0; i < 150; ++i) {
            descend(135 + static_cast<int>(next_random() % 40));
            if (i % 3 == 0) descend(1 + static_cast<int>(next_random() % 20));  // back within max now and then
        }
    };
    for (int max : {72, 150}) check_keys_at_most(max, deep_random, 400);
    // Two stacks of about 310 frames, the same but for the 13th.
    check_keys_at_most(
        72,
        [] {
            for (int i = 0; i < 200; ++i) deep_base(290, next_random() % 2);
        },
        399);
    CHECK(g_key_tally.checks == 400);
    CHECK(g_keyed.size() == 2);  // a stack per twin
    g_key_max = kMax;
    g_keyed.clear();
    g_leaf = Leaf::Compare;
}

namespace {

// A frame whose CFA is rbp-based, met twice at the same place and sp but
// with its rbp elsewhere: called from a deeper frame, with a smaller
// alloca. The walk depends on that rbp, so the unwinder must compare it:
// the first walk's words may still lie where it read them, and the two
// callers are called from one place, so every link of the first stack
// above the moved frame would check out and give the first stack's key.
volatile char* g_alloca_at;

// A frame between: it keeps rbp as it got it, so its rbp is the moved one
// too, and the walk depends on it through the frame below.
__attribute__((noinline, optimize("omit-frame-pointer"))) void alloca_relay() {
    compare_key_from_frame();
    g_sink = 5;
}

__attribute__((noinline)) void alloca_place(size_t size, bool compare) {
    auto* p = static_cast<volatile char*>(alloca(size));
    p[0] = 1;
    g_alloca_at = p;
    if (compare && next_random() % 2) {
        compare_key_from_frame();
    } else if (compare) {
        alloca_relay();
    }
    g_sink = p[0];
}

__attribute__((noinline)) void alloca_from_shallow(size_t size, bool compare) {
    alloca_place(size, compare);
    g_sink = 1;
}

__attribute__((noinline)) void alloca_from_deep(size_t size, bool compare) {
    volatile char pad[512];
    pad[0] = 1;
    alloca_place(size, compare);
    g_sink = pad[0];
}

__attribute__((noinline)) void alloca_through(bool deep, size_t size, bool compare) {
    void (*caller)(size_t, bool) = deep ? alloca_from_deep : alloca_from_shallow;
    caller(size, compare);
    g_sink = 2;
}

// At several depths, in random order: whichever variant's segment the
// other meets first.
__attribute__((noinline)) void alloca_at_depth(int depth, bool deep, size_t size) {
    if (depth > 0) {
        alloca_at_depth(depth - 1, deep, size);
        g_sink = depth;
        return;
    }
    alloca_through(deep, size, true);
}

}  // namespace

TEST_CASE("unwind_stack_key on a frame whose rbp moved while its sp stayed") {
    constexpr size_t kSize = 2048;
    alloca_through(false, kSize, false);
    auto shallow = reinterpret_cast<uintptr_t>(g_alloca_at);
    alloca_through(true, kSize, false);
    size_t depth = shallow - reinterpret_cast<uintptr_t>(g_alloca_at);
    REQUIRE(depth > 0);
    REQUIRE(depth < kSize);
    alloca_through(true, kSize - depth, false);
    REQUIRE(reinterpret_cast<uintptr_t>(g_alloca_at) == shallow);  // the same sp, another rbp
    g_key_tally = {};
    for (int i = 0; i < 400; ++i) {
        bool deep = next_random() % 2;
        alloca_at_depth(static_cast<int>(next_random() % 8), deep, deep ? kSize - depth : kSize);
    }
    CHECK(g_key_tally.checks == 400);
    CHECK(g_key_tally.mismatches == 0);
}

namespace {

// One place (key_site_a) reached through two callers of the same frame
// size (key_site_b and this twin of it), called from the same frame: its
// frame, the first of the walk, is the same (ip, sp and rbp) both times,
// the stack below it is not. The last stack's top frame is the caller's
// frame again, so only its links tell the stacks apart.
__attribute__((noinline)) void key_site_b_twin() {
    key_site_a();
    g_sink = 8;
}

}  // namespace

TEST_CASE("unwind_stack_key on one place whose frame is the same under two callers") {
    g_key_tally = {};
    for (int i = 0; i < 100; ++i) {
        if (next_random() % 2)
            key_site_b();
        else
            key_site_b_twin();
    }
    CHECK(g_key_tally.checks == 100);
    CHECK(g_key_tally.mismatches == 0);
}

namespace {

// Threads hold their stack caches while they live: more live threads than
// the pool has caches (128) must still get exact stacks, and the caches of
// exited threads must come back.
struct ThreadTallies {
    std::atomic<long> checks{0};
    std::atomic<long> mismatches{0};
    pthread_barrier_t all_started;
};

// Keys from many threads: interned under a lock, checked against
// libunwind as compare_key_from_frame does. Places taken in turn make the
// threads meet segments, also in caches that exited threads left behind.
pthread_mutex_t g_thread_keys_lock = PTHREAD_MUTEX_INITIALIZER;
std::vector<std::vector<uint64_t>> g_thread_keyed;

uint32_t intern_locked(uint64_t* ips, int n, uint64_t, const void** token) {
    std::vector<uint64_t> stack(ips + 1, ips + n);  // without the return address into the place
    pthread_mutex_lock(&g_thread_keys_lock);
    uint32_t key = 0;
    for (size_t i = 0; i < g_thread_keyed.size() && !key; ++i)
        if (g_thread_keyed[i] == stack) key = static_cast<uint32_t>(i + 1);
    if (!key) {
        g_thread_keyed.push_back(stack);
        key = static_cast<uint32_t>(g_thread_keyed.size());
    }
    pthread_mutex_unlock(&g_thread_keys_lock);
    *token = token_of(key);
    return key;
}

bool memo_matches_locked(const void* token, const uint64_t* ips, int n) {
    pthread_mutex_lock(&g_thread_keys_lock);
    bool same = g_thread_keyed.at(key_of(token) - 1) == std::vector<uint64_t>(ips + 1, ips + n);
    pthread_mutex_unlock(&g_thread_keys_lock);
    return same;
}

__attribute__((noinline)) void thread_key_compare(Tally& tally) {
    uint64_t ips[kMax];
    uint32_t key =
        unwind_stack_key(ips, kMax, {intern_locked, nullptr, memo_matches_locked}, __builtin_frame_address(0));
    std::vector<uint64_t> theirs = libunwind_stack();
    std::vector<uint64_t> expected(theirs.begin() + 2, theirs.end());
    pthread_mutex_lock(&g_thread_keys_lock);
    bool same = key != 0 && key <= g_thread_keyed.size() && g_thread_keyed[key - 1] == expected;
    pthread_mutex_unlock(&g_thread_keys_lock);
    ++tally.checks;
    if (!same) ++tally.mismatches;
}

__attribute__((noinline)) void thread_place_a(Tally& tally) {
    thread_key_compare(tally);
    g_sink = 1;
}

__attribute__((noinline)) void thread_place_b(Tally& tally) {
    thread_place_a(tally);
    g_sink = 2;
}

__attribute__((noinline)) void thread_recurse(int depth, Tally& tally) {
    if (depth > 0) {
        thread_recurse(depth - 1, tally);
        g_sink = depth;
        return;
    }
    switch (tally.checks % 3) {
        case 0: compare_here(tally); break;
        case 1: thread_place_a(tally); break;
        default: thread_place_b(tally); break;
    }
}

void* thread_body(void* arg) {
    auto* tallies = static_cast<ThreadTallies*>(arg);
    Tally tally;
    thread_recurse(3, tally);  // a first walk: the thread takes a cache
    pthread_barrier_wait(&tallies->all_started);
    for (int i = 0; i < 1000; ++i) thread_recurse(1 + i % 7, tally);
    tallies->checks += tally.checks;
    tallies->mismatches += tally.mismatches;
    heapsnap::recorder::release_stack_cache();  // as the recorder's thread exit hook does
    return nullptr;
}

}  // namespace

TEST_CASE("unwind_stack and unwind_stack_key on more live threads than there are stack caches, twice over") {
    constexpr int kThreads = 160;
    for (int batch = 0; batch < 2; ++batch) {
        ThreadTallies tallies;
        pthread_barrier_init(&tallies.all_started, nullptr, kThreads);
        std::vector<pthread_t> threads(kThreads);
        for (pthread_t& t : threads) REQUIRE(pthread_create(&t, nullptr, thread_body, &tallies) == 0);
        for (pthread_t t : threads) pthread_join(t, nullptr);
        pthread_barrier_destroy(&tallies.all_started);
        CHECK(tallies.checks == kThreads * 1001);
        CHECK(tallies.mismatches == 0);
    }
}

namespace {

struct Crowd {
    pthread_barrier_t walked;   // every thread owns a cache
    pthread_barrier_t counted;  // the test has read the memory mapped
    // Threads give their caches back one at a time: two that exit at
    // once may each keep theirs as a spare (release_stack_cache), and the
    // test counts exactly eight.
    pthread_mutex_t releasing = PTHREAD_MUTEX_INITIALIZER;
};

// A thread as the recorder's: walks (taking a cache), checking each
// stack, and gives the cache back at exit.
void* crowd_member(void* arg) {
    auto* crowd = static_cast<Crowd*>(arg);
    Tally tally;
    for (int i = 0; i < 20; ++i) thread_recurse(1 + i % 3, tally);
    CHECK(tally.mismatches == 0);
    if (!crowd) {
        heapsnap::recorder::release_stack_cache();
        return nullptr;
    }
    pthread_barrier_wait(&crowd->walked);
    pthread_barrier_wait(&crowd->counted);
    pthread_mutex_lock(&crowd->releasing);
    heapsnap::recorder::release_stack_cache();
    pthread_mutex_unlock(&crowd->releasing);
    return nullptr;
}

void run_alone() {
    pthread_t t;
    REQUIRE(pthread_create(&t, nullptr, crowd_member, nullptr) == 0);
    pthread_join(t, nullptr);
}

// The recorder's memory (raw_mapped_bytes) with `threads` alive at once,
// each owning a cache, and once they have all exited.
std::pair<uint64_t, uint64_t> crowd_mapped(int threads) {
    Crowd crowd;
    pthread_barrier_init(&crowd.walked, nullptr, threads + 1);
    pthread_barrier_init(&crowd.counted, nullptr, threads + 1);
    std::vector<pthread_t> all(threads);
    for (pthread_t& t : all) REQUIRE(pthread_create(&t, nullptr, crowd_member, &crowd) == 0);
    pthread_barrier_wait(&crowd.walked);
    uint64_t alive = heapsnap::recorder::raw_mapped_bytes();
    pthread_barrier_wait(&crowd.counted);
    for (pthread_t t : all) pthread_join(t, nullptr);
    pthread_barrier_destroy(&crowd.walked);
    pthread_barrier_destroy(&crowd.counted);
    return {alive, heapsnap::recorder::raw_mapped_bytes()};
}

}  // namespace

TEST_CASE("threads that come and go one after another reuse one stack cache") {
    run_alone();
    uint64_t after_first = heapsnap::recorder::raw_mapped_bytes();
    for (int i = 0; i < 300; ++i) run_alone();
    CHECK(heapsnap::recorder::raw_mapped_bytes() == after_first);
}

TEST_CASE("the stack caches of exited threads are unmapped past eight spares") {
    // The first crowd leaves the pool as every later one does: eight free
    // caches mapped (the caches' memory itself is not known here).
    crowd_mapped(40);
    uint64_t before = heapsnap::recorder::raw_mapped_bytes();
    auto [alive, after] = crowd_mapped(40);
    CHECK(alive > before);
    CHECK(after == before);
    auto [alive_again, after_again] = crowd_mapped(40);
    CHECK(alive_again == alive);
    CHECK(after_again == before);
}
