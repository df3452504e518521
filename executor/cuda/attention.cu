/*
 * Causal multi-head attention in the manner of FlashAttention-2: the
 * T x T score matrix lives only in registers, tile by tile, and the
 * softmax is computed online. Three kernels on the tensor cores
 * (mma.sync m16n8k16, bf16 in, fp32 accumulate):
 *
 *   forward  one block per 64 queries of one (sequence, head): loops over
 *            the key tiles up to the diagonal, keeps O and the running
 *            max / sum, writes O (bf16) and the log-sum-exp (fp32).
 *   dK, dV   one block per 64 keys: loops over the query tiles from the
 *            diagonal on, recomputing P from the saved log-sum-exp.
 *   dQ       one block per 64 queries: loops over the key tiles again.
 *
 * Splitting dQ from dK/dV costs two extra tile products (Q K^T and
 * dO V^T are computed in both) but needs no atomics, so gradients are
 * the same on every run. Each warp owns 16 rows of its block; K, V (or
 * Q, dO) tiles stream through shared memory with cp.async, two buffers
 * deep. Rows are padded by 16 bytes so ldmatrix reads hit 32 distinct
 * banks.
 *
 * Scores are kept in base 2: s2 = q.k x scale x log2(e), so the
 * exponentials are exp2 (one instruction); the saved lse is
 * log2(sum exp2(s2)) + max.
 *
 * Head sizes other than 64 and 128 take the plain fallback kernels of
 * attention_plain.cu (one block per query or key row, no tensor cores),
 * correct but slow; GPT-2 uses 64 at every size.
 */
#include "executor/cuda/cuda_common.cuh"

#define ATT_ROWS 64      /* rows a block owns: queries (fwd, dQ), keys (dK) */
#define ATT_TILE 64      /* rows of the streamed tiles */
#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * WARP_SIZE)

/* --------------------------------------------------------- PTX helpers */

static __device__ inline uint32_t shared_address(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronously; zero-filled when !valid (the
 * source address must still be a valid one). */
static __device__ inline void copy_async16(void *shared, const void *global,
                                           bool valid)
{
    int source_bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     shared_address(shared)),
                 "l"(global), "r"(source_bytes));
}

static __device__ inline void copy_async_commit(void)
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int PENDING> static __device__ inline void copy_async_wait(void)
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

/* ldmatrix on a shared-memory address. volatile keeps it in order with
 * the barriers around the tiles; the products below are not volatile, so
 * the compiler may move them among the loads. */
static __device__ inline void load_matrix_x4(uint32_t r[4], uint32_t address)
{
    asm volatile(
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
        : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
        : "r"(address));
}

static __device__ inline void load_matrix_x4_trans(uint32_t r[4],
                                                   uint32_t address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, "
                 "%2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

/* c (16x8 fp32) += a (16x16 bf16, row) b (16x8 bf16, col). */
static __device__ inline void mma_16x8x16(float c[4], const uint32_t a[4],
                                          uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                   "r"(b1));
}

static __device__ inline uint32_t pack_bf16x2(float low, float high)
{
    bf16x2 pair = __floats2bfloat162_rn(low, high);
    return *reinterpret_cast<uint32_t *>(&pair);
}

/* ------------------------------------------------------ tile movements */

/*
 * Fragment addressing (see the PTX ISA, mma.m16n8k16 and ldmatrix):
 *   A, 16 rows x 16 k from a [row][k] tile: lane -> row (lane & 15),
 *     column (lane >> 4) x 8.
 *   B as two n-tiles of 8 x 16 k from an [n][k] tile (non-transposed):
 *     lane -> n (lane & 7) + (lane >> 4) x 8, k ((lane >> 3) & 1) x 8;
 *     registers: b0, b1 of n-tile 0, then b0, b1 of n-tile 1.
 *   B from a [k][n] tile (transposed): lane -> k (lane & 7) +
 *     ((lane >> 3) & 1) x 8, n (lane >> 4) x 8; same register order.
 */
/* Each lane's byte offset inside a tile for the three fragment kinds;
 * computed once per kernel, so a fragment load is one ldmatrix at
 * (tile address + lane offset + a compile-time offset). */
template <int STRIDE> static __device__ inline uint32_t a_lane(int lane)
{
    return (uint32_t)(((lane & 15) * STRIDE + (lane >> 4) * 8) * 2);
}

template <int STRIDE> static __device__ inline uint32_t b_lane(int lane)
{
    return (uint32_t)((((lane & 7) + (lane >> 4) * 8) * STRIDE +
                       ((lane >> 3) & 1) * 8) * 2);
}

template <int STRIDE> static __device__ inline uint32_t b_trans_lane(int lane)
{
    return (uint32_t)((((lane & 7) + ((lane >> 3) & 1) * 8) * STRIDE +
                       (lane >> 4) * 8) * 2);
}

/* `base` = shared address of the tile + the lane offset of that kind. */
template <int STRIDE>
static __device__ inline void load_a(uint32_t a[4], uint32_t base, int row0,
                                     int k0)
{
    load_matrix_x4(a, base + (uint32_t)((row0 * STRIDE + k0) * 2));
}

template <int STRIDE>
static __device__ inline void load_b(uint32_t b[4], uint32_t base, int n0,
                                     int k0)
{
    load_matrix_x4(b, base + (uint32_t)((n0 * STRIDE + k0) * 2));
}

template <int STRIDE>
static __device__ inline void load_b_trans(uint32_t b[4], uint32_t base,
                                           int k0, int n0)
{
    load_matrix_x4_trans(b, base + (uint32_t)((k0 * STRIDE + n0) * 2));
}

/* Starts copying rows [row0, row0 + ROWS) of one head (HD channels, rows
 * `row_stride` elements apart) into a padded shared tile; rows at or past
 * T are zero-filled. */
template <int HD, int ROWS>
static __device__ inline void load_tile_async(bf16 *tile, const bf16 *head,
                                              size_t row_stride, int row0,
                                              int T)
{
    constexpr int STRIDE = HD + 8;
    constexpr int CHUNKS = HD / 8;
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += ATT_THREADS) {
        int r = i / CHUNKS;
        int c = (i % CHUNKS) * 8;
        bool valid = row0 + r < T;
        const bf16 *source =
            head + (size_t)(valid ? row0 + r : 0) * row_stride + c;
        copy_async16(tile + r * STRIDE + c, source, valid);
    }
}

/* Writes a 16 x HD accumulator (rows row0 .. row0 + 15, scaled) to
 * global memory through 16 rows of shared memory that only this warp
 * uses, so the global stores are 16 bytes wide. */
template <int HD>
static __device__ inline void store_rows(bf16 *global_head, size_t row_stride,
                                         int row0, int T, float acc[][4],
                                         float scale0, float scale1,
                                         bf16 *rows, int lane)
{
    constexpr int STRIDE = HD + 8;
    constexpr int DTILES = HD / 8;
    int g = lane >> 2;
    int t = lane & 3;
#pragma unroll
    for (int d = 0; d < DTILES; d++) {
        int column = d * 8 + 2 * t;
        *reinterpret_cast<bf16x2 *>(rows + g * STRIDE + column) =
            __floats2bfloat162_rn(acc[d][0] * scale0, acc[d][1] * scale0);
        *reinterpret_cast<bf16x2 *>(rows + (g + 8) * STRIDE + column) =
            __floats2bfloat162_rn(acc[d][2] * scale1, acc[d][3] * scale1);
    }
    __syncwarp();
    constexpr int CHUNKS = HD / 8;
    for (int i = lane; i < 16 * CHUNKS; i += WARP_SIZE) {
        int r = i / CHUNKS;
        int c = (i % CHUNKS) * 8;
        int row = row0 + r;
        if (row < T)
            *reinterpret_cast<bf16x8 *>(global_head +
                                        (size_t)row * row_stride + c) =
                *reinterpret_cast<const bf16x8 *>(rows + r * STRIDE + c);
    }
}

/* ------------------------------------------------------------- forward */

/*
 * Each warp owns MT x 16 query rows (MT m-tiles), so every K or V
 * fragment it reads from shared memory feeds MT products: with MT = 2 the
 * shared-memory traffic per product halves (one m-tile per warp leaves
 * the kernel bound by ldmatrix, not the tensor cores).
 *
 * Long, on purpose (as the two backward kernels): the fragments of the
 * running output, maxima and sums live in registers across the loop over
 * key tiles, and the two-buffer cp.async pipeline interleaves loads with
 * products; cut into functions, the tile loop would have to pass those
 * arrays by reference and the compiler could no longer keep them in
 * registers.
 */
template <int HD, int MT>
__global__ void __launch_bounds__(ATT_THREADS)
attention_forward_kernel(bf16 *out, float *lse, const bf16 *qkv, int T,
                         int NH, float scale_log2)
{
    constexpr int STRIDE = HD + 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int DTILES = HD / 8;
    constexpr int STILES = ATT_TILE / 8;
    constexpr int ROWS = ATT_WARPS * 16 * MT;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    bf16 *q_tile = reinterpret_cast<bf16 *>(shared_raw);
    bf16 *k_tiles = q_tile + ROWS * STRIDE;
    bf16 *v_tiles = k_tiles + 2 * ATT_TILE * STRIDE;

    int query_block = gridDim.x - 1 - blockIdx.x; /* longest rows first */
    int b = blockIdx.y / NH;
    int h = blockIdx.y % NH;
    int C = NH * HD;
    size_t qkv_stride = 3 * (size_t)C;
    const bf16 *q_head = qkv + (size_t)b * T * qkv_stride + h * HD;
    const bf16 *k_head = q_head + C;
    const bf16 *v_head = q_head + 2 * C;
    int q0 = query_block * ROWS;
    int warp = threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    int g = lane >> 2;
    int t = lane & 3;
    int warp_row = warp * 16 * MT;           /* in the block's tile */
    int warp_q0 = q0 + warp_row;
    int warp_q_last = warp_q0 + 16 * MT - 1;

    constexpr uint32_t TILE_BYTES = ATT_TILE * STRIDE * 2;
    uint32_t q_a = shared_address(q_tile) + a_lane<STRIDE>(lane);
    uint32_t k_b0 = shared_address(k_tiles) + b_lane<STRIDE>(lane);
    uint32_t v_bt0 = shared_address(v_tiles) + b_trans_lane<STRIDE>(lane);
    load_tile_async<HD, ROWS>(q_tile, q_head, qkv_stride, q0, T);
    load_tile_async<HD, ATT_TILE>(k_tiles, k_head, qkv_stride, 0, T);
    load_tile_async<HD, ATT_TILE>(v_tiles, v_head, qkv_stride, 0, T);
    copy_async_commit();

    int key_end = min(q0 + ROWS, T);
    int key_tiles = (key_end + ATT_TILE - 1) / ATT_TILE;
    uint32_t q_frag[MT][KSTEPS][4];
    float o[MT][DTILES][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++) {
#pragma unroll
        for (int d = 0; d < DTILES; d++)
            o[m][d][0] = o[m][d][1] = o[m][d][2] = o[m][d][3] = 0.0f;
        row_max[m][0] = row_max[m][1] = -INFINITY;
        row_sum[m][0] = row_sum[m][1] = 0.0f;
    }

    for (int kt = 0; kt < key_tiles; kt++) {
        int buffer = kt & 1;
        if (kt + 1 < key_tiles) {
            int next = (kt + 1) * ATT_TILE;
            load_tile_async<HD, ATT_TILE>(
                k_tiles + (buffer ^ 1) * ATT_TILE * STRIDE, k_head,
                qkv_stride, next, T);
            load_tile_async<HD, ATT_TILE>(
                v_tiles + (buffer ^ 1) * ATT_TILE * STRIDE, v_head,
                qkv_stride, next, T);
        }
        copy_async_commit();
        copy_async_wait<1>();
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int ks = 0; ks < KSTEPS; ks++)
                    load_a<STRIDE>(q_frag[m][ks], q_a, warp_row + m * 16,
                                   ks * 16);
        }
        int k0 = kt * ATT_TILE;
        /* a tile wholly above this warp's diagonal adds nothing */
        if (k0 <= warp_q_last) {
            uint32_t k_b = k_b0 + buffer * TILE_BYTES;
            uint32_t v_bt = v_bt0 + buffer * TILE_BYTES;
            float s[MT][STILES][4];
#pragma unroll
            for (int m = 0; m < MT; m++)
#pragma unroll
                for (int j = 0; j < STILES; j++)
                    s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
                for (int np = 0; np < STILES / 2; np++) {
                    uint32_t bfrag[4];
                    load_b<STRIDE>(bfrag, k_b, np * 16, ks * 16);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        mma_16x8x16(s[m][2 * np], q_frag[m][ks], bfrag[0],
                                    bfrag[1]);
                        mma_16x8x16(s[m][2 * np + 1], q_frag[m][ks],
                                    bfrag[2], bfrag[3]);
                    }
                }
            }
            /* scores stay unscaled here: the scale rides in the
             * exponent's FFMA; masking only on tiles that reach the
             * diagonal or the end of the sequence */
            if (k0 + ATT_TILE - 1 > warp_q0 || k0 + ATT_TILE > T) {
#pragma unroll
                for (int m = 0; m < MT; m++)
#pragma unroll
                    for (int j = 0; j < STILES; j++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int key = k0 + j * 8 + 2 * t + (e & 1);
                            int query = warp_q0 + m * 16 + g + (e >> 1) * 8;
                            if (key > query || key >= T)
                                s[m][j][e] = -INFINITY;
                        }
            }
#pragma unroll
            for (int m = 0; m < MT; m++) {
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    float tile_max = row_max[m][r];
#pragma unroll
                    for (int j = 0; j < STILES; j++)
                        tile_max = fmaxf(tile_max, fmaxf(s[m][j][2 * r],
                                                         s[m][j][2 * r + 1]));
                    tile_max = fmaxf(tile_max,
                                     __shfl_xor_sync(FULL_MASK, tile_max, 1));
                    tile_max = fmaxf(tile_max,
                                     __shfl_xor_sync(FULL_MASK, tile_max, 2));
                    float reference =
                        tile_max == -INFINITY ? 0.0f : tile_max * scale_log2;
                    float correction =
                        fast_exp2(row_max[m][r] * scale_log2 - reference);
                    row_max[m][r] = tile_max;
                    row_sum[m][r] *= correction;
#pragma unroll
                    for (int d = 0; d < DTILES; d++) {
                        o[m][d][2 * r] *= correction;
                        o[m][d][2 * r + 1] *= correction;
                    }
#pragma unroll
                    for (int j = 0; j < STILES; j++) {
                        s[m][j][2 * r] = fast_exp2(
                            fmaf(s[m][j][2 * r], scale_log2, -reference));
                        s[m][j][2 * r + 1] = fast_exp2(
                            fmaf(s[m][j][2 * r + 1], scale_log2, -reference));
                        row_sum[m][r] += s[m][j][2 * r] + s[m][j][2 * r + 1];
                    }
                }
            }
#pragma unroll
            for (int kk = 0; kk < STILES / 2; kk++) {
                uint32_t a[MT][4];
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    a[m][0] = pack_bf16x2(s[m][2 * kk][0], s[m][2 * kk][1]);
                    a[m][1] = pack_bf16x2(s[m][2 * kk][2], s[m][2 * kk][3]);
                    a[m][2] = pack_bf16x2(s[m][2 * kk + 1][0],
                                          s[m][2 * kk + 1][1]);
                    a[m][3] = pack_bf16x2(s[m][2 * kk + 1][2],
                                          s[m][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DTILES / 2; dp++) {
                    uint32_t bfrag[4];
                    load_b_trans<STRIDE>(bfrag, v_bt, kk * 16, dp * 16);
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        mma_16x8x16(o[m][2 * dp], a[m], bfrag[0], bfrag[1]);
                        mma_16x8x16(o[m][2 * dp + 1], a[m], bfrag[2],
                                    bfrag[3]);
                    }
                }
            }
        }
        __syncthreads(); /* the next prefetch overwrites the other buffer */
    }

    bf16 *out_head = out + (size_t)b * T * C + h * HD;
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float inverse[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float sum = row_sum[m][r];
            sum += __shfl_xor_sync(FULL_MASK, sum, 1);
            sum += __shfl_xor_sync(FULL_MASK, sum, 2);
            inverse[r] = 1.0f / sum;
            int query = warp_q0 + m * 16 + g + r * 8;
            if (t == 0 && query < T)
                lse[(size_t)blockIdx.y * T + query] =
                    row_max[m][r] * scale_log2 + log2f(sum);
        }
        store_rows<HD>(out_head, C, warp_q0 + m * 16, T, o[m], inverse[0],
                       inverse[1], q_tile + (warp_row + m * 16) * STRIDE,
                       lane);
    }
}

/* ------------------------------------------------------------ backward */

/* dK and dV of one block of keys; long for the reason the forward kernel
 * gives (its accumulators stay in registers across the query loop). */
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dkdv_kernel(bf16 *d_qkv, const bf16 *d_out,
                               const bf16 *qkv, const float *lse,
                               const float *delta, int T, int NH,
                               float scale_log2, float scale)
{
    constexpr int STRIDE = HD + 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int DTILES = HD / 8;
    constexpr int STILES = ATT_TILE / 8;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    bf16 *k_tile = reinterpret_cast<bf16 *>(shared_raw);
    bf16 *v_tile = k_tile + ATT_ROWS * STRIDE;
    bf16 *q_tiles = v_tile + ATT_ROWS * STRIDE;
    bf16 *do_tiles = q_tiles + 2 * ATT_TILE * STRIDE;
    float *lse_tiles =
        reinterpret_cast<float *>(do_tiles + 2 * ATT_TILE * STRIDE);
    float *delta_tiles = lse_tiles + 2 * ATT_TILE;

    int key_block = blockIdx.x; /* low keys see the most queries: first */
    int bh = blockIdx.y;
    int b = bh / NH;
    int h = bh % NH;
    int C = NH * HD;
    size_t qkv_stride = 3 * (size_t)C;
    const bf16 *q_head = qkv + (size_t)b * T * qkv_stride + h * HD;
    const bf16 *k_head = q_head + C;
    const bf16 *v_head = q_head + 2 * C;
    const bf16 *do_head = d_out + (size_t)b * T * C + h * HD;
    const float *lse_row = lse + (size_t)bh * T;
    const float *delta_row = delta + (size_t)bh * T;
    int k0 = key_block * ATT_ROWS;
    int warp = threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    int g = lane >> 2;
    int t = lane & 3;

    int first_tile = k0 / ATT_TILE;
    int query_tiles = (T + ATT_TILE - 1) / ATT_TILE;
    constexpr uint32_t TILE_BYTES = ATT_TILE * STRIDE * 2;
    uint32_t k_a = shared_address(k_tile) + a_lane<STRIDE>(lane);
    uint32_t v_a = shared_address(v_tile) + a_lane<STRIDE>(lane);
    uint32_t q_b0 = shared_address(q_tiles) + b_lane<STRIDE>(lane);
    uint32_t q_bt0 = shared_address(q_tiles) + b_trans_lane<STRIDE>(lane);
    uint32_t do_b0 = shared_address(do_tiles) + b_lane<STRIDE>(lane);
    uint32_t do_bt0 = shared_address(do_tiles) + b_trans_lane<STRIDE>(lane);
    load_tile_async<HD, ATT_ROWS>(k_tile, k_head, qkv_stride, k0, T);
    load_tile_async<HD, ATT_ROWS>(v_tile, v_head, qkv_stride, k0, T);

    uint32_t k_frag[KSTEPS][4];
    uint32_t v_frag[KSTEPS][4];
    float dk[DTILES][4];
    float dv[DTILES][4];
#pragma unroll
    for (int d = 0; d < DTILES; d++) {
        dk[d][0] = dk[d][1] = dk[d][2] = dk[d][3] = 0.0f;
        dv[d][0] = dv[d][1] = dv[d][2] = dv[d][3] = 0.0f;
    }

    for (int qt = first_tile; qt < query_tiles; qt++) {
        int buffer = (qt - first_tile) & 1;
        if (qt == first_tile) {
            /* the first query tile joins the K / V group */
            int q0 = qt * ATT_TILE;
            load_tile_async<HD, ATT_TILE>(q_tiles, q_head, qkv_stride, q0, T);
            load_tile_async<HD, ATT_TILE>(do_tiles, do_head, C, q0, T);
            for (int i = threadIdx.x; i < ATT_TILE; i += ATT_THREADS) {
                bool valid = q0 + i < T;
                lse_tiles[i] = valid ? lse_row[q0 + i] : INFINITY;
                delta_tiles[i] = valid ? delta_row[q0 + i] : 0.0f;
            }
            copy_async_commit();
        }
        if (qt + 1 < query_tiles) {
            int next = (qt + 1) * ATT_TILE;
            int other = buffer ^ 1;
            load_tile_async<HD, ATT_TILE>(q_tiles + other * ATT_TILE * STRIDE,
                                          q_head, qkv_stride, next, T);
            load_tile_async<HD, ATT_TILE>(do_tiles + other * ATT_TILE * STRIDE,
                                          do_head, C, next, T);
            for (int i = threadIdx.x; i < ATT_TILE; i += ATT_THREADS) {
                bool valid = next + i < T;
                lse_tiles[other * ATT_TILE + i] =
                    valid ? lse_row[next + i] : INFINITY;
                delta_tiles[other * ATT_TILE + i] =
                    valid ? delta_row[next + i] : 0.0f;
            }
        }
        copy_async_commit();
        copy_async_wait<1>();
        __syncthreads();
        if (qt == first_tile) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                load_a<STRIDE>(k_frag[ks], k_a, warp * 16, ks * 16);
                load_a<STRIDE>(v_frag[ks], v_a, warp * 16, ks * 16);
            }
        }
        uint32_t q_b = q_b0 + buffer * TILE_BYTES;
        uint32_t q_bt = q_bt0 + buffer * TILE_BYTES;
        uint32_t do_b = do_b0 + buffer * TILE_BYTES;
        uint32_t do_bt = do_bt0 + buffer * TILE_BYTES;
        const float *lse_tile = lse_tiles + buffer * ATT_TILE;
        const float *delta_tile = delta_tiles + buffer * ATT_TILE;
        int q0 = qt * ATT_TILE;

        /* S^T = K Q^T: rows keys, columns queries */
        float p[STILES][4];
#pragma unroll
        for (int j = 0; j < STILES; j++)
            p[j][0] = p[j][1] = p[j][2] = p[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int np = 0; np < STILES / 2; np++) {
                uint32_t bfrag[4];
                load_b<STRIDE>(bfrag, q_b, np * 16, ks * 16);
                mma_16x8x16(p[2 * np], k_frag[ks], bfrag[0], bfrag[1]);
                mma_16x8x16(p[2 * np + 1], k_frag[ks], bfrag[2], bfrag[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < STILES; j++) {
            float2 column_lse =
                *reinterpret_cast<const float2 *>(lse_tile + j * 8 + 2 * t);
            p[j][0] = fast_exp2(fmaf(p[j][0], scale_log2, -column_lse.x));
            p[j][1] = fast_exp2(fmaf(p[j][1], scale_log2, -column_lse.y));
            p[j][2] = fast_exp2(fmaf(p[j][2], scale_log2, -column_lse.x));
            p[j][3] = fast_exp2(fmaf(p[j][3], scale_log2, -column_lse.y));
        }
        if (q0 < k0 + ATT_ROWS) { /* the diagonal tile: queries before keys */
#pragma unroll
            for (int j = 0; j < STILES; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int query = q0 + j * 8 + 2 * t + (e & 1);
                    int key = k0 + warp * 16 + g + (e >> 1) * 8;
                    if (query < key)
                        p[j][e] = 0.0f;
                }
        }
        /* dV += P^T dO */
#pragma unroll
        for (int kk = 0; kk < STILES / 2; kk++) {
            uint32_t a[4] = {
                pack_bf16x2(p[2 * kk][0], p[2 * kk][1]),
                pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3]),
            };
#pragma unroll
            for (int dp = 0; dp < DTILES / 2; dp++) {
                uint32_t bfrag[4];
                load_b_trans<STRIDE>(bfrag, do_bt, kk * 16, dp * 16);
                mma_16x8x16(dv[2 * dp], a, bfrag[0], bfrag[1]);
                mma_16x8x16(dv[2 * dp + 1], a, bfrag[2], bfrag[3]);
            }
        }
        /* dP^T = V dO^T */
        float ds[STILES][4];
#pragma unroll
        for (int j = 0; j < STILES; j++)
            ds[j][0] = ds[j][1] = ds[j][2] = ds[j][3] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int np = 0; np < STILES / 2; np++) {
                uint32_t bfrag[4];
                load_b<STRIDE>(bfrag, do_b, np * 16, ks * 16);
                mma_16x8x16(ds[2 * np], v_frag[ks], bfrag[0], bfrag[1]);
                mma_16x8x16(ds[2 * np + 1], v_frag[ks], bfrag[2], bfrag[3]);
            }
        }
        /* dS^T = P^T (dP^T - delta) */
#pragma unroll
        for (int j = 0; j < STILES; j++) {
            float2 column_delta =
                *reinterpret_cast<const float2 *>(delta_tile + j * 8 + 2 * t);
            ds[j][0] = p[j][0] * (ds[j][0] - column_delta.x);
            ds[j][1] = p[j][1] * (ds[j][1] - column_delta.y);
            ds[j][2] = p[j][2] * (ds[j][2] - column_delta.x);
            ds[j][3] = p[j][3] * (ds[j][3] - column_delta.y);
        }
        /* dK += dS^T Q */
#pragma unroll
        for (int kk = 0; kk < STILES / 2; kk++) {
            uint32_t a[4] = {
                pack_bf16x2(ds[2 * kk][0], ds[2 * kk][1]),
                pack_bf16x2(ds[2 * kk][2], ds[2 * kk][3]),
                pack_bf16x2(ds[2 * kk + 1][0], ds[2 * kk + 1][1]),
                pack_bf16x2(ds[2 * kk + 1][2], ds[2 * kk + 1][3]),
            };
#pragma unroll
            for (int dp = 0; dp < DTILES / 2; dp++) {
                uint32_t bfrag[4];
                load_b_trans<STRIDE>(bfrag, q_bt, kk * 16, dp * 16);
                mma_16x8x16(dk[2 * dp], a, bfrag[0], bfrag[1]);
                mma_16x8x16(dk[2 * dp + 1], a, bfrag[2], bfrag[3]);
            }
        }
        __syncthreads();
    }
    bf16 *dk_head = d_qkv + (size_t)b * T * qkv_stride + C + h * HD;
    bf16 *dv_head = dk_head + C;
    store_rows<HD>(dk_head, qkv_stride, k0 + warp * 16, T, dk, scale, scale,
                   k_tile + warp * 16 * STRIDE, lane);
    store_rows<HD>(dv_head, qkv_stride, k0 + warp * 16, T, dv, 1.0f, 1.0f,
                   v_tile + warp * 16 * STRIDE, lane);
}

/*
 * Runs before the dK / dV kernel: besides dQ it computes delta = dO . O
 * of its query rows (from an O tile it loads) and writes it for that
 * kernel. Long for the reason the forward kernel gives.
 */
template <int HD>
__global__ void __launch_bounds__(ATT_THREADS)
attention_backward_dq_kernel(bf16 *d_qkv, const bf16 *d_out, const bf16 *qkv,
                             const bf16 *out, const float *lse, float *delta,
                             int T, int NH, float scale_log2, float scale)
{
    constexpr int STRIDE = HD + 8;
    constexpr int KSTEPS = HD / 16;
    constexpr int DTILES = HD / 8;
    constexpr int STILES = ATT_TILE / 8;
    extern __shared__ __align__(16) unsigned char shared_raw[];
    bf16 *q_tile = reinterpret_cast<bf16 *>(shared_raw);
    bf16 *do_tile = q_tile + ATT_ROWS * STRIDE;
    bf16 *o_tile = do_tile + ATT_ROWS * STRIDE;
    bf16 *k_tiles = o_tile + ATT_ROWS * STRIDE;
    bf16 *v_tiles = k_tiles + 2 * ATT_TILE * STRIDE;

    int query_block = gridDim.x - 1 - blockIdx.x;
    int bh = blockIdx.y;
    int b = bh / NH;
    int h = bh % NH;
    int C = NH * HD;
    size_t qkv_stride = 3 * (size_t)C;
    const bf16 *q_head = qkv + (size_t)b * T * qkv_stride + h * HD;
    const bf16 *k_head = q_head + C;
    const bf16 *v_head = q_head + 2 * C;
    const bf16 *do_head = d_out + (size_t)b * T * C + h * HD;
    int q0 = query_block * ATT_ROWS;
    int warp = threadIdx.x / WARP_SIZE;
    int lane = threadIdx.x % WARP_SIZE;
    int g = lane >> 2;
    int t = lane & 3;

    constexpr uint32_t TILE_BYTES = ATT_TILE * STRIDE * 2;
    uint32_t q_a = shared_address(q_tile) + a_lane<STRIDE>(lane);
    uint32_t do_a = shared_address(do_tile) + a_lane<STRIDE>(lane);
    uint32_t k_b0 = shared_address(k_tiles) + b_lane<STRIDE>(lane);
    uint32_t k_bt0 = shared_address(k_tiles) + b_trans_lane<STRIDE>(lane);
    uint32_t v_b0 = shared_address(v_tiles) + b_lane<STRIDE>(lane);
    load_tile_async<HD, ATT_ROWS>(q_tile, q_head, qkv_stride, q0, T);
    load_tile_async<HD, ATT_ROWS>(do_tile, do_head, C, q0, T);
    load_tile_async<HD, ATT_ROWS>(o_tile, out + (size_t)b * T * C + h * HD,
                                  C, q0, T);
    load_tile_async<HD, ATT_TILE>(k_tiles, k_head, qkv_stride, 0, T);
    load_tile_async<HD, ATT_TILE>(v_tiles, v_head, qkv_stride, 0, T);
    copy_async_commit();

    float row_lse[2], row_delta[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int query = q0 + warp * 16 + g + r * 8;
        row_lse[r] = query < T ? lse[(size_t)bh * T + query] : INFINITY;
    }

    int key_tiles = (q0 + ATT_ROWS + ATT_TILE - 1) / ATT_TILE;
    uint32_t q_frag[KSTEPS][4];
    uint32_t do_frag[KSTEPS][4];
    float dq[DTILES][4];
#pragma unroll
    for (int d = 0; d < DTILES; d++)
        dq[d][0] = dq[d][1] = dq[d][2] = dq[d][3] = 0.0f;

    for (int kt = 0; kt < key_tiles; kt++) {
        int buffer = kt & 1;
        if (kt + 1 < key_tiles) {
            int next = (kt + 1) * ATT_TILE;
            load_tile_async<HD, ATT_TILE>(
                k_tiles + (buffer ^ 1) * ATT_TILE * STRIDE, k_head,
                qkv_stride, next, T);
            load_tile_async<HD, ATT_TILE>(
                v_tiles + (buffer ^ 1) * ATT_TILE * STRIDE, v_head,
                qkv_stride, next, T);
        }
        copy_async_commit();
        copy_async_wait<1>();
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int ks = 0; ks < KSTEPS; ks++) {
                load_a<STRIDE>(q_frag[ks], q_a, warp * 16, ks * 16);
                load_a<STRIDE>(do_frag[ks], do_a, warp * 16, ks * 16);
            }
            /* delta of the warp's 16 rows: two lanes per row, half the
             * head each; rows past T are zero tiles and give 0 */
            int own = lane >> 1;
            int half = (lane & 1) * (HD / 2);
            const bf16 *dy = do_tile + (warp * 16 + own) * STRIDE + half;
            const bf16 *y = o_tile + (warp * 16 + own) * STRIDE + half;
            float dot = 0.0f;
#pragma unroll
            for (int c = 0; c < HD / 2; c += 8) {
                float a[8], bb[8];
                bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(dy + c), a);
                bf16x8_to_float(*reinterpret_cast<const bf16x8 *>(y + c), bb);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    dot += a[i] * bb[i];
            }
            dot += __shfl_xor_sync(FULL_MASK, dot, 1);
            row_delta[0] = __shfl_sync(FULL_MASK, dot, 2 * g);
            row_delta[1] = __shfl_sync(FULL_MASK, dot, 2 * (g + 8));
            int own_row = q0 + warp * 16 + own;
            if ((lane & 1) == 0 && own_row < T)
                delta[(size_t)bh * T + own_row] = dot;
        }
        uint32_t k_b = k_b0 + buffer * TILE_BYTES;
        uint32_t k_bt = k_bt0 + buffer * TILE_BYTES;
        uint32_t v_b = v_b0 + buffer * TILE_BYTES;
        int k0 = kt * ATT_TILE;

        float p[STILES][4];
        float ds[STILES][4];
#pragma unroll
        for (int j = 0; j < STILES; j++) {
            p[j][0] = p[j][1] = p[j][2] = p[j][3] = 0.0f;
            ds[j][0] = ds[j][1] = ds[j][2] = ds[j][3] = 0.0f;
        }
#pragma unroll
        for (int ks = 0; ks < KSTEPS; ks++) {
#pragma unroll
            for (int np = 0; np < STILES / 2; np++) {
                uint32_t bfrag[4];
                load_b<STRIDE>(bfrag, k_b, np * 16, ks * 16);
                mma_16x8x16(p[2 * np], q_frag[ks], bfrag[0], bfrag[1]);
                mma_16x8x16(p[2 * np + 1], q_frag[ks], bfrag[2], bfrag[3]);
                load_b<STRIDE>(bfrag, v_b, np * 16, ks * 16);
                mma_16x8x16(ds[2 * np], do_frag[ks], bfrag[0], bfrag[1]);
                mma_16x8x16(ds[2 * np + 1], do_frag[ks], bfrag[2], bfrag[3]);
            }
        }
#pragma unroll
        for (int j = 0; j < STILES; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                p[j][e] =
                    fast_exp2(fmaf(p[j][e], scale_log2, -row_lse[e >> 1]));
        if (k0 + ATT_TILE > q0 || k0 + ATT_TILE > T) {
#pragma unroll
            for (int j = 0; j < STILES; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int key = k0 + j * 8 + 2 * t + (e & 1);
                    int query = q0 + warp * 16 + g + (e >> 1) * 8;
                    if (key > query || key >= T)
                        p[j][e] = 0.0f;
                }
        }
#pragma unroll
        for (int j = 0; j < STILES; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                ds[j][e] = p[j][e] * (ds[j][e] - row_delta[e >> 1]);
        /* dQ += dS K */
#pragma unroll
        for (int kk = 0; kk < STILES / 2; kk++) {
            uint32_t a[4] = {
                pack_bf16x2(ds[2 * kk][0], ds[2 * kk][1]),
                pack_bf16x2(ds[2 * kk][2], ds[2 * kk][3]),
                pack_bf16x2(ds[2 * kk + 1][0], ds[2 * kk + 1][1]),
                pack_bf16x2(ds[2 * kk + 1][2], ds[2 * kk + 1][3]),
            };
#pragma unroll
            for (int dp = 0; dp < DTILES / 2; dp++) {
                uint32_t bfrag[4];
                load_b_trans<STRIDE>(bfrag, k_bt, kk * 16, dp * 16);
                mma_16x8x16(dq[2 * dp], a, bfrag[0], bfrag[1]);
                mma_16x8x16(dq[2 * dp + 1], a, bfrag[2], bfrag[3]);
            }
        }
        __syncthreads();
    }
    bf16 *dq_head = d_qkv + (size_t)b * T * qkv_stride + h * HD;
    store_rows<HD>(dq_head, qkv_stride, q0 + warp * 16, T, dq, scale, scale,
                   q_tile + warp * 16 * STRIDE, lane);
}

/* ----------------------------------------------------------- launchers */

static size_t tile_bytes(int HD)
{
    return (size_t)ATT_TILE * (HD + 8) * sizeof(bf16);
}

/* m-tiles (16 query rows each) per warp in the head-size-64 forward. On
 * an H100, 2 (two resident blocks per SM at 251 registers) measured 1.5 %
 * faster per forward than 1 (three blocks at 132 registers) once the
 * fragment addresses were precomputed; before that, 1 was faster. */
#ifndef ATTENTION_FORWARD_M_TILES
#define ATTENTION_FORWARD_M_TILES 2
#endif

template <int HD, int MT>
static cudaError_t launch_forward(bf16 *out, float *lse, const bf16 *qkv,
                                  int B, int T, int NH, float scale_log2,
                                  cudaStream_t stream)
{
    constexpr int rows = ATT_WARPS * 16 * MT;
    size_t shared = (size_t)(rows + 4 * ATT_TILE) * (HD + 8) * sizeof(bf16);
    cudaError_t status = cudaFuncSetAttribute(
        attention_forward_kernel<HD, MT>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)shared);
    if (status != cudaSuccess)
        return status;
    dim3 grid((unsigned)((T + rows - 1) / rows), (unsigned)(B * NH));
    attention_forward_kernel<HD, MT><<<grid, ATT_THREADS, shared, stream>>>(
        out, lse, qkv, T, NH, scale_log2);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_forward(pt_bf16 *out_bf16, float *lse,
                                              const pt_bf16 *qkv_bf16, int B,
                                              int T, int C, int NH,
                                              cudaStream_t stream)
{
    int HD = C / NH;
    float scale_log2 = LOG2E_F / sqrtf((float)HD);
    bf16 *out = as_bf16(out_bf16);
    const bf16 *qkv = as_bf16(qkv_bf16);
    if (HD == 64)
        return launch_forward<64, ATTENTION_FORWARD_M_TILES>(
            out, lse, qkv, B, T, NH, scale_log2, stream);
    if (HD == 128)
        return launch_forward<128, 1>(out, lse, qkv, B, T, NH, scale_log2,
                                      stream);
    return cuda_attention_forward_plain(out_bf16, lse, qkv_bf16, B, T, C, NH,
                                        stream);
}

template <int HD>
static cudaError_t launch_backward(bf16 *d_qkv, const bf16 *d_out,
                                   const bf16 *qkv, const bf16 *out,
                                   const float *lse, float *delta, int B,
                                   int T, int NH,
                                   float scale_log2, float scale,
                                   cudaStream_t stream)
{
    size_t dkdv_shared = 6 * tile_bytes(HD) + 4 * ATT_TILE * sizeof(float);
    size_t dq_shared = 7 * tile_bytes(HD);
    cudaError_t status = cudaFuncSetAttribute(
        attention_backward_dkdv_kernel<HD>,
        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_shared);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(
            attention_backward_dq_kernel<HD>,
            cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dq_shared);
    if (status != cudaSuccess)
        return status;
    dim3 grid((unsigned)((T + ATT_ROWS - 1) / ATT_ROWS), (unsigned)(B * NH));
    /* dQ first: it writes the delta the dK / dV kernel reads */
    attention_backward_dq_kernel<HD><<<grid, ATT_THREADS, dq_shared,
                                       stream>>>(
        d_qkv, d_out, qkv, out, lse, delta, T, NH, scale_log2, scale);
    attention_backward_dkdv_kernel<HD><<<grid, ATT_THREADS, dkdv_shared,
                                         stream>>>(
        d_qkv, d_out, qkv, lse, delta, T, NH, scale_log2, scale);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_attention_backward(
    pt_bf16 *d_qkv_bf16, const pt_bf16 *d_out_bf16, const pt_bf16 *qkv_bf16,
    const pt_bf16 *out_bf16, const float *lse, float *scratch, int B, int T,
    int C, int NH, cudaStream_t stream)
{
    int HD = C / NH;
    float scale = 1.0f / sqrtf((float)HD);
    float scale_log2 = LOG2E_F * scale;
    bf16 *d_qkv = as_bf16(d_qkv_bf16);
    const bf16 *d_out = as_bf16(d_out_bf16);
    const bf16 *qkv = as_bf16(qkv_bf16);
    float *delta = scratch;
    const bf16 *out = as_bf16(out_bf16);
    if (HD == 64)
        return launch_backward<64>(d_qkv, d_out, qkv, out, lse, delta, B, T,
                                   NH, scale_log2, scale, stream);
    if (HD == 128)
        return launch_backward<128>(d_qkv, d_out, qkv, out, lse, delta, B, T,
                                    NH, scale_log2, scale, stream);
    return cuda_attention_backward_plain(d_qkv_bf16, d_out_bf16, qkv_bf16,
                                         out_bf16, lse, scratch, B, T, C, NH,
                                         stream);
}
