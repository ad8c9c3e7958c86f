// The CUDA emulator's runtime: runs a kernel over its grid, each block on one OS thread of a
// small pool, each CUDA thread of the block as a fiber of that OS thread.
//
// Scheduling. A block's fibers run in rounds: each runnable fiber, in the launch's lane order
// (forward, reverse, or shuffled anew every round from a seed), runs until it reaches a sync
// point (block barrier, warp shuffle/vote/__syncwarp) or returns. After each round the
// scheduler releases what can be released: a warp group once every lane of its mask waits at a
// warp op with that same mask (computing the shuffle or vote results), the block barrier once
// every thread waits at the same __syncthreads. When nothing is runnable and nothing can be
// released, the block has a fault (a deadlock, a thread gone that others wait for), which ends
// the launch: the block's fibers are abandoned and the launch reports what happened.
//
// Context switch: hand-written on x86-64 (callee-saved registers, stack pointer, MXCSR and
// the x87 control word) and on aarch64 (callee-saved x and d registers, FPCR), ucontext
// elsewhere (or with -DEMU_USE_UCONTEXT). Under AddressSanitizer every switch is announced
// with __sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define EMU_ASAN 1
#else
#define EMU_ASAN 0
#endif

#if (defined(__x86_64__) || defined(__aarch64__)) && !defined(EMU_USE_UCONTEXT)
#define EMU_ASM_SWITCH 1
#else
#define EMU_ASM_SWITCH 0
#include <ucontext.h>
#endif

namespace cuda_emu {

thread_local ThreadContext* current_thread;
thread_local BlockContext current_block;

namespace {

// Fiber stacks: allocated once per OS thread, reused by every block, with a guard page below.
// AddressSanitizer's frames are several times larger.
constexpr size_t kStackSize = EMU_ASAN ? 512 * 1024 : 64 * 1024;
constexpr size_t kGuardSize = 4096;
constexpr int kMaxThreads = 1024;

// ---- the context switch ------------------------------------------------------------------

#if EMU_ASM_SWITCH
extern "C" void emu_switch(void** save_sp, void* load_sp);
extern "C" void emu_fiber_start();

struct Context {
    void* sp = nullptr;
};

inline void switch_context(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
#endif

#if EMU_ASM_SWITCH && defined(__x86_64__)

// emu_switch saves the callee-saved registers, MXCSR and the x87 control word on the current
// stack, stores the stack pointer in *save_sp, and restores the same from load_sp.
// emu_fiber_start is where a new fiber's first switch "returns" to: it calls r12(r13).
asm(R"(
    .text
    .globl emu_switch
    .hidden emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch

    .globl emu_fiber_start
    .hidden emu_fiber_start
    .type emu_fiber_start, @function
emu_fiber_start:
    movq %r13, %rdi
    callq *%r12
    ud2
    .size emu_fiber_start, .-emu_fiber_start
)");

// A new context that starts by calling entry(arg) on the stack [base, base + size).
void make_context(Context& c, char* base, size_t size, void (*entry)(void*), void* arg) {
    uint64_t* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(base + size)) & ~uintptr_t(15));
    // Layout emu_switch pops, from the new stack pointer up: MXCSR | x87 CW, r15, r14, r13,
    // r12, rbx, rbp, return address. After `ret` the stack pointer is 16-byte aligned.
    top[-1] = reinterpret_cast<uint64_t>(&emu_fiber_start);
    top[-2] = 0;                                     // rbp: the end of the frame chain
    top[-3] = 0;                                     // rbx
    top[-4] = reinterpret_cast<uint64_t>(entry);     // r12
    top[-5] = reinterpret_cast<uint64_t>(arg);       // r13
    top[-6] = 0;                                     // r14
    top[-7] = 0;                                     // r15
    top[-8] = 0x1F80ull | (uint64_t(0x037F) << 32);  // default MXCSR, x87 control word
    c.sp = top - 8;
}
#elif EMU_ASM_SWITCH && defined(__aarch64__)
// The same on aarch64: x19-x30, d8-d15 and FPCR in a 176-byte frame; emu_fiber_start calls
// x19(x20).
asm(R"(
    .text
    .globl emu_switch
    .hidden emu_switch
    .type emu_switch, %function
emu_switch:
    sub sp, sp, #176
    stp x19, x20, [sp, #0]
    stp x21, x22, [sp, #16]
    stp x23, x24, [sp, #32]
    stp x25, x26, [sp, #48]
    stp x27, x28, [sp, #64]
    stp x29, x30, [sp, #80]
    stp d8, d9, [sp, #96]
    stp d10, d11, [sp, #112]
    stp d12, d13, [sp, #128]
    stp d14, d15, [sp, #144]
    mrs x9, fpcr
    str x9, [sp, #160]
    mov x9, sp
    str x9, [x0]
    mov sp, x1
    ldp x19, x20, [sp, #0]
    ldp x21, x22, [sp, #16]
    ldp x23, x24, [sp, #32]
    ldp x25, x26, [sp, #48]
    ldp x27, x28, [sp, #64]
    ldp x29, x30, [sp, #80]
    ldp d8, d9, [sp, #96]
    ldp d10, d11, [sp, #112]
    ldp d12, d13, [sp, #128]
    ldp d14, d15, [sp, #144]
    ldr x9, [sp, #160]
    msr fpcr, x9
    add sp, sp, #176
    ret
    .size emu_switch, .-emu_switch

    .globl emu_fiber_start
    .hidden emu_fiber_start
    .type emu_fiber_start, %function
emu_fiber_start:
    mov x0, x20
    blr x19
    brk #0
    .size emu_fiber_start, .-emu_fiber_start
)");

void make_context(Context& c, char* base, size_t size, void (*entry)(void*), void* arg) {
    uint64_t* top = reinterpret_cast<uint64_t*>((reinterpret_cast<uintptr_t>(base + size)) & ~uintptr_t(15));
    uint64_t* frame = top - 22;  // 176 bytes: x19..x30, d8..d15, FPCR, padding
    for (int i = 0; i < 22; ++i) frame[i] = 0;
    frame[0] = reinterpret_cast<uint64_t>(entry);             // x19
    frame[1] = reinterpret_cast<uint64_t>(arg);               // x20
    frame[11] = reinterpret_cast<uint64_t>(&emu_fiber_start);  // x30, where `ret` goes; x29 = 0 ends the frame chain
    c.sp = frame;
}
#else
struct Context {
    ucontext_t uc;
};

// makecontext passes int arguments only: the target and its argument travel in two halves.
thread_local void (*ucontext_target)(void*);

void ucontext_entry(unsigned hi, unsigned lo) { ucontext_target(reinterpret_cast<void*>(uintptr_t(hi) << 32 | lo)); }

void make_context(Context& c, char* base, size_t size, void (*entry)(void*), void* arg) {
    ucontext_target = entry;
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = base;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    const uintptr_t p = reinterpret_cast<uintptr_t>(arg);
    makecontext(&c.uc, reinterpret_cast<void (*)()>(&ucontext_entry), 2, unsigned(p >> 32), unsigned(p));
}

inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

// ---- launches and blocks -------------------------------------------------------------------

enum Order : int { ORDER_FORWARD = 0, ORDER_REVERSE = 1, ORDER_SHUFFLED = 2 };

struct Launch {
    const char* kernel;
    void (*body)(void**);
    void** args;
    dim3 grid, block;
    int order;
    uint64_t seed;
    uint64_t blocks;
    std::atomic<uint64_t> next_block{0};
    std::atomic<bool> failed{false};
    std::mutex fault_mutex;
    std::string fault;

    void fail(const std::string& message) {
        std::lock_guard<std::mutex> lock(fault_mutex);
        if (!failed.exchange(true)) fault = message;
    }
};

enum State : uint8_t { RUNNABLE, AT_BARRIER, AT_WARP, EXITED, FAULTED };

const char* op_name(int op) {
    static const char* const names[] = {"__shfl_sync",   "__shfl_up_sync", "__shfl_down_sync", "__shfl_xor_sync",
                                        "__ballot_sync", "__any_sync",     "__all_sync",       "__syncwarp"};
    return names[op];
}

struct Fiber {
    ThreadContext thread;
    Context context;
    char* stack = nullptr;
    State state = EXITED;
    bool started = false;
    // The sync point it waits at.
    const char* site = nullptr;
    WarpOp op = OP_SYNCWARP;
    unsigned mask = 0;
    uint64_t value = 0;
    int arg = 0;
    int width = 32;
    uint64_t result = 0;
#if EMU_ASAN
    void* fake_stack = nullptr;
#endif
};

std::string hex(unsigned v) {
    char buf[16];
    snprintf(buf, sizeof buf, "0x%08x", v);
    return buf;
}

// "0-15, 17, 20-31": sorted numbers, as runs.
std::string ranges(const std::vector<int>& sorted) {
    std::string out;
    for (size_t i = 0; i < sorted.size();) {
        size_t j = i;
        while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
        if (!out.empty()) out += ", ";
        out += std::to_string(sorted[i]);
        if (j > i) out += "-" + std::to_string(sorted[j]);
        i = j + 1;
    }
    return out;
}

// The set bits of a lane mask, plus `base`, as runs.
std::string lane_ranges(unsigned bits, int base = 0) {
    std::vector<int> lanes;
    for (int l = 0; l < 32; ++l)
        if (bits >> l & 1) lanes.push_back(base + l);
    return ranges(lanes);
}

// One OS thread's scheduler: its fibers (with their stacks) and the block it runs.
class Scheduler {
   public:
    // Runs block number `linear` of the launch; false after a fault (reported to the launch).
    bool run_block(Launch& launch, uint64_t linear);
    // Called on a fiber's stack: wait at a sync point until the scheduler releases it.
    void wait(State state);
    [[noreturn]] void fail_here(const std::string& what, const char* site);
    Fiber& current() { return fibers_[current_index_]; }
    int count() const { return count_; }
    bool in_fiber() const { return in_fiber_; }
    const char* kernel() const { return launch_ ? launch_->kernel : "?"; }

    Fiber* fibers() { return fibers_.data(); }

   private:
    static void fiber_main(void* self);
    void ensure_fibers(int n);
    void resume(int index);
    void switch_to_scheduler(bool exiting);
    // Releases what the waiting fibers allow; false when the block has a fault (set in fault_).
    bool resolve(bool& progress);
    bool resolve_warp(int warp, bool& progress);
    void compute_warp_results(int base, unsigned group);
    std::string thread_name(int i) const;
    std::string describe_waits() const;
    void abandon();

    std::vector<Fiber> fibers_;
    char* stacks_ = nullptr;
    size_t capacity_ = 0;
    int count_ = 0;
    int current_index_ = -1;
    bool in_fiber_ = false;
    Context scheduler_context_;
    Launch* launch_ = nullptr;
    std::string fault_;
#if EMU_ASAN
    const void* scheduler_stack_bottom_ = nullptr;
    size_t scheduler_stack_size_ = 0;
    void* scheduler_fake_stack_ = nullptr;
#endif
};

thread_local Scheduler* tl_scheduler = nullptr;

Scheduler& this_scheduler() {
    if (!tl_scheduler) tl_scheduler = new Scheduler();  // lives as long as its OS thread (never freed)
    return *tl_scheduler;
}

void Scheduler::ensure_fibers(int n) {
    if ((size_t)n <= capacity_) return;
    const size_t slot = kStackSize + kGuardSize;
    if (stacks_) munmap(stacks_, capacity_ * slot);
    capacity_ = kMaxThreads;
    void* p = mmap(nullptr, capacity_ * slot, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "cuda emulator: cannot map fiber stacks\n");
        abort();
    }
    stacks_ = static_cast<char*>(p);
    fibers_.assign(capacity_, Fiber{});
    for (size_t i = 0; i < capacity_; ++i) {
        mprotect(stacks_ + i * slot, kGuardSize, PROT_NONE);  // a stack overflow faults here
        fibers_[i].stack = stacks_ + i * slot + kGuardSize;
    }
}

void Scheduler::fiber_main(void* self) {
    Scheduler& s = *static_cast<Scheduler*>(self);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(nullptr, &s.scheduler_stack_bottom_, &s.scheduler_stack_size_);
#endif
    s.launch_->body(s.launch_->args);
    s.current().state = EXITED;
    s.switch_to_scheduler(true);
    __builtin_unreachable();
}

void Scheduler::resume(int index) {
    Fiber& f = fibers_[index];
    current_index_ = index;
    current_thread = &f.thread;
    in_fiber_ = true;
    f.started = true;
#if EMU_ASAN
    __sanitizer_start_switch_fiber(&scheduler_fake_stack_, f.stack, kStackSize);
#endif
    switch_context(scheduler_context_, f.context);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(scheduler_fake_stack_, nullptr, nullptr);
#endif
    in_fiber_ = false;
}

void Scheduler::switch_to_scheduler(bool exiting) {
    Fiber& f = current();
#if EMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, scheduler_stack_bottom_, scheduler_stack_size_);
#else
    (void)exiting;
#endif
    switch_context(f.context, scheduler_context_);
#if EMU_ASAN
    __sanitizer_finish_switch_fiber(f.fake_stack, &scheduler_stack_bottom_, &scheduler_stack_size_);
#endif
}

void Scheduler::wait(State state) {
    current().state = state;
    switch_to_scheduler(false);
}

void Scheduler::fail_here(const std::string& what, const char* site) {
    fault_ = thread_name(current_index_) + ": " + what + (site ? std::string(" (") + site + ")" : std::string());
    current().state = FAULTED;
    switch_to_scheduler(true);
    __builtin_unreachable();
}

std::string Scheduler::thread_name(int i) const {
    const uint3 t = fibers_[i].thread.thread_idx;
    const dim3 b = current_block.block_dim;
    std::string name = "thread " + std::to_string(i);
    if (b.y > 1 || b.z > 1)
        name += " (" + std::to_string(t.x) + "," + std::to_string(t.y) + "," + std::to_string(t.z) + ")";
    return name;
}

// Every live thread's wait, grouped: "threads 0-15 wait at __syncthreads (k.cu:12); threads
// 16-31 wait at __shfl_xor_sync with mask 0xffffffff (k.cu:20); threads 32-63 exited".
std::string Scheduler::describe_waits() const {
    std::vector<std::pair<std::string, std::vector<int>>> groups;
    for (int i = 0; i < count_; ++i) {
        const Fiber& f = fibers_[i];
        std::string what;
        if (f.state == AT_BARRIER)
            what = std::string("wait at __syncthreads (") + f.site + ")";
        else if (f.state == AT_WARP)
            what = std::string("wait at ") + op_name(f.op) + " with mask " + hex(f.mask) + " (" + f.site + ")";
        else if (f.state == EXITED)
            what = "exited";
        else
            what = "are runnable";
        auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == what; });
        if (it == groups.end())
            groups.push_back({what, {i}});
        else
            it->second.push_back(i);
    }
    std::string out;
    for (const auto& g : groups) {
        if (!out.empty()) out += "; ";
        out += (g.second.size() == 1 ? "thread " : "threads ") + ranges(g.second) + " " + g.first;
    }
    return out;
}

void Scheduler::compute_warp_results(int base, unsigned group) {
    const Fiber& first = fibers_[base + __builtin_ctz(group)];
    const WarpOp op = first.op;
    if (op == OP_BALLOT || op == OP_ANY || op == OP_ALL || op == OP_SYNCWARP) {
        unsigned ballot = 0;
        for (int l = 0; l < 32; ++l)
            if ((group >> l & 1) && fibers_[base + l].value) ballot |= 1u << l;
        const uint64_t r = op == OP_BALLOT ? ballot : op == OP_ANY ? ballot != 0 : op == OP_ALL ? ballot == group : 0;
        for (int l = 0; l < 32; ++l)
            if (group >> l & 1) fibers_[base + l].result = r;
        return;
    }
    for (int l = 0; l < 32; ++l) {
        if (!(group >> l & 1)) continue;
        Fiber& f = fibers_[base + l];
        // PTX shfl.sync: segmask selects the lane's width-segment; out-of-range reads keep var.
        const int seg = (32 - f.width) & 31, b = f.arg & 31;
        const int min_lane = l & seg, max_lane = min_lane | (op == OP_SHFL_UP ? 0 : (31 & ~seg));
        int j;
        bool in_range;
        if (op == OP_SHFL_UP) {
            j = l - b;
            in_range = j >= max_lane;
        } else if (op == OP_SHFL_DOWN) {
            j = l + b;
            in_range = j <= max_lane;
        } else if (op == OP_SHFL_XOR) {
            j = l ^ b;
            in_range = j <= max_lane;
        } else {
            j = min_lane | (b & ~seg);
            in_range = j <= max_lane;
        }
        if (!in_range) j = l;
        if (!(group >> j & 1)) {
            fault_ = thread_name(base + l) + ": " + op_name(op) + " reads lane " + std::to_string(j) +
                     ", outside the mask " + hex(group) + " (" + f.site + ")";
            return;
        }
        f.result = fibers_[base + j].value;
    }
}

bool Scheduler::resolve_warp(int warp, bool& progress) {
    const int base = warp * 32, lanes = std::min(32, count_ - base);
    unsigned waiting = 0, exited = 0;
    for (int l = 0; l < lanes; ++l) {
        const State s = fibers_[base + l].state;
        if (s == AT_WARP) waiting |= 1u << l;
        if (s == EXITED) exited |= 1u << l;
    }
    unsigned seen = 0;
    while (waiting & ~seen) {
        const int lead = __builtin_ctz(waiting & ~seen);
        const Fiber& f = fibers_[base + lead];
        const unsigned mask = f.mask;
        unsigned group = 0;
        for (int l = 0; l < lanes; ++l)
            if ((waiting >> l & 1) && fibers_[base + l].mask == mask) group |= 1u << l;
        seen |= group;
        if (mask & exited) {
            fault_ = std::string(group == 1u << lead ? "thread " : "threads ") + lane_ranges(group, base) + " wait at " + op_name(f.op) + " with mask " + hex(mask) + " (" + f.site + ") but lanes " +
                     lane_ranges(mask & exited) + " of warp " + std::to_string(warp) + " exited";
            return false;
        }
        if (group != mask) continue;  // not everyone there yet
        for (int l = 0; l < 32; ++l) {
            if (group >> l & 1 && fibers_[base + l].op != f.op) {
                fault_ = "warp " + std::to_string(warp) + ", mask " + hex(mask) + ": lane " + std::to_string(lead) +
                         " waits at " + op_name(f.op) + " (" + f.site + ") but lane " + std::to_string(l) +
                         " at " + op_name(fibers_[base + l].op) + " (" + fibers_[base + l].site + ")";
                return false;
            }
        }
        compute_warp_results(base, group);
        if (!fault_.empty()) return false;
        for (int l = 0; l < 32; ++l)
            if (group >> l & 1) fibers_[base + l].state = RUNNABLE;
        progress = true;
    }
    return true;
}

bool Scheduler::resolve(bool& progress) {
    int runnable = 0, at_barrier = 0, exited = 0;
    for (int i = 0; i < count_; ++i) {
        runnable += fibers_[i].state == RUNNABLE;
        at_barrier += fibers_[i].state == AT_BARRIER;
        exited += fibers_[i].state == EXITED;
    }
    progress = runnable > 0;
    if (exited == count_) return true;
    for (int w = 0; w * 32 < count_; ++w)
        if (!resolve_warp(w, progress)) return false;
    if (progress) return true;
    if (at_barrier + exited == count_) {
        if (exited > 0) {
            fault_ = "a thread exited while others wait at __syncthreads: " + describe_waits();
            return false;
        }
        const char* site = nullptr;
        for (int i = 0; i < count_; ++i) {
            if (!site) site = fibers_[i].site;
            if (strcmp(site, fibers_[i].site) != 0) {
                fault_ = "deadlock: the threads wait at different __syncthreads: " + describe_waits();
                return false;
            }
        }
        for (int i = 0; i < count_; ++i) fibers_[i].state = RUNNABLE;
        progress = true;
        return true;
    }
    fault_ = "deadlock: " + describe_waits();
    return false;
}

void Scheduler::abandon() {
#if EMU_ASAN
    // The abandoned fibers' frames leave their stacks poisoned: clear that before reuse.
    for (int i = 0; i < count_; ++i)
        if (fibers_[i].started) __asan_unpoison_memory_region(fibers_[i].stack, kStackSize);
#endif
    for (int i = 0; i < count_; ++i) fibers_[i].state = EXITED;
}

bool Scheduler::run_block(Launch& launch, uint64_t linear) {
    const dim3 g = launch.grid, b = launch.block;
    current_block.grid_dim = g;
    current_block.block_dim = b;
    current_block.block_idx = uint3{unsigned(linear % g.x), unsigned(linear / g.x % g.y), unsigned(linear / g.x / g.y)};
    count_ = int(b.x * b.y * b.z);
    launch_ = &launch;
    fault_.clear();
    ensure_fibers(count_);
    std::vector<int> order(count_);
    for (int i = 0; i < count_; ++i) {
        Fiber& f = fibers_[i];
        f.thread.thread_idx = uint3{unsigned(i % b.x), unsigned(i / b.x % b.y), unsigned(i / b.x / b.y)};
        f.state = RUNNABLE;
        f.started = false;
#if EMU_ASAN
        __asan_unpoison_memory_region(f.stack + kStackSize - 16384, 16384);  // fiber_main's old frame
#endif
        make_context(f.context, f.stack, kStackSize, &Scheduler::fiber_main, this);
        order[i] = launch.order == ORDER_REVERSE ? count_ - 1 - i : i;
    }
    std::mt19937_64 rng;
    if (launch.order == ORDER_SHUFFLED) rng.seed(launch.seed * 0x9E3779B97F4A7C15ull + linear);
    for (;;) {
        if (launch.order == ORDER_SHUFFLED) std::shuffle(order.begin(), order.end(), rng);
        for (int i : order) {
            if (fibers_[i].state != RUNNABLE) continue;
            resume(i);
            if (fibers_[i].state == FAULTED) break;
        }
        bool progress = false;
        if (fault_.empty() && resolve(progress)) {
            if (progress) continue;
            return true;  // every thread exited
        }
        const uint3 bi = current_block.block_idx;
        launch.fail(std::string("kernel ") + launch.kernel + ", block (" + std::to_string(bi.x) + "," +
                    std::to_string(bi.y) + "," + std::to_string(bi.z) + "): " + fault_);
        abandon();
        return false;
    }
}

// ---- the pool of OS threads ------------------------------------------------------------------

void run_blocks(Launch& launch) {
    Scheduler& s = this_scheduler();
    for (;;) {
        if (launch.failed.load(std::memory_order_relaxed)) return;
        const uint64_t b = launch.next_block.fetch_add(1);
        if (b >= launch.blocks) return;
        if (!s.run_block(launch, b)) return;
    }
}

int configured_threads() {
    if (const char* env = getenv("SPRIG_CUDA_EMULATOR_THREADS")) {
        const int n = atoi(env);
        if (n > 0) return n;
    }
    const unsigned n = std::thread::hardware_concurrency();
    return n ? int(n) : 1;
}

// Helper threads wait for a launch; the launching thread runs blocks too. Never destroyed:
// the threads are detached and simply end with the process.
class Pool {
   public:
    explicit Pool(int threads) : threads_(threads) {
        for (int i = 1; i < threads; ++i) std::thread([this] { serve(); }).detach();
    }
    int threads() const { return threads_; }

    void run(Launch& launch) {
        const int helpers = int(std::min<uint64_t>(launch.blocks, uint64_t(threads_)) - 1);
        if (helpers <= 0) return run_blocks(launch);
        std::unique_lock<std::mutex> lock(mutex_);
        job_ = &launch;
        wanted_ = helpers;
        ++generation_;
        wake_.notify_all();
        lock.unlock();
        run_blocks(launch);
        lock.lock();
        done_.wait(lock, [&] { return wanted_ == 0 && busy_ == 0; });
        job_ = nullptr;
    }

   private:
    void serve() {
        uint64_t seen = 0;
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            wake_.wait(lock, [&] { return generation_ != seen && wanted_ > 0; });
            seen = generation_;
            --wanted_;
            ++busy_;
            Launch* job = job_;
            lock.unlock();
            run_blocks(*job);
            lock.lock();
            --busy_;
            if (wanted_ == 0 && busy_ == 0) done_.notify_all();
        }
    }

    int threads_;
    std::mutex mutex_;
    std::condition_variable wake_, done_;
    Launch* job_ = nullptr;
    uint64_t generation_ = 0;
    int wanted_ = 0, busy_ = 0;
};

Pool& pool() {
    static Pool* p = new Pool(configured_threads());
    return *p;
}

#if EMU_ASAN
// Printed when AddressSanitizer reports an error: which CUDA thread made it.
void report_cuda_thread() {
    if (!tl_scheduler || !tl_scheduler->in_fiber()) return;
    const uint3 b = current_block.block_idx, t = current_thread->thread_idx;
    fprintf(stderr, "cuda emulator: in kernel %s, block (%u,%u,%u), thread (%u,%u,%u)\n", tl_scheduler->kernel(), b.x, b.y,
            b.z, t.x, t.y, t.z);
}
#endif

std::mutex launch_mutex;              // one launch at a time per module
thread_local std::string last_fault;  // what the calling thread's last failed launch reported

}  // namespace

// ---- what the kernels call ---------------------------------------------------------------------

void syncthreads(const char* site) {
    Scheduler& s = this_scheduler();
    s.current().site = site;
    s.wait(AT_BARRIER);
}

uint64_t warp_op(WarpOp op, unsigned mask, uint64_t value, int arg, int width, const char* site) {
    Scheduler& s = this_scheduler();
    Fiber& f = s.current();
    const int index = int(&f - s.fibers()), lane = index & 31, base = index - lane;
    const int lanes = std::min(32, s.count() - base);
    if (!(mask >> lane & 1))
        s.fail_here(std::string(op_name(op)) + " with mask " + hex(mask) + ", which does not contain the calling lane " +
                        std::to_string(lane),
                    site);
    if (lanes < 32 && (mask >> lanes))
        s.fail_here(std::string(op_name(op)) + " with mask " + hex(mask) + " names lanes " +
                        lane_ranges(mask & ~((1u << lanes) - 1)) + ", which do not exist in a block of " +
                        std::to_string(s.count()) + " threads",
                    site);
    if (width < 1 || width > 32 || (width & (width - 1)))
        s.fail_here(std::string(op_name(op)) + " with width " + std::to_string(width) + " (not a power of 2 up to 32)",
                    site);
    f.op = op;
    f.mask = mask;
    f.value = value;
    f.arg = arg;
    f.width = width;
    f.site = site;
    s.wait(AT_WARP);
    return f.result;
}

unsigned active_mask() {
    Scheduler& s = this_scheduler();
    const int index = int(&s.current() - s.fibers()), base = index & ~31;
    unsigned mask = 0;
    for (int l = 0; l < 32 && base + l < s.count(); ++l)
        if (s.fibers()[base + l].state != EXITED) mask |= 1u << l;
    return mask;
}

void fault(const char* what, const char* site) {
    Scheduler& s = this_scheduler();
    if (!s.in_fiber()) {
        fprintf(stderr, "cuda emulator: %s (%s) outside a kernel\n", what, site);
        abort();
    }
    s.fail_here(what, site);
}

}  // namespace cuda_emu

// A failed assert() in a kernel faults its block, as on the GPU, instead of aborting the process.
extern "C" __attribute__((visibility("hidden"))) void __assert_fail(const char* expr, const char* file,
                                                                    unsigned int line, const char* function) noexcept {
    const std::string what = std::string("assertion `") + expr + "` failed in " + function;
    const std::string site = std::string(file) + ":" + std::to_string(line);
    cuda_emu::fault(what.c_str(), site.c_str());
}

// ---- the module's C interface (build.py's thunks and emulator_device.py) ------------------------

extern "C" {

// Runs body over the grid; 0, or 1 after a fault (then emu_last_fault() says what).
__attribute__((visibility("default"))) int emu_run(const char* kernel, void (*body)(void**), void** args,
                                                   unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                                   unsigned bz, int order, unsigned long long seed) {
    using namespace cuda_emu;
#if EMU_ASAN
    static const bool reporting = (__sanitizer_set_death_callback(report_cuda_thread), true);
    (void)reporting;
#endif
    std::lock_guard<std::mutex> lock(launch_mutex);
    Launch launch;
    launch.kernel = kernel;
    launch.body = body;
    launch.args = args;
    launch.grid = dim3(gx, gy, gz);
    launch.block = dim3(bx, by, bz);
    launch.order = order;
    launch.seed = seed;
    launch.blocks = uint64_t(gx) * gy * gz;
    pool().run(launch);
    if (!launch.failed) return 0;
    last_fault = launch.fault;
    return 1;
}

__attribute__((visibility("default"))) const char* emu_last_fault() { return cuda_emu::last_fault.c_str(); }

__attribute__((visibility("default"))) int emu_thread_count() { return cuda_emu::pool().threads(); }
}
