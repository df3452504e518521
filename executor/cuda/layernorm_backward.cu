/*
 * Layer norm's and RMSNorm's backward (layernorm.cu has their forward;
 * RMS is the same template flag), fused with the residual branch point
 * (d_inp = d_residual + the norm's own term): it writes d_inp in fp32
 * and/or the bf16 copy the next matrix products read, and adds the
 * weight and bias gradients, in one kernel: a team of 1, 2, 4 or 8
 * warps takes a row at a time, each block sums dy x xhat and dy over its
 * rows, writes them as its partial row, and the last block of each group
 * of blocks to finish sums the group's partials, the last group the
 * groups' sums (a fixed order everywhere, so results do not change
 * between runs). Rows wider than FUSED_MAX_COLUMNS or not 16-byte
 * vectorisable take two generic kernels (rows, then partials).
 *
 * Where the forward's output was not kept, the backward may write it
 * again as it goes (norm_out: the row's values are in registers, so it
 * costs one write of the row, where a forward pass of its own read the
 * input once more): the same expression as the forward's
 * (norm_output_value), so the same bits.
 */

#include <atomic>

#include "executor/cuda/cuda_common.cuh"

#define BACKWARD_THREADS 256
#define BACKWARD_ROWS CUDA_LAYERNORM_BACKWARD_ROWS /* kernel_sizes.h */
#define FUSED_MAX_COLUMNS 8192 /* a team of 8 warps x 4 groups of 8 */
#define FUSED_GROUP_BLOCKS CUDA_LAYERNORM_GROUP_BLOCKS /* kernel_sizes.h */

/* ------------------------------------ the fused backward's shared parts */

/* What the fused backward reads and writes (cuda_layernorm_backward's
 * arguments; partials and counters: its scratch, see
 * cuda_layernorm_backward_scratch). */
struct layernorm_backward_args {
    float *d_inp;                /* may be NULL: d_inp_bf16 alone */
    bf16 *d_inp_bf16;            /* may be NULL (not with d_inp NULL) */
    cuda_grad d_weight, d_bias;  /* added to; either's data may be NULL */
    float *partials;             /* blocks x 2C, then groups x 2C */
    unsigned int *counters;      /* groups + 1, zero between calls */
    const float *d_residual;     /* may be NULL, may equal d_inp */
    const bf16 *d_residual_bf16; /* used when d_residual is NULL; may be
                                  * NULL, may equal d_inp_bf16 */
    const bf16 *d_out;
    const bf16 *inp;
    const float *weight, *mean, *rstd; /* mean: NULL under RMSNorm */
    int N, C;
};

/* The forward's output written again (the kernels' OUTPUT flag): a
 * kernel argument of its own, as fields of layernorm_backward_args made
 * ptxas spill more in the kernels without it (layer norm's one-warp-row
 * backward at G = 7, its sums then in registers: 116 bytes of spill
 * loads to 200). */
struct norm_output_args {
    bf16 *out;
    const float *bias; /* layer norm's bias */
};

/* The norm's output of one value from xhat = (x - mean) rstd, written
 * as layernorm.cu's forward writes it (RMS: x rstd w, without the mean
 * subtracted: xhat is x rstd). */
template <bool RMS>
static __device__ __forceinline__ float norm_output_value(float xhat, float w,
                                                          float b)
{
    return RMS ? xhat * w : xhat * w + b;
}

/* Counts the block in at *counter after its writes (fenced first); true
 * in every thread of the block that completes the count (`expected`
 * blocks), which then zeroes the counter for the next call and sees the
 * other blocks' writes. */
static __device__ bool arrive_last(unsigned int *counter,
                                   unsigned int expected)
{
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(counter, 1u) + 1u == expected;
        if (last)
            *counter = 0u;
    }
    __syncthreads();
    if (last)
        __threadfence();
    return last;
}

/* The column sums of count rows of 2C floats (dw | db), in row order, 4
 * columns a thread at a time (read through L2: other blocks wrote them);
 * `columns`: 2C, or C where there is no bias (RMSNorm: the bias half is
 * zeros, neither read nor written). Written to out, or added to d_weight
 * (columns < C) and d_bias when out is NULL. */
static __device__ void sum_rows(float *out, const cuda_grad *d_weight,
                                const cuda_grad *d_bias, const float *rows,
                                int count, int C, int columns)
{
    int C2 = 2 * C;
    for (int j = threadIdx.x * 4; j < columns; j += blockDim.x * 4) {
        float4 total = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int r = 0; r < count; r++) {
            float4 v = __ldcg(
                reinterpret_cast<const float4 *>(rows + (size_t)r * C2 + j));
            total.x += v.x;
            total.y += v.y;
            total.z += v.z;
            total.w += v.w;
        }
        if (out != NULL) {
            *reinterpret_cast<float4 *>(out + j) = total;
            continue;
        }
        const cuda_grad *grad = j < C ? d_weight : d_bias;
        size_t at = (size_t)(j < C ? j : j - C);
        if (grad->data != NULL) {
            grad_add(*grad, at, total.x);
            grad_add(*grad, at + 1, total.y);
            grad_add(*grad, at + 2, total.z);
            grad_add(*grad, at + 3, total.w);
        }
    }
}

/* After every block has written its partial row (dw | db, 2C floats):
 * the last block of each group to finish sums the group's rows, the last
 * group the groups' sums into the gradients. */
template <bool RMS>
static __device__ void add_partial_rows(const layernorm_backward_args &a)
{
    int columns = RMS ? a.C : 2 * a.C;
    size_t C2 = 2 * (size_t)a.C;
    int blocks = gridDim.x;
    int groups = (blocks + FUSED_GROUP_BLOCKS - 1) / FUSED_GROUP_BLOCKS;
    int group = blockIdx.x / FUSED_GROUP_BLOCKS;
    int group_first = group * FUSED_GROUP_BLOCKS;
    int group_size = min(FUSED_GROUP_BLOCKS, blocks - group_first);
    float *group_sums = a.partials + (size_t)blocks * C2;
    if (!arrive_last(&a.counters[group], (unsigned int)group_size))
        return;
    sum_rows(group_sums + group * C2, &a.d_weight, &a.d_bias,
             a.partials + group_first * C2, group_size, a.C, columns);
    if (!arrive_last(&a.counters[groups], (unsigned int)groups))
        return;
    sum_rows(NULL, &a.d_weight, &a.d_bias, group_sums, groups, a.C,
             columns);
}

/* ---------------------------------------------------- generic backward */

/*
 * The generic backward (C % 8 != 0, unaligned tensors, or C above
 * FUSED_MAX_COLUMNS), in two kernels. A block owns BACKWARD_ROWS rows.
 * Phase 1, row-parallel: one warp per row writes d_inp (fp32 and bf16)
 * and, where norm_out is not NULL, the norm's output again.
 * Phase 2, column-parallel: each thread sums dy x xhat and dy of 8
 * columns (VECTOR) over a share of the block's rows (re-read from L2,
 * where phase 1 just left them); the shares are added in order in shared
 * memory and written as the block's partials (partials[block][0..C)
 * weight, [C..2C) bias). One kernel, and so one long function: the two
 * phases share the block's rows through L2 and its shared memory, which
 * a second kernel or a call would not keep.
 */
#define PARTIAL_SPACE (BACKWARD_THREADS * 16)

/* VECTOR channels of dy, x (bf16) and the weight, widened to fp32. */
template <int VECTOR>
static __device__ inline void load_group(float *dy, float *x, float *w,
                                         const bf16 *d_out, const bf16 *inp,
                                         const float *weight)
{
    if (VECTOR == 8) {
        load8(dy, d_out);
        load8(x, inp);
        load8(w, weight);
    } else {
        dy[0] = __bfloat162float(d_out[0]);
        x[0] = __bfloat162float(inp[0]);
        w[0] = weight[0];
    }
}

template <int VECTOR, bool RMS>
__global__ void __launch_bounds__(BACKWARD_THREADS)
layernorm_backward_generic(float *d_inp, bf16 *d_inp_bf16, bf16 *norm_out,
                          float *partials, const float *d_residual,
                          const bf16 *d_residual_bf16, const bf16 *d_out,
                          const bf16 *inp, const float *weight,
                          const float *bias, const float *mean,
                          const float *rstd, int N, int C)
{
    __shared__ float shares[PARTIAL_SPACE];
    int lane = threadIdx.x % WARP_SIZE;
    int warp = threadIdx.x / WARP_SIZE;
    int warps = blockDim.x / WARP_SIZE;
    int first_row = blockIdx.x * BACKWARD_ROWS;
    int last_row = min(first_row + BACKWARD_ROWS, N);
    for (int row = first_row + warp; row < last_row; row += warps) {
        size_t base = (size_t)row * C;
        float row_mean = RMS ? 0.0f : mean[row];
        float row_rstd = rstd[row];
        float g_sum = 0.0f;
        float g_xhat_sum = 0.0f;
        for (int c = lane * VECTOR; c < C; c += WARP_SIZE * VECTOR) {
            float dy[VECTOR], x[VECTOR], w[VECTOR];
            load_group<VECTOR>(dy, x, w, d_out + base + c, inp + base + c,
                               weight + c);
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                float g = dy[i] * w[i];
                g_sum += g;
                g_xhat_sum += g * (x[i] - row_mean) * row_rstd;
            }
        }
        float g_mean = RMS ? 0.0f : warp_sum(g_sum) / (float)C;
        float g_xhat_mean = warp_sum(g_xhat_sum) / (float)C;
        for (int c = lane * VECTOR; c < C; c += WARP_SIZE * VECTOR) {
            float dy[VECTOR], x[VECTOR], w[VECTOR], value[VECTOR];
            load_group<VECTOR>(dy, x, w, d_out + base + c, inp + base + c,
                               weight + c);
            float residual[VECTOR];
#pragma unroll
            for (int i = 0; i < VECTOR; i++)
                residual[i] = 0.0f;
            if (d_residual != NULL) {
                if (VECTOR == 8)
                    load8(residual, d_residual + base + c);
                else
                    residual[0] = d_residual[base + c];
            } else if (d_residual_bf16 != NULL) {
                if (VECTOR == 8)
                    load8(residual, d_residual_bf16 + base + c);
                else
                    residual[0] = __bfloat162float(d_residual_bf16[base + c]);
            }
            float out[VECTOR];
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                float xhat = (x[i] - row_mean) * row_rstd;
                value[i] = residual[i] + row_rstd * (dy[i] * w[i] - g_mean -
                                                     xhat * g_xhat_mean);
                out[i] = norm_output_value<RMS>(
                    xhat, w[i], RMS || norm_out == NULL ? 0.0f : bias[c + i]);
            }
            if (VECTOR == 8) {
                if (d_inp != NULL)
                    store8(d_inp + base + c, value);
                if (d_inp_bf16 != NULL)
                    store8(d_inp_bf16 + base + c, value);
                if (norm_out != NULL)
                    store8(norm_out + base + c, out);
            } else {
                if (d_inp != NULL)
                    d_inp[base + c] = value[0];
                if (d_inp_bf16 != NULL)
                    d_inp_bf16[base + c] = __float2bfloat16_rn(value[0]);
                if (norm_out != NULL)
                    norm_out[base + c] = __float2bfloat16_rn(out[0]);
            }
        }
    }

    /* phase 2: `lanes` threads share each group of VECTOR columns */
    int groups = C / VECTOR;
    int lanes = max(1, (int)blockDim.x / groups);
    float *weight_partial = partials + (size_t)blockIdx.x * 2 * C;
    float *bias_partial = weight_partial + C;
    for (int item = threadIdx.x; item < groups * lanes; item += blockDim.x) {
        int group = item % groups;
        int share = item / groups;
        int c = group * VECTOR;
        float dw[VECTOR], db[VECTOR];
#pragma unroll
        for (int i = 0; i < VECTOR; i++)
            dw[i] = db[i] = 0.0f;
        for (int row = first_row + share; row < last_row; row += lanes) {
            size_t base = (size_t)row * C + c;
            float dy[VECTOR], x[VECTOR];
            if (VECTOR == 8) {
                load8(dy, d_out + base);
                load8(x, inp + base);
            } else {
                dy[0] = __bfloat162float(d_out[base]);
                x[0] = __bfloat162float(inp[base]);
            }
            float row_mean = RMS ? 0.0f : mean[row];
            float row_rstd = rstd[row];
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                dw[i] += dy[i] * (x[i] - row_mean) * row_rstd;
                if (!RMS)
                    db[i] += dy[i];
            }
        }
        if (lanes == 1) {
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                weight_partial[c + i] = dw[i];
                bias_partial[c + i] = db[i];
            }
        } else {
#pragma unroll
            for (int i = 0; i < VECTOR; i++) {
                shares[share * 2 * C + c + i] = dw[i];
                shares[share * 2 * C + C + c + i] = db[i];
            }
        }
    }
    if (lanes == 1)
        return;
    __syncthreads();
    for (int j = threadIdx.x; j < 2 * C; j += blockDim.x) {
        float total = 0.0f;
        for (int share = 0; share < lanes; share++)
            total += shares[share * 2 * C + j];
        weight_partial[j] = total; /* bias_partial follows weight_partial */
    }
}

/* Sums the blocks' partials of each of the 2C columns in block order
 * (8 threads down the blocks, then in shared memory) and adds them to the
 * gradients. */
__global__ void layernorm_partials_kernel(cuda_grad d_weight,
                                          cuda_grad d_bias,
                                          const float *partials, int blocks,
                                          int C)
{
    __shared__ float sums[8][WARP_SIZE + 1];
    int j = blockIdx.x * WARP_SIZE + threadIdx.x;
    float total = 0.0f;
    if (j < 2 * C)
        for (int b = threadIdx.y; b < blocks; b += 8)
            total += partials[(size_t)b * 2 * C + j];
    sums[threadIdx.y][threadIdx.x] = total;
    __syncthreads();
    if (threadIdx.y != 0 || j >= 2 * C)
        return;
    for (int y = 1; y < 8; y++)
        total += sums[y][threadIdx.x];
    if (j < C) {
        if (d_weight.data != NULL)
            grad_add(d_weight, (size_t)j, total);
    } else if (d_bias.data != NULL) {
        grad_add(d_bias, (size_t)(j - C), total);
    }
}

/* ------------------------------------------------------ team backward */

/*
 * The backward of rows of C <= FUSED_MAX_COLUMNS channels (C % 8 == 0,
 * 16-byte aligned): a team of TEAM warps a row (a block's 8 warps are
 * 8 / TEAM teams), each team going from row to row on its own, with its
 * loads (dy, x and the bf16 residual, read before the sums) in flight
 * while other teams compute; a row's two sums are warp sums, added over
 * the team's warps behind a named barrier of the team alone. Each lane
 * keeps its weight and bias gradient sums over all its team's rows in
 * shared memory (a warp's G x 8 x 32 floats of each, lane-minor, so that
 * a warp's accesses fall in distinct banks); the block's teams add
 * theirs in team order at the end, and the block's partial row goes to
 * its group's last block, then the last group (add_partial_rows).
 *
 * History, timed alone on an H200 (docs/records/gpu-runs.md): one warp
 * a row (no barrier between rows) replaced a block a row for C <= 2048
 * (130.9 -> 75.4 us at 16,384 x 1024; llm.c's 84.5); the sums moved from
 * registers to shared memory (82.9 -> 79.4 us at 8,192 x 2048 RMSNorm;
 * layer norm's had spilled from C = 1792 on); blocks of 8 warps where
 * 4-warp blocks ran (74.0 -> 68.2 us at 8,192 x 2048). The twenty-fifth
 * session (bench/norms/run.sh, us a call) gave every width a team of
 * the fewest warps whose lanes hold at most 4 groups (ROW_MAX_GROUPS),
 * where C <= 2048 had one warp of up to 8 groups a lane and wider rows
 * the block a row: RMSNorm 8,192 x 2048 68.5 -> 56.4 (teams of 2), 4,096
 * x 4096 77.9 -> 63.2 (4), 8,192 x 4096 135.2 -> 103.1 (4), 4,096 x
 * 8192 208.0 -> 115.2 (8); layer norm 4,096 x 5120 205.1 -> 96.4 (8),
 * 8,192 x 2560 125.7 -> 83.0 (4), 8,192 x 1600 70.2 -> 58.2 (2), 16,384
 * x 1024 61.8 (1, as before). Fewer groups a lane than 4 came out slower
 * (more teams' barriers and partial work a row), more too (fewer rows in
 * flight an SM).
 */
#define ROW_MAX_GROUPS 4       /* 8-channel groups a lane, at most */

/* Blocks of a team kernel an SM should hold at least (__launch_bounds__:
 * at most 128 registers a thread, which 4 groups a lane need without
 * spilling; 3 blocks, 85 registers, spilled at 2 groups). */
#define ROW_MIN_BLOCKS 2

/* Floats of one set of a block's sums (weight or bias): its warps' G x
 * 8 x 32. */
#define ROW_SET_FLOATS(G) (NORM_BLOCK_WARPS * (G) * 8 * WARP_SIZE)

/* The dynamic shared memory of layernorm_backward_rows<G, TEAM, ...>:
 * the weight's sums, and layer norm's bias's after them (16 KiB a group
 * of layer norm, 8 of RMSNorm: up to 64 KiB a block at G = 4;
 * allow_rows_shared lets the kernel have it). */
static constexpr size_t rows_shared_bytes(int G, bool RMS)
{
    return (RMS ? 1 : 2) * (size_t)ROW_SET_FLOATS(G) * sizeof(float);
}

/* Where lane `lane` of warp `warp` keeps its sum of channel k * 8 + i of
 * its groups (lane-minor: a warp's accesses fall in distinct banks). */
template <int G>
static __device__ __forceinline__ int lane_sum_index(int warp, int k, int i,
                                                     int lane)
{
    return (warp * G * 8 + k * 8 + i) * WARP_SIZE + lane;
}

/* The block's partial row [dw | db] (C each; RMSNorm: dw alone, sum_rows
 * skips the bias half) from its warps' sums in shared memory: channel
 * group `group` is the member (group % STRIDE) / 32's, lane group % 32's,
 * its k = group / STRIDE, in every team; the teams' sums added in team
 * order. */
template <int G, int TEAM, bool RMS>
static __device__ __forceinline__ void
shared_sums_to_partial(float *own, const float *warp_sums, int C)
{
    constexpr int STRIDE = TEAM * WARP_SIZE, TEAMS = NORM_BLOCK_WARPS / TEAM;
    __syncthreads();
    for (int set = 0; set < (RMS ? 1 : 2); set++)
        for (int j = threadIdx.x; j < C; j += blockDim.x) {
            int group = j / 8, slot = group % STRIDE;
            const float *sums = warp_sums + set * ROW_SET_FLOATS(G) +
                                lane_sum_index<G>(slot / WARP_SIZE,
                                                  group / STRIDE, j % 8,
                                                  slot % WARP_SIZE);
            float total = sums[0];
            for (int t = 1; t < TEAMS; t++)
                total += sums[t * TEAM * G * 8 * WARP_SIZE];
            own[set * C + j] = total;
        }
}

/* A row's two sums over its team: each warp's (already warp sums) into
 * shared memory, double-buffered (a warp rewrites a buffer two rows on,
 * after the barrier of the row between, which its team mates pass only
 * once they have read it), added in member order. */
template <int TEAM>
static __device__ __forceinline__ void
team_row_sums(float (*shares)[NORM_BLOCK_WARPS][2], int &buffer, int team,
              int warp, int lane, float *g_sum, float *g_xhat_sum)
{
    if (TEAM == 1)
        return;
    if (lane == 0) {
        shares[buffer][warp][0] = *g_sum;
        shares[buffer][warp][1] = *g_xhat_sum;
    }
    team_barrier<TEAM>(team);
    float sum = 0.0f, xhat_sum = 0.0f;
#pragma unroll
    for (int m = 0; m < TEAM; m++) {
        sum += shares[buffer][team * TEAM + m][0];
        xhat_sum += shares[buffer][team * TEAM + m][1];
    }
    *g_sum = sum;
    *g_xhat_sum = xhat_sum;
    buffer ^= 1;
}

/* The team kernel (above): lane l of member m owns the 8-channel groups
 * m * 32 + l + k * 32 TEAM (k < G); a row's two sums are the members'
 * warp sums added in shared memory (team_row_sums). One function, longer
 * than a screen: a row's loaded values stay in registers from its sums
 * to its writes, which a call across a split would not promise. */
template <int G, int TEAM, bool RMS, bool OUTPUT>
__global__ void __launch_bounds__(NORM_BLOCK_WARPS *WARP_SIZE, ROW_MIN_BLOCKS)
layernorm_backward_rows(layernorm_backward_args a, int rows_per_block,
                        norm_output_args o)
{
    constexpr int STRIDE = TEAM * WARP_SIZE, TEAMS = NORM_BLOCK_WARPS / TEAM;
    extern __shared__ float warp_sums[]; /* rows_shared_bytes */
    __shared__ float team_shares[2][NORM_BLOCK_WARPS][2];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int team = warp / TEAM, slot = (warp % TEAM) * WARP_SIZE + lane;
    int C = a.C, buffer = 0;
    int first = blockIdx.x * rows_per_block;
    int last = min(first + rows_per_block, a.N);
    float *lane_sums = warp_sums + lane_sum_index<G>(warp, 0, 0, lane);
    float *lane_bias_sums = lane_sums + ROW_SET_FLOATS(G);
#pragma unroll
    for (int k = 0; k < G; k++)
#pragma unroll
        for (int i = 0; i < 8; i++) {
            lane_sums[(k * 8 + i) * WARP_SIZE] = 0.0f;
            if (!RMS)
                lane_bias_sums[(k * 8 + i) * WARP_SIZE] = 0.0f;
        }
    for (int row = first + team; row < last; row += TEAMS) {
        size_t base = (size_t)row * C;
        bf16x8 dy_raw[G], x_raw[G], residual_raw[G];
#pragma unroll
        for (int k = 0; k < G; k++) {
            int c = (slot + k * STRIDE) * 8;
            if (c >= C)
                continue;
            dy_raw[k] = *reinterpret_cast<const bf16x8 *>(a.d_out + base + c);
            x_raw[k] = *reinterpret_cast<const bf16x8 *>(a.inp + base + c);
            if (a.d_residual == NULL && a.d_residual_bf16 != NULL)
                residual_raw[k] = *reinterpret_cast<const bf16x8 *>(
                    a.d_residual_bf16 + base + c);
        }
        float m = RMS ? 0.0f : a.mean[row], rs = a.rstd[row];
        float g_sum = 0.0f, g_xhat_sum = 0.0f;
#pragma unroll
        for (int k = 0; k < G; k++) {
            int c = (slot + k * STRIDE) * 8;
            if (c >= C)
                continue;
            float dy[8], x[8], w[8];
            bf16x8_to_float(dy_raw[k], dy);
            bf16x8_to_float(x_raw[k], x);
            load8(w, a.weight + c);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float g = dy[i] * w[i];
                g_sum += g;
                g_xhat_sum += g * (x[i] - m) * rs;
            }
        }
        g_sum = RMS ? 0.0f : warp_sum(g_sum);
        g_xhat_sum = warp_sum(g_xhat_sum);
        team_row_sums<TEAM>(team_shares, buffer, team, warp, lane, &g_sum,
                            &g_xhat_sum);
        float mean_g = g_sum / (float)C;
        float mean_g_xhat = g_xhat_sum / (float)C;
#pragma unroll
        for (int k = 0; k < G; k++) {
            int c = (slot + k * STRIDE) * 8;
            if (c >= C)
                continue;
            float dy[8], x[8], w[8], residual[8], value[8];
            bf16x8_to_float(dy_raw[k], dy);
            bf16x8_to_float(x_raw[k], x);
            load8(w, a.weight + c);
            if (a.d_residual != NULL)
                load8(residual, a.d_residual + base + c);
            else if (a.d_residual_bf16 != NULL)
                bf16x8_to_float(residual_raw[k], residual);
            else
#pragma unroll
                for (int i = 0; i < 8; i++)
                    residual[i] = 0.0f;
            float out[8], b[8];
#pragma unroll
            for (int i = 0; i < 8; i++)
                b[i] = 0.0f;
            if (OUTPUT && !RMS)
                load8(b, o.bias + c);
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float xhat = (x[i] - m) * rs;
                value[i] = residual[i] +
                           rs * (dy[i] * w[i] - mean_g - xhat * mean_g_xhat);
                if (OUTPUT)
                    out[i] = norm_output_value<RMS>(xhat, w[i], b[i]);
                lane_sums[(k * 8 + i) * WARP_SIZE] += dy[i] * xhat;
                if (!RMS)
                    lane_bias_sums[(k * 8 + i) * WARP_SIZE] += dy[i];
            }
            if (a.d_inp != NULL)
                store8(a.d_inp + base + c, value);
            if (a.d_inp_bf16 != NULL)
                store8(a.d_inp_bf16 + base + c, value);
            if (OUTPUT)
                store8(o.out + base + c, out);
        }
    }
    float *own = a.partials + blockIdx.x * 2 * (size_t)C;
    shared_sums_to_partial<G, TEAM, RMS>(own, warp_sums, C);
    add_partial_rows<RMS>(a);
}

/* The warps of a row's team at C channels (norm_row_team: at most
 * ROW_MAX_GROUPS groups a lane; PARTITA_LAYERNORM_BACKWARD=teamN, read
 * once a process, forces N where it holds the row); 0 where no team of 8
 * holds it. */
static int norm_team(int C)
{
    static const int forced = env_norm_team("PARTITA_LAYERNORM_BACKWARD");
    return norm_row_team(C / 8, forced, ROW_MAX_GROUPS, ROW_MAX_GROUPS);
}

/* Devices whose occupancy answer blocks_per_sm keeps (a device past them
 * is asked at every launch). */
#define ROW_CACHED_DEVICES 16
/* Lets layernorm_backward_rows<G, RMS, OUTPUT> have rows_shared_bytes
 * (allow_dynamic_shared) in the current context: at every launch, since
 * a green context of a slice of the GPU may be a context of its own. */
template <int G, int TEAM, bool RMS, bool OUTPUT>
static cudaError_t allow_rows_shared(void)
{
    return allow_dynamic_shared(layernorm_backward_rows<G, TEAM, RMS, OUTPUT>,
                                rows_shared_bytes(G, RMS));
}

/* The current device and its SMs (1 where the runtime does not say). */
static void current_device_sms(int *device, int *sms)
{
    *device = 0;
    *sms = 0;
    if (cudaGetDevice(device) != cudaSuccess ||
        cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount,
                               *device) != cudaSuccess ||
        *sms <= 0)
        *sms = 1;
}

/* Blocks a kernel's SM holds at once on `device`, `ask`ed of the runtime
 * (its occupancy: registers and shared memory decide; 0 or less when it
 * cannot say, taken as 1) once a process and device: `cached` is the
 * kernel's own array of ROW_CACHED_DEVICES slots. */
template <typename Ask>
static int blocks_per_sm(std::atomic<int> *cached, int device, Ask ask)
{
    std::atomic<int> *slot = device >= 0 && device < ROW_CACHED_DEVICES
                                 ? &cached[device]
                                 : NULL;
    int blocks = slot != NULL ? slot->load(std::memory_order_relaxed) : 0;
    if (blocks > 0)
        return blocks;
    blocks = ask();
    if (blocks <= 0)
        blocks = 1;
    if (slot != NULL)
        slot->store(blocks, std::memory_order_relaxed);
    return blocks;
}

/* Rows a block for a grid of about one wave of `per_sm` blocks on each of
 * `sms` SMs: at least CUDA_LAYERNORM_ROW_KERNEL_MIN_ROWS (one row a warp
 * of a team kernel's block), at most CUDA_LAYERNORM_ROW_KERNEL_MAX_BLOCKS
 * blocks, the scratch's partial rows (cuda_layernorm_backward_scratch). */
static int one_wave_rows_per_block(int N, int sms, int per_sm)
{
    int aim = min(sms * per_sm, CUDA_LAYERNORM_ROW_KERNEL_MAX_BLOCKS);
    return max(CUDA_LAYERNORM_ROW_KERNEL_MIN_ROWS, (N + aim - 1) / aim);
}

/* Blocks of layernorm_backward_rows<G, TEAM, RMS, OUTPUT> an SM of
 * `device` holds at once. */
template <int G, int TEAM, bool RMS, bool OUTPUT>
static int rows_blocks_per_sm(int device)
{
    static std::atomic<int> cached[ROW_CACHED_DEVICES];
    return blocks_per_sm(cached, device, [] {
        int blocks = 0;
        if (allow_rows_shared<G, TEAM, RMS, OUTPUT>() != cudaSuccess ||
            cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &blocks, layernorm_backward_rows<G, TEAM, RMS, OUTPUT>,
                NORM_BLOCK_WARPS * WARP_SIZE,
                rows_shared_bytes(G, RMS)) != cudaSuccess)
            return 0;
        return blocks;
    });
}

/* A team kernel's launch: rows_per_block so that the grid is one
 * wave of the device's SMs (one_wave_rows_per_block: at least one row a
 * warp, so that a call of few rows, 1,024 at GPT-2 micro-batch 1, still
 * reaches every SM, where the floor of 32 rows a block it had left 32
 * blocks). */
template <int G, int TEAM, bool RMS, bool OUTPUT>
static void launch_rows_of(const layernorm_backward_args &a,
                           const norm_output_args &o, int device, int sms,
                           cudaStream_t stream)
{
    int per_sm = rows_blocks_per_sm<G, TEAM, RMS, OUTPUT>(device);
    if (allow_rows_shared<G, TEAM, RMS, OUTPUT>() != cudaSuccess)
        return; /* the launch's error, cudaGetLastError's */
    int rows_per_block = one_wave_rows_per_block(a.N, sms, per_sm);
    unsigned int blocks =
        (unsigned int)((a.N + rows_per_block - 1) / rows_per_block);
    layernorm_backward_rows<G, TEAM, RMS, OUTPUT>
        <<<blocks, NORM_BLOCK_WARPS * WARP_SIZE, rows_shared_bytes(G, RMS),
           stream>>>(a, rows_per_block, o);
}

/* The team kernel of TEAM warps a row, its lanes' groups G from C. */
template <int TEAM, bool RMS, bool OUTPUT>
static void launch_team(const layernorm_backward_args &a,
                        const norm_output_args &o, int device, int sms,
                        cudaStream_t stream)
{
    switch ((a.C / 8 + TEAM * WARP_SIZE - 1) / (TEAM * WARP_SIZE)) {
    case 1: launch_rows_of<1, TEAM, RMS, OUTPUT>(a, o, device, sms, stream); break;
    case 2: launch_rows_of<2, TEAM, RMS, OUTPUT>(a, o, device, sms, stream); break;
    case 3: launch_rows_of<3, TEAM, RMS, OUTPUT>(a, o, device, sms, stream); break;
    default: launch_rows_of<4, TEAM, RMS, OUTPUT>(a, o, device, sms, stream); break;
    }
}

template <bool RMS, bool OUTPUT>
static void launch_rows(const layernorm_backward_args &a,
                        const norm_output_args &o, int team,
                        cudaStream_t stream)
{
    int device = 0, sms = 0;
    current_device_sms(&device, &sms);
    switch (team) {
    case 1: launch_team<1, RMS, OUTPUT>(a, o, device, sms, stream); break;
    case 2: launch_team<2, RMS, OUTPUT>(a, o, device, sms, stream); break;
    case 4: launch_team<4, RMS, OUTPUT>(a, o, device, sms, stream); break;
    default: launch_team<8, RMS, OUTPUT>(a, o, device, sms, stream); break;
    }
}

/* The backward of either norm (mean NULL and d_bias empty under RMS);
 * norm_out NULL or the forward's output written again (bias: layer
 * norm's, read for it). */
template <bool RMS>
static cudaError_t launch_backward(
    float *d_inp, pt_bf16 *d_inp_bf16, cuda_grad d_weight, cuda_grad d_bias,
    const float *d_residual, const pt_bf16 *d_residual_bf16,
    const pt_bf16 *d_out_bf16, const pt_bf16 *inp_bf16, const float *weight,
    const float *mean, const float *rstd, pt_bf16 *norm_out,
    const float *bias, float *scratch, int N, int C, cudaStream_t stream)
{
    if (N <= 0)
        return cudaSuccess;
    unsigned int blocks = blocks_for((size_t)N, BACKWARD_ROWS);
    const bf16 *inp = as_bf16(inp_bf16);
    if (d_inp == NULL && d_inp_bf16 == NULL)
        return cudaErrorInvalidValue;
    bool vector = C % 8 == 0 && aligned16(d_out_bf16) && aligned16(inp) &&
                  aligned16(weight) && aligned16(scratch) &&
                  (d_inp == NULL || aligned16(d_inp)) &&
                  (d_inp_bf16 == NULL || aligned16(d_inp_bf16)) &&
                  (d_residual == NULL || aligned16(d_residual)) &&
                  (d_residual_bf16 == NULL || aligned16(d_residual_bf16)) &&
                  (norm_out == NULL || aligned16(norm_out)) &&
                  (norm_out == NULL || RMS || aligned16(bias));
    const bf16 *residual_bf16 = d_residual == NULL ? as_bf16(d_residual_bf16)
                                                   : NULL;
    float *partials = scratch + cuda_layernorm_counter_floats(N);
    if (vector && C <= FUSED_MAX_COLUMNS) {
        layernorm_backward_args a = {
            d_inp, as_bf16(d_inp_bf16), d_weight, d_bias, partials,
            reinterpret_cast<unsigned int *>(scratch), d_residual,
            residual_bf16, as_bf16(d_out_bf16), inp, weight, mean, rstd, N,
            C};
        norm_output_args o = {as_bf16(norm_out), bias};
        int team = norm_team(C); /* C <= FUSED_MAX_COLUMNS: a team holds it */
        if (norm_out != NULL)
            launch_rows<RMS, true>(a, o, team, stream);
        else
            launch_rows<RMS, false>(a, o, team, stream);
        return cudaGetLastError();
    }
    /* the shared shares hold lanes x 2C floats: lanes x C <= 8 x threads
     * for the vector path, 1 x threads for the scalar one */
    if (vector)
        layernorm_backward_generic<8, RMS>
            <<<blocks, BACKWARD_THREADS, 0, stream>>>(
                d_inp, as_bf16(d_inp_bf16), as_bf16(norm_out), partials,
                d_residual, residual_bf16, as_bf16(d_out_bf16), inp, weight,
                bias, mean, rstd, N, C);
    else
        layernorm_backward_generic<1, RMS>
            <<<blocks, BACKWARD_THREADS, 0, stream>>>(
                d_inp, as_bf16(d_inp_bf16), as_bf16(norm_out), partials,
                d_residual, residual_bf16, as_bf16(d_out_bf16), inp, weight,
                bias, mean, rstd, N, C);
    dim3 threads(WARP_SIZE, 8);
    layernorm_partials_kernel<<<blocks_for((size_t)2 * C, WARP_SIZE), threads,
                                0, stream>>>(d_weight, d_bias, partials,
                                             (int)blocks, C);
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_layernorm_backward(
    float *d_inp, pt_bf16 *d_inp_bf16, cuda_grad d_weight, cuda_grad d_bias,
    const float *d_residual, const pt_bf16 *d_residual_bf16,
    const pt_bf16 *d_out_bf16,
    const pt_bf16 *inp_bf16, const float *weight, const float *mean, const float *rstd,
    float *scratch, int N, int C, cudaStream_t stream)
{
    return launch_backward<false>(d_inp, d_inp_bf16, d_weight, d_bias,
                                  d_residual, d_residual_bf16, d_out_bf16,
                                  inp_bf16, weight, mean, rstd, NULL, NULL,
                                  scratch, N, C, stream);
}

extern "C" cudaError_t cuda_rmsnorm_backward(
    float *d_inp, pt_bf16 *d_inp_bf16, cuda_grad d_weight,
    const float *d_residual, const pt_bf16 *d_residual_bf16,
    const pt_bf16 *d_out_bf16, const pt_bf16 *inp_bf16, const float *weight,
    const float *rstd, float *scratch, int N, int C, cudaStream_t stream)
{
    cuda_grad no_bias = {NULL, false};
    return launch_backward<true>(d_inp, d_inp_bf16, d_weight, no_bias,
                                 d_residual, d_residual_bf16, d_out_bf16,
                                 inp_bf16, weight, NULL, rstd, NULL, NULL,
                                 scratch, N, C, stream);
}

extern "C" cudaError_t cuda_norm_backward_and_output(
    pt_bf16 *out_bf16, pt_bf16 *d_inp_bf16, cuda_grad d_weight,
    cuda_grad d_bias, const pt_bf16 *d_residual_bf16,
    const pt_bf16 *d_out_bf16, const pt_bf16 *inp_bf16, const float *weight,
    const float *bias, const float *mean, const float *rstd, bool rms,
    float *scratch, int N, int C, cudaStream_t stream)
{
    if (out_bf16 == NULL || (!rms && bias == NULL))
        return cudaErrorInvalidValue;
    if (rms) {
        cuda_grad no_bias = {NULL, false};
        return launch_backward<true>(NULL, d_inp_bf16, d_weight, no_bias,
                                     NULL, d_residual_bf16, d_out_bf16,
                                     inp_bf16, weight, NULL, rstd, out_bf16,
                                     NULL, scratch, N, C, stream);
    }
    return launch_backward<false>(NULL, d_inp_bf16, d_weight, d_bias, NULL,
                                  d_residual_bf16, d_out_bf16, inp_bf16,
                                  weight, mean, rstd, out_bf16, bias, scratch,
                                  N, C, stream);
}
