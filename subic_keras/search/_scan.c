/* Exact asymmetric top-k scan of SuBiC codes: bound with SIMD, refine exactly.
 *
 * The database is a sequence of tiles of `tile` items; a tile stores its
 * sub-codes column by column (`columns` rows of `tile` bytes). A sub-code
 * covers one or more blocks (see `subic_keras/search/native.py`), and each
 * query `z` (float32, M*K values) gets one exact float64 look-up table per
 * sub-code, the sum of its blocks' entries, so that
 *
 *     score(item) = sum_g lut[g][sub_g(item)]            (paper Eq. 8)
 *
 * For every query the tables are quantised to integers with one step
 * `delta` and a per-table offset, rounding down: q = floor((v - min_g) /
 * delta), so v - min_g lies in [q delta, (q + 1) delta). The quantised sum
 * Q of an item (16-bit, added with SIMD table look-ups: AVX2 pshufb, on
 * 16-entry tables or, for 5- to 8-bit sub-codes, on 16-entry sub-tables
 * chosen by a blend tree on the high bits, on 256 bits or, with
 * AVX-512BW, on 512; AVX-512 VBMI vpermb; NEON tbl; portable C everywhere,
 * and for 16-bit sub-codes) bounds its score:
 *
 *     base + delta Q  <=  score  <  base + delta (Q + G)
 *
 * with `base = sum_g min_g` and G sub-codes. The k best items so far are
 * kept in a heap whose root, the k-th best exact score S_k, sets the bar
 * from the k-th item on (the bar rises with every item it takes, so fewer
 * items are scored exactly than with a buffer of 2k cut back by
 * quickselect). Items of equal codes
 * are scanned once (`Database.members`), and many of them enter the heap
 * at once (`keep_group`). An item with Q < t, where
 * t = ceil((S_k - base) / delta) - G - 1, scores below S_k and is skipped;
 * every other item is scored exactly (in float64) and kept if it beats
 * S_k. The extra -1 absorbs floating-point rounding. Results are therefore
 * those of an exact scan: best score first, equal scores by position
 * (earlier first).
 */

#ifndef SUBIC_NO_PYTHON /* the emulator test builds the kernels alone */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#endif

#include <math.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>
#define SUBIC_X86 1
#else
#define SUBIC_X86 0
#endif

#if defined(__aarch64__) && defined(__ARM_NEON)
#include <arm_neon.h>
#define SUBIC_NEON 1
#else
#define SUBIC_NEON 0
#endif

/* The kernels, by the number the binding takes. */
enum {
    KERNEL_PORTABLE = 0,
    KERNEL_AVX2 = 1,
    KERNEL_VBMI = 2,
    KERNEL_NEON = 3,
    KERNEL_AVX512BW = 4,
    KERNEL_COUNT = 5
};
static const char *const KERNEL_NAMES[] = {"portable", "avx2", "vbmi", "neon", "avx512bw"};

#define QUERY_GROUP 8        /* queries sharing each pass over a tile */
#define LARGE_K (1 << 16)    /* beyond it, one query at a time (buffer memory) */

typedef struct {
    double score;
    int64_t position;
} Item;

typedef struct {
    const uint8_t *tiles;
    int64_t n, tile, columns;
    int bits, table, groups;
    int num_blocks, block_size, nbits, per_group, entries; /* sub-code layout */
    int64_t k;
    /* Items with equal codes are scanned once: row r of the tiles is the
       code of items members[starts[r]], ..., members[starts[r + 1] - 1]
       (increasing positions). NULL: row r is the item at position r. */
    const int64_t *starts, *members;
    /* The filter, bits LSB first: bit r of `row_bits` says whether row r
       may be returned (a row without it is never scored exactly, a tile
       without any is not scanned), bit p of `member_bits` whether the item
       at position p may (with `members`). NULL: every one. */
    const uint8_t *row_bits, *member_bits;
    int qmax;     /* the largest quantised table entry */
    int per_byte; /* look-ups the SIMD kernels sum in bytes: 255 / qmax */
    int64_t log2k; /* levels of the heap of the k best, rounded up */
} Database;

typedef struct {
    double *lut;       /* groups x table, exact */
    uint8_t *qlut;     /* groups x table, quantised */
    uint8_t *packed;   /* groups x table / 2: two 4-bit entries a byte (AVX2) */
    double base, delta;
    int32_t threshold; /* items with Q below it are skipped */
    Item *kept;        /* the k best so far: a heap, the worst at its root */
    int64_t size;      /* once it is k, the root is the bar for later items */
    Item *scratch;     /* 2k items, for `keep_group` */
} Query;

/* Scans `valid` items of a tile (from item `start`) for one query,
   offering each item whose bound reaches its bar. */
typedef void (*TileKernel)(Query *q, const Database *db, const uint8_t *cols, int64_t valid,
                           int64_t start);

static inline int bit_set(const uint8_t *bits, int64_t at) {
    return (bits[at >> 3] >> (at & 7)) & 1;
}

/* `a` ranks after `b`: a lower score, or an equal score at a later position. */
static inline int ranks_after(const Item *a, const Item *b) {
    return a->score < b->score || (a->score == b->score && a->position > b->position);
}

static inline void swap_items(Item *a, Item *b) {
    Item t = *a;
    *a = *b;
    *b = t;
}

/* Moves `item` down from `at` in a heap of the k best (the worst at the
   root) to its place. */
static void sift_down(Item *heap, int64_t size, int64_t at, Item item) {
    for (;;) {
        int64_t child = 2 * at + 1;
        if (child >= size) break;
        if (child + 1 < size && ranks_after(&heap[child + 1], &heap[child])) child++;
        if (!ranks_after(&heap[child], &item)) break;
        heap[at] = heap[child];
        at = child;
    }
    heap[at] = item;
}

static void sift_up(Item *heap, int64_t at, Item item) {
    while (at > 0) {
        int64_t parent = (at - 1) / 2;
        if (!ranks_after(&item, &heap[parent])) break;
        heap[at] = heap[parent];
        at = parent;
    }
    heap[at] = item;
}

/* Puts a heap of the k best in order, best first, in place (heapsort: the
   root, the worst, goes to the end): no call per comparison, as qsort's. */
static void sort_heap(Item *heap, int64_t size) {
    for (int64_t last = size - 1; last > 0; last--) {
        Item worst = heap[0];
        sift_down(heap, last, 0, heap[last]);
        heap[last] = worst;
    }
}

/* Moves the `keep` best of `items[0 .. count)` to its front, in any order
   (quickselect on the strict order `ranks_after`: positions differ). */
static void select_best(Item *items, int64_t count, int64_t keep) {
    int64_t lo = 0, hi = count - 1;
    while (lo < hi) {
        /* The median of three as pivot, moved to `hi`. */
        int64_t mid = lo + (hi - lo) / 2;
        if (ranks_after(&items[lo], &items[mid])) swap_items(&items[lo], &items[mid]);
        if (ranks_after(&items[mid], &items[hi])) swap_items(&items[mid], &items[hi]);
        if (ranks_after(&items[lo], &items[mid])) swap_items(&items[lo], &items[mid]);
        swap_items(&items[mid], &items[hi]);
        Item pivot = items[hi];
        int64_t store = lo;
        for (int64_t i = lo; i < hi; i++)
            if (ranks_after(&pivot, &items[i])) swap_items(&items[i], &items[store++]);
        swap_items(&items[store], &items[hi]);
        if (store == keep || store + 1 == keep) return;
        if (store > keep) hi = store - 1;
        else lo = store + 1;
    }
}

/* The exact table of every sub-code: the sum of its blocks' entries of the
   query `z` (blocks past `num_blocks` add nothing; unused entries repeat
   entry 0, so they do not widen the range). */
static void build_tables(const float *z, const Database *db, double *lut) {
    const int K = db->block_size;
    for (int g = 0; g < db->groups; g++) {
        double *out = lut + (int64_t)g * db->table;
        for (int j = 0; j < db->entries; j++) {
            double v = 0.0;
            for (int t = 0; t < db->per_group; t++) {
                int block = g * db->per_group + t;
                if (block < db->num_blocks)
                    v += z[(int64_t)block * K + ((j >> (t * db->nbits)) & (K - 1))];
            }
            out[j] = v;
        }
        for (int j = db->entries; j < db->table; j++) out[j] = out[0];
    }
}

/* The bound threshold that the k-th best exact score so far (the heap's
   root) sets. */
static void raise_bar(Query *q, const Database *db) {
    double t = ceil((q->kept[0].score - q->base) / q->delta) - db->groups - 1;
    q->threshold = t < 0 ? 0 : (t > 65536 ? 65536 : (int32_t)t);
}

static void quantise(Query *q, const Database *db) {
    const int groups = db->groups, table = db->table;
    const int entries = db->bits == 4 ? 16 : table;
    const int qmax = db->qmax;
    double range = 0.0, magnitude = 0.0;
    q->base = 0.0;
    for (int g = 0; g < groups; g++) {
        const double *v = q->lut + (int64_t)g * table;
        double lo = v[0], hi = v[0];
        for (int j = 1; j < entries; j++) {
            if (v[j] < lo) lo = v[j];
            if (v[j] > hi) hi = v[j];
        }
        q->base += lo;
        if (hi - lo > range) range = hi - lo;
        if (fabs(lo) > magnitude) magnitude = fabs(lo);
        if (fabs(hi) > magnitude) magnitude = fabs(hi);
    }
    /* A step far below the scores' rounding error would make the bound
       meaningless; widen it (more items are then scored exactly). */
    double delta = range / qmax * (1.0 + 1e-9);
    double floor_delta = magnitude * groups * 1e-12;
    if (delta < floor_delta) delta = floor_delta;
    if (!(delta > 0.0)) delta = 1.0;
    q->delta = delta;
    for (int g = 0; g < groups; g++) {
        const double *v = q->lut + (int64_t)g * table;
        uint8_t *out = q->qlut + (int64_t)g * table;
        double lo = v[0];
        for (int j = 1; j < entries; j++)
            if (v[j] < lo) lo = v[j];
        for (int j = 0; j < entries; j++) {
            double level = floor((v[j] - lo) / delta);
            out[j] = (uint8_t)(level < 0 ? 0 : (level > qmax ? qmax : level));
        }
        for (int j = entries; j < table; j++) out[j] = 0;
    }
}

/* Two 4-bit entries a byte: byte b of group g's packed table holds entry
   b (low nibble) and entry b + table / 2 (high nibble). */
static void pack_nibbles(Query *q, const Database *db) {
    const int half = db->table / 2;
    for (int g = 0; g < db->groups; g++) {
        const uint8_t *t = q->qlut + (int64_t)g * db->table;
        uint8_t *out = q->packed + (int64_t)g * half;
        for (int b = 0; b < half; b++) out[b] = (uint8_t)(t[b] | (t[b + half] << 4));
    }
}

/* Sub-code g of the item at `lane` of a tile. */
static inline int sub_code(const Database *db, const uint8_t *cols, int g, int64_t lane) {
    if (db->bits == 16) return ((const uint16_t *)cols)[(int64_t)g * db->tile + lane];
    if (db->bits == 4) {
        uint8_t byte = cols[(int64_t)(g >> 1) * db->tile + lane];
        return (g & 1) ? byte >> 4 : byte & 15;
    }
    return cols[(int64_t)g * db->tile + lane];
}

/* The exact score of the item at `lane` of a tile: even and odd sub-codes
   summed apart (half the latency), then added. */
static inline double exact_score(const Query *q, const Database *db, const uint8_t *cols,
                                 int64_t lane) {
    const double *lut = q->lut;
    const int64_t table = db->table, tile = db->tile;
    const int groups = db->groups;
    double sums[2] = {0.0, 0.0};
    if (db->bits == 8) {
        const uint8_t *c = cols + lane;
        for (int g = 0; g < groups; g++) sums[g & 1] += lut[g * table + c[g * tile]];
    } else if (db->bits == 4) { /* table == 16: sub-codes 2c and 2c + 1 in byte c */
        const uint8_t *c = cols + lane;
        for (int g = 0; g + 1 < groups; g += 2) {
            uint8_t byte = c[(g >> 1) * tile];
            sums[0] += lut[g * 16 + (byte & 15)];
            sums[1] += lut[g * 16 + 16 + (byte >> 4)];
        }
        if (groups & 1) sums[0] += lut[(groups - 1) * 16 + (c[(groups >> 1) * tile] & 15)];
    } else {
        for (int g = 0; g < groups; g++)
            sums[g & 1] += lut[g * table + sub_code(db, cols, g, lane)];
    }
    return sums[0] + sums[1];
}

/* Keeps `item` if it is among the k best so far; 0 if it is not. */
static inline int keep(Query *q, const Database *db, Item item) {
    if (q->size < db->k) {
        sift_up(q->kept, q->size++, item);
        if (q->size == db->k) raise_bar(q, db);
    } else if (ranks_after(&q->kept[0], &item)) {
        sift_down(q->kept, q->size, 0, item);
        raise_bar(q, db);
    } else {
        return 0;
    }
    return 1;
}

/* Keeps, all at once, the items of equal score `item.score` at
   `positions[0 .. count)` (increasing) that are among the k best, the heap
   being full; 0 if so few could enter that one at a time is cheaper. One
   at a time, each costs a sift through the heap; a trained model's large
   groups would fill it that way again and again (a third of the time of a
   query over CIFAR-10's 64-bit codes). At once, the heap and the members
   it could take are cut to the k best and made a heap again: linear in
   k. */
static int keep_group(Query *q, const Database *db, Item item, const int64_t *positions,
                      int64_t count) {
    const int64_t k = db->k;
    /* Members enter only in place of items ranking after the first one. */
    int64_t worse = 0;
    for (int64_t i = 0; i < k; i++) worse += ranks_after(&q->kept[i], &item);
    const int64_t members = count;
    if (count > worse) count = worse;
    if (count * db->log2k < k) return 0;
    Item *all = q->scratch;
    memcpy(all, q->kept, sizeof(Item) * k);
    int64_t taken = 0;
    for (int64_t m = 0; m < members && taken < count; m++) {
        if (db->member_bits && !bit_set(db->member_bits, positions[m])) continue;
        all[k + taken].score = item.score;
        all[k + taken].position = positions[m];
        taken++;
    }
    select_best(all, k + taken, k);
    for (int64_t i = k / 2 - 1; i >= 0; i--) sift_down(all, k, i, all[i]);
    memcpy(q->kept, all, sizeof(Item) * k);
    raise_bar(q, db);
    return 1;
}

/* Scores the code at `lane` of a tile (row `row` of the tiles) exactly, and
   keeps its items that are among the k best: in increasing positions, so
   once one is not, none after it is (an equal score, a later position). */
static void offer(Query *q, const Database *db, const uint8_t *cols, int64_t lane,
                  int64_t row) {
    if (db->row_bits && !bit_set(db->row_bits, row)) return;
    int64_t m = db->members ? db->starts[row] : 0;
    const int64_t stop = db->members ? db->starts[row + 1] : 0;
    if (db->member_bits) /* a code none of whose items is kept is not scored */
        while (m < stop && !bit_set(db->member_bits, db->members[m])) m++;
    if (m == stop && db->members) return;
    Item item = {exact_score(q, db, cols, lane), row};
    if (!db->members) {
        keep(q, db, item);
        return;
    }
    int at_once = 0; /* tried once the heap is full (it looks at every item) */
    for (; m < stop; m++) {
        item.position = db->members[m];
        if (db->member_bits && !bit_set(db->member_bits, item.position)) continue;
        if (!at_once && q->size == db->k && (stop - m) * db->log2k >= db->k) {
            at_once = 1;
            if (keep_group(q, db, item, db->members + m, stop - m)) return;
        }
        if (!keep(q, db, item)) break;
    }
}

/* Quantised sums of a tile ------------------------------------------------- */

/* Prefetches the cache line at byte `at` of the next tile. A tile's columns
   are runs of `tile` bytes (1 KB), too short for the hardware's stream
   prefetchers to learn: without this, a database larger than the caches is
   scanned at the memory's latency, not its bandwidth. Past the last tile
   it may touch memory that is not the database, harmlessly: a prefetch
   never faults. */
static inline void prefetch_next(const Database *db, const uint8_t *cols, int64_t at) {
    __builtin_prefetch(cols + db->columns * db->tile * (db->bits == 16 ? 2 : 1) + at);
}

/* Quantised sums of lanes [from, from + count) of a tile of 4- or 16-bit
   sub-codes. */
static void sums_scalar(const Database *db, const uint8_t *cols, const uint8_t *qlut,
                        int64_t from, int64_t count, uint16_t *acc) {
    const int64_t tile = db->tile;
    memset(acc, 0, count * sizeof(uint16_t));
    const int64_t entry = db->bits == 16 ? 2 : 1;
    for (int g = 0; g < db->groups; g++) {
        const uint8_t *t = qlut + (int64_t)g * db->table;
        if (db->bits == 16 || !(g & 1)) { /* a new column: the next tile's */
            const int64_t column = db->bits == 16 ? g : g >> 1;
            for (int64_t at = 0; at < count * entry; at += 64)
                prefetch_next(db, cols, (column * tile + from) * entry + at);
        }
        if (db->bits == 16) {
            const uint16_t *col = (const uint16_t *)cols + (int64_t)g * tile + from;
            for (int64_t i = 0; i < count; i++) acc[i] += t[col[i]];
        } else { /* 4 bits: 8-bit sub-codes take `tile_bytes_scalar` */
            const uint8_t *col = cols + (int64_t)(g >> 1) * tile + from;
            int shift = (g & 1) * 4;
            for (int64_t i = 0; i < count; i++) acc[i] += t[(col[i] >> shift) & 15];
        }
    }
}

/* Offers the items whose 16-bit sum passes: `sums[lane]` is the sum of
   item `base_lane + 2 * lane + odd` (even and odd items apart), and bit
   `lane << shift` of `mask` is set where it passed. */
static inline void offer_hits(Query *q, const Database *db, const uint8_t *cols,
                              uint64_t mask, int shift, const uint16_t *sums,
                              int64_t base_lane, int odd, int64_t valid, int64_t start) {
    while (mask) {
        int lane = __builtin_ctzll(mask) >> shift;
        mask &= mask - 1;
        int64_t at = base_lane + 2 * lane + odd;
        if (at < valid && sums[lane] >= q->threshold) offer(q, db, cols, at, start + at);
    }
}

#if SUBIC_X86
/* Adds 32 byte values to 16-bit sums as faiss's fast scan does: `lo`
   collects every byte at weight 1 and 256 (its even bytes are the even
   items' sums plus 256 times the odd ones'), `hi` the odd bytes alone;
   `finish_avx2` takes them apart, modulo 2^16, where no sum overflows. */
#define SUBIC_AVX2 __attribute__((target("avx2")))
/* Kernels specialised by constant arguments (table size, query count). */
#define ALWAYS_INLINE __attribute__((always_inline))
SUBIC_AVX2 static inline void widen_avx2(__m256i *lo, __m256i *hi, __m256i r) {
    *lo = _mm256_add_epi16(*lo, r);
    *hi = _mm256_add_epi16(*hi, _mm256_srli_epi16(r, 8));
}

/* Sums look-ups in bytes, `db->per_byte` at a time, then widens them. */
typedef struct {
    __m256i lo, hi, bytes;
    int count;
} SumsAvx2;

SUBIC_AVX2 static inline void add_avx2(SumsAvx2 *s, __m256i r, int per_byte) {
    s->bytes = _mm256_add_epi8(s->bytes, r);
    if (++s->count == per_byte) {
        widen_avx2(&s->lo, &s->hi, s->bytes);
        s->bytes = _mm256_setzero_si256();
        s->count = 0;
    }
}

/* Offers the items of a 32-item block whose sum reaches the threshold. */
SUBIC_AVX2 static inline void finish_avx2(Query *q, const Database *db,
                                          const uint8_t *cols, SumsAvx2 *s, int64_t i,
                                          int64_t valid, int64_t start) {
    if (s->count) widen_avx2(&s->lo, &s->hi, s->bytes);
    __m256i even = _mm256_sub_epi16(s->lo, _mm256_slli_epi16(s->hi, 8)), odd = s->hi;
    __m256i t = _mm256_set1_epi16((short)(uint16_t)q->threshold);
    /* Two mask bits per 16-bit lane: the even ones name the lanes. */
    uint32_t me = (uint32_t)_mm256_movemask_epi8(
                      _mm256_cmpeq_epi16(_mm256_max_epu16(even, t), even)) &
                  0x55555555u;
    uint32_t mo = (uint32_t)_mm256_movemask_epi8(
                      _mm256_cmpeq_epi16(_mm256_max_epu16(odd, t), odd)) &
                  0x55555555u;
    if (me | mo) {
        uint16_t sums[2][16];
        _mm256_storeu_si256((__m256i *)sums[0], even);
        _mm256_storeu_si256((__m256i *)sums[1], odd);
        offer_hits(q, db, cols, me, 1, sums[0], i, 0, valid, start);
        offer_hits(q, db, cols, mo, 1, sums[1], i, 1, valid, start);
    }
}

SUBIC_AVX2 static inline __m256i table16_avx2(const uint8_t *t) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)t));
}

/* Adds a byte column of 32 * `blocks` items, at `codes`, to the sums of
   `nq` queries: its low nibbles index the sub-code whose tables start at
   byte `at` of each query's `qlut`, its high ones the next sub-code's
   (`pair`; without, the last of an odd count, whose high nibbles are
   zero). The look-ups are all made before any sum is widened: so ordered,
   GCC keeps two queries' sums in registers. */
SUBIC_AVX2 ALWAYS_INLINE static inline void nibble_column_avx2(Query *qs, int nq, int blocks,
                                                               SumsAvx2 s[2][4],
                                                               const uint8_t *codes,
                                                               int64_t at, int table,
                                                               int pair) {
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256i t0[2], t1[2];
    for (int j = 0; j < nq; j++) {
        t0[j] = table16_avx2(qs[j].qlut + at);
        if (pair) t1[j] = table16_avx2(qs[j].qlut + at + table);
    }
    __m256i r[2][4];
    for (int h = 0; h < blocks; h++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(codes + 32 * h));
        __m256i low = _mm256_and_si256(v, low4);
        __m256i up = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int j = 0; j < nq; j++) {
            r[j][h] = _mm256_shuffle_epi8(t0[j], low);
            if (pair) r[j][h] = _mm256_add_epi8(r[j][h], _mm256_shuffle_epi8(t1[j], up));
        }
    }
    for (int j = 0; j < nq; j++)
        for (int h = 0; h < blocks; h++) widen_avx2(&s[j][h].lo, &s[j][h].hi, r[j][h]);
}

/* 4-bit sub-codes, two per byte: one pshufb per sub-code and query, for
   `nq` consecutive queries (1 or 2) that share every code load, taking its
   nibbles apart once for all of them. 128 / nq items at a time (each table
   load serves 4 / nq code loads), which keeps the sums in the 16
   registers. A byte's two look-ups (at most qmax = 127 each, `choose`) are
   added in bytes and widened at once: no count of look-ups to keep. */
SUBIC_AVX2 ALWAYS_INLINE static inline void nibbles_avx2(Query *qs, int nq, int blocks,
                                                         const Database *db,
                                                         const uint8_t *cols, int64_t valid,
                                                         int64_t start) {
    const int64_t tile = db->tile;
    const int groups = db->groups, table = db->table;
    for (int64_t i = 0; i < valid; i += 32 * blocks) {
        SumsAvx2 s[2][4];
        for (int j = 0; j < nq; j++)
            for (int h = 0; h < blocks; h++)
                s[j][h].lo = s[j][h].hi = s[j][h].bytes = _mm256_setzero_si256(),
                s[j][h].count = 0;
        for (int g = 0; g < groups; g += 2) {
            for (int at = 0; at < 32 * blocks; at += 64)
                prefetch_next(db, cols, (g >> 1) * tile + i + at);
            /* Two branches, so that the loop's look-ups need no test. */
            if (g + 1 < groups)
                nibble_column_avx2(qs, nq, blocks, s, cols + (g >> 1) * tile + i,
                                   (int64_t)g * table, table, 1);
            else
                nibble_column_avx2(qs, nq, blocks, s, cols + (g >> 1) * tile + i,
                                   (int64_t)g * table, table, 0);
        }
        int scanning = 0;
        for (int j = 0; j < nq; j++) {
            if (qs[j].threshold > 65535) continue;
            scanning = 1;
            for (int h = 0; h < blocks; h++)
                finish_avx2(&qs[j], db, cols, &s[j][h], i + 32 * h, valid, start);
        }
        if (!scanning) return;
    }
}

/* `nibble_column_avx2` for four queries and 32 items: the 16 registers
   hold the four queries' sums, not their tables, which are loaded where
   each is used, once. */
SUBIC_AVX2 ALWAYS_INLINE static inline void nibble_column4_avx2(Query *qs, __m256i lo[4],
                                                                __m256i hi[4],
                                                                const uint8_t *codes,
                                                                int64_t at, int table,
                                                                int pair) {
    const __m256i low4 = _mm256_set1_epi8(15);
    __m256i v = _mm256_loadu_si256((const __m256i *)codes);
    __m256i low = _mm256_and_si256(v, low4);
    __m256i up = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    for (int j = 0; j < 4; j++) {
        const uint8_t *t = qs[j].qlut + at;
        __m256i r = _mm256_shuffle_epi8(table16_avx2(t), low);
        if (pair) r = _mm256_add_epi8(r, _mm256_shuffle_epi8(table16_avx2(t + table), up));
        widen_avx2(&lo[j], &hi[j], r);
    }
}

/* Four consecutive queries sharing every code load, 32 items at a time:
   the nibbles taken apart once for four queries rather than two, for a
   second table load per query (load ports are less busy than the
   shuffle and shift ports both need); measured against two queries a
   load in docs/instance.md, "Search speed". It keeps a loop of its own:
   folded into `nibbles_avx2`, four queries a load scanned batches of 64
   and 128 bits more slowly than two (benchmarks/shared_loads.py). */
SUBIC_AVX2 static void tile_nibbles4_avx2(Query *qs, const Database *db, const uint8_t *cols,
                                          int64_t valid, int64_t start) {
    const int64_t tile = db->tile;
    const int groups = db->groups, table = db->table;
    for (int64_t i = 0; i < valid; i += 32) {
        __m256i lo[4], hi[4];
        for (int j = 0; j < 4; j++) lo[j] = hi[j] = _mm256_setzero_si256();
        for (int g = 0; g < groups; g += 2) {
            if (!(i & 63)) prefetch_next(db, cols, (g >> 1) * tile + i);
            /* Two branches, so that the loop's look-ups need no test. */
            if (g + 1 < groups)
                nibble_column4_avx2(qs, lo, hi, cols + (g >> 1) * tile + i, (int64_t)g * table,
                                    table, 1);
            else
                nibble_column4_avx2(qs, lo, hi, cols + (g >> 1) * tile + i, (int64_t)g * table,
                                    table, 0);
        }
        int scanning = 0;
        for (int j = 0; j < 4; j++) {
            if (qs[j].threshold > 65535) continue;
            scanning = 1;
            SumsAvx2 s = {lo[j], hi[j], _mm256_setzero_si256(), 0};
            finish_avx2(&qs[j], db, cols, &s, i, valid, start);
        }
        if (!scanning) return;
    }
}

SUBIC_AVX2 static void tile_nibbles_avx2(Query *q, const Database *db, const uint8_t *cols,
                                         int64_t valid, int64_t start) {
    nibbles_avx2(q, 1, 4, db, cols, valid, start);
}

SUBIC_AVX2 static void tile_nibbles2_avx2(Query *qs, const Database *db, const uint8_t *cols,
                                          int64_t valid, int64_t start) {
    nibbles_avx2(qs, 2, 2, db, cols, valid, start);
}

/* Entry `v` of 16-entry sub-tables `t` (`count` of them, 16 bytes apart)
   for 32 indices `v`: pshufb looks every sub-table up by the low four bits
   (`low`), and a blend tree keeps the one bits 4, 5, ... name. blendv
   selects on a byte's top bit, so bit b is shifted there. */
SUBIC_AVX2 ALWAYS_INLINE static inline __m256i split_lookup_avx2(__m256i v, __m256i low, const uint8_t *t,
                                                   int count) {
    __m256i r[16];
    for (int s = 0; s < count; s++) r[s] = _mm256_shuffle_epi8(table16_avx2(t + 16 * s), low);
    for (int bit = 4, width = count; width > 1; bit++, width /= 2) {
        __m256i select = _mm256_slli_epi16(v, 7 - bit);
        for (int s = 0; s < width / 2; s++)
            r[s] = _mm256_blendv_epi8(r[2 * s], r[2 * s + 1], select);
    }
    return r[0];
}

/* Sub-codes of 5 to 8 bits, one per byte, in tables of `table` = 64, 128
   or 256 entries. With 4-bit entries (qmax <= 15) each byte of the packed
   table holds entry j (low nibble) and entry j + table / 2 (high nibble):
   half the look-ups, and the top index bit picks the nibble. 32 items at
   a time: sharing table loads between two code loads (as the nibble
   kernel does) or code loads between two queries outgrows the 16
   registers. */
SUBIC_AVX2 ALWAYS_INLINE static inline void split_avx2(Query *q, const Database *db,
                                                       const uint8_t *cols, int64_t valid,
                                                       int64_t start, int table) {
    const int64_t tile = db->tile;
    const int per_byte = db->per_byte, nibbles = db->qmax <= 15;
    const int top_bit = table == 64 ? 5 : (table == 128 ? 6 : 7);
    const __m256i low4 = _mm256_set1_epi8(15);
    for (int64_t i = 0; i < valid; i += 32) {
        SumsAvx2 s = {_mm256_setzero_si256(), _mm256_setzero_si256(),
                      _mm256_setzero_si256(), 0};
        if (!(i & 63))
            for (int g = 0; g < db->groups; g++) prefetch_next(db, cols, (int64_t)g * tile + i);
        for (int g = 0; g < db->groups; g++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(cols + (int64_t)g * tile + i));
            /* An index with its top bit set would look up 0. */
            __m256i low = table == 256 ? _mm256_and_si256(v, low4) : v;
            __m256i r;
            if (nibbles) {
                r = split_lookup_avx2(v, low, q->packed + (int64_t)g * (table / 2), table / 32);
                __m256i upper = _mm256_slli_epi16(v, 7 - top_bit);
                r = _mm256_and_si256(_mm256_blendv_epi8(r, _mm256_srli_epi16(r, 4), upper),
                                     low4);
            } else {
                r = split_lookup_avx2(v, low, q->qlut + (int64_t)g * table, table / 16);
            }
            add_avx2(&s, r, per_byte);
        }
        if (q->threshold > 65535) return;
        finish_avx2(q, db, cols, &s, i, valid, start);
    }
}

/* One copy per table size, so that the blend trees are unrolled. */
#define SPLIT_AVX2(table)                                                                 \
    SUBIC_AVX2 static void tile_split##table##_avx2(Query *q, const Database *db,          \
                                                    const uint8_t *cols, int64_t valid,    \
                                                    int64_t start) {                       \
        split_avx2(q, db, cols, valid, start, table);                                     \
    }
SPLIT_AVX2(64)
SPLIT_AVX2(128)
SPLIT_AVX2(256)

#define SUBIC_AVX512 __attribute__((target("avx512f,avx512bw")))
#define SUBIC_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi")))
#define SUBIC_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
SUBIC_VBMI static inline __m512i lookup_vbmi(__m512i v, const uint8_t *t, int table) {
    if (table <= 64) return _mm512_permutexvar_epi8(v, _mm512_loadu_si512((const void *)t));
    __m512i r0 = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)t), v,
                                          _mm512_loadu_si512((const void *)(t + 64)));
    if (table == 128) return r0;
    __m512i r1 = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(t + 128)), v,
                                          _mm512_loadu_si512((const void *)(t + 192)));
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), r0, r1);
}

/* As `SumsAvx2`, 64 bytes at a time (AVX-512BW). */
typedef struct {
    __m512i lo, hi, bytes;
    int count;
} SumsAvx512;

SUBIC_AVX512 static inline SumsAvx512 zero_avx512(void) {
    SumsAvx512 s = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                    0};
    return s;
}

SUBIC_AVX512 static inline void widen_avx512(SumsAvx512 *s) {
    s->lo = _mm512_add_epi16(s->lo, s->bytes);
    s->hi = _mm512_add_epi16(s->hi, _mm512_srli_epi16(s->bytes, 8));
    s->bytes = _mm512_setzero_si512();
    s->count = 0;
}

SUBIC_AVX512 static inline void add_avx512(SumsAvx512 *s, __m512i r, int per_byte) {
    s->bytes = _mm512_add_epi8(s->bytes, r);
    if (++s->count == per_byte) widen_avx512(s);
}

/* Offers the items of 64 whose sums `sums` (even items, odd items) reach
   the threshold. */
SUBIC_AVX512 static inline void finish_avx512(Query *q, const Database *db,
                                              const uint8_t *cols, SumsAvx512 *s, int64_t i,
                                              int64_t valid, int64_t start) {
    if (s->count) widen_avx512(s);
    __m512i sums[2] = {_mm512_sub_epi16(s->lo, _mm512_slli_epi16(s->hi, 8)), s->hi};
    __m512i t = _mm512_set1_epi16((short)(uint16_t)q->threshold);
    for (int h = 0; h < 2; h++) {
        uint32_t mask = _mm512_cmpge_epu16_mask(sums[h], t);
        if (mask) {
            uint16_t lanes[32];
            _mm512_storeu_si512((void *)lanes, sums[h]);
            offer_hits(q, db, cols, mask, 0, lanes, i, h, valid, start);
        }
    }
}

/* `nibble_column_avx2` on 512 bits, for 128 items: a zero table for an odd
   last sub-code (one test per column costs nothing measurable here). */
SUBIC_AVX512 ALWAYS_INLINE static inline void nibble_column_avx512(Query *qs, int nq,
                                                                   SumsAvx512 s[4][2],
                                                                   const uint8_t *codes,
                                                                   int64_t at, int table,
                                                                   int pair) {
    const __m512i low4 = _mm512_set1_epi8(15);
    __m512i t0[4], t1[4];
    for (int j = 0; j < nq; j++) {
        const uint8_t *t = qs[j].qlut + at;
        t0[j] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)t));
        t1[j] = pair ? _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(t + table)))
                     : _mm512_setzero_si512();
    }
    for (int h = 0; h < 2; h++) {
        __m512i v = _mm512_loadu_si512((const void *)(codes + 64 * h));
        __m512i low = _mm512_and_si512(v, low4);
        __m512i up = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int j = 0; j < nq; j++)
            s[j][h].bytes = _mm512_add_epi8(_mm512_shuffle_epi8(t0[j], low),
                                            _mm512_shuffle_epi8(t1[j], up));
    }
    for (int j = 0; j < nq; j++)
        for (int h = 0; h < 2; h++) widen_avx512(&s[j][h]);
}

/* 4-bit sub-codes, two per byte, 128 items at a time: vpshufb on 512 bits
   (AVX-512BW), for `nq` consecutive queries (1 or 4) sharing every code
   load as in `nibbles_avx2` (the 32 registers hold four queries' sums).
   The nibble layout has 16-entry tables, 8 times fewer entries to build
   per query than 8-bit sub-codes of two blocks: it is the AVX-512BW
   kernel's layout for K = 2, 4 and 16, and the VBMI kernel's in small
   databases and for long codes (`native.Layout.for_kernel`). */
SUBIC_AVX512 ALWAYS_INLINE static inline void nibbles_avx512(Query *qs, int nq,
                                                             const Database *db,
                                                             const uint8_t *cols,
                                                             int64_t valid, int64_t start) {
    const int64_t tile = db->tile;
    const int groups = db->groups, table = db->table;
    for (int64_t i = 0; i < valid; i += 128) {
        SumsAvx512 s[4][2];
        for (int j = 0; j < nq; j++) s[j][0] = s[j][1] = zero_avx512();
        for (int g = 0; g < groups; g += 2) {
            nibble_column_avx512(qs, nq, s, cols + (g >> 1) * tile + i, (int64_t)g * table,
                                 table, g + 1 < groups);
            prefetch_next(db, cols, (g >> 1) * tile + i);
            prefetch_next(db, cols, (g >> 1) * tile + i + 64);
        }
        int scanning = 0;
        for (int j = 0; j < nq; j++) {
            if (qs[j].threshold > 65535) continue;
            scanning = 1;
            for (int h = 0; h < 2; h++)
                finish_avx512(&qs[j], db, cols, &s[j][h], i + 64 * h, valid, start);
        }
        if (!scanning) return;
    }
}

SUBIC_AVX512 static void tile_nibbles_avx512(Query *q, const Database *db,
                                             const uint8_t *cols, int64_t valid,
                                             int64_t start) {
    nibbles_avx512(q, 1, db, cols, valid, start);
}

SUBIC_AVX512 static void tile_nibbles4_avx512(Query *qs, const Database *db,
                                              const uint8_t *cols, int64_t valid,
                                              int64_t start) {
    nibbles_avx512(qs, 4, db, cols, valid, start);
}

/* `split_lookup_avx2` on 512 bits: the blend tree takes its choices from
   mask registers (vptestmb reads the bit where it is: no shift). */
SUBIC_AVX512 ALWAYS_INLINE static inline __m512i split_lookup_avx512(__m512i v, __m512i low,
                                                                     const uint8_t *t,
                                                                     int count) {
    __m512i r[16];
    for (int s = 0; s < count; s++)
        r[s] = _mm512_shuffle_epi8(
            _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(t + 16 * s))), low);
    for (int bit = 4, width = count; width > 1; bit++, width /= 2) {
        __mmask64 select = _mm512_test_epi8_mask(v, _mm512_set1_epi8((char)(1 << bit)));
        for (int s = 0; s < width / 2; s++)
            r[s] = _mm512_mask_blend_epi8(select, r[2 * s], r[2 * s + 1]);
    }
    return r[0];
}

/* `split_avx2` on 512 bits, 64 items at a time, for CPUs with AVX-512BW
   but not VBMI (Skylake-SP, Cascade Lake), which have no `vpermb`. */
SUBIC_AVX512 ALWAYS_INLINE static inline void split_avx512(Query *q, const Database *db,
                                                           const uint8_t *cols,
                                                           int64_t valid, int64_t start,
                                                           int table) {
    const int64_t tile = db->tile;
    const int per_byte = db->per_byte, nibbles = db->qmax <= 15;
    const __m512i low4 = _mm512_set1_epi8(15);
    const __m512i upper = _mm512_set1_epi8((char)(table / 2)); /* the nibble's bit */
    for (int64_t i = 0; i < valid; i += 64) {
        SumsAvx512 s = zero_avx512();
        for (int g = 0; g < db->groups; g++) {
            prefetch_next(db, cols, (int64_t)g * tile + i);
            __m512i v = _mm512_loadu_si512((const void *)(cols + (int64_t)g * tile + i));
            /* An index with its top bit set would look up 0. */
            __m512i low = table == 256 ? _mm512_and_si512(v, low4) : v, r;
            if (nibbles) {
                r = split_lookup_avx512(v, low, q->packed + (int64_t)g * (table / 2),
                                        table / 32);
                r = _mm512_and_si512(_mm512_mask_blend_epi8(_mm512_test_epi8_mask(v, upper),
                                                            r, _mm512_srli_epi16(r, 4)),
                                     low4);
            } else {
                r = split_lookup_avx512(v, low, q->qlut + (int64_t)g * table, table / 16);
            }
            add_avx512(&s, r, per_byte);
        }
        if (q->threshold > 65535) return;
        finish_avx512(q, db, cols, &s, i, valid, start);
    }
}

#define SPLIT_AVX512(table)                                                              \
    SUBIC_AVX512 static void tile_split##table##_avx512(Query *q, const Database *db,     \
                                                        const uint8_t *cols,              \
                                                        int64_t valid, int64_t start) {   \
        split_avx512(q, db, cols, valid, start, table);                                  \
    }
SPLIT_AVX512(64)
SPLIT_AVX512(128)
SPLIT_AVX512(256)

SUBIC_VBMI static void tile_bytes_vbmi(Query *q, const Database *db, const uint8_t *cols,
                                       int64_t valid, int64_t start) {
    const int64_t tile = db->tile;
    const int table = db->table, per_byte = db->per_byte;
    for (int64_t i = 0; i < valid; i += 128) {
        SumsAvx512 s[2] = {zero_avx512(), zero_avx512()};
        for (int g = 0; g < db->groups; g++) {
            const uint8_t *t = q->qlut + (int64_t)g * table;
            const uint8_t *c = cols + (int64_t)g * tile + i;
            prefetch_next(db, cols, (int64_t)g * tile + i);
            prefetch_next(db, cols, (int64_t)g * tile + i + 64);
            for (int h = 0; h < 2; h++)
                add_avx512(&s[h],
                           lookup_vbmi(_mm512_loadu_si512((const void *)(c + 64 * h)), t, table),
                           per_byte);
        }
        if (q->threshold > 65535) return;
        for (int h = 0; h < 2; h++)
            if (s[h].count) widen_avx512(&s[h]);
        __m512i sums[4] = {_mm512_sub_epi16(s[0].lo, _mm512_slli_epi16(s[0].hi, 8)), s[0].hi,
                           _mm512_sub_epi16(s[1].lo, _mm512_slli_epi16(s[1].hi, 8)), s[1].hi};
        __m512i t = _mm512_set1_epi16((short)(uint16_t)q->threshold);
        uint32_t m[4];
        for (int h = 0; h < 4; h++) m[h] = _mm512_cmpge_epu16_mask(sums[h], t);
        if (m[0] | m[1] | m[2] | m[3]) {
            for (int h = 0; h < 4; h++) {
                uint16_t lanes[32];
                _mm512_storeu_si512((void *)lanes, sums[h]);
                offer_hits(q, db, cols, m[h], 0, lanes, i + 64 * (h >> 1), h & 1, valid,
                           start);
            }
        }
    }
}
#endif

#if SUBIC_NEON
/* Sums look-ups in bytes, `db->per_byte` at a time, then widens them:
   `lo` holds items 0..7, `hi` items 8..15. */
typedef struct {
    uint16x8_t lo, hi;
    uint8x16_t bytes;
    int count;
} SumsNeon;

static inline void widen_neon(SumsNeon *s) {
    s->lo = vaddw_u8(s->lo, vget_low_u8(s->bytes));
    s->hi = vaddw_high_u8(s->hi, s->bytes);
    s->bytes = vdupq_n_u8(0);
    s->count = 0;
}

static inline void add_neon(SumsNeon *s, uint8x16_t r, int per_byte) {
    s->bytes = vaddq_u8(s->bytes, r);
    if (++s->count == per_byte) widen_neon(s);
}

/* Offers the items of a 16-item block whose sum reaches the threshold. */
static inline void finish_neon(Query *q, const Database *db, const uint8_t *cols,
                               SumsNeon *s, int64_t i, int64_t valid, int64_t start) {
    if (s->count) widen_neon(s);
    uint16x8_t t = vdupq_n_u16((uint16_t)q->threshold);
    if (vmaxvq_u16(vorrq_u16(vcgeq_u16(s->lo, t), vcgeq_u16(s->hi, t))) == 0) return;
    uint16_t sums[16];
    vst1q_u16(sums, s->lo);
    vst1q_u16(sums + 8, s->hi);
    for (int lane = 0; lane < 16; lane++)
        if (i + lane < valid && sums[lane] >= q->threshold)
            offer(q, db, cols, i + lane, start + i + lane);
}

static inline SumsNeon zero_neon(void) {
    SumsNeon s = {vdupq_n_u16(0), vdupq_n_u16(0), vdupq_n_u8(0), 0};
    return s;
}

/* 4-bit sub-codes, two per byte: one tbl per sub-code. */
static void tile_nibbles_neon(Query *q, const Database *db, const uint8_t *cols,
                              int64_t valid, int64_t start) {
    const int64_t tile = db->tile;
    const int groups = db->groups, table = db->table, per_byte = db->per_byte;
    const uint8x16_t low4 = vdupq_n_u8(15);
    for (int64_t i = 0; i < valid; i += 16) {
        SumsNeon s = zero_neon();
        if (!(i & 63))
            for (int g = 0; g < groups; g += 2) prefetch_next(db, cols, (g >> 1) * tile + i);
        for (int g = 0; g < groups; g += 2) {
            uint8x16_t v = vld1q_u8(cols + (g >> 1) * tile + i);
            const uint8_t *t = q->qlut + (int64_t)g * table;
            add_neon(&s, vqtbl1q_u8(vld1q_u8(t), vandq_u8(v, low4)), per_byte);
            if (g + 1 < groups)
                add_neon(&s, vqtbl1q_u8(vld1q_u8(t + table), vshrq_n_u8(v, 4)), per_byte);
        }
        if (q->threshold > 65535) return;
        finish_neon(q, db, cols, &s, i, valid, start);
    }
}

/* Sub-codes of 5 to 8 bits, one per byte: tbl on four 16-byte registers
   covers 64 entries, and gives 0 for an index beyond them, so the 64-entry
   quarters of a larger table are looked up at v, v - 64, ... and or-ed. */
static void tile_bytes_neon(Query *q, const Database *db, const uint8_t *cols,
                            int64_t valid, int64_t start) {
    const int64_t tile = db->tile;
    const int table = db->table, per_byte = db->per_byte;
    for (int64_t i = 0; i < valid; i += 16) {
        SumsNeon s = zero_neon();
        if (!(i & 63))
            for (int g = 0; g < db->groups; g++) prefetch_next(db, cols, (int64_t)g * tile + i);
        for (int g = 0; g < db->groups; g++) {
            const uint8_t *t = q->qlut + (int64_t)g * table;
            uint8x16_t v = vld1q_u8(cols + (int64_t)g * tile + i);
            uint8x16_t r = vqtbl4q_u8(vld1q_u8_x4(t), v);
            for (int quarter = 1; quarter < table / 64; quarter++) {
                uint8x16_t at = vsubq_u8(v, vdupq_n_u8((uint8_t)(64 * quarter)));
                r = vorrq_u8(r, vqtbl4q_u8(vld1q_u8_x4(t + 64 * quarter), at));
            }
            add_neon(&s, r, per_byte);
        }
        if (q->threshold > 65535) return;
        finish_neon(q, db, cols, &s, i, valid, start);
    }
}
#endif

/* Portable, one sub-code per byte: each item's look-ups are summed in a
   register, 8 items at a time, rather than added column by column into an
   array of sums, which stores and reloads every sum once per sub-code. */
static void tile_bytes_scalar(Query *q, const Database *db, const uint8_t *cols,
                              int64_t valid, int64_t start) {
    const int groups = db->groups, table = db->table;
    const int64_t tile = db->tile;
    for (int64_t i = 0; i < valid; i += 8) {
        uint32_t sums[8] = {0};
        if (!(i & 63))
            for (int g = 0; g < groups; g++) prefetch_next(db, cols, g * tile + i);
        for (int g = 0; g < groups; g++) {
            const uint8_t *c = cols + g * tile + i, *t = q->qlut + (int64_t)g * table;
            for (int j = 0; j < 8; j++) sums[j] += t[c[j]];
        }
        if (q->threshold > 65535) return;
        int any = 0;
        for (int j = 0; j < 8; j++) any |= sums[j] >= (uint32_t)q->threshold;
        if (!any) continue;
        for (int j = 0; j < 8 && i + j < valid; j++)
            if (sums[j] >= (uint32_t)q->threshold) offer(q, db, cols, i + j, start + i + j);
    }
}

/* Portable, 4- and 16-bit sub-codes: sums of a column at a time. */
static void tile_scalar(Query *q, const Database *db, const uint8_t *cols,
                        int64_t valid, int64_t start) {
    uint16_t acc[1024];
    for (int64_t i0 = 0; i0 < valid; i0 += 1024) {
        int64_t stop = valid - i0 < 1024 ? valid - i0 : 1024;
        sums_scalar(db, cols, q->qlut, i0, stop, acc);
        for (int64_t i = 0; i < stop; i++)
            if (acc[i] >= q->threshold) offer(q, db, cols, i0 + i, start + i0 + i);
    }
}


/* Whether this CPU runs `kernel`. */
static int cpu_runs(int kernel) {
    if (kernel == KERNEL_PORTABLE) return 1;
#if SUBIC_X86
    __builtin_cpu_init();
    if (kernel == KERNEL_AVX2) return __builtin_cpu_supports("avx2");
    if (kernel == KERNEL_VBMI)
        return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
    if (kernel == KERNEL_AVX512BW) return __builtin_cpu_supports("avx512bw");
#endif
#if SUBIC_NEON
    if (kernel == KERNEL_NEON) return 1;
#endif
    return 0;
}

/* The tile function of `kernel` for `db`'s sub-codes (16-bit ones, and any
   the kernel has no SIMD path for, are bounded in portable C), and its
   largest quantised entry `*qmax`; `*together`, where the kernel has one,
   scans `*shared` consecutive queries in one pass, sharing their code
   loads (NULL: each query alone), and `*pair` two, where fewer than
   `*shared` are left (NULL: none).

   Items whose bound reaches the bar are scored exactly, and the bound's
   slack is G steps of range / qmax, so a smaller qmax lets more items
   through to exact scoring. It buys speed elsewhere: SIMD kernels sum
   255 / qmax look-ups in bytes before widening them, and the AVX2 split
   tables of 128 or 256 entries hold two 4-bit entries a byte for
   qmax = 15. Each kernel takes the value that scanned fastest in
   `benchmarks/search_speed.py` (its results name the CPU): VBMI keeps 255
   for 8-bit sub-codes, its look-ups being cheap and refining not.
   Sums are 16-bit: G * qmax must stay below 2^16, and the x86 nibble
   kernels add a byte's two look-ups in a byte: qmax at most 127 there. */
static TileKernel choose(const Database *db, int kernel, int *qmax, TileKernel *together,
                         int *shared, TileKernel *pair) {
    /* Tiles hold a multiple of 64 items (the binding checks). */
    TileKernel chosen = db->bits == 8 ? tile_bytes_scalar : tile_scalar;
    int wanted = 255;
    *together = *pair = NULL, *shared = 1;
#if SUBIC_X86
    if (kernel == KERNEL_AVX2 && db->tile % 64 == 0) {
        if (db->bits == 4 && db->tile % 128 == 0)
            chosen = tile_nibbles_avx2, *together = tile_nibbles4_avx2, *shared = 4,
            *pair = tile_nibbles2_avx2, wanted = 127;
        if (db->bits == 8 && db->table == 64) chosen = tile_split64_avx2, wanted = 63;
        if (db->bits == 8 && db->table == 128) chosen = tile_split128_avx2, wanted = 15;
        if (db->bits == 8 && db->table == 256) chosen = tile_split256_avx2, wanted = 15;
        /* Many sub-codes widen the slack: byte entries then. */
        if (db->bits == 8 && db->groups > 16) wanted = 63;
    }
    if (kernel == KERNEL_AVX512BW && db->tile % 64 == 0) {
        if (db->bits == 4 && db->tile % 128 == 0)
            chosen = tile_nibbles_avx512, *together = tile_nibbles4_avx512, *shared = 4,
            wanted = 127;
        if (db->bits == 8 && db->table == 64) chosen = tile_split64_avx512, wanted = 127;
        if (db->bits == 8 && db->table == 128) chosen = tile_split128_avx512, wanted = 15;
        if (db->bits == 8 && db->table == 256) chosen = tile_split256_avx512, wanted = 15;
        if (db->bits == 8 && db->groups > 16) wanted = 63;
    }
    if (kernel == KERNEL_VBMI && db->bits == 8 && db->tile % 128 == 0)
        chosen = tile_bytes_vbmi;
    if (kernel == KERNEL_VBMI && db->bits == 4 && db->tile % 128 == 0)
        chosen = tile_nibbles_avx512, *together = tile_nibbles4_avx512, *shared = 4,
        wanted = 127;
#endif
#if SUBIC_NEON
    if (kernel == KERNEL_NEON && db->tile % 16 == 0) {
        if (db->bits == 4) chosen = tile_nibbles_neon, wanted = 63;
        if (db->bits == 8) chosen = tile_bytes_neon, wanted = 63;
    }
#endif
    (void)kernel;
    int limit = 65535 / db->groups;
    *qmax = limit < wanted ? limit : wanted;
    return chosen;
}

/* Whether the `count` bytes at `bits` are all zero. */
static int none_set(const uint8_t *bits, int64_t count) {
    uint8_t any = 0;
    for (int64_t i = 0; i < count; i++) any |= bits[i];
    return !any;
}

/* Scans queries [0, nq) and writes their top k, best first. At most
   `per_load` queries share a load of codes (0: as many as the kernel
   shares; 1 or 2 to measure what sharing gains). */
static int run(const Database *database, const float *z, int64_t nq, int kernel_id,
               int per_load, double *scores_out, int64_t *positions_out) {
    Database layout = *database;
    const Database *db = &layout;
    TileKernel together, pair; /* `shared` (`pair`: two) consecutive queries in one pass */
    int shared;
    const TileKernel kernel = choose(db, kernel_id, &layout.qmax, &together, &shared, &pair);
    if (per_load && per_load < shared) together = NULL;
    if (per_load == 1) pair = NULL;
    layout.per_byte = 255 / layout.qmax;
    const int64_t lut_size = (int64_t)db->groups * db->table;
    const int64_t num_tiles = (db->n + db->tile - 1) / db->tile;
    const int64_t entry_bytes = db->bits == 16 ? 2 : 1; /* per sub-code column entry */
    Query queries[QUERY_GROUP];
    uint8_t *qluts = aligned_alloc(64, ((QUERY_GROUP * lut_size + 63) / 64) * 64 + 64);
    uint8_t *packed = malloc(QUERY_GROUP * lut_size / 2 + 1);
    Item *kept = malloc(sizeof(Item) * (db->k > LARGE_K ? 1 : QUERY_GROUP) * (size_t)db->k);
    double *luts = malloc(sizeof(double) * QUERY_GROUP * lut_size);
    Item *scratch = db->members ? malloc(sizeof(Item) * 2 * (size_t)db->k) : NULL;
    const int64_t width = (int64_t)db->num_blocks * db->block_size;
    if (!qluts || !packed || !kept || !luts || (db->members && !scratch)) {
        free(qluts);
        free(packed);
        free(kept);
        free(luts);
        free(scratch);
        return -1;
    }
    layout.log2k = 1;
    while (layout.log2k < 62 && ((int64_t)1 << layout.log2k) < db->k) layout.log2k++;
    const int group = db->k > LARGE_K ? 1 : QUERY_GROUP;
    for (int64_t q0 = 0; q0 < nq; q0 += group) {
        int count = (int)(nq - q0 < group ? nq - q0 : group);
        for (int j = 0; j < count; j++) {
            Query *q = &queries[j];
            q->lut = luts + j * lut_size;
            build_tables(z + (q0 + j) * width, db, q->lut);
            q->qlut = qluts + j * lut_size;
            q->kept = kept + j * db->k;
            q->scratch = scratch;
            q->size = 0;
            q->threshold = 0;
            quantise(q, db);
            q->packed = packed + j * lut_size / 2;
            if (db->bits == 8 && db->qmax <= 15) pack_nibbles(q, db);
        }
        for (int64_t t = 0; t < num_tiles; t++) {
            const uint8_t *cols = db->tiles + t * db->columns * db->tile * entry_bytes;
            int64_t start = t * db->tile;
            int64_t valid = db->n - start < db->tile ? db->n - start : db->tile;
            if (db->row_bits && none_set(db->row_bits + start / 8, (valid + 7) / 8)) continue;
            for (int j = 0; j < count;) {
                if (together && j + shared <= count) {
                    together(&queries[j], db, cols, valid, start);
                    j += shared;
                    continue;
                }
                if (pair && j + 2 <= count) {
                    pair(&queries[j], db, cols, valid, start);
                    j += 2;
                    continue;
                }
                if (queries[j].threshold <= 65535) kernel(&queries[j], db, cols, valid, start);
                j++;
            }
        }
        for (int j = 0; j < count; j++) {
            Query *q = &queries[j];
            sort_heap(q->kept, q->size);
            for (int64_t r = 0; r < db->k; r++) {
                int64_t at = (q0 + j) * db->k + r;
                if (r < q->size) {
                    scores_out[at] = q->kept[r].score;
                    positions_out[at] = q->kept[r].position;
                } else {
                    scores_out[at] = -INFINITY;
                    positions_out[at] = -1;
                }
            }
        }
    }
    free(qluts);
    free(packed);
    free(kept);
    free(luts);
    free(scratch);
    return 0;
}

/* Python binding ----------------------------------------------------------- */

#ifndef SUBIC_NO_PYTHON

/* `*out = a * b` for a, b >= 0; 0 if the product overflows a long long. */
static int product(long long a, long long b, long long *out) {
    if (a < 0 || b < 0 || (a > 0 && b > LLONG_MAX / a)) return 0;
    *out = a * b;
    return 1;
}

/* The byte sizes the buffers must have, each checked against overflow, so
   that no size wraps around and passes the checks below. */
static int expected_sizes(long long n, long long tile, long long columns, int bits,
                          long long nq, int num_blocks, int block_size, long long k,
                          long long *tiles, long long *queries, long long *outputs) {
    long long count, row;
    if (n > LLONG_MAX - tile) return 0;
    return product((n + tile - 1) / tile, tile, &count) &&
           product(count, columns, &count) && product(count, bits == 16 ? 2 : 1, tiles) &&
           product(nq, num_blocks, &row) && product(row, block_size, &row) &&
           product(row, (long long)sizeof(float), queries) && product(nq, k, &row) &&
           product(row, 8, outputs);
}

/* NULL if `starts` and `members` group n rows' items as `Database` says
   (int64 buffers, starts from 0 to every member, never decreasing), so
   that no index falls outside them; else what is wrong. */
static const char *check_groups(const Py_buffer *starts, const Py_buffer *members,
                                long long n) {
    if (starts->len % 8 || members->len % 8 || starts->len / 8 != n + 1)
        return "starts must hold n + 1 int64 values, members int64 values";
    const int64_t *s = starts->buf;
    if (s[0] != 0 || s[n] != members->len / 8) return "starts must run from 0 to every member";
    for (long long r = 0; r < n; r++)
        if (s[r + 1] < s[r]) return "starts must not decrease";
    return NULL;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer tiles, queries, scores, positions, starts, members, row_bits, member_bits;
    Database db;
    long long n, tile, columns, k, nq;
    int bits, table, groups, num_blocks, block_size, per_group, kernel, per_load;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLLiiiiiiLy*Lw*w*iiy*y*y*y*", &tiles, &n, &tile, &columns,
                          &bits, &table, &groups, &num_blocks, &block_size, &per_group, &k,
                          &queries, &nq, &scores, &positions, &kernel, &per_load, &starts,
                          &members, &row_bits, &member_bits))
        return NULL;
    int nbits = 0;
    while (nbits < 16 && (1 << nbits) < block_size) nbits++;
    const char *problem = NULL;
    if (kernel < 0 || kernel >= KERNEL_COUNT || !cpu_runs(kernel))
        problem = "this CPU cannot run that kernel";
    else if (per_load < 0)
        problem = "queries per load out of range";
    else if (n < 0 || tile < 64 || tile % 64 || columns < 1 || groups < 1 || k < 1 || nq < 0)
        problem = "sizes out of range";
    else if (groups > 4096) /* 16-bit sums of at least 16 levels a sub-code */
        problem = "more than 4096 sub-codes";
    else if (block_size < 2 || (1 << nbits) != block_size || per_group < 1 ||
             per_group * nbits > 16 || num_blocks < 1 ||
             groups != (num_blocks + per_group - 1) / per_group ||
             (1 << (per_group * nbits)) > table)
        problem = "blocks and sub-codes do not match";
    else if (!(bits == 4 || bits == 8 || bits == 16) || (bits == 4 && table != 16) ||
             (bits == 8 && !(table == 64 || table == 128 || table == 256)) ||
             (bits == 16 && (table < 2 || table > 65536)))
        problem = "bits and table size do not match";
    else if ((bits == 4 && columns != (groups + 1) / 2) || (bits != 4 && columns != groups))
        problem = "columns and groups do not match";
    long long tiles_size = 0, queries_size = 0, outputs_size = 0;
    if (!problem && !expected_sizes(n, tile, columns, bits, nq, num_blocks, block_size, k,
                                    &tiles_size, &queries_size, &outputs_size))
        problem = "sizes overflow";
    if (!problem && tiles.len != tiles_size) problem = "tiles buffer has the wrong size";
    if (!problem && queries.len != queries_size)
        problem = "queries buffer has the wrong size";
    if (!problem && (scores.len != outputs_size || positions.len != outputs_size))
        problem = "output buffers have the wrong size";
    if (!problem && (starts.len || members.len))
        problem = check_groups(&starts, &members, n);
    if (!problem && row_bits.len && row_bits.len != (n + 7) / 8)
        problem = "row_bits must hold one bit per row";
    if (!problem && member_bits.len && !members.len)
        problem = "member_bits need members";
    if (!problem && member_bits.len) {
        /* One bit per position up to the largest member. */
        const int64_t *m = members.buf;
        int64_t largest = -1;
        for (Py_ssize_t i = 0; i < members.len / 8; i++) largest = m[i] > largest ? m[i] : largest;
        if (largest < 0 || member_bits.len < largest / 8 + 1)
            problem = "member_bits must hold one bit per member position";
    }
    int status = 0;
    if (!problem && nq > 0) {
        db.tiles = tiles.buf;
        db.n = n;
        db.tile = tile;
        db.columns = columns;
        db.bits = bits;
        db.table = table;
        db.groups = groups;
        db.num_blocks = num_blocks;
        db.block_size = block_size;
        db.nbits = nbits;
        db.per_group = per_group;
        db.entries = 1 << (per_group * nbits);
        db.k = k;
        db.starts = starts.len ? starts.buf : NULL;
        db.members = starts.len ? members.buf : NULL;
        db.row_bits = row_bits.len ? row_bits.buf : NULL;
        db.member_bits = member_bits.len ? member_bits.buf : NULL;
        Py_BEGIN_ALLOW_THREADS status =
            run(&db, queries.buf, nq, kernel, per_load, scores.buf, positions.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&tiles);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&members);
    PyBuffer_Release(&row_bits);
    PyBuffer_Release(&member_bits);
    PyBuffer_Release(&queries);
    PyBuffer_Release(&scores);
    PyBuffer_Release(&positions);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    if (status) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* Items of equal codes, in time linear in the items: a hash table of the
 * distinct rows (open addressing, grown by doubling), then a counting sort
 * of the items by distinct row. `first[r]` is the first item of distinct
 * row r (rows numbered in order of their first item), and its items are
 * `members[starts[r] .. starts[r+1]]`, increasing. Returns the number of
 * distinct rows, -1 if it exceeds `limit` (grouping would not pay), or -2
 * without memory. */
static uint64_t row_hash(const uint8_t *row, long long width) {
    uint64_t h = 0x243F6A8885A308D3ULL;
    for (long long at = 0; at < width; at += 8) {
        uint64_t chunk = 0;
        memcpy(&chunk, row + at, (size_t)(width - at < 8 ? width - at : 8));
        h = (h ^ chunk) * 0x9E3779B97F4A7C15ULL;
        h ^= h >> 29;
    }
    return h;
}

typedef struct {
    uint64_t hash; /* for rows of up to 8 bytes, the row itself, mixed */
    int64_t group; /* -1: an empty slot */
} Slot;

static long long group_rows(const uint8_t *rows, long long n, long long width,
                            long long limit, int64_t *first, int64_t *starts,
                            int64_t *members) {
    long long capacity = 1024, distinct = 0, result = -2;
    /* A slot holds its row's hash and group: one cache line read a probe. */
    Slot *table = malloc((size_t)capacity * sizeof(Slot));
    int32_t *group_of = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
    if (!table || !group_of) goto done;
    for (long long s = 0; s < capacity; s++) table[s].group = -1;
    const int short_rows = width <= 8; /* a row is its key: no byte compare */
    for (long long i = 0; i < n; i++) {
        const uint8_t *row = rows + i * width;
        uint64_t h;
        if (short_rows) {
            uint64_t key = 0;
            memcpy(&key, row, (size_t)width);
            h = key * 0x9E3779B97F4A7C15ULL; /* odd: one hash per key */
        } else {
            h = row_hash(row, width);
        }
        long long slot = (long long)((h ^ (h >> 31)) & (uint64_t)(capacity - 1));
        int64_t found = -1;
        while (table[slot].group >= 0) {
            if (table[slot].hash == h &&
                (short_rows ||
                 !memcmp(rows + first[table[slot].group] * width, row, (size_t)width))) {
                found = table[slot].group;
                break;
            }
            slot = (slot + 1) & (capacity - 1);
        }
        if (found < 0) {
            if (distinct >= limit) {
                result = -1;
                goto done;
            }
            found = distinct++;
            first[found] = i;
            table[slot].hash = h;
            table[slot].group = found;
            if (2 * distinct > capacity) { /* grow: every slot again */
                long long grown = 2 * capacity;
                Slot *bigger = malloc((size_t)grown * sizeof(Slot));
                if (!bigger) goto done;
                for (long long s = 0; s < grown; s++) bigger[s].group = -1;
                for (long long s = 0; s < capacity; s++) {
                    if (table[s].group < 0) continue;
                    uint64_t hg = table[s].hash;
                    long long t = (long long)((hg ^ (hg >> 31)) & (uint64_t)(grown - 1));
                    while (bigger[t].group >= 0) t = (t + 1) & (grown - 1);
                    bigger[t] = table[s];
                }
                free(table);
                table = bigger;
                capacity = grown;
            }
        }
        group_of[i] = (int32_t)found;
    }
    /* Counting sort: each distinct row's items, in increasing positions. */
    memset(starts, 0, (size_t)(distinct + 1) * sizeof(int64_t));
    for (long long i = 0; i < n; i++) starts[group_of[i] + 1]++;
    for (long long g = 0; g < distinct; g++) starts[g + 1] += starts[g];
    for (long long i = 0; i < n; i++) members[starts[group_of[i]]++] = i;
    for (long long g = distinct; g > 0; g--) starts[g] = starts[g - 1];
    starts[0] = 0;
    result = distinct;
done:
    free(table);
    free(group_of);
    return result;
}

/* What scores rows of packed codes for one query: `table`, one float32
 * entry a block value, and for codes of 4- or 8-bit blocks `bytes`, one
 * double entry a byte value (`width * 256`: entry `b * 256 + v` is the sum
 * of the blocks byte b holds when its value is v, one block of 8 bits or
 * two of 4, the second absent past the last block, where padding bits are
 * zero), so that a row costs one look-up per byte. */
typedef struct {
    const float *table;
    double *bytes; /* NULL: a look-up per block */
    long long width;
    int bits, num_blocks;
} RowScorer;

#define SCORE_AHEAD 16       /* rows whose codes are fetched ahead */
#define BYTE_TABLES_FROM 128 /* rows from which the byte tables pay for themselves */

static RowScorer row_scorer(const float *table, int bits, int num_blocks, long long width,
                            long long rows) {
    RowScorer scorer = {table, NULL, width, bits, num_blocks};
    if ((bits != 4 && bits != 8) || rows < BYTE_TABLES_FROM) return scorer;
    double *out = malloc((size_t)width * 256 * sizeof(double));
    if (!out) return scorer; /* a look-up per block instead */
    for (long long b = 0; b < width; b++)
        for (int v = 0; v < 256; v++) {
            double sum;
            if (bits == 8)
                sum = table[(b << 8) + v];
            else {
                sum = table[(2 * b << 4) + (v & 15)];
                if (2 * b + 1 < num_blocks) sum += table[((2 * b + 1) << 4) + (v >> 4)];
            }
            out[(b << 8) + v] = sum;
        }
    scorer.bytes = out;
    return scorer;
}

/* sum_m table[m * 2^bits + c_m] of a row, its code's blocks read least
 * significant bit first (faiss's bit-string layout), summed in double; by
 * bytes in four sums that do not wait on one another where it can. */
static inline double score_row(const RowScorer *s, const uint8_t *row) {
    if (s->bytes) {
        const double *bytes = s->bytes;
        double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
        long long b = 0;
        for (; b + 4 <= s->width; b += 4) {
            s0 += bytes[(b << 8) + row[b]];
            s1 += bytes[((b + 1) << 8) + row[b + 1]];
            s2 += bytes[((b + 2) << 8) + row[b + 2]];
            s3 += bytes[((b + 3) << 8) + row[b + 3]];
        }
        for (; b < s->width; b++) s0 += bytes[(b << 8) + row[b]];
        return (s0 + s1) + (s2 + s3);
    }
    const int bits = s->bits;
    const uint32_t mask = (1u << bits) - 1;
    double sum = 0.0;
    long long at = 0;
    for (int m = 0; m < s->num_blocks; m++, at += bits) {
        long long byte = at >> 3;
        /* A block of at most 10 bits spans at most 3 bytes. */
        uint32_t word = row[byte];
        if (byte + 1 < s->width) word |= (uint32_t)row[byte + 1] << 8;
        if (byte + 2 < s->width) word |= (uint32_t)row[byte + 2] << 16;
        sum += s->table[((long long)m << bits) + ((word >> (at & 7)) & mask)];
    }
    return sum;
}

/* Each of `count` positions' score (`score_row`): the scores of a few items
 * of a large index (a tie group to order) without unpacking their codes. */
static void score_rows_c(const uint8_t *packed, long long width, int bits, int num_blocks,
                         const int64_t *positions, long long count, const float *table,
                         double *out) {
    RowScorer scorer = row_scorer(table, bits, num_blocks, width, count);
    for (long long i = 0; i < count; i++) {
        if (i + SCORE_AHEAD < count)
            __builtin_prefetch(packed + positions[i + SCORE_AHEAD] * width);
        out[i] = score_row(&scorer, packed + positions[i] * width);
    }
    free(scorer.bytes);
}

static PyObject *score_rows(PyObject *self, PyObject *args) {
    Py_buffer packed, positions, table, out;
    long long n, width, count;
    int bits, num_blocks;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLiiy*Ly*w*", &packed, &n, &width, &bits, &num_blocks,
                          &positions, &count, &table, &out))
        return NULL;
    const char *problem = NULL;
    if (n < 0 || width < 1 || count < 0 || bits < 1 || bits > 10 || num_blocks < 1 ||
        (long long)num_blocks * bits > 8 * width)
        problem = "sizes out of range";
    else if (packed.len != n * width)
        problem = "packed buffer has the wrong size";
    else if (positions.len != count * 8 || out.len != count * 8)
        problem = "positions and out must hold count int64 and float64";
    else if (table.len != ((long long)num_blocks << bits) * 4)
        problem = "table must hold num_blocks * 2^bits float32";
    if (!problem) {
        const int64_t *at = positions.buf;
        for (long long i = 0; i < count; i++)
            if (at[i] < 0 || at[i] >= n) {
                problem = "positions out of range";
                break;
            }
    }
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS score_rows_c(packed.buf, width, bits, num_blocks,
                                            positions.buf, count, table.buf, out.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&packed);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&table);
    PyBuffer_Release(&out);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* Equal scores of a scan's results ordered by a second code's scores (an
 * instance code's, beside a class code whose codes repeat), then by
 * position: `views.tie_ordered_top_k` for a batch of queries. A query's
 * scan gives its best `wide` (k + 1 where the filter keeps that many),
 * which tell whether the k-th result's tie group goes on past them; where
 * it does, the rest of it (the positions whose row is one of the rows at
 * the k-th's score, that the filter keeps and the scan did not return, the
 * `max_tied` least) joins the candidates, and the best k of them by score,
 * second score (`score_row`) and position are the answer. */
typedef struct {
    double score, key;
    int64_t position;
} Tied;

/* qsort's order: higher score first, then higher key, then lower position. */
static int tied_order(const void *pa, const void *pb) {
    const Tied *a = pa, *b = pb;
    if (a->score != b->score) return a->score < b->score ? 1 : -1;
    if (a->key != b->key) return a->key < b->key ? 1 : -1;
    return (a->position > b->position) - (a->position < b->position);
}

static int position_order(const void *pa, const void *pb) {
    int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    return (a > b) - (a < b);
}

static int word_order(const void *pa, const void *pb) {
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return (a > b) - (a < b);
}

typedef struct {
    const uint8_t *row;
    long long width;
} RowRef;

static int row_order(const void *pa, const void *pb) {
    const RowRef *a = pa, *b = pb;
    return memcmp(a->row, b->row, (size_t)a->width);
}

typedef struct {
    const uint8_t *packed; /* the first code's rows: its tie groups */
    long long n, width;
    const int64_t *order;   /* positions by their rows' first 8 bytes, ... */
    const uint64_t *sorted; /* ... which, read as one word each, increase */
    const uint8_t *keep;    /* one byte an item; NULL: every item */
    const uint8_t *second;  /* the second code's rows, at the same positions */
    long long second_width;
    int bits, num_blocks;
    long long max_tied;
} TieSource;

/* One query's buffers: `wide` for the scan's, the others grown as needed. */
typedef struct {
    RowRef *rows;
    uint64_t *words;
    int64_t *bar, *found;
    int64_t *positions; /* the candidates */
    double *keys;
    Tied *tied;
    Item *items;
    long long capacity;
} TieBuffers;

static int grow_ties(TieBuffers *b, long long needed) {
    if (needed <= b->capacity) return 0;
    long long size = needed > 2 * b->capacity ? needed : 2 * b->capacity;
    int64_t *positions = realloc(b->positions, (size_t)size * sizeof(int64_t));
    if (positions) b->positions = positions;
    double *keys = realloc(b->keys, (size_t)size * sizeof(double));
    if (keys) b->keys = keys;
    Tied *tied = realloc(b->tied, (size_t)size * sizeof(Tied));
    if (tied) b->tied = tied;
    Item *items = realloc(b->items, (size_t)size * sizeof(Item));
    if (items) b->items = items;
    if (!positions || !keys || !tied || !items) return -1;
    b->capacity = size;
    return 0;
}

static uint64_t first_word(const uint8_t *row, long long width) {
    uint64_t word = 0; /* as `store._keys`: the first 8 bytes, zero-padded */
    memcpy(&word, row, (size_t)(width < 8 ? width : 8));
    return word;
}

static long long first_past(const uint64_t *sorted, long long n, uint64_t word, int equal) {
    long long lo = 0, hi = n; /* the first entry above `word` (`equal`: at least it) */
    while (lo < hi) {
        long long mid = lo + (hi - lo) / 2;
        if (sorted[mid] < word || (!equal && sorted[mid] == word)) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Appends the rest of a tie group (the `count` positions of `b->bar` give
 * its rows) to the `start` candidates of `b->positions`, increasing; the
 * new count, or -1 without memory, -2 for a position out of range. */
static long long rest_of_group(const TieSource *t, TieBuffers *b, long long count,
                               long long found, long long start) {
    const long long width = t->width;
    RowRef *rows = b->rows;
    long long distinct = 0, words = 0;
    for (long long i = 0; i < count; i++)
        rows[i] = (RowRef){t->packed + b->bar[i] * width, width};
    qsort(rows, (size_t)count, sizeof(RowRef), row_order);
    for (long long i = 0; i < count; i++)
        if (!distinct || row_order(&rows[distinct - 1], &rows[i])) rows[distinct++] = rows[i];
    for (long long i = 0; i < distinct; i++) b->words[i] = first_word(rows[i].row, width);
    qsort(b->words, (size_t)distinct, sizeof(uint64_t), word_order);
    for (long long i = 0; i < distinct; i++)
        if (!words || b->words[words - 1] != b->words[i]) b->words[words++] = b->words[i];
    long long total = start;
    for (long long w = 0; w < words; w++) {
        long long lo = first_past(t->sorted, t->n, b->words[w], 1);
        long long hi = first_past(t->sorted, t->n, b->words[w], 0);
        long long next_found = 0; /* a run and `found` both increase: one walk */
        for (long long at = lo; at < hi; at++) {
            int64_t position = t->order[at];
            if (position < 0 || position >= t->n) return -2;
            while (next_found < found && b->found[next_found] < position) next_found++;
            if (next_found < found && b->found[next_found] == position) continue;
            if (t->keep && !t->keep[position]) continue;
            if (width > 8) { /* a word is a row's first bytes: the rest must match */
                RowRef probe = {t->packed + position * width, width};
                if (!bsearch(&probe, rows, (size_t)distinct, sizeof(RowRef), row_order))
                    continue;
            }
            if (grow_ties(b, total + 1)) return -1;
            b->positions[total++] = position;
            /* A word's run increases: with one word, its first are the least. */
            if (words == 1 && total - start == t->max_tied) break;
        }
    }
    if (words > 1)
        qsort(b->positions + start, (size_t)(total - start), sizeof(int64_t), position_order);
    return total - start < t->max_tied ? total : start + t->max_tied;
}

/* One query: its best `k` of the scan's `wide` into `out_*`; 0, or as
 * `rest_of_group`. */
static int order_row(const TieSource *t, TieBuffers *b, const float *scores,
                     const int64_t *positions, long long wide, long long k, const float *table,
                     float *out_scores, int64_t *out_positions) {
    int extends = wide > k && scores[k - 1] == scores[k];
    int ties = extends;
    for (long long i = 1; i < k && !ties; i++) ties = scores[i] == scores[i - 1];
    if (!ties) { /* the scan's order stands */
        memcpy(out_scores, scores, (size_t)k * sizeof(float));
        memcpy(out_positions, positions, (size_t)k * sizeof(int64_t));
        return 0;
    }
    const float bar = scores[k - 1];
    if (grow_ties(b, wide)) return -1;
    memcpy(b->positions, positions, (size_t)wide * sizeof(int64_t));
    long long count = wide;
    if (extends) {
        if (!t->order) return -3; /* the caller said no tie group goes on */
        long long at_bar = 0;
        for (long long i = 0; i < wide; i++)
            if (scores[i] == bar) b->bar[at_bar++] = positions[i];
        memcpy(b->found, positions, (size_t)wide * sizeof(int64_t));
        qsort(b->found, (size_t)wide, sizeof(int64_t), position_order);
        count = rest_of_group(t, b, at_bar, wide, wide);
        if (count < 0) return (int)count;
    }
    score_rows_c(t->second, t->second_width, t->bits, t->num_blocks, b->positions, count,
                 table, b->keys);
    long long n = 0;
    if (count <= 4 * k) {
        for (long long i = 0; i < count; i++)
            b->tied[n++] = (Tied){i < wide ? scores[i] : bar, b->keys[i], b->positions[i]};
    } else { /* a long tie group (every candidate at or above the bar) */
        for (long long i = 0; i < wide && scores[i] > bar; i++)
            b->tied[n++] = (Tied){scores[i], b->keys[i], b->positions[i]};
        /* The rest's best `need` by key, then position: a heap of them, the
           worst at its root, as the scan keeps its k best. */
        long long need = k - n, size = 0;
        for (long long i = n; i < count; i++) {
            Item item = {b->keys[i], b->positions[i]};
            if (size < need) sift_up(b->items, size++, item);
            else if (ranks_after(&b->items[0], &item)) sift_down(b->items, size, 0, item);
        }
        for (long long i = 0; i < size; i++)
            b->tied[n++] = (Tied){bar, b->items[i].score, b->items[i].position};
    }
    qsort(b->tied, (size_t)n, sizeof(Tied), tied_order);
    for (long long i = 0; i < k; i++) {
        out_scores[i] = (float)b->tied[i].score;
        out_positions[i] = b->tied[i].position;
    }
    return 0;
}

/* Every query of a batch (`order_row`); 0, -1 without memory, -2 for a
 * position out of range. */
static int order_ties_c(const TieSource *t, const float *scores, const int64_t *positions,
                        long long nq, long long wide, long long k, const float *tables,
                        long long table_size, float *out_scores, int64_t *out_positions) {
    TieBuffers b = {0};
    int status = 0;
    long long size = wide > 0 ? wide : 1;
    b.rows = malloc((size_t)size * sizeof(RowRef));
    b.words = malloc((size_t)size * sizeof(uint64_t));
    b.bar = malloc((size_t)size * sizeof(int64_t));
    b.found = malloc((size_t)size * sizeof(int64_t));
    if (!b.rows || !b.words || !b.bar || !b.found || grow_ties(&b, 4 * size)) status = -1;
    for (long long q = 0; q < nq && !status; q++)
        status = order_row(t, &b, scores + q * wide, positions + q * wide, wide, k,
                           tables + q * table_size, out_scores + q * k, out_positions + q * k);
    free(b.rows);
    free(b.words);
    free(b.bar);
    free(b.found);
    free(b.positions);
    free(b.keys);
    free(b.tied);
    free(b.items);
    return status;
}

static PyObject *order_ties(PyObject *self, PyObject *args) {
    Py_buffer scores, positions, packed, order, sorted, keep, second, tables, out_scores,
        out_positions;
    TieSource t;
    long long nq, wide, k;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*y*LLLy*LLy*y*y*y*LiiLy*w*w*", &scores, &positions, &nq,
                          &wide, &k, &packed, &t.n, &t.width, &order, &sorted, &keep,
                          &second, &t.second_width, &t.bits, &t.num_blocks, &t.max_tied,
                          &tables, &out_scores, &out_positions))
        return NULL;
    const char *problem = NULL;
    if (nq < 0 || k < 0 || wide < k || wide > k + 1 || t.n < 0 || t.width < 1 ||
        t.second_width < 1 || t.bits < 1 || t.bits > 10 || t.num_blocks < 1 ||
        (long long)t.num_blocks * t.bits > 8 * t.second_width || t.max_tied < 0)
        problem = "sizes out of range";
    else if (scores.len != nq * wide * 4 || positions.len != nq * wide * 8)
        problem = "scores and positions must hold nq * wide float32 and int64";
    else if (packed.len != t.n * t.width || second.len != t.n * t.second_width)
        problem = "packed buffers have the wrong size";
    else if (order.len != sorted.len || (order.len != 0 && order.len != t.n * 8) ||
             (keep.len != 0 && keep.len != t.n))
        problem = "order, sorted and keep must hold one entry an item";
    const long long table_size = problem ? 0 : (long long)t.num_blocks << t.bits;
    if (problem)
        ;
    else if (tables.len != nq * table_size * 4)
        problem = "tables must hold nq * num_blocks * 2^bits float32";
    else if (out_scores.len != nq * k * 4 || out_positions.len != nq * k * 8)
        problem = "outputs must hold nq * k float32 and int64";
    if (!problem) {
        const int64_t *at = positions.buf;
        for (long long i = 0; i < nq * wide; i++)
            if (at[i] < 0 || at[i] >= t.n) {
                problem = "positions out of range";
                break;
            }
    }
    int status = 0;
    if (!problem) {
        t.packed = packed.buf;
        t.order = order.len ? order.buf : NULL; /* NULL: no group goes on */
        t.sorted = sorted.len ? sorted.buf : NULL;
        t.keep = keep.len ? keep.buf : NULL;
        t.second = second.buf;
        Py_BEGIN_ALLOW_THREADS status =
            order_ties_c(&t, scores.buf, positions.buf, nq, wide, k, tables.buf, table_size,
                         out_scores.buf, out_positions.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&scores);
    PyBuffer_Release(&positions);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&order);
    PyBuffer_Release(&sorted);
    PyBuffer_Release(&keep);
    PyBuffer_Release(&second);
    PyBuffer_Release(&tables);
    PyBuffer_Release(&out_scores);
    PyBuffer_Release(&out_positions);
    if (status == -2) problem = "order holds a position out of range";
    if (status == -3) problem = "a tie group goes on past the scan: order is needed";
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    if (status == -1) return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *group(PyObject *self, PyObject *args) {
    Py_buffer rows, first, starts, members;
    long long n, width, limit;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLLw*w*w*", &rows, &n, &width, &limit, &first, &starts,
                          &members))
        return NULL;
    const char *problem = NULL;
    if (n < 0 || width < 1 || limit < 0 || limit > n || limit >= INT32_MAX)
        problem = "sizes out of range";
    else if (rows.len != n * width)
        problem = "rows buffer has the wrong size";
    else if (first.len != n * 8 || starts.len != (n + 1) * 8 || members.len != n * 8)
        problem = "output buffers have the wrong size";
    long long distinct = 0;
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS distinct =
            group_rows(rows.buf, n, width, limit, first.buf, starts.buf, members.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&rows);
    PyBuffer_Release(&first);
    PyBuffer_Release(&starts);
    PyBuffer_Release(&members);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    if (distinct == -2) return PyErr_NoMemory();
    return PyLong_FromLongLong(distinct);
}

/* How often codes repeat, from every row at the cost of a hash each: the
 * rows whose mixed hash falls below `threshold` (a share of all possible
 * rows, whatever their order) are kept, and the distinct ones among them
 * counted in a small table of hashes. `kept / distinct` estimates the
 * items per distinct row of the whole. Returns distinct (and kept in
 * *kept), or -2 without memory. */
static uint64_t mixed(uint64_t x) { /* splitmix64's finaliser */
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

static long long sampled_distinct(const uint8_t *rows, long long n, long long width,
                                  uint64_t threshold, long long *kept) {
    long long capacity = 1024, distinct = 0;
    uint64_t *table = calloc((size_t)capacity, sizeof(uint64_t)); /* 0: empty */
    if (!table) return -2;
    *kept = 0;
    for (long long i = 0; i < n; i++) {
        const uint8_t *row = rows + i * width;
        uint64_t h;
        if (width <= 8) {
            uint64_t key = 0;
            memcpy(&key, row, (size_t)width);
            h = mixed(key);
        } else {
            h = mixed(row_hash(row, width));
        }
        if (h >= threshold) continue;
        ++*kept;
        h |= 1; /* never 0, the empty slot */
        long long slot = (long long)((h >> 7) & (uint64_t)(capacity - 1));
        while (table[slot] && table[slot] != h) slot = (slot + 1) & (capacity - 1);
        if (table[slot]) continue;
        table[slot] = h;
        if (2 * ++distinct > capacity) {
            long long grown = 2 * capacity;
            uint64_t *bigger = calloc((size_t)grown, sizeof(uint64_t));
            if (!bigger) {
                free(table);
                return -2;
            }
            for (long long s = 0; s < capacity; s++) {
                if (!table[s]) continue;
                long long t = (long long)((table[s] >> 7) & (uint64_t)(grown - 1));
                while (bigger[t]) t = (t + 1) & (grown - 1);
                bigger[t] = table[s];
            }
            free(table);
            table = bigger;
            capacity = grown;
        }
    }
    free(table);
    return distinct;
}

static PyObject *sample_repeats(PyObject *self, PyObject *args) {
    Py_buffer rows;
    long long n, width, kept = 0, distinct = 0;
    unsigned long long threshold;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLK", &rows, &n, &width, &threshold)) return NULL;
    const char *problem = NULL;
    if (n < 0 || width < 1)
        problem = "sizes out of range";
    else if (rows.len != n * width)
        problem = "rows buffer has the wrong size";
    if (!problem) {
        Py_BEGIN_ALLOW_THREADS distinct =
            sampled_distinct(rows.buf, n, width, (uint64_t)threshold, &kept);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&rows);
    if (problem) {
        PyErr_SetString(PyExc_ValueError, problem);
        return NULL;
    }
    if (distinct == -2) return PyErr_NoMemory();
    return Py_BuildValue("LL", kept, distinct);
}

static PyObject *kernels(PyObject *self, PyObject *args) {
    (void)self;
    (void)args;
    static const int best_first[] = {KERNEL_VBMI, KERNEL_AVX512BW, KERNEL_AVX2, KERNEL_NEON,
                                     KERNEL_PORTABLE};
    PyObject *names = PyList_New(0);
    for (int i = 0; names && i < KERNEL_COUNT; i++) {
        if (!cpu_runs(best_first[i])) continue;
        PyObject *name = PyUnicode_FromString(KERNEL_NAMES[best_first[i]]);
        if (!name || PyList_Append(names, name)) Py_CLEAR(names);
        Py_XDECREF(name);
    }
    return names;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(tiles, n, tile, columns, bits, table, groups, num_blocks, block_size, "
     "per_group, k, queries, nq, scores, positions, kernel, starts, members, row_bits, "
     "member_bits): "
     "exact top-k of every float32 query, written to scores and positions; kernel 0 "
     "portable, 1 avx2, 2 vbmi, 3 neon, 4 avx512bw; n rows of tiles, whose items starts and "
     "members list (both empty: row r is item r); row_bits, one bit a row (LSB first), "
     "the rows that may be returned, member_bits one bit a member position, the "
     "items that may (empty: all)."},
    {"group", group, METH_VARARGS,
     "group(rows, n, width, limit, first, starts, members): the items of equal rows "
     "(n rows of width bytes), in linear time; returns the number of distinct rows "
     "(first: each one's first item; members[starts[r]:starts[r+1]]: its items), or "
     "-1 past limit."},
    {"score_rows", score_rows, METH_VARARGS,
     "score_rows(packed, n, width, bits, num_blocks, positions, count, table, out): "
     "out[i] = the float64 sum over blocks m of table[m * 2^bits + c_m], c the code "
     "of packed row positions[i] (n rows of width bytes, blocks of bits bits, least "
     "significant bit first)."},
    {"order_ties", order_ties, METH_VARARGS,
     "order_ties(scores, positions, nq, wide, k, packed, n, width, order, sorted, keep, "
     "second, second_width, bits, num_blocks, max_tied, tables, out_scores, "
     "out_positions): each query's best k of its scan's best wide (k or k + 1), the "
     "k-th's tie group completed from packed (rows by their first 8 bytes: order, "
     "sorted, both empty where no group goes on; keep: one byte an item, or empty), "
     "equal scores by the score of second's "
     "row under the query's table, then by position."},
    {"sample_repeats", sample_repeats, METH_VARARGS,
     "sample_repeats(rows, n, width, threshold): (kept, distinct): the rows whose "
     "mixed hash is below threshold, and the distinct ones among them."},
    {"kernels", kernels, METH_NOARGS,
     "kernels(): the kernels this CPU runs, best first (names, as KERNEL_NAMES)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan",
                                    "Exact SuBiC top-k scan (bound with SIMD).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
#endif
