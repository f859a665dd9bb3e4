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
 * Q of an item (16-bit, added with SIMD shuffles: pshufb for 4-bit
 * sub-codes, vpermb for sub-codes of up to 8 bits; in portable C for
 * 16-bit sub-codes, blocks of 512 or 1024 values) bounds its score:
 *
 *     base + delta Q  <=  score  <  base + delta (Q + G)
 *
 * with `base = sum_g min_g` and G sub-codes. Candidates gather in a buffer
 * of 2k; when it is full it is cut back to the k best by quickselect, and
 * S_k, the k-th best exact score, sets the bar. An item with Q < t, where
 * t = ceil((S_k - base) / delta) - G - 1, scores below S_k and is skipped;
 * every other item is scored exactly (in float64) and kept if it beats
 * S_k. The extra -1 absorbs floating-point rounding. Results are therefore
 * those of an exact scan: best score first, equal scores by position
 * (earlier first).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

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
} Database;

typedef struct {
    double *lut;       /* groups x table, exact */
    uint8_t *qlut;     /* groups x table, quantised */
    double base, delta;
    int32_t threshold; /* items with Q below it are skipped */
    Item *kept;        /* candidates, room for 2k; the k best are kept */
    int64_t size;
    int has_kth;       /* once 2k candidates came: */
    Item kth;          /* the k-th best of them, the bar for later items */
} Query;

/* `a` ranks after `b`: a lower score, or an equal score at a later position. */
static inline int ranks_after(const Item *a, const Item *b) {
    return a->score < b->score || (a->score == b->score && a->position > b->position);
}

static inline void swap_items(Item *a, Item *b) {
    Item t = *a;
    *a = *b;
    *b = t;
}

/* Reorders `items` so that the first `k` are the best, the k-th best at
   `k - 1` (quickselect; positions are unique, so the order is total). */
static void select_best(Item *items, int64_t n, int64_t k) {
    int64_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        /* The median of three as pivot. */
        if (ranks_after(&items[lo], &items[mid])) swap_items(&items[lo], &items[mid]);
        if (ranks_after(&items[lo], &items[hi])) swap_items(&items[lo], &items[hi]);
        if (ranks_after(&items[mid], &items[hi])) swap_items(&items[mid], &items[hi]);
        Item pivot = items[mid];
        int64_t i = lo, j = hi;
        while (i <= j) {
            while (ranks_after(&pivot, &items[i])) i++;
            while (ranks_after(&items[j], &pivot)) j--;
            if (i <= j) swap_items(&items[i++], &items[j--]);
        }
        if (k - 1 <= j)
            hi = j;
        else if (k - 1 >= i)
            lo = i;
        else
            break;
    }
}

static int best_first(const void *a, const void *b) {
    return ranks_after(a, b) ? 1 : (ranks_after(b, a) ? -1 : 0);
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

/* Keeps the k best candidates; the k-th becomes the bar, and the bound
   threshold follows from its score. */
static void compact(Query *q, const Database *db) {
    select_best(q->kept, q->size, db->k);
    q->size = db->k;
    q->kth = q->kept[db->k - 1];
    q->has_kth = 1;
    double t = ceil((q->kth.score - q->base) / q->delta) - db->groups - 1;
    q->threshold = t < 0 ? 0 : (t > 65536 ? 65536 : (int32_t)t);
}

static void quantise(Query *q, const Database *db) {
    const int groups = db->groups, table = db->table;
    const int entries = db->bits == 4 ? 16 : table;
    /* 16-bit sums: the largest quantised sum must stay below 2^16. */
    int qmax = 65535 / groups;
    if (qmax > 255) qmax = 255;
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

/* Sub-code g of the item at `lane` of a tile. */
static inline int sub_code(const Database *db, const uint8_t *cols, int g, int64_t lane) {
    if (db->bits == 16) return ((const uint16_t *)cols)[(int64_t)g * db->tile + lane];
    if (db->bits == 4) {
        uint8_t byte = cols[(int64_t)(g >> 1) * db->tile + lane];
        return (g & 1) ? byte >> 4 : byte & 15;
    }
    return cols[(int64_t)g * db->tile + lane];
}

static void offer(Query *q, const Database *db, const uint8_t *cols, int64_t lane,
                  int64_t position) {
    double score = 0.0;
    for (int g = 0; g < db->groups; g++)
        score += q->lut[(int64_t)g * db->table + sub_code(db, cols, g, lane)];
    Item item = {score, position};
    if (q->has_kth && !ranks_after(&q->kth, &item)) return;
    q->kept[q->size++] = item;
    if (q->size == 2 * db->k) compact(q, db);
}

/* Quantised sums of a tile ------------------------------------------------- */

/* Quantised sums of lanes [from, from + count) of a tile. */
static void sums_scalar(const Database *db, const uint8_t *cols, const uint8_t *qlut,
                        int64_t from, int64_t count, uint16_t *acc) {
    const int64_t tile = db->tile;
    memset(acc, 0, count * sizeof(uint16_t));
    for (int g = 0; g < db->groups; g++) {
        const uint8_t *t = qlut + (int64_t)g * db->table;
        if (db->bits == 16) {
            const uint16_t *col = (const uint16_t *)cols + (int64_t)g * tile + from;
            for (int64_t i = 0; i < count; i++) acc[i] += t[col[i]];
        } else if (db->bits == 4) {
            const uint8_t *col = cols + (int64_t)(g >> 1) * tile + from;
            int shift = (g & 1) * 4;
            for (int64_t i = 0; i < count; i++) acc[i] += t[(col[i] >> shift) & 15];
        } else {
            const uint8_t *col = cols + (int64_t)g * tile + from;
            for (int64_t i = 0; i < count; i++) acc[i] += t[col[i]];
        }
    }
}

#if SUBIC_X86
/* Offers the lanes of 16-bit sums whose bit is set in `mask`; `item` maps a
   lane to its offset in the tile (the sums are kept in even/odd halves). */
static inline void offer_hits(Query *q, const Database *db, const uint8_t *cols,
                              uint64_t mask, const uint16_t *sums, int64_t base_lane,
                              int odd, int64_t valid, int64_t start) {
    while (mask) {
        int lane = __builtin_ctzll(mask);
        mask &= mask - 1;
        int64_t at = base_lane + 16 * (lane >> 3) + 2 * (lane & 7) + odd;
        if (at < valid && sums[lane] >= q->threshold) offer(q, db, cols, at, start + at);
    }
}

/* Adds 32 byte values to 16-bit sums, kept as even and odd lanes. */
__attribute__((target("avx2"))) static inline void add_bytes_avx2(__m256i *even,
                                                                  __m256i *odd,
                                                                  __m256i r) {
    *even = _mm256_add_epi16(*even, _mm256_and_si256(r, _mm256_set1_epi16(255)));
    *odd = _mm256_add_epi16(*odd, _mm256_srli_epi16(r, 8));
}

__attribute__((target("avx2,bmi2"))) static void tile_nibbles_avx2(Query *q,
                                                             const Database *db,
                                                             const uint8_t *cols,
                                                             int64_t valid,
                                                             int64_t start) {
    const int64_t tile = db->tile;
    const int groups = db->groups;
    const __m256i low4 = _mm256_set1_epi8(15);
    uint16_t sums[2][16];
    for (int64_t i = 0; i < valid; i += 32) {
        __m256i even = _mm256_setzero_si256(), odd = _mm256_setzero_si256();
        for (int g = 0; g < groups; g += 2) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(cols + (g >> 1) * tile + i));
            __m256i t0 = _mm256_broadcastsi128_si256(
                _mm_loadu_si128((const __m128i *)(q->qlut + (int64_t)g * db->table)));
            __m256i r = _mm256_shuffle_epi8(t0, _mm256_and_si256(v, low4));
            if (g + 1 < groups) {
                __m256i t1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    (const __m128i *)(q->qlut + (int64_t)(g + 1) * db->table)));
                __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
                add_bytes_avx2(&even, &odd, _mm256_shuffle_epi8(t1, hi));
            }
            add_bytes_avx2(&even, &odd, r);
        }
        if (q->threshold > 65535) return;
        __m256i t = _mm256_set1_epi16((short)(uint16_t)q->threshold);
        __m256i pass_even = _mm256_cmpeq_epi16(_mm256_max_epu16(even, t), even);
        __m256i pass_odd = _mm256_cmpeq_epi16(_mm256_max_epu16(odd, t), odd);
        uint32_t me = (uint32_t)_mm256_movemask_epi8(pass_even);
        uint32_t mo = (uint32_t)_mm256_movemask_epi8(pass_odd);
        if (me | mo) {
            _mm256_storeu_si256((__m256i *)sums[0], even);
            _mm256_storeu_si256((__m256i *)sums[1], odd);
            /* movemask gives two bits per 16-bit lane: keep one. */
            me = (uint32_t)_pext_u32(me, 0x55555555u);
            mo = (uint32_t)_pext_u32(mo, 0x55555555u);
            offer_hits(q, db, cols, me, sums[0], i, 0, valid, start);
            offer_hits(q, db, cols, mo, sums[1], i, 1, valid, start);
        }
    }
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static inline __m512i lookup_vbmi(
    __m512i v, const uint8_t *t, int table) {
    if (table <= 64) return _mm512_permutexvar_epi8(v, _mm512_loadu_si512((const void *)t));
    __m512i r0 = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)t), v,
                                          _mm512_loadu_si512((const void *)(t + 64)));
    if (table == 128) return r0;
    __m512i r1 = _mm512_permutex2var_epi8(_mm512_loadu_si512((const void *)(t + 128)), v,
                                          _mm512_loadu_si512((const void *)(t + 192)));
    return _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), r0, r1);
}

/* Adds 64 byte values to 16-bit sums, kept as even and odd lanes. */
__attribute__((target("avx512f,avx512bw"))) static inline void add_bytes_avx512(
    __m512i *even, __m512i *odd, __m512i r) {
    *even = _mm512_add_epi16(*even, _mm512_and_si512(r, _mm512_set1_epi16(255)));
    *odd = _mm512_add_epi16(*odd, _mm512_srli_epi16(r, 8));
}

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) static void tile_bytes_vbmi(
    Query *q, const Database *db, const uint8_t *cols, int64_t valid, int64_t start) {
    const int64_t tile = db->tile;
    const int table = db->table;
    uint16_t sums[4][32];
    for (int64_t i = 0; i < valid; i += 128) {
        __m512i e0 = _mm512_setzero_si512(), o0 = _mm512_setzero_si512();
        __m512i e1 = _mm512_setzero_si512(), o1 = _mm512_setzero_si512();
        for (int g = 0; g < db->groups; g++) {
            const uint8_t *t = q->qlut + (int64_t)g * table;
            const uint8_t *c = cols + (int64_t)g * tile + i;
            add_bytes_avx512(&e0, &o0,
                             lookup_vbmi(_mm512_loadu_si512((const void *)c), t, table));
            add_bytes_avx512(&e1, &o1,
                             lookup_vbmi(_mm512_loadu_si512((const void *)(c + 64)), t, table));
        }
        if (q->threshold > 65535) return;
        __m512i t = _mm512_set1_epi16((short)(uint16_t)q->threshold);
        uint32_t m[4] = {_mm512_cmpge_epu16_mask(e0, t), _mm512_cmpge_epu16_mask(o0, t),
                         _mm512_cmpge_epu16_mask(e1, t), _mm512_cmpge_epu16_mask(o1, t)};
        if (m[0] | m[1] | m[2] | m[3]) {
            _mm512_storeu_si512((void *)sums[0], e0);
            _mm512_storeu_si512((void *)sums[1], o0);
            _mm512_storeu_si512((void *)sums[2], e1);
            _mm512_storeu_si512((void *)sums[3], o1);
            for (int h = 0; h < 4; h++)
                offer_hits(q, db, cols, m[h], sums[h], i + 64 * (h >> 1), h & 1, valid,
                           start);
        }
    }
}
#endif

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

typedef void (*TileKernel)(Query *, const Database *, const uint8_t *, int64_t, int64_t);

static int cpu_has(const char *feature) {
#if SUBIC_X86
    __builtin_cpu_init();
    if (!strcmp(feature, "avx2")) return __builtin_cpu_supports("avx2");
    if (!strcmp(feature, "bmi2")) return __builtin_cpu_supports("bmi2");
    if (!strcmp(feature, "avx512vbmi"))
        return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi");
#endif
    (void)feature;
    return 0;
}

/* The kernel this CPU runs for `db`; `simd` 0 forces the portable one. */
static const char *choose(const Database *db, int simd, TileKernel *kernel) {
    *kernel = tile_scalar;
#if SUBIC_X86
    if (simd && db->bits == 4 && db->tile % 32 == 0 && cpu_has("avx2") &&
        cpu_has("bmi2")) {
        *kernel = tile_nibbles_avx2;
        return "avx2";
    }
    if (simd && db->bits == 8 && db->tile % 128 == 0 && cpu_has("avx512vbmi")) {
        *kernel = tile_bytes_vbmi;
        return "avx512vbmi";
    }
#endif
    return "scalar";
}

/* Scans queries [0, nq) and writes their top k, best first. */
static int run(const Database *db, const float *z, int64_t nq, int simd,
               double *scores_out, int64_t *positions_out) {
    TileKernel kernel;
    choose(db, simd, &kernel);
    const int64_t lut_size = (int64_t)db->groups * db->table;
    const int64_t num_tiles = (db->n + db->tile - 1) / db->tile;
    const int64_t entry_bytes = db->bits == 16 ? 2 : 1; /* per sub-code column entry */
    Query queries[QUERY_GROUP];
    uint8_t *qluts = aligned_alloc(64, ((QUERY_GROUP * lut_size + 63) / 64) * 64 + 64);
    Item *kept = malloc(sizeof(Item) * (db->k > LARGE_K ? 1 : QUERY_GROUP) * 2 * (size_t)db->k);
    double *luts = malloc(sizeof(double) * QUERY_GROUP * lut_size);
    const int64_t width = (int64_t)db->num_blocks * db->block_size;
    if (!qluts || !kept || !luts) {
        free(qluts);
        free(kept);
        free(luts);
        return -1;
    }
    const int group = db->k > LARGE_K ? 1 : QUERY_GROUP;
    for (int64_t q0 = 0; q0 < nq; q0 += group) {
        int count = (int)(nq - q0 < group ? nq - q0 : group);
        for (int j = 0; j < count; j++) {
            Query *q = &queries[j];
            q->lut = luts + j * lut_size;
            build_tables(z + (q0 + j) * width, db, q->lut);
            q->qlut = qluts + j * lut_size;
            q->kept = kept + j * 2 * db->k;
            q->size = 0;
            q->has_kth = 0;
            q->threshold = 0;
            quantise(q, db);
        }
        for (int64_t t = 0; t < num_tiles; t++) {
            const uint8_t *cols = db->tiles + t * db->columns * db->tile * entry_bytes;
            int64_t start = t * db->tile;
            int64_t valid = db->n - start < db->tile ? db->n - start : db->tile;
            for (int j = 0; j < count; j++) {
                if (queries[j].threshold <= 65535) kernel(&queries[j], db, cols, valid, start);
            }
        }
        for (int j = 0; j < count; j++) {
            Query *q = &queries[j];
            if (q->size > db->k) compact(q, db);
            qsort(q->kept, q->size, sizeof(Item), best_first);
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
    free(kept);
    free(luts);
    return 0;
}

/* Python binding ----------------------------------------------------------- */

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

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer tiles, queries, scores, positions;
    Database db;
    long long n, tile, columns, k, nq;
    int bits, table, groups, num_blocks, block_size, per_group, simd;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*LLLiiiiiiLy*Lw*w*p", &tiles, &n, &tile, &columns, &bits,
                          &table, &groups, &num_blocks, &block_size, &per_group, &k,
                          &queries, &nq, &scores, &positions, &simd))
        return NULL;
    int nbits = 0;
    while (nbits < 16 && (1 << nbits) < block_size) nbits++;
    const char *problem = NULL;
    if (n < 0 || tile < 64 || tile % 64 || columns < 1 || groups < 1 || k < 1 || nq < 0)
        problem = "sizes out of range";
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
        Py_BEGIN_ALLOW_THREADS status =
            run(&db, queries.buf, nq, simd, scores.buf, positions.buf);
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&tiles);
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

static PyObject *kernel_name(PyObject *self, PyObject *args) {
    int bits, tile;
    (void)self;
    if (!PyArg_ParseTuple(args, "ii", &bits, &tile)) return NULL;
    Database db = {0};
    db.bits = bits;
    db.tile = tile;
    TileKernel kernel;
    return PyUnicode_FromString(choose(&db, 1, &kernel));
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(tiles, n, tile, columns, bits, table, groups, num_blocks, block_size, "
     "per_group, k, queries, nq, scores, positions, simd): exact top-k of every "
     "float32 query, written to scores and positions."},
    {"kernel_name", kernel_name, METH_VARARGS,
     "kernel_name(bits, tile): the SIMD kernel this CPU runs for such sub-codes."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan",
                                    "Exact SuBiC top-k scan (bound with SIMD, refine).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__scan(void) { return PyModule_Create(&module); }
