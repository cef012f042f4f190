// A prototype, not product code: the Q4_K small-batch product with lanes as rows.
//
// The exact mode's small-batch kernel (adapters/patches/ggml-exact-k-quants.patch,
// la_exact_rows) takes one weight row at a time: 256-bit lanes are elements, each column costs
// 8 vpmaddubsw + 8 vpdpwssd a block, and every (row, block) ends in horizontal sums. Here 16
// rows are interleaved once, as a load-time repack would store them: one 512-bit vpdpbusd
// multiplies 4 codes of each of 16 rows by 4 activations broadcast from memory, the sub-block
// scales and mins apply to 16 rows' lanes, and the tiled kernel's float epilogue (t = s1 * d0 -
// dmin * s2, then a fused multiply-add with the activations' scale) runs on 16 rows at once,
// with no horizontal sums. Per 16 rows and 256-element block: 2048 bytes of packed nibbles (lane
// r, byte i: codes 4q+i in the low nibble, 128+4q+i in the high), 8 x 16 scale bytes, 4 x 32
// bytes of (min 2p, min 2p+1) pairs, and 16 + 16 fp16 d and dmin: 148 bytes a row-block against
// Q4_K's 144.
//
// It times the kernel on 1M rows of 1536 elements (one thread, in cache and streamed from
// memory; cycles counted at 3.65 GHz, the EPYC's clock here). Given the path of the set-up's
// libggml-cpu.so, it also repacks random Q4_K rows and compares every result with the library's
// la_exact_rows<block_q4_K, N> bit for bit (an internal symbol: a rebuild of the patch may rename
// it). Build and run as one command:
//     g++ -O3 -std=c++17 -mavx512f -mavx512bw -mavx512vl -mavx512vnni -mavx512dq -mfma -mf16c
//         -o /tmp/lanes_as_rows samples/examples/lanes_as_rows.cpp -ldl && /tmp/lanes_as_rows
//         .venv/lib/python3.11/site-packages/llama_cpp/lib/libggml-cpu.so.0
// What it showed: docs/benchmarks.md, seventh session.
#include <immintrin.h>
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>

struct block_q4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[128]; };  // ggml's layouts
struct block_q8_K { float d; int8_t qs[256]; int16_t bsums[16]; };
static_assert(sizeof(block_q4_K) == 144 && sizeof(block_q8_K) == 292, "ggml's block sizes");

constexpr int GROUP_BYTES = 2048 + 128 + 128 + 64;  // 16 rows x 1 block: codes, scales, min pairs, d and dmin
constexpr int SCALES = 2048, MINS = 2048 + 128, DS = 2048 + 256;

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

// scale and min of sub-block j (ggml's get_scale_min_k4), and the code of element e
static void scale_min(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}
static int code(const block_q4_K &x, int e) {
    const int g = e / 64, i = e % 64;
    return i < 32 ? x.qs[32 * g + i] & 15 : x.qs[32 * g + i - 32] >> 4;
}

// 16 rows of nb blocks (row stride nb) into the interleaved layout, block after block
static void repack(const block_q4_K *w, long nb, uint8_t *out) {
    for (long b = 0; b < nb; b++) {
        uint8_t *g = out + b * GROUP_BYTES;
        for (int r = 0; r < 16; r++) {
            const block_q4_K &x = w[r * nb + b];
            for (int q = 0; q < 32; q++)
                for (int i = 0; i < 4; i++) g[q * 64 + r * 4 + i] = (uint8_t) (code(x, 4 * q + i) | (code(x, 128 + 4 * q + i) << 4));
            uint8_t sc[8], mn[8];
            for (int s = 0; s < 8; s++) scale_min(s, x.scales, &sc[s], &mn[s]);
            for (int s = 0; s < 8; s++) g[SCALES + s * 16 + r] = sc[s];
            for (int p = 0; p < 4; p++) {
                g[MINS + p * 32 + 2 * r] = mn[2 * p];
                g[MINS + p * 32 + 2 * r + 1] = mn[2 * p + 1];
            }
            memcpy(g + DS + 2 * r, &x.d, 2);
            memcpy(g + DS + 32 + 2 * r, &x.dmin, 2);
        }
    }
}

// out[j * out_stride + 16 * g + r]: row 16g + r times column j, for `groups` groups of 16 rows
template <int N>
__attribute__((noinline)) void lanes_as_rows(const uint8_t *w, long groups, long nb, const block_q8_K *const *y,
                                             float *out, long out_stride) {
    const __m512i m4 = _mm512_set1_epi8(0x0F);
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
                        const int8_t *a = y[j][b].qs;
                        lo_sum[j] = _mm512_dpbusd_epi32(lo_sum[j], lo, _mm512_set1_epi32(*(const int32_t *) (a + 4 * q)));
                        hi_sum[j] = _mm512_dpbusd_epi32(hi_sum[j], hi, _mm512_set1_epi32(*(const int32_t *) (a + 128 + 4 * q)));
                    }
                }
                const __m512i sc_lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) (blk + SCALES + sb * 16)));
                const __m512i sc_hi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *) (blk + SCALES + (sb + 4) * 16)));
                for (int j = 0; j < N; j++)
                    s1[j] = _mm512_add_epi32(s1[j], _mm512_add_epi32(_mm512_mullo_epi32(lo_sum[j], sc_lo),
                                                                     _mm512_mullo_epi32(hi_sum[j], sc_hi)));
            }
            for (int p = 0; p < 4; p++) {  // the mins times the 32-element code sums of sub-blocks 2p, 2p + 1
                const __m512i pair = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *) (blk + MINS + p * 32)));
                for (int j = 0; j < N; j++) {
                    const int16_t *bs = y[j][b].bsums;
                    const uint32_t lo = (uint16_t) (bs[4 * p] + bs[4 * p + 1]), hi = (uint16_t) (bs[4 * p + 2] + bs[4 * p + 3]);
                    s2[j] = _mm512_dpwssd_epi32(s2[j], pair, _mm512_set1_epi32((int32_t) (lo | hi << 16)));
                }
            }
            const __m512 d0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (blk + DS)));
            const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (blk + DS + 32)));
            for (int j = 0; j < N; j++) {
                __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(s1[j]), d0);
                t = _mm512_fnmadd_ps(dm, _mm512_cvtepi32_ps(s2[j]), t);
                acc[j] = _mm512_fmadd_ps(t, _mm512_set1_ps(y[j][b].d), acc[j]);
            }
        }
        for (int j = 0; j < N; j++) _mm512_storeu_ps(out + j * out_stride + 16 * g, acc[j]);
    }
}

static void random_columns(std::mt19937 &rng, int n, long nb, block_q8_K *y) {
    std::uniform_int_distribution<int> q8(-127, 127);
    std::uniform_real_distribution<float> f(-2.0f, 2.0f);
    for (long i = 0; i < n * nb; i++) {
        y[i].d = f(rng);
        for (auto &c : y[i].qs) c = (int8_t) q8(rng);
        for (int k = 0; k < 16; k++) {
            int s = 0;
            for (int e = 0; e < 16; e++) s += y[i].qs[16 * k + e];
            y[i].bsums[k] = (int16_t) s;
        }
    }
}

template <int N>
static void time_it(const uint8_t *w, long groups, long nb, const block_q8_K *const *y, float *out, size_t bytes) {
    double resident = 1e9, streamed = 1e9;
    const long window = 16;  // groups in cache: 16 x nb x 2368 bytes
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        for (long c = 0; c < groups / window; c++) lanes_as_rows<N>(w, window, nb, y, out, groups * 16);
        double t1 = now();
        if (t1 - t0 < resident) resident = t1 - t0;
        t0 = now();
        lanes_as_rows<N>(w, groups, nb, y, out, groups * 16);
        t1 = now();
        if (t1 - t0 < streamed) streamed = t1 - t0;
    }
    const double row_blocks = (double) groups * 16 * nb;
    printf("N=%d  in cache %5.1f cycles a row-block   streamed %5.1f (%.1f GB/s)\n", N,
           resident * 3.65e9 / row_blocks, streamed * 3.65e9 / row_blocks, bytes / streamed / 1e9);
}

typedef void (*reference_t)(const block_q4_K *, long, int, const block_q8_K *const *, long, float *, long);

template <int N>
static bool check(void *lib, std::mt19937 &rng, long nb) {
    char name[128];
    snprintf(name, sizeof name, "_Z13la_exact_rowsI10block_q4_KLi%dEEvPKT_liPKPK10block_q8_KlPfl", N);
    reference_t reference = (reference_t) dlsym(lib, name);
    if (!reference) {
        printf("N=%d: %s is not in the library\n", N, name);
        return false;
    }
    const int rows = 256;
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> f(-0.05f, 0.05f);
    block_q4_K *w = new block_q4_K[rows * nb];
    for (long i = 0; i < rows * nb; i++) {
        for (auto &c : w[i].scales) c = (uint8_t) byte(rng);
        for (auto &c : w[i].qs) c = (uint8_t) byte(rng);
        w[i].d = _cvtss_sh(f(rng), 0);
        w[i].dmin = _cvtss_sh(f(rng), 0);
    }
    block_q8_K *act = new block_q8_K[N * nb];
    random_columns(rng, N, nb, act);
    const block_q8_K *y[N];
    for (int j = 0; j < N; j++) y[j] = act + j * nb;
    float *want = new float[rows * N], *got = new float[rows * N];
    reference(w, nb, rows, y, nb, want, rows);
    uint8_t *packed = (uint8_t *) aligned_alloc(64, (size_t) GROUP_BYTES * nb * rows / 16);
    for (int g = 0; g < rows / 16; g++) repack(w + g * 16 * nb, nb, packed + (size_t) g * nb * GROUP_BYTES);
    lanes_as_rows<N>(packed, rows / 16, nb, y, got, rows);
    int same = 0;
    for (int i = 0; i < rows * N; i++) same += memcmp(&want[i], &got[i], sizeof(float)) == 0;
    printf("N=%d, rows of %ld blocks: %d of %d results bit for bit la_exact_rows'\n", N, nb, same, rows * N);
    free(packed);
    delete[] w; delete[] act; delete[] want; delete[] got;
    return same == rows * N;
}

int main(int argc, char **argv) {
    std::mt19937 rng(7);
    if (argc > 1) {
        void *lib = dlopen(argv[1], RTLD_NOW);
        if (!lib) {
            fprintf(stderr, "%s\n", dlerror());
            return 2;
        }
        bool ok = true;
        for (long nb : {6L, 35L}) ok = check<2>(lib, rng, nb) & check<3>(lib, rng, nb) & check<4>(lib, rng, nb) & check<6>(lib, rng, nb) & ok;
        if (!ok) return 1;
    }
    const long nb = 6, groups = (1L << 20) / 16;  // 1M rows of 1536 elements, 931 MB: streamed from memory
    const size_t bytes = (size_t) groups * nb * GROUP_BYTES;
    uint8_t *w = (uint8_t *) aligned_alloc(64, bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t) (i * 2654435761u >> 13);
    block_q8_K act[8 * 6];
    random_columns(rng, 8, nb, act);
    const block_q8_K *y[8];
    for (int j = 0; j < 8; j++) y[j] = act + j * nb;
    float *out = (float *) aligned_alloc(64, (size_t) groups * 16 * 8 * sizeof(float));
    time_it<1>(w, groups, nb, y, out, bytes);
    time_it<2>(w, groups, nb, y, out, bytes);
    time_it<4>(w, groups, nb, y, out, bytes);
    time_it<6>(w, groups, nb, y, out, bytes);
    time_it<8>(w, groups, nb, y, out, bytes);
    return 0;
}
