/* Per-thread scratch buffers: an unpacked weight row and a float work area.
 * Grown by the caller before a parallel task starts, never inside one. */
#include <stdlib.h>

#include "kernels.h"

static struct {
    RowBuffer row;
    float *floats;
} slots[MAX_POOL_THREADS];
static int64_t reserved_cols, reserved_floats;
static int reserved_threads;

/* A buffer of at least `bytes` in place of p (its contents not kept; p freed only when the new
 * one is there), on a cache line: the prefill kernels load whole lines of the row buffer's f. */
static void *grow(void *p, size_t bytes) {
    void *q = aligned_alloc(64, (bytes / 64 + 1) * 64); /* a whole number of lines, never 0 */
    if (q) free(p);
    return q;
}

int scratch_reserve(int64_t cols, int64_t floats) {
    cols = (cols + 255) / 256 * 256;
    int n = pool_threads();
    if (cols <= reserved_cols && floats <= reserved_floats && n <= reserved_threads) return 0;
    if (cols < reserved_cols) cols = reserved_cols;
    if (floats < reserved_floats) floats = reserved_floats;
    for (int i = 0; i < n && i < MAX_POOL_THREADS; i++) {
        RowBuffer *r = &slots[i].row;
        void *q = grow(r->q, (size_t)cols), *s = grow(r->scale, sizeof(float) * (size_t)(cols / GROUP * HALVES)),
             *m = grow(r->min, sizeof(float) * (size_t)(cols / GROUP * HALVES)), *f = grow(r->f, sizeof(float) * (size_t)float_panel_floats(cols)),
             *w = grow(slots[i].floats, sizeof(float) * (size_t)floats);
        if (q) r->q = q;
        if (s) r->scale = s;
        if (m) r->min = m;
        if (f) r->f = f;
        if (w) slots[i].floats = w;
        if (!q || !s || !m || !f || !w) return -1;
    }
    reserved_threads = n;
    reserved_cols = cols;
    reserved_floats = floats;
    return 0;
}

RowBuffer *scratch_row(int ith) { return &slots[ith].row; }
float *scratch_floats(int ith) { return slots[ith].floats; }
