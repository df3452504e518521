/*
 * A run's options: their defaults and checks, and the plans exec can run
 * at all.
 */
#include "executor/run/internal.h"

#include <math.h>
#include <string.h>
#include <sys/stat.h>

double run_comm_timeout(const run_options *options)
{
    if (options->comm_timeout_s > 0)
        return options->comm_timeout_s;
    return options->backend == BACKEND_CPU ? RUN_COMM_TIMEOUT_S
                                           : RUN_GPU_COMM_TIMEOUT_S;
}

run_options run_options_defaults(long iterations)
{
    run_options options = {
        .backend = BACKEND_CPU,
        .iterations = iterations,
        .seed = 1234,
        .train = train_config_defaults(),
        .checkpoint_keep = 2,
    };
    options.train.schedule.max_lr = 6e-4;
    options.train.schedule.min_lr = 6e-5;
    options.train.schedule.warmup_steps = iterations > 0 ? iterations / 10 : 0;
    options.train.schedule.decay_steps = iterations > 0 ? iterations : 0;
    return options;
}

/* Both backends train every model file's layer (the cuda backend the
 * Llama family's through executor/cuda/passes_llama.c); the cuda
 * backend's Llama layer moves whole heads of bf16 through 16-byte rows
 * (its qkv regrouping and rotation, the products of a (NH + 2 KVH) hs
 * wide qkv), so a head size that is not a multiple of 8 is refused
 * there (GPT-2's layer keeps its own checks). */
int run_check_backend(const plan *p, backend_kind backend, pt_error *err)
{
    const model_shape *m = &p->model;
    if (backend != BACKEND_CUDA || model_is_gpt(m) ||
        (m->hidden / m->heads) % 8 == 0)
        return 0;
    return pt_fail(err, "model %s%s%s%s: hidden %d over %d heads: the cuda "
                   "backend's Llama layer needs a head size that is a "
                   "multiple of 8, not %d; train this model with --backend "
                   "cpu, or plan, estimate or export it",
                   m->name, p->model_origin[0] ? " (" : "", p->model_origin,
                   p->model_origin[0] ? ")" : "", m->hidden, m->heads,
                   m->hidden / m->heads);
}

/* Stages of their own degrees (issue 36): what exec does not run of
 * them. The tied embedding between a first and a last stage of different
 * degrees is summed from ZeRO-1's shards in fp32 only. */
static int check_asymmetric(const plan *p, pt_error *err)
{
    const parallel_config *config = &p->config;
    int own = plan_first_asymmetric_stage(p);
    if (own < 0)
        return 0;
    parallel_config first = parallel_stage_config(config, p->stages, 0);
    parallel_config last =
        parallel_stage_config(config, p->stages, config->pp - 1);
    bool twins = first.tp == last.tp && first.dp == last.dp;
    if (p->model.tied_embeddings && config->pp > 1 && !twins &&
        config->distributed_optimizer &&
        config->grad_precision == GRAD_PRECISION_BF16)
        return pt_fail(err, "grad_precision: bf16 with the distributed "
                       "optimizer and tied embeddings between a first stage "
                       "of tp %d x dp %d and a last of tp %d x dp %d: exec "
                       "sums the tied embedding from sharded gradients in "
                       "fp32 only; use grad_precision fp32 or zero 0",
                       first.tp, first.dp, last.tp, last.dp);
    return 0;
}

int run_check_plan(const plan *p, pt_error *err)
{
    const parallel_config *config = &p->config;
    if (config->dp < 1 || config->pp < 1 || config->tp < 1 ||
        config->pp > PT_MAX_STAGES || config->tp > PT_MAX_TP ||
        (long)config->dp * config->pp * config->tp > RUN_MAX_RANKS)
        return pt_fail(err, "tp %d x dp %d x pp %d: exec runs 1 to %d ranks "
                            "of 1 to %d stages, tp at most %d",
                       config->tp, config->dp, config->pp, RUN_MAX_RANKS,
                       PT_MAX_STAGES, PT_MAX_TP);
    for (int s = 0; s < config->pp; s++) {
        parallel_config stage = parallel_stage_config(config, p->stages, s);
        if (stage.tp > PT_MAX_TP)
            return pt_fail(err, "stages[%d]: tp %d: exec runs tp at most %d",
                           s, stage.tp, PT_MAX_TP);
    }
    if (plan_rank_count(p) > RUN_MAX_RANKS)
        return pt_fail(err, "stages: the stages' tp x dp sum to %d ranks; "
                            "exec runs at most %d",
                       plan_rank_count(p), RUN_MAX_RANKS);
    if (config->runtime != RUNTIME_PARTITA)
        return pt_fail(err, "runtime: %s: the plan is priced for %s, which "
                       "exec does not run (hand it over with partita export "
                       "--to %s, or set runtime to partita)",
                       runtime_name(config->runtime),
                       runtime_name(config->runtime),
                       runtime_name(config->runtime));
    if (plan_check_tp_split(p, err) != 0 || check_asymmetric(p, err) != 0)
        return -1;
    if (parallel_attention(config) == ATTENTION_UNFUSED)
        return pt_fail(err, "attention: unfused: exec computes attention "
                       "fused (flash); set attention to flash or leave it "
                       "out");
    if (config->selective_recompute)
        return pt_fail(err, "recompute: selective: Megatron-LM's selective "
                       "recompute is priced and exported, but exec runs "
                       "recompute none or full");
    int ranks = plan_rank_count(p);
    int gpus = plan_gpu_count(p);
    if (ranks != gpus && plan_first_asymmetric_stage(p) >= 0)
        return pt_fail(err, "stages: the stages' tp x dp sum to %d ranks, "
                            "but the nodes of the plan's node order hold %d "
                            "GPUs",
                       ranks, gpus);
    if (ranks != gpus)
        return pt_fail(err, "the plan has tp x dp x pp = %d x %d x %d = %d "
                            "ranks, but the nodes of its node order hold %d "
                            "GPUs",
                       config->tp, config->dp, config->pp, ranks, gpus);
    if (config->mbs < 1 || config->gbs < config->mbs ||
        config->gbs % (config->mbs * config->dp) != 0)
        return pt_fail(err, "gbs %d is not a positive multiple of dp x mbs "
                            "= %d x %d",
                       config->gbs, config->dp, config->mbs);
    return 0;
}

int run_check_interleave(const plan *p, const run_options *options,
                         pt_error *err)
{
    (void)options;
    int v = parallel_virtual_stages(&p->config);
    if (v == 1)
        return 0;
    /* each chunk would need its own dp shards (parallel/step.c) */
    if (parallel_zero_stage(&p->config) >= 2 && p->config.dp > 1)
        return pt_fail(err, "virtual_stages: exec runs ZeRO-%d without the "
                            "interleaved 1F1B only yet; use zero 1 or "
                            "virtual_stages 1",
                       parallel_zero_stage(&p->config));
    return 0;
}

int run_check_options(const run_options *options, pt_error *err)
{
    if (options->data_prefix == NULL || options->data_prefix[0] == '\0')
        return pt_fail(err, "no dataset given (the PREFIX of PREFIX.bin and "
                            "PREFIX.idx)");
    if (options->iterations < 1)
        return pt_fail(err, "iterations must be >= 1, got %ld",
                       options->iterations);
    if (options->save_interval < 0)
        return pt_fail(err, "the save interval must be >= 0 iterations, "
                            "got %ld",
                       options->save_interval);
    if (options->seed > (uint64_t)INT64_MAX)
        return pt_fail(err, "the seed must be below 2^63 (JSON files hold "
                            "it as an integer)");
    if (!isfinite(options->train.max_grad_norm))
        return pt_fail(err, "the gradient clipping norm must be finite");
    if (lr_schedule_check(&options->train.schedule, err) != 0)
        return -1;
    if (options->checkpoint_keep < 1 ||
        options->checkpoint_keep > RUN_MAX_CHECKPOINT_KEEP)
        return pt_fail(err, "checkpoints kept: expected 1 to %d "
                            "generations, got %d",
                       RUN_MAX_CHECKPOINT_KEEP, options->checkpoint_keep);
    return run_check_save_dir(options, err);
}

/* Whether two paths name the same folder. */
static bool same_folder(const char *a, const char *b)
{
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev &&
           x.st_ino == y.st_ino;
}

int run_check_save_dir(const run_options *options, pt_error *err)
{
    const char *save = options->save_dir;
    if (save != NULL && checkpoint_check_ours(save, err) != 0) {
        pt_error reason = *err;
        return pt_fail(err, "--save %s: %s; choose another folder (one "
                            "that is not ours is never saved into, even "
                            "with --overwrite)",
                       save, reason.message);
    }
    if (save == NULL || options->overwrite_checkpoint ||
        !checkpoint_exists(save))
        return 0;
    if (options->load_dir != NULL && same_folder(options->load_dir, save))
        return 0;
    checkpoint_manifest held;
    char what[96] = "a checkpoint";
    if (checkpoint_read_manifest(save, &held, NULL) == 0)
        snprintf(what, sizeof what, "a checkpoint (generation %llu)",
                 (unsigned long long)held.generation);
    return pt_fail(err, "--save %s: the folder already holds %s that this "
                        "run does not resume from: resume with --load %s, "
                        "or give --overwrite to save over it (the newest "
                        "%d generations are kept)",
                   save, what, save, options->checkpoint_keep);
}
