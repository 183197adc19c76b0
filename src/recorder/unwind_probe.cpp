// libunwind's memory check, without a descriptor: for HEAPSNAP_VERIFY_STACKS,
// the one mode that loads libunwind (unwind.h, load_reference_unwinder).
//
// libunwind (1.6, x86-64; Debian builds it with conservative checks)
// checks that memory is readable before it reads it while stepping:
// mincore, then a write(2) of one byte from the address into a pipe it
// opens as it starts (pipe2), read back before the next check. That pipe
// would take descriptors 3 and 4 in the program, where the program's
// first open expects 3; and a program that put a file of its own on one
// of those numbers would have libunwind's byte written into it, or its data read.
//
// Here libunwind's pipe2 gets two numbers no descriptor ever has (above
// the largest descriptor table the kernel allows, fs.nr_open's ceiling),
// and its write, which it makes through syscall(2), is answered without
// one: rt_sigprocmask with an invalid `how` copies the 8-byte set from the
// address before it looks at `how`, so it fails with EFAULT where the
// word holding the address is unreadable, with EINVAL otherwise, and
// changes nothing. libunwind's read of the pipe fails (EBADF), so before
// each check it closes both numbers (EBADF) and calls pipe2 again: four
// system calls a check, one check per page it has not seen lately.
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "recorder/cfi_walk.h"
#include "recorder/unwind.h"

#define HEAPSNAP_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// INT_MAX and INT_MAX - 1: fs.nr_open is at most INT_MAX rounded down to
// a multiple of 64.
constexpr int kPipeRead = 0x7ffffffe;
constexpr int kPipeWrite = 0x7fffffff;

bool from_libunwind(const void* caller) {
    static const void* unwinder_map = nullptr;
    dl_find_object found;
    if (!unwinder_map) {
        const void* reference = heapsnap::recorder::reference_unwinder();
        if (!reference || _dl_find_object(const_cast<void*>(reference), &found) != 0) return false;
        unwinder_map = found.dlfo_link_map;
    }
    return _dl_find_object(const_cast<void*>(caller), &found) == 0 && found.dlfo_link_map == unwinder_map;
}

}  // namespace

// syscall(SYS_write, kPipeWrite, addr, n), from libunwind: whether the
// word at addr can be read. Reached from syscall (below) with its
// arguments as they were.
extern "C" __attribute__((used, visibility("hidden"))) long heapsnap_probe_write(long, long, uintptr_t addr, long n) {
    bool readable = (addr & ~uintptr_t{7}) >= 4096 && heapsnap::recorder::word_readable(addr);
    if (!readable) errno = EFAULT;
    return readable ? n : -1;
}

// glibc's syscall(2), with libunwind's write to its pipe taken aside
// first. Written in assembly as glibc's is: the arguments pass through
// untouched, and nothing is on the stack when the kernel returns (a
// clone or vfork made through it returns twice).
asm(R"(
    .text
    .globl syscall
    .type syscall, @function
    .p2align 4
syscall:
    cmp $1, %rdi
    jne 1f
    cmp $0x7fffffff, %esi
    je heapsnap_probe_write
1:  mov %rdi, %rax
    mov %rsi, %rdi
    mov %rdx, %rsi
    mov %rcx, %rdx
    mov %r8, %r10
    mov %r9, %r8
    mov 8(%rsp), %r9
    syscall
    cmp $-4095, %rax
    jae 2f
    ret
2:  neg %eax
    push %rax
    call __errno_location@PLT
    pop %rcx
    mov %ecx, (%rax)
    mov $-1, %rax
    ret
    .size syscall, .-syscall
)");

HEAPSNAP_EXPORT int pipe2(int fds[2], int flags) {
    if (from_libunwind(__builtin_return_address(0))) {
        fds[0] = kPipeRead;
        fds[1] = kPipeWrite;
        return 0;
    }
    return static_cast<int>(syscall(SYS_pipe2, fds, flags));
}
