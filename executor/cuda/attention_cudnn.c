/*
 * cuDNN's fused flash attention through cuDNN's backend graph API, in C
 * (no cudnn-frontend): the forward and backward of causal scaled
 * dot-product attention written as graphs of cuDNN operations (matrix
 * products, pointwise operations, reductions, reshapes) in the pattern
 * cuDNN's heuristics match to its fused SDPA engines:
 *
 *   forward   S = Q K^T scale, masked where key > query (-inf),
 *             M = rowmax S, E = exp(S - M), Z = rowsum E,
 *             stats = M + log Z, P = E / Z (bf16), O = P V
 *   backward  delta = rowsum(dO * O) (real memory: the workspace's head),
 *             P = exp(mask(Q K^T scale - stats)), dV = P^T dO,
 *             dS = P (dO V^T - delta) scale, dK = dS^T Q, dQ = dS K
 *
 * Grouped-query attention (KVH key/value heads, each shared by NH / KVH
 * query heads) is the same graphs with K and V declared with their own
 * head count, which the products broadcast over the query heads; in the
 * backward dK and dV come out per query head (virtual tensors) and a
 * reduction over each group sums them onto the shared heads.
 *
 * By default (cuDNN 9.6 or later) the backward writes dQ's product
 * into an fp32 accumulator of the workspace (B x H x T x D, after the
 * row sums) and converts it to dQ, as cudnn-frontend's default (non-
 * deterministic) backward does, and Megatron-LM's and PyTorch's: cuDNN
 * adds the key blocks' shares with atomics, without B x H x T x T
 * products in memory and without the separate dQ product kernel
 * (`matmul_dq`, 150.8 us a layer of GPT-2 350M at micro-batch 16 on an
 * H200; a step 1.1-1.9 % faster, 2026-11-30), at the price of bits
 * that may differ from run to run. Deterministic (a plan's
 * "deterministic", Megatron-LM's --deterministic-mode; llm.c asks for
 * the same), dQ is written by its product directly, no accumulator, no
 * atomics: a step gives the same bits on every run, as the own kernels
 * do. Its workspace (B x H x T x T bf16) is large; where the caller
 * lends less, the backward runs in pieces of whole sequences, each a
 * call of the plan built for B / pieces (a sequence's gradients do not
 * depend on the others': the same bits).
 *
 * Plans are built once per shape (cuDNN compiles kernels for them) and
 * kept with every descriptor they came from; each call makes its variant
 * pack. Every failing call becomes a pt_error naming the graph, the call
 * and the attribute, and cuDNN's message (cudnnGetLastErrorString).
 */
#include "executor/cuda/attention_cudnn.h"

#include <float.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn_graph.h>
#include <cudnn_version.h>

#include "executor/cuda/attention_cudnn_graph.h"
#include "executor/cuda/cuda_backend.h"

#define ATTENTION_MAX_SHAPES 8
#define ENGINE_CONFIGS_TRIED 16
#define WORKSPACE_ALIGNMENT 256

/* Unique ids of the tensors the caller's memory (or a host scalar)
 * backs, the variant pack's; virtual tensors are numbered after them. */
enum tensor_uid {
    UID_Q = 1,
    UID_K,          /* bound as K^T: the key's dims and strides swapped */
    UID_V,          /* V, or V^T in the backward */
    UID_O,
    UID_STATS,
    UID_D_OUT,
    UID_D_Q,
    UID_D_K,
    UID_D_V,
    UID_SCALE,      /* by value: 1 / sqrt(D) */
    UID_NEG_INF,    /* by value: what masked scores become */
    UID_ONE,        /* by value: 1 */
    UID_DELTA,      /* rowsum(dO * O), B x H x T floats of workspace */
    UID_DQ_ACCUM,   /* dQ in fp32, B x H x T x D floats of workspace
                       (not deterministic) */
    UID_FIRST_VIRTUAL = 100
};

/* An execution plan and the graph it was made from. */
typedef struct sdpa_plan {
    graph *graph;
    cudnnBackendDescriptor_t plan;
    int64_t workspace;          /* bytes cuDNN asked for */
    int64_t engine;             /* cuDNN's global engine index */
} sdpa_plan;

typedef struct sdpa_shape {
    int B, T, H, KVH, D;
    sdpa_plan forward, backward;
    bool backward_borrows;      /* the backward's workspace is lent by the
                                   caller (cudnn_attention_prepare) */
    bool dq_accumulated;        /* its dQ through the fp32 accumulator */
    int pieces;                 /* the backward's calls, each of
                                   B / pieces sequences (its plan's) */
    char description[320];
} sdpa_shape;

struct cudnn_attention {
    cudnnHandle_t handle;
    sdpa_shape shapes[ATTENTION_MAX_SHAPES];
    int shape_count;
    void *workspace;            /* device */
    size_t workspace_bytes;
    float neg_inf;
    bool accumulate_dq;         /* not deterministic, on cuDNN 9.6 or
                                   later */
};

/* --------------------------------------------------------------- graphs */

/* The tensor shapes of one problem: B sequences, H query heads, KVH
 * key/value heads, T positions, D channels a head, C = H D; qkv rows of
 * W = (H + 2 KVH) D (3C without grouping), output rows of C. */
typedef struct sdpa_layout {
    tensor_shape q;             /* Q, dQ: [B, H, T, D] */
    tensor_shape q_packed;      /* dQ's fp32 accumulator, packed */
    tensor_shape kv;            /* K, V, dK, dV: [B, KVH, T, D] */
    tensor_shape kt;            /* K^T, V^T: [B, KVH, D, T] */
    tensor_shape kv_full;       /* dK, dV per query head (virtual) */
    tensor_shape o;             /* O, dO: [B, H, T, D] */
    tensor_shape o_product;     /* dO * O (virtual) */
    tensor_shape scores;        /* [B, H, T, T] */
    tensor_shape scores_t;      /* the same, transposed */
    tensor_shape rows;          /* stats, delta: [B, H, T, 1] */
} sdpa_layout;

static sdpa_layout layout_of(int B, int T, int H, int KVH, int D)
{
    int64_t b = B, t = T, h = H, kvh = KVH, d = D, c = h * d;
    int64_t w = (h + 2 * kvh) * d;
    sdpa_layout l = {
        .q = {{b, h, t, d}, {t * w, d, w, 1}},
        .q_packed = {{b, h, t, d}, {h * t * d, t * d, d, 1}},
        .kv = {{b, kvh, t, d}, {t * w, d, w, 1}},
        .kt = {{b, kvh, d, t}, {t * w, d, 1, w}},
        .kv_full = {{b, h, t, d}, {h * t * d, t * d, d, 1}},
        .o = {{b, h, t, d}, {t * c, d, c, 1}},
        /* as cudnn-frontend declares it (virtual: never laid out) */
        .o_product = {{b, h, t, d}, {h * t * d, t * d, h * d, 1}},
        .scores = {{b, h, t, t}, {h * t * t, t * t, t, 1}},
        .scores_t = {{b, h, t, t}, {h * t * t, t * t, 1, t}},
        .rows = {{b, h, t, 1}, {h * t, t, 1, 1}},
    };
    return l;
}

/* scores where the query's position (row) is at least the key's
 * (column), neg_inf elsewhere. */
static cudnnBackendDescriptor_t causal_mask(graph *g,
                                            cudnnBackendDescriptor_t scores,
                                            const tensor_shape *shape,
                                            cudnnBackendDescriptor_t neg_inf)
{
    cudnnBackendDescriptor_t row =
        sdpa_virtual_tensor(g, "row index", CUDNN_DATA_INT32, shape);
    cudnnBackendDescriptor_t column =
        sdpa_virtual_tensor(g, "column index", CUDNN_DATA_INT32, shape);
    cudnnBackendDescriptor_t keep =
        sdpa_virtual_tensor(g, "causal", CUDNN_DATA_BOOLEAN, shape);
    cudnnBackendDescriptor_t masked =
        sdpa_virtual_tensor(g, "masked scores", CUDNN_DATA_FLOAT, shape);
    sdpa_pointwise(g, "row index", CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT,
                   2, scores, NULL, NULL, row);
    sdpa_pointwise(g, "column index", CUDNN_POINTWISE_GEN_INDEX,
                   CUDNN_DATA_FLOAT, 3, scores, NULL, NULL, column);
    sdpa_pointwise(g, "row >= column", CUDNN_POINTWISE_CMP_GE,
                   CUDNN_DATA_BOOLEAN, -1, row, column, NULL, keep);
    sdpa_pointwise(g, "causal select", CUDNN_POINTWISE_BINARY_SELECT,
                   CUDNN_DATA_FLOAT, -1, scores, neg_inf, keep, masked);
    return masked;
}

static void build_forward(graph *g, const sdpa_layout *l)
{
    cudnnBackendDescriptor_t q =
        sdpa_tensor(g, "Q", UID_Q, CUDNN_DATA_BFLOAT16, &l->q, false, false);
    cudnnBackendDescriptor_t kt =
        sdpa_tensor(g, "K^T", UID_K, CUDNN_DATA_BFLOAT16, &l->kt, false, false);
    cudnnBackendDescriptor_t v =
        sdpa_tensor(g, "V", UID_V, CUDNN_DATA_BFLOAT16, &l->kv, false, false);
    cudnnBackendDescriptor_t o =
        sdpa_tensor(g, "O", UID_O, CUDNN_DATA_BFLOAT16, &l->o, false, false);
    cudnnBackendDescriptor_t stats = sdpa_tensor(
        g, "stats", UID_STATS, CUDNN_DATA_FLOAT, &l->rows, false, false);
    cudnnBackendDescriptor_t scale = sdpa_scalar(g, "scale", UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = sdpa_scalar(g, "-inf", UID_NEG_INF);

    cudnnBackendDescriptor_t s =
        sdpa_virtual_tensor(g, "Q K^T", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_matmul(g, "Q K^T", q, kt, s);
    cudnnBackendDescriptor_t scaled =
        sdpa_virtual_tensor(g, "scores", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_binary(g, "scores x scale", CUDNN_POINTWISE_MUL, s, scale, scaled);
    cudnnBackendDescriptor_t masked =
        causal_mask(g, scaled, &l->scores, neg_inf);
    cudnnBackendDescriptor_t max =
        sdpa_virtual_tensor(g, "row max", CUDNN_DATA_FLOAT, &l->rows);
    sdpa_reduction(g, "row max", CUDNN_REDUCE_TENSOR_MAX, masked, max);
    cudnnBackendDescriptor_t shifted =
        sdpa_virtual_tensor(g, "scores - max", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_binary(g, "scores - max", CUDNN_POINTWISE_SUB, masked, max, shifted);
    cudnnBackendDescriptor_t e =
        sdpa_virtual_tensor(g, "exp", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_unary(g, "exp", CUDNN_POINTWISE_EXP, shifted, e);
    cudnnBackendDescriptor_t sum =
        sdpa_virtual_tensor(g, "row sum", CUDNN_DATA_FLOAT, &l->rows);
    sdpa_reduction(g, "row sum", CUDNN_REDUCE_TENSOR_ADD, e, sum);
    cudnnBackendDescriptor_t log_sum =
        sdpa_virtual_tensor(g, "log row sum", CUDNN_DATA_FLOAT, &l->rows);
    sdpa_unary(g, "log row sum", CUDNN_POINTWISE_LOG, sum, log_sum);
    sdpa_binary(g, "stats = max + log sum", CUDNN_POINTWISE_ADD, max, log_sum,
                stats);
    /* the second product takes P in the inputs' type */
    cudnnBackendDescriptor_t p =
        sdpa_virtual_tensor(g, "P", CUDNN_DATA_BFLOAT16, &l->scores);
    sdpa_binary(g, "P = exp / sum", CUDNN_POINTWISE_DIV, e, sum, p);
    sdpa_matmul(g, "P V", p, v, o);
}

/* The backward's P = exp(mask(Q K^T scale - stats)). */
static cudnnBackendDescriptor_t backward_probabilities(
    graph *g, const sdpa_layout *l, cudnnBackendDescriptor_t q,
    cudnnBackendDescriptor_t kt, cudnnBackendDescriptor_t stats,
    cudnnBackendDescriptor_t scale, cudnnBackendDescriptor_t neg_inf)
{
    cudnnBackendDescriptor_t s =
        sdpa_virtual_tensor(g, "Q K^T", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_matmul(g, "Q K^T", q, kt, s);
    cudnnBackendDescriptor_t scaled =
        sdpa_virtual_tensor(g, "scores", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_binary(g, "scores x scale", CUDNN_POINTWISE_MUL, s, scale, scaled);
    cudnnBackendDescriptor_t shifted =
        sdpa_virtual_tensor(g, "scores - stats", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_binary(g, "scores - stats", CUDNN_POINTWISE_SUB, scaled, stats,
                shifted);
    cudnnBackendDescriptor_t masked =
        causal_mask(g, shifted, &l->scores, neg_inf);
    cudnnBackendDescriptor_t p =
        sdpa_virtual_tensor(g, "P", CUDNN_DATA_FLOAT, &l->scores);
    sdpa_unary(g, "P = exp", CUDNN_POINTWISE_EXP, masked, p);
    return p;
}

/* delta = rowsum(dO * O) x 1, into the workspace (a real tensor, which
 * the rest of the backward reads). */
static cudnnBackendDescriptor_t backward_delta(graph *g,
                                               const sdpa_layout *l,
                                               cudnnBackendDescriptor_t d_out,
                                               cudnnBackendDescriptor_t o)
{
    cudnnBackendDescriptor_t one = sdpa_scalar(g, "one", UID_ONE);
    cudnnBackendDescriptor_t delta = sdpa_tensor(
        g, "delta", UID_DELTA, CUDNN_DATA_FLOAT, &l->rows, false, false);
    cudnnBackendDescriptor_t product =
        sdpa_virtual_tensor(g, "dO * O", CUDNN_DATA_FLOAT, &l->o_product);
    sdpa_binary(g, "dO * O", CUDNN_POINTWISE_MUL, d_out, o, product);
    cudnnBackendDescriptor_t sum =
        sdpa_virtual_tensor(g, "rowsum dO * O", CUDNN_DATA_FLOAT, &l->rows);
    sdpa_reduction(g, "rowsum dO * O", CUDNN_REDUCE_TENSOR_ADD, product, sum);
    sdpa_binary(g, "delta", CUDNN_POINTWISE_MUL, sum, one, delta);
    return delta;
}

/* The inputs and outputs of the backward, the caller's memory. */
typedef struct backward_io {
    cudnnBackendDescriptor_t q, kt, vt, o, d_out, stats, d_q, d_k, d_v;
} backward_io;

static backward_io backward_tensors(graph *g, const sdpa_layout *l)
{
    cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, fp32 = CUDNN_DATA_FLOAT;
    backward_io io = {
        .q = sdpa_tensor(g, "Q", UID_Q, bf16, &l->q, false, false),
        .kt = sdpa_tensor(g, "K^T", UID_K, bf16, &l->kt, false, false),
        .vt = sdpa_tensor(g, "V^T", UID_V, bf16, &l->kt, false, false),
        .o = sdpa_tensor(g, "O", UID_O, bf16, &l->o, false, false),
        .d_out = sdpa_tensor(g, "dO", UID_D_OUT, bf16, &l->o, false, false),
        .stats =
            sdpa_tensor(g, "stats", UID_STATS, fp32, &l->rows, false, false),
        .d_q = sdpa_tensor(g, "dQ", UID_D_Q, bf16, &l->q, false, false),
        .d_k = sdpa_tensor(g, "dK", UID_D_K, bf16, &l->kv, false, false),
        .d_v = sdpa_tensor(g, "dV", UID_D_V, bf16, &l->kv, false, false),
    };
    return io;
}

/* c = a b into a key/value gradient: directly without grouping, else
 * per query head into a virtual tensor summed over each group. */
static void matmul_into_kv(graph *g, const char *label,
                           const sdpa_layout *l, cudnnBackendDescriptor_t a,
                           cudnnBackendDescriptor_t b,
                           cudnnBackendDescriptor_t c)
{
    if (l->kv.dims[1] == l->q.dims[1]) {
        sdpa_matmul(g, label, a, b, c);
        return;
    }
    cudnnBackendDescriptor_t full =
        sdpa_virtual_tensor(g, label, CUDNN_DATA_BFLOAT16, &l->kv_full);
    sdpa_matmul(g, label, a, b, full);
    sdpa_reduction(g, "sum over the group", CUDNN_REDUCE_TENSOR_ADD, full, c);
}

static void build_backward(graph *g, const sdpa_layout *l,
                           bool accumulate_dq)
{
    cudnnDataType_t bf16 = CUDNN_DATA_BFLOAT16, fp32 = CUDNN_DATA_FLOAT;
    backward_io io = backward_tensors(g, l);
    cudnnBackendDescriptor_t scale = sdpa_scalar(g, "scale", UID_SCALE);
    cudnnBackendDescriptor_t neg_inf = sdpa_scalar(g, "-inf", UID_NEG_INF);
    cudnnBackendDescriptor_t delta = backward_delta(g, l, io.d_out, io.o);
    cudnnBackendDescriptor_t p =
        backward_probabilities(g, l, io.q, io.kt, io.stats, scale, neg_inf);
    /* dV = P^T dO */
    cudnnBackendDescriptor_t p_t =
        sdpa_virtual_tensor(g, "P^T", bf16, &l->scores_t);
    sdpa_reshape(g, "P^T", p, p_t);
    matmul_into_kv(g, "dV = P^T dO", l, p_t, io.d_out, io.d_v);
    /* dS = P (dO V^T - delta) scale */
    cudnnBackendDescriptor_t d_p =
        sdpa_virtual_tensor(g, "dP", fp32, &l->scores);
    sdpa_matmul(g, "dP = dO V^T", io.d_out, io.vt, d_p);
    cudnnBackendDescriptor_t centred =
        sdpa_virtual_tensor(g, "dP - delta", fp32, &l->scores);
    sdpa_binary(g, "dP - delta", CUDNN_POINTWISE_SUB, d_p, delta, centred);
    cudnnBackendDescriptor_t d_s_raw =
        sdpa_virtual_tensor(g, "P (dP - delta)", fp32, &l->scores);
    sdpa_binary(g, "P (dP - delta)", CUDNN_POINTWISE_MUL, centred, p, d_s_raw);
    cudnnBackendDescriptor_t d_s =
        sdpa_virtual_tensor(g, "dS", fp32, &l->scores);
    sdpa_binary(g, "dS = ... x scale", CUDNN_POINTWISE_MUL, d_s_raw, scale,
                d_s);
    /* dK = dS^T Q */
    cudnnBackendDescriptor_t d_s_t =
        sdpa_virtual_tensor(g, "dS^T", bf16, &l->scores_t);
    sdpa_reshape(g, "dS^T", d_s, d_s_t);
    matmul_into_kv(g, "dK = dS^T Q", l, d_s_t, io.q, io.d_k);
    /* dQ = dS K, K being K^T seen transposed again */
    cudnnBackendDescriptor_t k = sdpa_virtual_tensor(g, "K", bf16, &l->kv);
    sdpa_reshape(g, "K", io.kt, k);
    if (!accumulate_dq) {
        sdpa_matmul(g, "dQ = dS K", d_s, k, io.d_q);
        return;
    }
    /* cudnn-frontend's non-deterministic pattern: the product into a real
     * fp32 tensor, then its copy in the output's type */
    cudnnBackendDescriptor_t accumulator = sdpa_tensor(
        g, "dQ accumulator", UID_DQ_ACCUM, fp32, &l->q_packed, false, false);
    sdpa_matmul(g, "dQ = dS K (fp32)", d_s, k, accumulator);
    sdpa_unary(g, "dQ", CUDNN_POINTWISE_IDENTITY, accumulator, io.d_q);
}

/* ---------------------------------------------------------------- plans */

/* The operation graph of g's operations, finalized. */
static cudnnBackendDescriptor_t operation_graph(graph *g, cudnnHandle_t handle)
{
    cudnnBackendDescriptor_t og =
        sdpa_graph_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR, "graph");
    SET(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        g->operation_count, g->operations, "the operation graph");
    /* deprecated in cuDNN 9 (set, as cudnn-frontend does, but a refusal
     * is no failure) */
    if (og != NULL)
        cudnnBackendSetAttribute(og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE,
                                 CUDNN_TYPE_HANDLE, 1, &handle);
    sdpa_graph_finalize(g, og, "the operation graph");
    return og;
}

/* cuDNN's engine configurations for the graph, best first (heuristics
 * mode A), at most ENGINE_CONFIGS_TRIED; the count, 0 after a failure. */
static int64_t engine_configs(graph *g, cudnnBackendDescriptor_t og,
                              cudnnBackendDescriptor_t *configs)
{
    cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    cudnnBackendDescriptor_t heuristics =
        sdpa_graph_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "heuristics");
    SET(g, heuristics, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og, "the heuristics");
    SET(g, heuristics, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1,
        &mode, "the heuristics");
    sdpa_graph_finalize(g, heuristics, "the heuristics (mode A)");
    int64_t available = 0, count = 0;
    if (g->failed)
        return 0;
    cudnnStatus_t status =
        cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &available,
                                 NULL);
    if (status != CUDNN_STATUS_SUCCESS) {
        sdpa_graph_failed(g, "cudnnBackendGetAttribute",
                          "CUDNN_ATTR_ENGINEHEUR_RESULTS (count)", status);
        return 0;
    }
    if (available > ENGINE_CONFIGS_TRIED)
        available = ENGINE_CONFIGS_TRIED;
    for (int64_t i = 0; i < available; i++)
        configs[i] = sdpa_graph_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR,
                                    "an engine configuration");
    if (g->failed || available == 0)
        return 0;
    status = cudnnBackendGetAttribute(heuristics, CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR,
                                      available, &count, configs);
    if (status != CUDNN_STATUS_SUCCESS) {
        sdpa_graph_failed(g, "cudnnBackendGetAttribute",
                          "CUDNN_ATTR_ENGINEHEUR_RESULTS", status);
        return 0;
    }
    return count;
}

/* A finalized execution plan of the config, or NULL (cuDNN's message
 * left in `why`). */
static cudnnBackendDescriptor_t try_plan(cudnnHandle_t handle,
                                         cudnnBackendDescriptor_t config,
                                         char *why, size_t why_size)
{
    cudnnBackendDescriptor_t plan = NULL;
    cudnnStatus_t status =
        cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR,
                                     &plan);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendSetAttribute(
            plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG,
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &config);
    if (status == CUDNN_STATUS_SUCCESS) /* deprecated, as the graph's */
        cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE,
                                 CUDNN_TYPE_HANDLE, 1, &handle);
    if (status == CUDNN_STATUS_SUCCESS)
        status = cudnnBackendFinalize(plan);
    if (status == CUDNN_STATUS_SUCCESS)
        return plan;
    char detail[400];
    cudnnGetLastErrorString(detail, sizeof detail);
    snprintf(why, why_size, "%s%s%s", cudnnGetErrorString(status),
             detail[0] != '\0' ? ": " : "", detail);
    if (plan != NULL)
        cudnnBackendDestroyDescriptor(plan);
    return NULL;
}

/* cuDNN's global index of the config's engine (for the description);
 * -1 when it cannot say. */
static int64_t engine_index(graph *g, cudnnBackendDescriptor_t config)
{
    cudnnBackendDescriptor_t engine =
        sdpa_graph_new(g, CUDNN_BACKEND_ENGINE_DESCRIPTOR, "an engine");
    int64_t count = 0, index = -1;
    if (engine == NULL ||
        cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE,
                                 CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &count,
                                 &engine) != CUDNN_STATUS_SUCCESS ||
        cudnnBackendGetAttribute(engine, CUDNN_ATTR_ENGINE_GLOBAL_INDEX,
                                 CUDNN_TYPE_INT64, 1, &count,
                                 &index) != CUDNN_STATUS_SUCCESS)
        return -1;
    return index;
}

/* The plan of a built graph: the first engine configuration that cuDNN
 * finalizes, its workspace and engine. */
static int plan_graph(graph *g, cudnnHandle_t handle, sdpa_plan *out)
{
    cudnnBackendDescriptor_t og = operation_graph(g, handle);
    cudnnBackendDescriptor_t configs[ENGINE_CONFIGS_TRIED];
    int64_t count = engine_configs(g, og, configs);
    if (g->failed)
        return -1;
    char why[480] = "cuDNN's heuristics returned no engine configuration";
    for (int64_t i = 0; i < count; i++) {
        cudnnBackendDescriptor_t plan =
            try_plan(handle, configs[i], why, sizeof why);
        if (plan == NULL)
            continue;
        g->owned[g->owned_count++] = plan; /* build_plan kept room */
        int64_t elements = 0;
        cudnnStatus_t status = cudnnBackendGetAttribute(
            plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64,
            1, &elements, &out->workspace);
        if (status != CUDNN_STATUS_SUCCESS) {
            sdpa_graph_failed(g, "cudnnBackendGetAttribute",
                              "CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE",
                              status);
            return -1;
        }
        out->plan = plan;
        out->engine = engine_index(g, configs[i]);
        return 0;
    }
    return pt_fail(g->err, "cuDNN attention, %s graph: none of the %lld "
                           "engine configurations of cuDNN's heuristics "
                           "could be planned; the last: %s",
                   g->name, (long long)count, why);
}

/* Builds the forward or backward graph of the layout and its plan. */
static int build_plan(cudnn_attention *a, const sdpa_layout *l, bool forward,
                      sdpa_plan *out, pt_error *err)
{
    graph *g = calloc(1, sizeof *g);
    if (g == NULL)
        return pt_fail(err, "cuDNN attention: out of host memory");
    g->next_uid = UID_FIRST_VIRTUAL;
    g->name = forward ? "forward" : "backward";
    g->err = err;
    if (forward)
        build_forward(g, l);
    else
        build_backward(g, l, a->accumulate_dq);
    /* room for what plan_graph adds: the operation graph, heuristics,
     * configurations, plan and engine */
    if (!g->failed && g->owned_count + ENGINE_CONFIGS_TRIED + 4 >
                          GRAPH_MAX_DESCRIPTORS)
        pt_fail(err, "cuDNN attention: GRAPH_MAX_DESCRIPTORS is too small");
    else if (!g->failed && plan_graph(g, a->handle, out) == 0) {
        out->graph = g;
        return 0;
    }
    sdpa_graph_destroy(g);
    return -1;
}

/* ----------------------------------------------------------- the object */

size_t cudnn_attention_runtime_version(void)
{
    return cudnnGetVersion();
}

size_t cudnn_attention_build_version(void)
{
    return CUDNN_VERSION;
}

int cudnn_attention_create(cudnn_attention **out, bool deterministic,
                           pt_error *err)
{
    *out = NULL;
    cudnn_attention *a = calloc(1, sizeof *a);
    if (a == NULL)
        return pt_fail(err, "cuDNN attention: out of host memory");
    cudnnStatus_t status = cudnnCreate(&a->handle);
    if (status != CUDNN_STATUS_SUCCESS) {
        free(a);
        return sdpa_fail(err, "setting up", "cudnnCreate", "", status);
    }
    /* what masked scores become: cuDNN before 9.10 wants the lowest
     * float rather than -inf (as cudnn-frontend does) */
    a->neg_inf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY;
    /* before 9.6 the caller zeroed the accumulator (cudnn-frontend did):
     * not done here, so the option needs 9.6 */
    a->accumulate_dq = !deterministic && cudnnGetVersion() >= 90600;
    *out = a;
    return 0;
}

void cudnn_attention_destroy(cudnn_attention *a)
{
    if (a == NULL)
        return;
    for (int i = 0; i < a->shape_count; i++) {
        sdpa_graph_destroy(a->shapes[i].forward.graph);
        sdpa_graph_destroy(a->shapes[i].backward.graph);
    }
    if (a->workspace != NULL) {
        cudaFree(a->workspace);
        cuda_rank_memory_release(a->workspace_bytes);
    }
    cudnnDestroy(a->handle);
    free(a);
}

static sdpa_shape *find_shape(cudnn_attention *a, int B, int T, int H,
                              int KVH, int D)
{
    for (int i = 0; i < a->shape_count; i++) {
        sdpa_shape *s = &a->shapes[i];
        if (s->B == B && s->T == T && s->H == H && s->KVH == KVH &&
            s->D == D)
            return s;
    }
    return NULL;
}

static size_t round_up(size_t bytes)
{
    return (bytes + WORKSPACE_ALIGNMENT - 1) / WORKSPACE_ALIGNMENT *
           WORKSPACE_ALIGNMENT;
}

/* The backward's delta (B x H x T floats of one piece) heads the
 * workspace, then dQ's fp32 accumulator where the plan has one (B x H x
 * T x D floats); cuDNN's own workspace follows. */
static size_t delta_bytes(const sdpa_shape *s)
{
    return round_up((size_t)(s->B / s->pieces) * s->H * s->T *
                    sizeof(float));
}

static size_t accumulator_bytes(const sdpa_shape *s)
{
    return s->dq_accumulated ? round_up((size_t)(s->B / s->pieces) * s->H *
                                        s->T * s->D * sizeof(float))
                             : 0;
}

/* Grows the workspace to `bytes` (once per new largest shape: the old
 * one may still be in use by queued work, so the device is drained). */
static int grow_workspace(cudnn_attention *a, size_t bytes, pt_error *err)
{
    if (bytes <= a->workspace_bytes)
        return 0;
    if (cuda_rank_memory_reserve(bytes, "the cuDNN attention workspace",
                                 err) != 0)
        return -1;
    void *fresh = NULL;
    cudaError_t status = cudaDeviceSynchronize();
    if (status == cudaSuccess)
        status = cudaMalloc(&fresh, bytes);
    if (status != cudaSuccess) {
        cuda_rank_memory_release(bytes);
        cudaGetLastError();
        return pt_fail(err, "cuDNN attention: a workspace of %.1f MiB: %s",
                       (double)bytes / (1 << 20), cudaGetErrorString(status));
    }
    if (a->workspace != NULL) {
        cudaFree(a->workspace);
        cuda_rank_memory_release(a->workspace_bytes);
    }
    a->workspace = fresh;
    a->workspace_bytes = bytes;
    return 0;
}

static void describe_shape(sdpa_shape *s)
{
    size_t runtime = cudnnGetVersion();
    char pieces[48] = "";
    if (s->pieces > 1)
        snprintf(pieces, sizeof pieces, ", %d calls of %d sequences",
                 s->pieces, s->B / s->pieces);
    char accumulator[32] = "";
    if (s->dq_accumulated)
        snprintf(accumulator, sizeof accumulator, " + %.1f MiB",
                 (double)accumulator_bytes(s) / (1 << 20));
    char grouped[48] = "";
    if (s->KVH != s->H)
        snprintf(grouped, sizeof grouped, " (grouped: %d key/value heads)",
                 s->KVH);
    snprintf(s->description, sizeof s->description,
             "cuDNN %zu.%zu.%zu (built with %d.%d.%d) fused attention%s: "
             "forward engine %lld (workspace %.1f MiB), backward engine "
             "%lld (workspace %.1f MiB + %.1f MiB of row sums%s%s%s%s)",
             runtime / 10000, runtime % 10000 / 100, runtime % 100,
             CUDNN_MAJOR, CUDNN_MINOR, CUDNN_PATCHLEVEL, grouped,
             (long long)s->forward.engine,
             (double)s->forward.workspace / (1 << 20),
             (long long)s->backward.engine,
             (double)s->backward.workspace / (1 << 20),
             (double)delta_bytes(s) / (1 << 20), accumulator,
             s->dq_accumulated
                 ? " of dQ's fp32 accumulator (not deterministic)"
                 : "",
             s->backward_borrows ? ", in lent memory" : "", pieces);
}

/* The backward's workspace: its row sums, dQ's accumulator where it has
 * one, and cuDNN's own. */
static size_t backward_workspace_bytes(const sdpa_shape *s)
{
    return delta_bytes(s) + accumulator_bytes(s) +
           round_up((size_t)s->backward.workspace);
}

/* Where the whole backward's workspace is more than `lendable`, the
 * fewest pieces of whole sequences whose plan's workspace fits (cuDNN's
 * grows with the sequences: a plan is built only for a count whose
 * share of the whole one's fits); the whole plan is kept when none
 * does. */
static int split_backward(cudnn_attention *a, sdpa_shape *s,
                          size_t lendable, pt_error *err)
{
    size_t whole = (size_t)s->backward.workspace;
    for (int pieces = 2; pieces <= s->B; pieces++) {
        if (s->B % pieces != 0)
            continue;
        sdpa_shape piece = *s;
        piece.pieces = pieces;
        if (delta_bytes(&piece) + accumulator_bytes(&piece) +
                round_up(whole / (size_t)pieces) >
            lendable)
            continue;
        sdpa_layout l = layout_of(s->B / pieces, s->T, s->H, s->KVH, s->D);
        if (build_plan(a, &l, false, &piece.backward, err) != 0)
            return -1;
        if (backward_workspace_bytes(&piece) <= lendable) {
            sdpa_graph_destroy(s->backward.graph);
            *s = piece;
            return 0;
        }
        sdpa_graph_destroy(piece.backward.graph);
    }
    return 0;
}

int cudnn_attention_prepare(cudnn_attention *a, int B, int T, int H,
                            int KVH, int D, size_t lendable, pt_error *err)
{
    if (find_shape(a, B, T, H, KVH, D) != NULL)
        return 0;
    if (KVH <= 0 || H % KVH != 0)
        return pt_fail(err, "cuDNN attention: %d query heads cannot share "
                            "%d key/value heads",
                       H, KVH);
    if (a->shape_count == ATTENTION_MAX_SHAPES)
        return pt_fail(err, "cuDNN attention: more than %d shapes",
                       ATTENTION_MAX_SHAPES);
    sdpa_shape *s = &a->shapes[a->shape_count];
    *s = (sdpa_shape){.B = B,
                      .T = T,
                      .H = H,
                      .KVH = KVH,
                      .D = D,
                      .pieces = 1,
                      .dq_accumulated = a->accumulate_dq};
    sdpa_layout l = layout_of(B, T, H, KVH, D);
    if (build_plan(a, &l, true, &s->forward, err) != 0)
        return -1;
    if (build_plan(a, &l, false, &s->backward, err) == 0 &&
        (backward_workspace_bytes(s) <= lendable ||
         split_backward(a, s, lendable, err) == 0)) {
        size_t need = round_up((size_t)s->forward.workspace);
        s->backward_borrows = backward_workspace_bytes(s) <= lendable;
        if (!s->backward_borrows && backward_workspace_bytes(s) > need)
            need = backward_workspace_bytes(s);
        if (grow_workspace(a, need, err) == 0) {
            describe_shape(s);
            a->shape_count++;
            return 0;
        }
    }
    sdpa_graph_destroy(s->backward.graph);
    sdpa_graph_destroy(s->forward.graph);
    return -1;
}

/* Runs a plan with the tensors uids[i] at pointers[i] (device memory, or
 * a host scalar for the by-value ones). */
static int execute(cudnn_attention *a, const sdpa_plan *plan,
                   const char *what, const int64_t *uids, void **pointers,
                   int64_t count, void *workspace, cudaStream_t stream,
                   pt_error *err)
{
    cudnnStatus_t status = cudnnSetStream(a->handle, stream);
    if (status != CUDNN_STATUS_SUCCESS)
        return sdpa_fail(err, what, "cudnnSetStream", "", status);
    cudnnBackendDescriptor_t pack = NULL;
    const char *call = "cudnnBackendCreateDescriptor";
    const char *attribute = "CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR";
    status = cudnnBackendCreateDescriptor(
        CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
    if (status == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendSetAttribute";
        attribute = "CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS";
        status = cudnnBackendSetAttribute(pack,
                                          CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS,
                                          CUDNN_TYPE_INT64, count, uids);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        attribute = "CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS";
        status = cudnnBackendSetAttribute(
            pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR,
            count, pointers);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        attribute = "CUDNN_ATTR_VARIANT_PACK_WORKSPACE";
        status = cudnnBackendSetAttribute(pack,
                                          CUDNN_ATTR_VARIANT_PACK_WORKSPACE,
                                          CUDNN_TYPE_VOID_PTR, 1, &workspace);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendFinalize";
        attribute = "the variant pack";
        status = cudnnBackendFinalize(pack);
    }
    if (status == CUDNN_STATUS_SUCCESS) {
        call = "cudnnBackendExecute";
        attribute = "the plan";
        status = cudnnBackendExecute(a->handle, plan->plan, pack);
    }
    if (pack != NULL)
        cudnnBackendDestroyDescriptor(pack);
    if (status != CUDNN_STATUS_SUCCESS)
        return sdpa_fail(err, what, call, attribute, status);
    return 0;
}

static int prepared(cudnn_attention *a, int B, int T, int H, int KVH,
                    int D, sdpa_shape **out, pt_error *err)
{
    *out = find_shape(a, B, T, H, KVH, D);
    if (*out != NULL)
        return 0;
    return pt_fail(err, "cuDNN attention: B %d, T %d, %d heads of %d (%d "
                        "key/value heads) was not prepared",
                   B, T, H, D, KVH);
}

int cudnn_attention_forward(cudnn_attention *a, pt_bf16 *out, float *stats,
                            const pt_bf16 *qkv, int B, int T, int H, int KVH,
                            int D, cudaStream_t stream, pt_error *err)
{
    sdpa_shape *s = NULL;
    if (prepared(a, B, T, H, KVH, D, &s, err) != 0)
        return -1;
    /* the keys follow the H query heads, the values the KVH key heads */
    size_t keys = (size_t)H * D, values = keys + (size_t)KVH * D;
    float scale = 1.0f / sqrtf((float)D), neg_inf = a->neg_inf;
    int64_t uids[] = {UID_Q,     UID_K,     UID_V,      UID_O,
                      UID_STATS, UID_SCALE, UID_NEG_INF};
    void *pointers[] = {(void *)qkv,       (void *)(qkv + keys),
                        (void *)(qkv + values), out,
                        stats,             &scale,
                        &neg_inf};
    return execute(a, &s->forward, "forward", uids, pointers,
                   (int64_t)(sizeof uids / sizeof uids[0]), a->workspace,
                   stream, err);
}

int cudnn_attention_backward(cudnn_attention *a, pt_bf16 *d_qkv,
                             const pt_bf16 *d_out, const pt_bf16 *qkv,
                             const pt_bf16 *out, const float *stats, int B,
                             int T, int H, int KVH, int D, void *lent,
                             size_t lent_bytes, cudaStream_t stream,
                             pt_error *err)
{
    sdpa_shape *s = NULL;
    if (prepared(a, B, T, H, KVH, D, &s, err) != 0)
        return -1;
    char *delta = a->workspace;
    if (s->backward_borrows) {
        if (lent == NULL || lent_bytes < backward_workspace_bytes(s))
            return pt_fail(err, "cuDNN attention: the backward of B %d, "
                                "T %d needs %.1f MiB of lent workspace, "
                                "%.1f MiB were lent",
                           B, T,
                           (double)backward_workspace_bytes(s) / (1 << 20),
                           (double)lent_bytes / (1 << 20));
        delta = lent;
    }
    size_t keys = (size_t)H * D, values = keys + (size_t)KVH * D;
    float scale = 1.0f / sqrtf((float)D), neg_inf = a->neg_inf, one = 1.0f;
    int64_t uids[] = {UID_Q,     UID_K,     UID_V,       UID_O,
                      UID_D_OUT, UID_STATS, UID_D_Q,     UID_D_K,
                      UID_D_V,   UID_SCALE, UID_NEG_INF, UID_ONE,
                      UID_DELTA, UID_DQ_ACCUM};
    /* the accumulator's uid is left out of a plan without one */
    int64_t uid_count = (int64_t)(sizeof uids / sizeof uids[0]) -
                        (s->dq_accumulated ? 0 : 1);
    /* each piece's sequences: qkv rows of (H + 2 KVH) D, out rows of
     * H D, stats H x T a sequence */
    int sequences = B / s->pieces;
    size_t qkv_step = (size_t)sequences * T * (values + (size_t)KVH * D);
    size_t out_step = (size_t)sequences * T * keys;
    size_t stats_step = (size_t)sequences * H * T;
    for (int p = 0; p < s->pieces; p++) {
        const pt_bf16 *q = qkv + p * qkv_step;
        pt_bf16 *dq = d_qkv + p * qkv_step;
        void *pointers[] = {(void *)q,
                            (void *)(q + keys),
                            (void *)(q + values),
                            (void *)(out + p * out_step),
                            (void *)(d_out + p * out_step),
                            (void *)(stats + p * stats_step),
                            dq,
                            dq + keys,
                            dq + values,
                            &scale,
                            &neg_inf,
                            &one,
                            delta,
                            delta + delta_bytes(s)};
        if (execute(a, &s->backward, "backward", uids, pointers, uid_count,
                    delta + delta_bytes(s) + accumulator_bytes(s), stream,
                    err) != 0)
            return -1;
    }
    return 0;
}

size_t cudnn_attention_device_bytes(const cudnn_attention *a)
{
    return a != NULL ? a->workspace_bytes : 0;
}

const char *cudnn_attention_describe(cudnn_attention *a, int B, int T, int H,
                                     int KVH, int D)
{
    sdpa_shape *s = find_shape(a, B, T, H, KVH, D);
    return s != NULL ? s->description : "";
}
