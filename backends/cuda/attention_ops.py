"""Launchers for `kernels/attention.cu`: writing new keys and values into a layer's float16
cache, and attention over it (one-token decoding split among blocks, tiled prefill)."""

from dataclasses import dataclass

import numpy as np

from backends.cuda.device import Device

_CHUNK = 8  # halves per 16-byte load: rows of keys and values are whole chunks
_DECODE_THREADS = 128
_DECODE_MAX_D = 512
_DECODE_HEAD_GROUPS = (4, 3, 2, 1)  # query heads one decode block serves (decode_gq<n>)
_SPLIT_KEYS = 128  # a decode split takes at least about this many keys
_TARGET_BLOCKS = 256  # enough decode blocks to fill a large GPU
_PREFILL_ROWS = 16  # PREFILL_BQ
_PREFILL_THREADS = 128
_PREFILL_MAX_D = 256
_WRITE_THREADS = 128
_F32 = 4


@dataclass(frozen=True)
class LayerCache:
    """One layer's keys (kv_heads, slots, head_dim) and values (kv_heads, slots, value_dim),
    float16 at device pointers `keys` and `values`; position p at slot p, or p % slots when
    `ring`."""

    keys: int
    values: int
    kv_heads: int
    slots: int
    head_dim: int
    value_dim: int
    ring: bool


def _head_group(heads: int, kv_heads: int) -> int:
    """The most query heads of one KV head that a decode block can serve together."""
    group = heads // kv_heads
    return next(g for g in _DECODE_HEAD_GROUPS if group % g == 0)


def _lanes_per_key(head_dim: int, value_dim: int) -> int:
    """Lanes that read one key row together: a power of two, 16 halves (two chunks) a lane at most."""
    lanes = 1
    while 2 * _CHUNK * lanes < max(head_dim, value_dim):
        lanes *= 2
    return lanes


class Attention:
    """Attention over float16 KV caches on one device."""

    def __init__(self, dev: Device):
        self.dev = dev
        self._write = dev.function("attention", "write_kv")
        self._decode = {g: dev.function("attention", f"decode_gq{g}") for g in _DECODE_HEAD_GROUPS}
        self._prefill = dev.function("attention", "prefill")
        self._partials = _Scratch(dev)  # decode splits' partial values, then their max and sum
        self._counters = _Scratch(dev)  # per (row, heads): the decode splits done, zero between launches
        self._tables: dict[tuple[tuple[int, int, int], ...], int] = {}

    @staticmethod
    def _check(heads: int, cache: LayerCache, limit: int) -> None:
        if heads % cache.kv_heads:
            raise ValueError(f"{heads} query heads do not share {cache.kv_heads} KV heads evenly")
        for name, dim in (("head", cache.head_dim), ("value", cache.value_dim)):
            if dim % _CHUNK or dim > limit:
                raise ValueError(f"the CUDA attention kernels take {name} dims that are multiples of 8 up to {limit}")

    def write(self, k: int, v: int, t: int, cache: LayerCache, positions: int) -> None:
        """Store k (t, Hkv, Dh) and v (t, Hkv, Dv), float32, as float16 at the slots of
        `positions` (device int32 (t,)): slot p, or p % slots for a ring."""
        if t == 0:
            return
        args: list[np.generic] = [np.uintp(k), np.uintp(v), np.int32(cache.kv_heads)]
        args += [np.int32(cache.head_dim), np.int32(cache.value_dim), np.uintp(cache.keys), np.uintp(cache.values)]
        args += [np.int32(cache.slots), np.int32(cache.ring), np.uintp(positions)]
        self.dev.launch(self._write, (t, cache.kv_heads, 1), (_WRITE_THREADS, 1, 1), args)

    def attend(
        self,
        q: int,
        t: int,
        heads: int,
        cache: LayerCache,
        positions: int,
        scale: float,
        window: int | None,
        softcap: float | None,
        sinks: int,
        causal: bool,
        out: int,
    ) -> None:
        """Attention of q (t, H, Dh) float32 at `positions` (device int32 (t,), consecutive)
        over `cache`, whose positions up to the last one are written, into out (t, H * Dv).
        `window` None or a width; `softcap` None or a cap; `sinks` a device float32 (H,) or 0;
        `causal` False: every query sees every position up to the pass's last. One token
        decodes (split among blocks); more go through the tiled prefill kernel (head dims up to
        256), or, causal with wider heads (up to 512), through the decode kernel a query a row."""
        if t == 0:
            return
        wide = max(cache.head_dim, cache.value_dim) > _PREFILL_MAX_D
        if t == 1 or (wide and causal):  # heads too wide for the prefill tiles: each query decodes on its own
            self._check(heads, cache, _DECODE_MAX_D)
            self._decode_rows(q, t, heads, cache, 0, positions, scale, window, softcap, sinks, out)
            return
        self._check(heads, cache, _PREFILL_MAX_D)
        args: list[np.generic] = [np.uintp(q), np.int32(t), np.int32(heads), np.int32(cache.kv_heads)]
        args += [np.int32(cache.head_dim), np.int32(cache.value_dim), np.uintp(cache.keys), np.uintp(cache.values)]
        args.append(np.int32(cache.slots))
        args += [np.int32(cache.ring), np.uintp(positions), np.float32(scale), np.int32(window or 0)]
        args += [np.float32(softcap or 0.0), np.uintp(sinks), np.int32(causal), np.uintp(out)]
        grid = (-(-t // _PREFILL_ROWS), heads, 1)
        self.dev.launch(self._prefill, grid, (_PREFILL_THREADS, 1, 1), args)

    def attend_batch(
        self,
        q: int,
        b: int,
        heads: int,
        caches: list[LayerCache],
        positions: int,
        scale: float,
        window: int | None,
        softcap: float | None,
        sinks: int,
        out: int,
    ) -> None:
        """One token for each of b sequences: row i of q (b, H, Dh) at positions[i] over
        caches[i] (all of one layer's shape), into out (b, H * Dv)."""
        if b == 0:
            return
        first = caches[0]
        self._check(heads, first, _DECODE_MAX_D)
        shape = (first.kv_heads, first.head_dim, first.value_dim, first.ring)
        if any((c.kv_heads, c.head_dim, c.value_dim, c.ring) != shape for c in caches):
            raise ValueError("a batch's caches differ in shape")
        table = self._table(caches)
        self._decode_rows(q, b, heads, first, table, positions, scale, window, softcap, sinks, out)

    def _table(self, caches: list[LayerCache]) -> int:
        """A device array of each cache's keys pointer, values pointer and slots (int64), made once per list."""
        key = tuple((c.keys, c.values, c.slots) for c in caches)
        table = self._tables.get(key)
        if table is None:
            table = self.dev.to_device(np.array(key, dtype=np.int64))  # (b, 3)
            self._tables[key] = table
        return table

    def _decode_rows(
        self,
        q: int,
        rows: int,
        heads: int,
        cache: LayerCache,
        table: int,
        positions: int,
        scale: float,
        window: int | None,
        softcap: float | None,
        sinks: int,
        out: int,
    ) -> None:
        """One launch of the decode kernel over `rows` sequences (their caches in `table`, or
        `cache` when table is 0); with several splits, the last block of each heads' merges them."""
        gq = _head_group(heads, cache.kv_heads)
        head_blocks = heads // gq
        visible = cache.slots if window is None else min(window, cache.slots)
        splits = max(1, min(-(-visible // _SPLIT_KEYS), _TARGET_BLOCKS // (head_blocks * rows)))
        partial_values = partial_stats = counters = 0
        if splits > 1:
            partial_values = self._partials.at_least(_F32 * rows * heads * splits * (cache.value_dim + 2))
            partial_stats = partial_values + _F32 * rows * heads * splits * cache.value_dim
            counters = self._counters.at_least(4 * rows * head_blocks)
        args: list[np.generic] = [np.uintp(q), np.int32(heads), np.int32(cache.kv_heads), np.int32(cache.head_dim)]
        args += [np.int32(cache.value_dim), np.uintp(table), np.uintp(cache.keys), np.uintp(cache.values)]
        args += [np.int32(cache.slots), np.int32(cache.ring), np.uintp(positions), np.float32(scale)]
        args += [np.int32(window or 0), np.float32(softcap or 0.0), np.uintp(sinks)]
        args += [np.int32(_lanes_per_key(cache.head_dim, cache.value_dim)), np.uintp(out)]
        args += [np.uintp(partial_values), np.uintp(partial_stats), np.uintp(counters)]
        self.dev.launch(self._decode[gq], (head_blocks, splits, rows), (_DECODE_THREADS, 1, 1), args)

    def close(self) -> None:
        """Free the scratch buffers and batch tables."""
        self._partials.close()
        self._counters.close()
        for ptr in self._tables.values():
            self.dev.free(ptr)
        self._tables.clear()


class _Scratch:
    """A zeroed device buffer that grows as needed. An outgrown one is kept until `close`: a
    recorded graph may still use it."""

    def __init__(self, dev: Device):
        self.dev = dev
        self.ptr, self.nbytes = 0, 0
        self._retired: list[int] = []

    def at_least(self, nbytes: int) -> int:
        """The buffer, at least `nbytes` long."""
        if nbytes > self.nbytes:
            if self.ptr:
                self._retired.append(self.ptr)
            self.ptr, self.nbytes = self.dev.alloc(nbytes), nbytes
            self.dev.memset(self.ptr, 0, nbytes)
        return self.ptr

    def close(self) -> None:
        """Free every buffer it made."""
        for ptr in [self.ptr, *self._retired] if self.ptr else []:
            self.dev.free(ptr)
        self.ptr, self.nbytes, self._retired = 0, 0, []
