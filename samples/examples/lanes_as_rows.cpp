// A timing prototype, not product code: the Q4_K small-batch product with lanes as rows.
//
// The exact mode's small-batch kernel (adapters/patches/ggml-exact-k-quants.patch,
// la_exact_rows) takes one weight row at a time: 256-bit lanes are elements, each column costs
// 8 vpmaddubsw + 8 vpdpwssd a block, and every (row, block) ends in horizontal sums. Here 16
// rows are interleaved once, as a load-time repack would store them: one 512-bit vpdpbusd
// multiplies 4 codes of each of 16 rows by 4 activations broadcast from memory, the sub-block
// scales and mins apply to 16 rows' lanes, and the float epilogue (the tiled kernel's: t = s1 *
// d0 - dmin * s2, then a fused multiply-add with the activations' scale) runs on 16 rows at once,
// with no horizontal sums. Per 16 rows and 256-element block: 2048 bytes of packed nibbles (lane
// r, byte i: codes 4q+i in the low nibble, 4(q+32)+i in the high), 8 x 16 scale bytes, 4 x 32
// bytes of (min 2p, min 2p+1) pairs, and 16 + 16 fp16 d and dmin: 148 bytes a row-block against
// Q4_K's 144. The data is synthetic; the integers and float operations are the real ones' shape,
// not checked against them.
//
// Build and run (one thread; cycles are counted at 3.65 GHz, the EPYC's clock here):
//     g++ -O3 -std=c++17 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512dq -mfma -mf16c
//         -o /tmp/lanes_as_rows samples/examples/lanes_as_rows.cpp && /tmp/lanes_as_rows
// (one command).
// What it showed, and the current kernel beside it: docs/benchmarks.md, seventh session.
#include <immintrin.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

constexpr int GROUP_BYTES = 2048 + 128 + 128 + 64;  // 16 rows x 1 block: codes, scales, min pairs, d and dmin
constexpr int SCALES = 2048, MINS = 2048 + 128, DS = 2048 + 256;

struct Column {           // one activation row, q8_K-like
    const int8_t *q;      // [nb * 256]
    const int32_t *mins;  // [nb * 4]: the (2p, 2p + 1) sub-blocks' code sums as a 16-bit pair
    const float *d;       // [nb]
};

template <int N>
__attribute__((noinline)) void lanes_as_rows(const uint8_t *w, long groups, long nb, const Column *col, float *out) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const int8_t *aq[N];
    const int32_t *am[N];
    const float *ad[N];
    for (int j = 0; j < N; j++) {
        aq[j] = col[j].q;
        am[j] = col[j].mins;
        ad[j] = col[j].d;
    }
    for (long g = 0; g < groups; g++) {
        __m512 acc[N];
        for (int j = 0; j < N; j++) acc[j] = _mm512_setzero_ps();
        for (long b = 0; b < nb; b++) {
            const uint8_t *blk = w + (g * nb + b) * GROUP_BYTES;
            for (int o = 0; o < GROUP_BYTES; o += 64) _mm_prefetch((const char *) blk + 4 * GROUP_BYTES + o, _MM_HINT_T1);
            __m512i s1[N], s2[N];
            for (int j = 0; j < N; j++) s1[j] = s2[j] = _mm512_setzero_si512();
            for (int sb = 0; sb < 4; sb++) {  // sub-blocks sb (low nibbles) and sb + 4 (high)
                __m512i lo_sum[N], hi_sum[N];
                for (int j = 0; j < N; j++) lo_sum[j] = hi_sum[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
                for (int k = 0; k < 8; k++) {
                    const int q = sb * 8 + k;
                    const __m512i packed = _mm512_loadu_si512(blk + q * 64);
                    const __m512i lo = _mm512_and_si512(packed, m4);
                    const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(packed, 4), m4);
                    for (int j = 0; j < N; j++) {
                        const int8_t *a = aq[j] + b * 256;
                        lo_sum[j] = _mm512_dpbusd_epi32(lo_sum[j], lo, _mm512_set1_epi32(*(const int32_t *) (a + 4 * q)));
                        hi_sum[j] = _mm512_dpbusd_epi32(hi_sum[j], hi, _mm512_set1_epi32(*(const int32_t *) (a + 4 * (q + 32))));
                    }
                }
                const __m512i sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) (blk + SCALES + sb * 16)));
                const __m512i sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) (blk + SCALES + (sb + 4) * 16)));
                for (int j = 0; j < N; j++)
                    s1[j] = _mm512_add_epi32(s1[j], _mm512_add_epi32(_mm512_mullo_epi32(lo_sum[j], sc_lo),
                                                                     _mm512_mullo_epi32(hi_sum[j], sc_hi)));
            }
            for (int p = 0; p < 4; p++) {
                const __m512i pair = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *) (blk + MINS + p * 32)));
                for (int j = 0; j < N; j++) s2[j] = _mm512_dpwssd_epi32(s2[j], pair, _mm512_set1_epi32(am[j][b * 4 + p]));
            }
            const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (blk + DS)));
            const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (blk + DS + 32)));
            for (int j = 0; j < N; j++) {
                __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s1[j]), d0);
                t = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(s2[j]), t);
                acc[j] = _mm512_fmadd_ps(t, _mm512_set1_ps(ad[j][b]), acc[j]);
            }
        }
        for (int j = 0; j < N; j++) _mm512_storeu_ps(out + (g * N + j) * 16, acc[j]);
    }
}

int main() {
    const long nb = 6, groups = (1L << 20) / 16;  // 1M rows of 1536 elements: 931 MB, streamed from memory
    const size_t bytes = (size_t) groups * nb * GROUP_BYTES;
    uint8_t *w = (uint8_t *) aligned_alloc(64, bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t) (i * 2654435761u >> 13);
    for (long k = 0; k < groups * nb; k++)
        for (int r = 0; r < 32; r++) {
            const uint16_t half = 0x2c00;  // 0.0625
            memcpy(w + k * GROUP_BYTES + DS + 2 * r, &half, 2);
        }
    static int8_t q[8][6 * 256];
    static int32_t mins[8][6 * 4];
    static float d[8][6];
    Column col[8];
    for (int j = 0; j < 8; j++) {
        for (int i = 0; i < 6 * 256; i++) q[j][i] = (int8_t) ((i * 37 + j) % 200 - 100);
        for (int i = 0; i < 6 * 4; i++) mins[j][i] = 0x00100010;
        for (int i = 0; i < 6; i++) d[j][i] = 0.01f;
        col[j] = Column{q[j], mins[j], d[j]};
    }
    float *out = (float *) aligned_alloc(64, (size_t) groups * 8 * 16 * sizeof(float));
    auto run = [&](auto kernel, int n) {
        double resident = 1e9, streamed = 1e9;
        const long window = 16;  // groups in cache: 16 x 6 x 2368 bytes = 227 KB
        for (int rep = 0; rep < 3; rep++) {
            double t0 = now();
            for (long c = 0; c < groups / window; c++) kernel(w, window, nb, col, out);
            double t1 = now();
            if (t1 - t0 < resident) resident = t1 - t0;
            t0 = now();
            kernel(w, groups, nb, col, out);
            t1 = now();
            if (t1 - t0 < streamed) streamed = t1 - t0;
        }
        const double row_blocks = (double) groups * 16 * nb;
        printf("N=%d  in cache %5.1f cycles a row-block   streamed %5.1f (%.1f GB/s)\n", n,
               resident * 3.65e9 / row_blocks, streamed * 3.65e9 / row_blocks, bytes / streamed / 1e9);
    };
    run(lanes_as_rows<1>, 1);
    run(lanes_as_rows<2>, 2);
    run(lanes_as_rows<4>, 4);
    run(lanes_as_rows<6>, 6);
    run(lanes_as_rows<8>, 8);
    return 0;
}
