/*
 * Layer norm and RMSNorm forward on the bf16 residual stream (read into
 * fp32 registers; statistics in fp32); the backward is
 * layernorm_backward.cu. RMSNorm (Llama's) is layer norm without the
 * mean and the bias: every kernel takes RMS as a template flag that
 * drops those terms at compile time, so the two norms share one set of
 * kernels (and layer norm's instantiations are the code they were before
 * RMSNorm came).
 *
 * Forward: a team of 1, 2, 4 or 8 warps a row; the row (C <= 8192
 * channels, C % 8 == 0) is read once into registers and written as bf16,
 * the input of the next matrix product (larger or odd rows take a
 * generic kernel that reads the row three times, the later reads from
 * L1). The residual add that
 * precedes a norm may come in with it (`skip`): the row's sum is rounded
 * to bf16, written back (the stream's next value) and normalised, one
 * pass over the row where a product's epilogue with beta = 1 took about
 * 30 us more than with beta = 0 (GPT-2 774M, docs/cuda-backend.md).
 */
#include "executor/cuda/cuda_common.cuh"

#define LAYERNORM_EPS 1e-5f
#define ROWS_PER_FORWARD_BLOCK 8   /* the generic kernel's: one warp each */
#define FORWARD_MAX_GROUPS 4       /* 8-channel groups a lane, by the rule */
#define FORWARD_FORCED_GROUPS 8    /* ... and where a team is forced */

/* s = x + k over a row, rounded to bf16, 8 channels a lane per access
 * (C % 8 == 0, 16-byte aligned) where a scalar loop moves 2 bytes; s may
 * be k (in place), so each thread issues the loads of ADD_GROUPS groups
 * before storing their sums. */
#define ADD_GROUPS 4
static __device__ inline void add_rows_vector(bf16 *s, const bf16 *x,
                                              const bf16 *k, int C, int lane)
{
    for (int first = lane * 8; first < C;
         first += ADD_GROUPS * WARP_SIZE * 8) {
        bf16x8 a[ADD_GROUPS], b[ADD_GROUPS];
#pragma unroll
        for (int g = 0; g < ADD_GROUPS; g++) {
            int c = first + g * WARP_SIZE * 8;
            if (c < C) {
                a[g] = *reinterpret_cast<const bf16x8 *>(x + c);
                b[g] = *reinterpret_cast<const bf16x8 *>(k + c);
            }
        }
#pragma unroll
        for (int g = 0; g < ADD_GROUPS; g++) {
            int c = first + g * WARP_SIZE * 8;
            if (c >= C)
                continue;
            float xs[8], ks[8];
            bf16x8_to_float(a[g], xs);
            bf16x8_to_float(b[g], ks);
#pragma unroll
            for (int i = 0; i < 8; i++)
                xs[i] = xs[i] + ks[i];
            store8(s + c, xs);
        }
    }
}

/* The generic forward (any C; `vector`: C % 8 == 0 and every pointer
 * 16-byte aligned, so a lane moves 8 channels per access): the row is
 * read three times, the later reads from L1. */
template <bool RMS>
__global__ void layernorm_forward_generic(bf16 *out, float *mean,
                                          float *rstd, const bf16 *inp,
                                          const bf16 *skip, bf16 *sum_out,
                                          const float *weight,
                                          const float *bias, int N, int C,
                                          float eps, bool vector)
{
    int lane = threadIdx.x % WARP_SIZE;
    int row = blockIdx.x * ROWS_PER_FORWARD_BLOCK + threadIdx.x / WARP_SIZE;
    if (row >= N)
        return;
    const bf16 *x = inp + (size_t)row * C;
    if (skip != NULL) {
        /* the residual sum first, rounded as the stream keeps it; the
         * passes below read it back (written by other lanes: the warp
         * synchronises its memory first) */
        const bf16 *k = skip + (size_t)row * C;
        bf16 *s = sum_out + (size_t)row * C;
        if (vector)
            add_rows_vector(s, x, k, C, lane);
        else
            for (int c = lane; c < C; c += WARP_SIZE)
                s[c] = __float2bfloat16_rn(__bfloat162float(x[c]) +
                                           __bfloat162float(k[c]));
        __syncwarp();
        x = s;
    }
    bf16 *y = out + (size_t)row * C;
    float sum = 0.0f;
    if (RMS) {
        /* no mean: the squares below are taken about zero */
    } else if (vector) {
        for (int c = lane * 8; c < C; c += WARP_SIZE * 8) {
            float xs[8];
            load8(xs, x + c);
            sum += (xs[0] + xs[1]) + (xs[2] + xs[3]) + (xs[4] + xs[5]) +
                   (xs[6] + xs[7]);
        }
    } else {
        for (int c = lane; c < C; c += WARP_SIZE)
            sum += __bfloat162float(x[c]);
    }
    float row_mean = RMS ? 0.0f : warp_sum(sum) / (float)C;
    float square_sum = 0.0f;
    for (int c = lane; c < C; c += WARP_SIZE) {
        float centred = __bfloat162float(x[c]) - row_mean;
        square_sum += centred * centred;
    }
    float row_rstd = rsqrtf(warp_sum(square_sum) / (float)C + eps);
    if (vector) {
        for (int c = lane * 8; c < C; c += WARP_SIZE * 8) {
            float values[8], xs[8];
            load8(xs, x + c);
            float4 wa = *reinterpret_cast<const float4 *>(weight + c);
            float4 wb = *reinterpret_cast<const float4 *>(weight + c + 4);
            float ws[8] = {wa.x, wa.y, wa.z, wa.w, wb.x, wb.y, wb.z, wb.w};
            float bs[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
            if (!RMS) {
                float4 ba = *reinterpret_cast<const float4 *>(bias + c);
                float4 bb = *reinterpret_cast<const float4 *>(bias + c + 4);
                bs[0] = ba.x, bs[1] = ba.y, bs[2] = ba.z, bs[3] = ba.w;
                bs[4] = bb.x, bs[5] = bb.y, bs[6] = bb.z, bs[7] = bb.w;
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
                values[i] = RMS ? xs[i] * row_rstd * ws[i]
                                : (xs[i] - row_mean) * row_rstd * ws[i] +
                                      bs[i];
            *reinterpret_cast<bf16x8 *>(y + c) = float_to_bf16x8(values);
        }
    } else {
        for (int c = lane; c < C; c += WARP_SIZE) {
            float xc = __bfloat162float(x[c]);
            y[c] = __float2bfloat16_rn(
                RMS ? xc * row_rstd * weight[c]
                    : (xc - row_mean) * row_rstd * weight[c] + bias[c]);
        }
    }
    if (lane == 0) {
        if (!RMS && mean != NULL)
            mean[row] = row_mean;
        if (rstd != NULL)
            rstd[row] = row_rstd;
    }
}


/* A row's sum over its team of TEAM warps (value: the warp's own sum,
 * already summed over its lanes): the members' sums through shared
 * memory (`shares`, a slot a warp, used once a kernel: each team takes
 * one row) behind a named barrier of the team alone (team_barrier),
 * added in member order. */
template <int TEAM>
static __device__ __forceinline__ float team_total(float value,
                                                   float *shares, int team,
                                                   int warp, int lane)
{
    if (TEAM == 1)
        return value;
    if (lane == 0)
        shares[warp] = value;
    team_barrier<TEAM>(team);
    float total = 0.0f;
#pragma unroll
    for (int m = 0; m < TEAM; m++)
        total += shares[team * TEAM + m];
    return total;
}

/*
 * The forward of a row held in registers by a team of TEAM warps (a
 * block's 8 warps are 8 / TEAM teams, a row each): lane l of member m
 * holds the 8-channel groups m * 32 + l + k * 32 TEAM (k < G; C % 8 ==
 * 0, pointers 16-byte aligned), so the row is read from memory once; the
 * variance is taken about the mean, two passes over the registers, as
 * the cpu reference does, each pass's sum over the team (team_total).
 * TEAM 1 is the one-warp-a-row kernel rows up to 2048 wide had before
 * the twenty-fifth session (the same bits); the team of the fewest warps
 * whose lanes hold at most FORWARD_MAX_GROUPS groups (forward_team) has
 * more rows in flight an SM, and rows wider than 2048 no longer take the
 * generic kernel's three reads (docs/benchmarks.md, "The norms' kernels,
 * timed alone": 46.7 -> 40.1 us a call at Llama-3.2-1B's 8,192 rows of
 * 2048). One function a little longer than a screen, for the same reason
 * as the backward's: the row stays in registers throughout.
 */
template <int G, int TEAM, bool RMS>
__global__ void __launch_bounds__(NORM_BLOCK_WARPS *WARP_SIZE)
layernorm_forward_team(bf16 *out, float *mean, float *rstd, const bf16 *inp,
                       const bf16 *skip, bf16 *sum_out, const float *weight,
                       const float *bias, int N, int C, float eps)
{
    constexpr int STRIDE = TEAM * WARP_SIZE, TEAMS = NORM_BLOCK_WARPS / TEAM;
    __shared__ float shares[2][NORM_BLOCK_WARPS];
    int lane = threadIdx.x % WARP_SIZE, warp = threadIdx.x / WARP_SIZE;
    int team = warp / TEAM, slot = (warp % TEAM) * WARP_SIZE + lane;
    int row = blockIdx.x * TEAMS + team;
    if (row >= N)
        return; /* the whole team: its barrier waits for none of it */
    const bf16 *x = inp + (size_t)row * C;
    float values[G][8];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++) {
        int c = (slot + k * STRIDE) * 8;
        if (c < C) {
            load8(values[k], x + c);
            if (skip != NULL) {
                /* the residual sum, rounded as the stream keeps it */
                float added[8];
                load8(added, skip + (size_t)row * C + c);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    values[k][i] = __bfloat162float(
                        __float2bfloat16_rn(values[k][i] + added[i]));
                store8(sum_out + (size_t)row * C + c, values[k]);
            }
        } else {
#pragma unroll
            for (int i = 0; i < 8; i++)
                values[k][i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            sum += values[k][i];
    }
    float row_mean =
        RMS ? 0.0f
            : team_total<TEAM>(warp_sum(sum), shares[0], team, warp, lane) /
                  (float)C;
    float square_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < G; k++) {
        if ((slot + k * STRIDE) * 8 >= C)
            continue;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            float centred = values[k][i] - row_mean;
            square_sum += centred * centred;
        }
    }
    square_sum = team_total<TEAM>(warp_sum(square_sum), shares[1], team,
                                  warp, lane);
    float row_rstd = rsqrtf(square_sum / (float)C + eps);
    bf16 *y = out + (size_t)row * C;
#pragma unroll
    for (int k = 0; k < G; k++) {
        int c = (slot + k * STRIDE) * 8;
        if (c >= C)
            continue;
        float w[8], b[8], normed[8];
        load8(w, weight + c);
        if (!RMS)
            load8(b, bias + c);
#pragma unroll
        for (int i = 0; i < 8; i++)
            normed[i] = RMS ? values[k][i] * row_rstd * w[i]
                            : (values[k][i] - row_mean) * row_rstd * w[i] +
                                  b[i];
        store8(y + c, normed);
    }
    if (slot == 0) {
        if (!RMS && mean != NULL)
            mean[row] = row_mean;
        if (rstd != NULL)
            rstd[row] = row_rstd;
    }
}

/* The warps of a row's team at `groups` 8-channel groups (norm_row_team:
 * PARTITA_LAYERNORM_FORWARD=teamN, read once a process, forces N where a
 * lane then holds at most FORWARD_FORCED_GROUPS: team1 at 2048 channels
 * is the one-warp kernel of before); 0: the generic kernel. */
static int forward_team(int groups)
{
    static const int forced = env_norm_team("PARTITA_LAYERNORM_FORWARD");
    return norm_row_team(groups, forced, FORWARD_MAX_GROUPS,
                         FORWARD_FORCED_GROUPS);
}

/* The team kernel of TEAM warps a row, its lanes' groups G from C. */
template <int TEAM, bool RMS>
static void launch_forward_team(bf16 *out, float *mean, float *rstd,
                                const bf16 *inp, const bf16 *skip,
                                bf16 *sum, const float *weight,
                                const float *bias, int N, int C, float eps,
                                cudaStream_t stream)
{
    unsigned int blocks = blocks_for((size_t)N, NORM_BLOCK_WARPS / TEAM);
    unsigned int threads = NORM_BLOCK_WARPS * WARP_SIZE;
#define FORWARD_CASE(G)                                                      \
    case G:                                                                  \
        layernorm_forward_team<G, TEAM, RMS><<<blocks, threads, 0, stream>>>( \
            out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps);      \
        break
    switch ((C / 8 + TEAM * WARP_SIZE - 1) / (TEAM * WARP_SIZE)) {
        FORWARD_CASE(1);
        FORWARD_CASE(2);
        FORWARD_CASE(3);
        FORWARD_CASE(4);
        FORWARD_CASE(5);
        FORWARD_CASE(6);
        FORWARD_CASE(7);
        default:
        FORWARD_CASE(8);
    }
#undef FORWARD_CASE
}

/* The forward of either norm: a team kernel where the row fits (C <=
 * 8192, vectorisable), else the generic one. */
template <bool RMS>
static cudaError_t launch_forward(pt_bf16 *out_bf16, float *mean,
                                  float *rstd, const pt_bf16 *inp_bf16,
                                  const pt_bf16 *skip_bf16,
                                  pt_bf16 *sum_bf16, const float *weight,
                                  const float *bias, int N, int C, float eps,
                                  cudaStream_t stream)
{
    if (N <= 0)
        return cudaSuccess;
    const bf16 *inp = as_bf16(inp_bf16);
    const bf16 *skip = skip_bf16 != NULL ? as_bf16(skip_bf16) : NULL;
    bf16 *sum = sum_bf16 != NULL ? as_bf16(sum_bf16) : NULL;
    bool vector = C % 8 == 0 && aligned16(out_bf16) && aligned16(inp) &&
                  aligned16(weight) && aligned16(bias) && aligned16(skip) &&
                  aligned16(sum);
    int team = vector ? forward_team(C / 8) : 0;
    bf16 *out = as_bf16(out_bf16);
    switch (team) {
    case 1: launch_forward_team<1, RMS>(out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps, stream); break;
    case 2: launch_forward_team<2, RMS>(out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps, stream); break;
    case 4: launch_forward_team<4, RMS>(out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps, stream); break;
    case 8: launch_forward_team<8, RMS>(out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps, stream); break;
    default:
        layernorm_forward_generic<RMS>
            <<<blocks_for((size_t)N, ROWS_PER_FORWARD_BLOCK),
               ROWS_PER_FORWARD_BLOCK * WARP_SIZE, 0, stream>>>(
                out, mean, rstd, inp, skip, sum, weight, bias, N, C, eps,
                vector);
    }
    return cudaGetLastError();
}

extern "C" cudaError_t cuda_layernorm_forward(pt_bf16 *out_bf16, float *mean,
                                              float *rstd,
                                              const pt_bf16 *inp_bf16,
                                              const float *weight,
                                              const float *bias, int N, int C,
                                              cudaStream_t stream)
{
    return launch_forward<false>(out_bf16, mean, rstd, inp_bf16, NULL, NULL,
                                 weight, bias, N, C, LAYERNORM_EPS, stream);
}

extern "C" cudaError_t cuda_rmsnorm_forward(pt_bf16 *out_bf16, float *rstd,
                                            const pt_bf16 *inp_bf16,
                                            const float *weight, float eps,
                                            int N, int C, cudaStream_t stream)
{
    return launch_forward<true>(out_bf16, NULL, rstd, inp_bf16, NULL, NULL,
                                weight, NULL, N, C, eps, stream);
}

extern "C" cudaError_t cuda_norm_forward_after_add(
    pt_bf16 *out_bf16, float *mean, float *rstd, pt_bf16 *sum_bf16,
    const pt_bf16 *inp_bf16, const pt_bf16 *skip_bf16, const float *weight,
    const float *bias, bool rms, float eps, int N, int C,
    cudaStream_t stream)
{
    if (rms)
        return launch_forward<true>(out_bf16, NULL, rstd, inp_bf16,
                                    skip_bf16, sum_bf16, weight, NULL, N, C,
                                    eps, stream);
    /* layer norm's eps is its fixed one, as cuda_layernorm_forward's */
    return launch_forward<false>(out_bf16, mean, rstd, inp_bf16, skip_bf16,
                                 sum_bf16, weight, bias, N, C, LAYERNORM_EPS,
                                 stream);
}
