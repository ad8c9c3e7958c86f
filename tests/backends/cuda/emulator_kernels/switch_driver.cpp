// Runs a few of the test kernels straight through the runtime's emu_run, for the context-switch
// variants the Python tests cannot load (ucontext; aarch64 under qemu): prints what they computed.
#include <stdio.h>

#include "broken.cu"
#include "correct.cu"

extern "C" int emu_run(const char*, void (*)(void**), void**, unsigned, unsigned, unsigned, unsigned, unsigned,
                       unsigned, int, unsigned long long);
extern "C" const char* emu_last_fault();

static void run_block_sum(void** a) { block_sum(*(const int**)a[0], *(int**)a[1]); }
static void run_warp_sum(void** a) { warp_sum(*(const int**)a[0], *(int**)a[1]); }
static void run_deadlock(void** a) { barrier_in_branch(*(int**)a[0]); }

int main() {
    static int x[1024], sums[4], warps[32], scratch[64];
    for (int i = 0; i < 1024; ++i) x[i] = i;
    const int* px = x;
    int *ps = sums, *pw = warps, *pj = scratch;
    void* sum_args[] = {&px, &ps};
    void* warp_args[] = {&px, &pw};
    void* deadlock_args[] = {&pj};
    for (int order = 0; order < 3; ++order) {
        int rc = emu_run("block_sum", run_block_sum, sum_args, 4, 1, 1, 256, 1, 1, order, 1);
        printf("block_sum %d: %d %d %d %d\n", rc, sums[0], sums[1], sums[2], sums[3]);
        rc = emu_run("warp_sum", run_warp_sum, warp_args, 4, 1, 1, 256, 1, 1, order, 1);
        printf("warp_sum %d: %d %d\n", rc, warps[0], warps[31]);
        rc = emu_run("barrier_in_branch", run_deadlock, deadlock_args, 1, 1, 1, 64, 1, 1, order, 1);
        printf("barrier_in_branch %d: %.40s\n", rc, emu_last_fault());
    }
    return 0;
}
