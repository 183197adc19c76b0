#include "cli/loader_stub.h"

namespace heapsnap::cli {

// The offsets the code uses, checked against the struct.
#define LB_PTHREAD_SELF 0
#define LB_PTHREAD_DETACH 8
#define LB_DLOPEN 16
#define LB_DLERROR 24
#define LB_MUNMAP 32
#define LB_ATTACH_OFFSET 40
#define LB_REGION 48
#define LB_REGION_BYTES 56
#define LB_BLOCK_BYTES 64
#define LB_PATH 72
#define LB_SETTINGS 80
#define LB_REPLY 88
#define LB_ERROR_TEXT 96
#define LB_OUTCOME 104
#define LB_READ 108
#define LB_NAME 112
#define LB_SCHED 128
#define LB_FREE 176
#define LB_PROBES 184
#define LB_PROBE_BLOCKS 8
#define LB_REPLY_BYTES 4200
#define LB_NOT_LOADED 4

static_assert(offsetof(LoaderBlock, pthread_self) == LB_PTHREAD_SELF);
static_assert(offsetof(LoaderBlock, pthread_detach) == LB_PTHREAD_DETACH);
static_assert(offsetof(LoaderBlock, dlopen) == LB_DLOPEN);
static_assert(offsetof(LoaderBlock, dlerror) == LB_DLERROR);
static_assert(offsetof(LoaderBlock, munmap) == LB_MUNMAP);
static_assert(offsetof(LoaderBlock, attach_offset) == LB_ATTACH_OFFSET);
static_assert(offsetof(LoaderBlock, region) == LB_REGION);
static_assert(offsetof(LoaderBlock, region_bytes) == LB_REGION_BYTES);
static_assert(offsetof(LoaderBlock, block_bytes) == LB_BLOCK_BYTES);
static_assert(offsetof(LoaderBlock, path) == LB_PATH);
static_assert(offsetof(LoaderBlock, settings) == LB_SETTINGS);
static_assert(offsetof(LoaderBlock, reply) == LB_REPLY);
static_assert(offsetof(LoaderBlock, error_text) == LB_ERROR_TEXT);
static_assert(offsetof(LoaderBlock, outcome) == LB_OUTCOME);
static_assert(offsetof(LoaderBlock, read) == LB_READ);
static_assert(offsetof(LoaderBlock, name) == LB_NAME);
static_assert(offsetof(LoaderBlock, sched) == LB_SCHED);
static_assert(offsetof(LoaderBlock, free) == LB_FREE);
static_assert(offsetof(LoaderBlock, probes) == LB_PROBES && kProbeBlocks == LB_PROBE_BLOCKS);
static_assert(kReplyBytes == LB_REPLY_BYTES && kNotLoaded == LB_NOT_LOADED);

#define LB_TEXT(x) #x
#define LB(x) LB_TEXT(x)

// start_routine(block): rbx holds the block throughout, r12 the naps
// left; 24 bytes of frame (a timespec) keep rsp 16-byte aligned at calls.
// Assembled into .rodata: heapsnap copies it, never runs it.
asm(R"(
    .pushsection .rodata
    .balign 16
    .globl heapsnap_loader_code_begin, heapsnap_loader_code_end
    .hidden heapsnap_loader_code_begin, heapsnap_loader_code_end
heapsnap_loader_code_begin:
    .intel_syntax noprefix
    endbr64
    push rbx
    push r12
    sub rsp, 24
    mov rbx, rdi
    mov rax, 0x180000000                # SIGCANCEL, SIGSETXID (32, 33): glibc's own
    mov [rsp], rax
    mov edi, 1                          # SIG_UNBLOCK
    mov rsi, rsp
    xor edx, edx
    mov r10d, 8
    mov eax, 14                         # rt_sigprocmask
    syscall
    mov edi, 15                         # PR_SET_NAME
    lea rsi, [rbx + )" LB(LB_NAME) R"(]
    mov eax, 157                        # prctl
    syscall
    cmp dword ptr [rbx + )" LB(LB_SCHED) R"(], 0
    je .Lsettled
    xor edi, edi
    lea rsi, [rbx + )" LB(LB_SCHED) R"(]
    xor edx, edx
    mov eax, 314                        # sched_setattr
    syscall
.Lsettled:
    mov rdi, rbx
    mov rsi, [rbx + )" LB(LB_BLOCK_BYTES) R"(]
    mov edx, 3                          # PROT_READ | PROT_WRITE
    mov eax, 10                         # mprotect
    syscall
    test rax, rax
    jnz .Lunmap
    call [rbx + )" LB(LB_PTHREAD_SELF) R"(]
    mov rdi, rax
    call [rbx + )" LB(LB_PTHREAD_DETACH) R"(]
    xor r12d, r12d
.Lfree:
    mov rdi, [rbx + r12 * 8 + )" LB(LB_PROBES) R"(]
    test rdi, rdi
    jz .Lfreed
    call [rbx + )" LB(LB_FREE) R"(]
.Lfreed:
    inc r12d
    cmp r12d, )" LB(LB_PROBE_BLOCKS) R"(
    jb .Lfree
    mov rdi, [rbx + )" LB(LB_PATH) R"(]
    mov esi, 2                          # RTLD_NOW
    call [rbx + )" LB(LB_DLOPEN) R"(]
    test rax, rax
    jnz .Lloaded
    call [rbx + )" LB(LB_DLERROR) R"(]
    mov [rbx + )" LB(LB_ERROR_TEXT) R"(], rax
    mov eax, )" LB(LB_NOT_LOADED) R"(
    jmp .Lanswer
.Lloaded:
    mov rax, [rax]                      # l_addr: where the recorder was loaded
    add rax, [rbx + )" LB(LB_ATTACH_OFFSET) R"(]
    mov rdi, [rbx + )" LB(LB_SETTINGS) R"(]
    mov rsi, [rbx + )" LB(LB_REPLY) R"(]
    mov edx, )" LB(LB_REPLY_BYTES) R"(
    call rax
.Lanswer:
    mov [rbx + )" LB(LB_OUTCOME) R"(], eax
    mov r12d, 30000
.Lwait:
    cmp dword ptr [rbx + )" LB(LB_READ) R"(], 0
    jne .Lunmap
    dec r12d
    jz .Lunmap
    mov qword ptr [rsp], 0
    mov qword ptr [rsp + 8], 1000000
    mov rdi, rsp
    xor esi, esi
    mov eax, 35                         # nanosleep
    syscall
    jmp .Lwait
.Lunmap:
    mov rax, [rbx + )" LB(LB_MUNMAP) R"(]
    mov rdi, [rbx + )" LB(LB_REGION) R"(]
    mov rsi, [rbx + )" LB(LB_REGION_BYTES) R"(]
    add rsp, 24
    pop r12
    pop rbx
    jmp rax                             # munmap returns to the thread's start
    .att_syntax prefix
heapsnap_loader_code_end:
    .popsection
)");

extern "C" const uint8_t heapsnap_loader_code_begin[];
extern "C" const uint8_t heapsnap_loader_code_end[];

const uint8_t* loader_code() { return heapsnap_loader_code_begin; }

size_t loader_code_bytes() { return static_cast<size_t>(heapsnap_loader_code_end - heapsnap_loader_code_begin); }

}  // namespace heapsnap::cli
