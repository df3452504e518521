/*
 * ZeRO-2 and ZeRO-3 on the cuda backend (plain C: the GPU machines have no
 * cmocka; PASS / FAIL lines, exit 77 without a GPU), over the device
 * exchange on slices of ONE GPU (each rank in a green context of 16 SMs,
 * unpaced links), as the accuracy suite runs dp plans. Checked:
 *   - dp 2 (a tied GPT of 8 layers, 2 micro-batches a replica): ZeRO-1,
 *     ZeRO-2 and ZeRO-3 give plain dp's losses and gradient norms over
 *     four steps, within bf16 / fp32 rounding (the reduce-scatters sum
 *     what the all-reduce sums, unit by unit);
 *   - pp 2 x dp 2 untied (four slices): ZeRO-3 likewise against plain;
 *   - dp 2 over the host-staged comm (no streams: the units' collectives
 *     blocking): ZeRO-2 and ZeRO-3 likewise;
 *   - memory: every rank's allocations, term by term, are those of the
 *     memory plan (buffers.c, what the cost model is held to), ZeRO-2's
 *     gradients and ZeRO-3's weights and mirror below ZeRO-1's;
 *   - ZeRO-3's gathers: each rank all-gathers the units the cost model
 *     counts (costmodel_zero3_gathers: a unit its buffer still holds
 *     since the optimizer step is not gathered again), and with
 *     PARTITA_CUDA_UNIT_HOLDS=0 (every unit of every pass gathered) the
 *     losses, gradient norms and every rank's parameters are the same
 *     bits.
 * Losses are compared, never times.
 */
#include "gpu_test.h"

#include "costmodel/costmodel.h"
#include "executor/cuda/buffers.h"
#include "executor/parallel/parallel.h"

#define PROGRAM "test_cuda_zero"
#define STEPS 4
#define SM_SLICE 16
#define TIMEOUT_S 120.0

typedef struct zero_case {
    const char *name;
    gpu_comm_kind comm;
    bool tied;
    int dp, pp;
    int partition[2];
} zero_case;

typedef struct case_result {
    float loss[STEPS];
    float norm[STEPS];
    pt_memory_terms terms[8];    /* by rank */
    long gathers[8];             /* ZeRO-3's units gathered, by rank */
    long expected_gathers[8];    /* what the rule says (run_case) */
    float *params[8];            /* owned: each rank's parameters (its
                                    shard under ZeRO-3) after the steps */
    size_t param_first[8], param_floats[8];
    int ranks;
    bool ok;
} case_result;

static void case_result_free(case_result *r)
{
    for (int i = 0; i < 8; i++)
        free(r->params[i]);
}

/* A rank's parameters to the host, on its own thread. */
typedef struct params_read {
    float *host;
    size_t first, floats;
} params_read;

static int read_params_task(void *data, int rank, model_stage *stage,
                            pt_error *err)
{
    (void)rank;
    params_read *read = data;
    read->first = stage->params_first;
    read->floats = model_stage_buffer_count(stage, STAGE_PARAMS);
    read->host = malloc((read->floats + 1) * sizeof *read->host);
    if (read->host == NULL)
        return pt_fail(err, "out of host memory for the parameters");
    return model_stage_read(stage, STAGE_PARAMS, read->host, err);
}

static model_shape shape_of(bool tied)
{
    /* 8 layers: enough that half the state saves more than the unit
     * buffers (two layers, the embeddings, the head) take */
    model_shape shape = {.name = "small", .layers = 8, .hidden = 128,
                         .heads = 2, .ffn_hidden = 512, .seq = 64,
                         .vocab = 257, .tied_embeddings = tied};
    return shape;
}

/* A rank's allocations against the plan of its spec. */
static bool memory_matches(const pipeline_layout *layout, int rank,
                           const model_stage *stage,
                           const pt_memory_terms *got)
{
    pt_error err = {{0}};
    pt_memory_terms plan;
    if (cuda_stage_memory_plan(&layout->shape, &stage->spec,
                               stage->mbs_capacity, stage->slot_count, NULL,
                               &plan, &err) != 0) {
        printf("# rank %d: %s\n", rank, err.message);
        return false;
    }
    bool same = true;
    for (int t = 0; t < PT_MEMORY_TERM_COUNT; t++)
        if (t != PT_MEMORY_WORKSPACE && got->bytes[t] != plan.bytes[t]) {
            printf("# rank %d: %s allocated %.0f bytes, planned %.0f\n",
                   rank, pt_memory_term_name((pt_memory_term)t),
                   got->bytes[t], plan.bytes[t]);
            same = false;
        }
    return same;
}

/* Each rank's gathers and parameters into `out`. */
static bool read_ranks(pipeline_gpu *gpu, case_result *out)
{
    bool read_all = true;
    for (int r = 0; r < out->ranks; r++) {
        out->gathers[r] = cuda_stage_param_gathers(&gpu->threads.stages[r]);
        params_read read = {NULL, 0, 0};
        pt_error err = {{0}};
        if (pipeline_threads_on_rank(&gpu->threads, r, read_params_task,
                                     &read, &err) != 0) {
            printf("# rank %d: %s\n", r, err.message);
            read_all = false;
        }
        out->params[r] = read.host;
        out->param_first[r] = read.first;
        out->param_floats[r] = read.floats;
    }
    return read_all;
}

/* The units each rank gathers in STEPS steps under ZeRO-3: what the
 * cost model counts (the executor's rule), or with `holds` false every
 * unit of each of a step's 2 m passes (a tied head's backward gathers
 * the embeddings first and keeps them to its end). */
static void expect_gathers(const pipeline_layout *layout,
                           const model_shape *shape,
                           const parallel_config *config, bool holds,
                           case_result *out)
{
    int m = parallel_microbatches(config);
    for (int r = 0; r < layout->rank_count; r++) {
        int stage = pipeline_rank_stage(layout, r);
        int layers = layout->partition[stage];
        /* 0 where the stage gathers no units (a tied pipeline's pair) */
        double step = costmodel_zero3_gathers(shape, config, stage, layers);
        if (!holds && step > 0.0)
            step = 2.0 * m *
                   (layers + (stage == 0) + (stage == config->pp - 1));
        out->expected_gathers[r] = (long)(STEPS * step);
    }
}

/* `holds` false: the run under PARTITA_CUDA_UNIT_HOLDS=0 (read as the
 * stages are made). */
static case_result run_case(gpu_test_tally *tally, const zero_case *c,
                            int zero, bool holds)
{
    case_result out = {.ok = false};
    model_shape shape = shape_of(c->tied);
    parallel_config config = {.gbs = 4 * c->dp, .mbs = 2, .tp = 1,
                              .dp = c->dp, .pp = c->pp,
                              .schedule = SCHEDULE_1F1B,
                              .precision = PRECISION_BF16};
    if (zero > 0)
        parallel_set_zero_stage(&config, zero);
    pipeline_layout layout;
    pt_error err = {{0}};
    char what[160];
    snprintf(what, sizeof what, "%s, ZeRO-%d: the plan starts", c->name,
             zero);
    if (pipeline_layout_init(&layout, &shape, &config, c->partition, c->pp,
                             &err) != 0) {
        gpu_test_expect(tally, false, err.message);
        return out;
    }
    if (zero >= 3)
        expect_gathers(&layout, &shape, &config, holds, &out);
    device_spec devices[8];
    for (int r = 0; r < layout.rank_count; r++)
        devices[r] = (device_spec){.index = 0, .sm_limit = SM_SLICE};
    pipeline_gpu gpu;
    if (!holds)
        setenv("PARTITA_CUDA_UNIT_HOLDS", "0", 1);
    int started = pipeline_gpu_start(&gpu, &layout, devices, c->comm, NULL,
                                     7, TIMEOUT_S, &err);
    unsetenv("PARTITA_CUDA_UNIT_HOLDS");
    if (started != 0) {
        printf("# %s\n", err.message);
        gpu_test_expect(tally, false, what);
        return out;
    }
    size_t windows = (size_t)config.gbs * (size_t)(shape.seq + 1);
    uint32_t *tokens = malloc(windows * sizeof *tokens);
    train_config train = train_config_defaults();
    bool ran = tokens != NULL;
    for (int step = 0; step < STEPS && ran; step++) {
        for (size_t i = 0; i < windows; i++)
            tokens[i] = (uint32_t)((i * 31 + (size_t)step * 7) % 257);
        step_result result;
        if (pipeline_threads_step(&gpu.threads, &train, tokens, &result,
                                  &err) != 0) {
            printf("# %s\n", err.message);
            ran = false;
            break;
        }
        out.loss[step] = result.loss;
        out.norm[step] = result.grad_norm;
    }
    snprintf(what, sizeof what, "%s, ZeRO-%d: %d steps run", c->name, zero,
             STEPS);
    gpu_test_expect(tally, ran, what);
    out.ranks = layout.rank_count;
    bool memory_ok = true;
    for (int r = 0; r < layout.rank_count && ran; r++) {
        const model_stage *stage = &gpu.threads.stages[r];
        cuda_stage_memory_terms(stage, &out.terms[r]);
        memory_ok = memory_matches(&layout, r, stage, &out.terms[r]) &&
                    memory_ok;
    }
    snprintf(what, sizeof what,
             "%s, ZeRO-%d: every rank allocates its memory plan", c->name,
             zero);
    if (ran)
        gpu_test_expect(tally, memory_ok, what);
    if (ran && !read_ranks(&gpu, &out))
        ran = false;
    free(tokens);
    pipeline_gpu_stop(&gpu);
    out.ok = ran;
    return out;
}

static void compare_runs(gpu_test_tally *tally, const zero_case *c,
                         int zero, const case_result *plain,
                         const case_result *got)
{
    if (!plain->ok || !got->ok)
        return;
    char name[160];
    snprintf(name, sizeof name, "%s, ZeRO-%d against plain dp: losses",
             c->name, zero);
    gpu_test_compare(tally, name, got->loss, plain->loss, STEPS, 1e-3);
    snprintf(name, sizeof name,
             "%s, ZeRO-%d against plain dp: gradient norms", c->name, zero);
    gpu_test_compare(tally, name, got->norm, plain->norm, STEPS, 1e-2);
    for (int r = 0; r < got->ranks; r++) {
        snprintf(name, sizeof name,
                 "%s, ZeRO-%d against plain dp: rank %d's parameters",
                 c->name, zero, r);
        gpu_test_compare(tally, name, got->params[r],
                         plain->params[r] + got->param_first[r],
                         got->param_floats[r], 1e-3);
    }
    for (int s = 0; s < STEPS; s++)
        printf("# %s ZeRO-%d step %d: loss %.6f (plain %.6f), norm %.5f "
               "(plain %.5f)\n",
               c->name, zero, s, got->loss[s], plain->loss[s], got->norm[s],
               plain->norm[s]);
}

/* ZeRO-3: each rank gathered what the rule says; and against the run
 * that gathers every unit again, the same bits. */
static void compare_gathers(gpu_test_tally *tally, const zero_case *c,
                            const case_result *held,
                            const case_result *again)
{
    const case_result *runs[2] = {held, again};
    for (int i = 0; i < 2; i++) {
        const case_result *run = runs[i];
        if (!run->ok)
            continue;
        bool same = true;
        char counts[96] = "";
        for (int r = 0; r < run->ranks; r++) {
            same = same && run->gathers[r] == run->expected_gathers[r];
            size_t used = strlen(counts);
            snprintf(counts + used, sizeof counts - used, "%s%ld/%ld",
                     r > 0 ? " " : "", run->gathers[r],
                     run->expected_gathers[r]);
        }
        char what[240];
        snprintf(what, sizeof what,
                 "%s, ZeRO-3%s: units gathered by rank (made/expected) %s",
                 c->name, i == 0 ? "" : ", PARTITA_CUDA_UNIT_HOLDS=0",
                 counts);
        gpu_test_expect(tally, same, what);
    }
    if (!held->ok || !again->ok)
        return;
    bool bits = memcmp(held->loss, again->loss, sizeof held->loss) == 0 &&
                memcmp(held->norm, again->norm, sizeof held->norm) == 0;
    for (int r = 0; r < held->ranks; r++)
        bits = bits && held->param_floats[r] == again->param_floats[r] &&
               memcmp(held->params[r], again->params[r],
                      held->param_floats[r] * sizeof(float)) == 0;
    char what[200];
    snprintf(what, sizeof what,
             "%s, ZeRO-3: losses, norms and parameters the same bits as "
             "with every unit gathered again",
             c->name);
    gpu_test_expect(tally, bits, what);
}

/* Rank 0's bytes of one term. */
static double term_of(const case_result *r, pt_memory_term term)
{
    return r->terms[0].bytes[term];
}

/* ZeRO-2/3's gradients, and ZeRO-3's weights and mirror, below
 * ZeRO-1's on rank 0. */
static void compare_memory(gpu_test_tally *tally, const zero_case *c,
                           int zero, const case_result *got,
                           const case_result *one)
{
    char what[160];
    snprintf(what, sizeof what,
             "%s, ZeRO-%d: rank 0's gradients %.0f bytes, ZeRO-1's %.0f",
             c->name, zero, term_of(got, PT_MEMORY_GRADIENTS),
             term_of(one, PT_MEMORY_GRADIENTS));
    gpu_test_expect(tally,
                    term_of(got, PT_MEMORY_GRADIENTS) <
                        term_of(one, PT_MEMORY_GRADIENTS),
                    what);
    if (zero < 3)
        return;
    double weights = term_of(got, PT_MEMORY_WEIGHTS) +
                     term_of(got, PT_MEMORY_WEIGHT_MIRROR);
    double ones = term_of(one, PT_MEMORY_WEIGHTS) +
                  term_of(one, PT_MEMORY_WEIGHT_MIRROR);
    snprintf(what, sizeof what,
             "%s, ZeRO-3: rank 0's weights and mirror %.0f bytes, "
             "ZeRO-1's %.0f",
             c->name, weights, ones);
    gpu_test_expect(tally, weights < ones, what);
}

static void test_zero_case(gpu_test_tally *tally, const zero_case *c,
                           const int *stages, int stage_count)
{
    case_result plain = run_case(tally, c, 0, true);
    case_result one = {.ok = false};
    for (int i = 0; i < stage_count; i++) {
        case_result got = run_case(tally, c, stages[i], true);
        compare_runs(tally, c, stages[i], &plain, &got);
        if (stages[i] >= 3) {
            case_result again = run_case(tally, c, stages[i], false);
            compare_gathers(tally, c, &got, &again);
            case_result_free(&again);
        }
        if (stages[i] == 1) {
            one = got; /* kept for the stages after it */
            continue;
        }
        if (one.ok && got.ok && stages[i] >= 2)
            compare_memory(tally, c, stages[i], &got, &one);
        case_result_free(&got);
    }
    case_result_free(&one);
    case_result_free(&plain);
}

int main(void)
{
    gpu_test_require_device(PROGRAM);
    /* the checks compare bits between runs: cuDNN's deterministic
     * attention backward (the default sums dQ with atomics) */
    setenv("PARTITA_CUDA_DETERMINISTIC", "1", 1);
    struct cudaDeviceProp properties;
    GPU_CHECK(cudaGetDeviceProperties(&properties, 0));
    if (properties.multiProcessorCount < 4 * SM_SLICE) {
        printf("SKIP %s: needs %d SMs for four slices, the GPU has %d\n",
               PROGRAM, 4 * SM_SLICE, properties.multiProcessorCount);
        return GPU_TEST_SKIP;
    }
    gpu_test_tally tally = {0};
    const zero_case dp2 = {.name = "dp 2 tied", .comm = GPU_COMM_DEVICE,
                           .tied = true, .dp = 2, .pp = 1,
                           .partition = {8}};
    const int all[] = {1, 2, 3};
    test_zero_case(&tally, &dp2, all, 3);
    const zero_case pp2 = {.name = "pp 2 x dp 2 untied",
                           .comm = GPU_COMM_DEVICE, .tied = false, .dp = 2,
                           .pp = 2, .partition = {5, 3}};
    const int three[] = {3};
    test_zero_case(&tally, &pp2, three, 1);
    /* a comm without stream-ordered collectives: the units blocking */
    const zero_case staged = {.name = "dp 2 tied, host-staged",
                              .comm = GPU_COMM_HOST, .tied = true, .dp = 2,
                              .pp = 1, .partition = {8}};
    const int two_three[] = {2, 3};
    test_zero_case(&tally, &staged, two_three, 2);
    return gpu_test_finish(&tally, PROGRAM);
}
