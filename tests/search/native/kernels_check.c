/* Every kernel the CPU runs gives the portable kernel's results, exactly.
 *
 * Built on its own (`_scan.c` without the Python binding), so that it runs
 * where Python cannot: the NEON kernel is checked on x86 machines by
 * cross-compiling this file for aarch64 and running it under qemu-user
 * (tests/search/test_native_neon.py). Prints one line per kernel and
 * layout checked; exits 1 at the first difference.
 */
#define SUBIC_NO_PYTHON
#include "../../../subic_keras/search/_scan.c"

#include <stdio.h>

static uint64_t state = 0x9E3779B97F4A7C15ull;

static uint64_t next_random(void) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
}

static double uniform(void) { return (double)(next_random() >> 11) / 9007199254740992.0; }

/* ReLU queries, and the cases that stress the bounds (as test_native.py). */
static void make_queries(float *z, int nq, int width) {
    for (int q = 0; q < nq; q++)
        for (int j = 0; j < width; j++) {
            double g = sqrt(-2 * log(uniform() + 1e-300)) * cos(6.283185307179586 * uniform());
            float v = g > 0 ? (float)g : 0.0f;
            if (q == 1) v = 0.0f;                     /* every item ties */
            if (q == 2 && j == 0) v = 1e6f;           /* one huge entry */
            if (q == 3) v -= 0.5f;                    /* negative entries */
            if (q == 4) v = (float)(g * 1e-30);       /* tiny */
            if (q == 5 && j % 3 == 0) v = -1e4f;
            z[(int64_t)q * width + j] = v;
        }
}

/* Tiles of random codes in the layout of `bits` (4: two sub-codes a byte). */
static Database make_database(int n, int M, int K, int bits, uint8_t **tiles) {
    Database db = {0};
    int nbits = 0;
    while ((1 << nbits) < K) nbits++;
    db.per_group = bits == 16 ? 1 : (bits / nbits > 0 ? bits / nbits : 1);
    db.groups = (M + db.per_group - 1) / db.per_group;
    db.columns = bits == 4 ? (db.groups + 1) / 2 : db.groups;
    db.entries = 1 << (db.per_group * nbits);
    db.table = bits == 4 ? 16 : (bits == 8 ? (db.entries < 64 ? 64 : db.entries) : db.entries);
    db.tile = 1024;
    db.n = n;
    db.bits = bits;
    db.num_blocks = M;
    db.block_size = K;
    db.nbits = nbits;
    db.k = 50;
    int64_t num_tiles = (n + db.tile - 1) / db.tile;
    int entry = bits == 16 ? 2 : 1;
    *tiles = calloc((size_t)(num_tiles * db.tile * db.columns * entry), 1);
    for (int64_t i = 0; i < n; i++) {
        int64_t t = i / db.tile, lane = i % db.tile;
        for (int g = 0; g < db.groups; g++) {
            int sub = 0;
            for (int p = 0; p < db.per_group; p++)
                if (g * db.per_group + p < M) sub |= (int)(next_random() % K) << (p * nbits);
            int64_t base = t * db.tile * db.columns;
            if (bits == 16)
                ((uint16_t *)*tiles)[base + g * db.tile + lane] = (uint16_t)sub;
            else if (bits == 4)
                (*tiles)[base + (g >> 1) * db.tile + lane] |= (uint8_t)(g & 1 ? sub << 4 : sub);
            else
                (*tiles)[base + g * db.tile + lane] = (uint8_t)sub;
        }
    }
    db.tiles = *tiles;
    return db;
}

int main(void) {
    static const int shapes[][2] = {{1, 2},  {3, 4},   {13, 8},  {8, 16},  {5, 16},
                                    {16, 16}, {6, 32}, {8, 64},  {3, 128}, {8, 256},
                                    {17, 256}, {4, 1024}};
    /* 11 queries: a full group of 8 (scanned four at a time by the x86
       nibble kernels), then 3 (a pair and one alone on AVX2, three alone on
       AVX-512). */
    enum { nq = 11 };
    const int n = 2500;
    int checked = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        const int M = shapes[s][0], K = shapes[s][1];
        const int layouts[2] = {K > 256 ? 16 : 8, 4};
        for (int l = 0; l < 2; l++) {
            int bits = layouts[l];
            if (bits == 4 && !(K == 2 || K == 4 || K == 16)) continue;
            uint8_t *tiles;
            Database db = make_database(n, M, K, bits, &tiles);
            float *z = malloc(sizeof(float) * nq * M * K);
            make_queries(z, nq, M * K);
            double want_scores[nq * 50], got_scores[nq * 50];
            int64_t want[nq * 50], got[nq * 50];
            /* Unfiltered, then with a filter keeping every third row of the
               first tile and none of the second (a tile skipped whole). */
            uint8_t bits_of_rows[(2500 + 7) / 8] = {0};
            for (int r = 0; r < n; r++)
                if (r % 3 == 0 && (r < 1024 || r >= 2048)) bits_of_rows[r >> 3] |= 1 << (r & 7);
            for (int filtered = 0; filtered < 2; filtered++) {
                db.row_bits = filtered ? bits_of_rows : NULL;
                if (run(&db, z, nq, KERNEL_PORTABLE, 0, want_scores, want)) return 2;
                for (int i = 0; filtered && i < nq * 50; i++)
                    if (want[i] < 0 || want[i] % 3 || (want[i] >= 1024 && want[i] < 2048)) {
                        printf("FAIL portable M=%d K=%d bits=%d: returned row %lld, which the "
                               "filter leaves out\n", M, K, bits, (long long)want[i]);
                        return 1;
                    }
                for (int kernel = KERNEL_AVX2; kernel < KERNEL_COUNT; kernel++) {
                    if (!cpu_runs(kernel)) continue;
                    /* A kernel whose queries share code loads: also at most
                       one and two queries a load, as a benchmark forces. */
                    TileKernel together, pair;
                    int qmax, shared;
                    choose(&db, kernel, &qmax, &together, &shared, &pair);
                    for (int per_load = 0; per_load <= (together ? 2 : 0); per_load++) {
                        if (run(&db, z, nq, kernel, per_load, got_scores, got)) return 2;
                        for (int i = 0; i < nq * 50; i++)
                            if (got[i] != want[i] || got_scores[i] != want_scores[i]) {
                                printf("FAIL %s M=%d K=%d bits=%d per_load=%d filtered=%d: "
                                       "query %d rank %d: %lld (%.17g), portable %lld "
                                       "(%.17g)\n",
                                       KERNEL_NAMES[kernel], M, K, bits, per_load, filtered,
                                       i / 50, i % 50, (long long)got[i], got_scores[i],
                                       (long long)want[i], want_scores[i]);
                                return 1;
                            }
                        printf("ok %s M=%d K=%d bits=%d per_load=%d filtered=%d\n",
                               KERNEL_NAMES[kernel], M, K, bits, per_load, filtered);
                        checked++;
                    }
                }
            }
            free(z);
            free(tiles);
        }
    }
    printf("%d kernel and layout pairs equal the portable kernel\n", checked);
    return 0;
}
