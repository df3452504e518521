/*
 * partita profile, measuring (in partita-exec, the executable that loads
 * the GPU stack): measures what the parts of a model cost on the GPU at
 * hand (executor's profiler) and writes profiles/<gpu>.json, source
 * "measured", with its provenance; completes a profile (--missing-only) or
 * writes only the host's offload rates into one (--host-rates). `partita`
 * itself parses the arguments first and runs --derive and --compare
 * (cli/cmd_profile.c).
 * docs/profiles.md ("Measuring") describes the measurement.
 */
#include "cli/cli.h"
#include "executor/executor.h"
#include "profiler/profiler.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* NCCL curves: 4 KiB to 1 GiB, every power of two. */
#define COMM_MIN_BYTES 4096.0
#define COMM_MAX_BYTES (1024.0 * 1024.0 * 1024.0)

/* "1,2,4" into values; -1 (printed) on anything else. */
static int parse_list(const char *option, const char *text, int *values,
                      int *count)
{
    return cli_parse_int_list("profile", option, text, 1024, values,
                              PROFILER_MAX_VALUES, count);
}

/* ------------------------------------------------------------ progress */

/* How a part was timed, as its progress line says it (docs/profiles.md,
 * "Measuring"): the executed and stepped parts are the ones a reader of a
 * whole-GPU profile asks about. */
static const char *timing_tag(profiler_timing timed)
{
    switch (timed) {
    case PROFILER_TIMING_GATED: return "gated";
    case PROFILER_TIMING_GRAPH: return "graphed";
    case PROFILER_TIMING_HOST: return "host clock";
    case PROFILER_TIMING_STEP: return "stepped";
    case PROFILER_TIMING_EXEC: return "executed";
    }
    return "?";
}

/* Each line says the seconds since the first one, so that a batch job's
 * log shows where a long profile spends its time; the measuring children
 * inherit the start (they are forked after the first line). */
static void print_progress(int done, int total, const char *label,
                           const profiled_point *point, void *data)
{
    (void)data;
    static double started = -1.0;
    if (started < 0.0)
        started = pt_monotonic_seconds();
    enum { WIDTH = 20 };
    char bar[WIDTH + 1];
    int filled = total > 0 ? WIDTH * done / total : WIDTH;
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[WIDTH] = '\0';
    fprintf(stderr, "[%s] %3d/%-3d %6.1f s  %s", bar, done, total,
            pt_monotonic_seconds() - started, label);
    if (point != NULL) {
        const profiled_part *parts[] = {&point->embedding, &point->layer,
                                        &point->head};
        static const char *const names[] = {"embedding", "layer", "head"};
        double spread = 0.0;
        for (int i = 0; i < 3; i++) {
            fprintf(stderr, "%s %s %.3f / %.3f ms (%s)", i == 0 ? ":" : ",",
                    names[i], parts[i]->forward.median_s * 1e3,
                    parts[i]->backward.median_s * 1e3,
                    timing_tag(point->timed[i]));
            spread = fmax(spread, fmax(parts[i]->forward.spread,
                                       parts[i]->backward.spread));
        }
        fprintf(stderr, " (forward / backward; spread up to %.1f %%)",
                100.0 * spread);
    }
    fputc('\n', stderr);
    fflush(stderr);
}

/* ---------------------------------------------------------- the device */

/* ------------------------------------------------------------ command */

static void join_command_line(int argc, char **argv, char *out, size_t size)
{
    size_t used = (size_t)snprintf(out, size, "partita");
    for (int i = 0; i < argc && used < size; i++) {
        bool plain = argv[i][0] != '\0' &&
                     strpbrk(argv[i], " \t'\"$\\") == NULL;
        used += (size_t)snprintf(out + used, size - used,
                                 plain ? " %s" : " '%s'", argv[i]);
    }
}

static void format_date_utc(char *out, size_t size)
{
    time_t now = time(NULL);
    struct tm utc;
    out[0] = '\0';
    if (gmtime_r(&now, &utc) != NULL)
        strftime(out, size, "%Y-%m-%dT%H:%M:%SZ", &utc);
}

/* The options the arguments ask for; -1 (printed) when they are bad. */
static int build_options(const profile_arguments *a,
                         profiler_options *options)
{
    pt_error err = {{0}};
    backend_kind backend = BACKEND_CUDA;
    if (backend_parse(a->backend, &backend, &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    *options = profiler_options_defaults(backend);
    if (a->quick)
        profiler_options_quick(options);
    const char *timings[PROFILER_TIMINGS] = {"gated", "graph", "host",
                                             "step", "exec"};
    const profiler_timing values[PROFILER_TIMINGS] = {
        PROFILER_TIMING_GATED, PROFILER_TIMING_GRAPH, PROFILER_TIMING_HOST,
        PROFILER_TIMING_STEP, PROFILER_TIMING_EXEC};
    bool known = a->timing == NULL;
    for (int i = 0; i < PROFILER_TIMINGS && !known; i++)
        if (strcmp(a->timing, timings[i]) == 0) {
            options->timing = values[i];
            known = true;
        }
    if (!known) {
        profile_bad_argument("--timing", "gated, graph, host, step or exec",
                             a->timing);
        return -1;
    }
    if (a->stage_sets > 0)
        options->stage_sets = a->stage_sets;
    if (a->embedding_sets > 0)
        options->embedding_sets = a->embedding_sets;
    else if (options->embedding_sets < options->stage_sets)
        options->embedding_sets = 0; /* as many as the stages' */
    if (a->processes > 0)
        options->processes = a->processes;
    if (a->rounds > 0)
        options->timing_rounds = a->rounds;
    if (a->layer_stack > 0)
        options->layer_stack = a->layer_stack;
    if (a->round_ms > 0.0)
        options->round_s = a->round_ms / 1e3;
    if (a->hold_ms >= 0.0)
        options->hold_s = a->hold_ms / 1e3;
    options->sm_limit = a->sm_limit;
    options->beside_place = a->beside_place;
    options->neighbours_idle = a->neighbours_idle;
    options->memory_limit_bytes = a->memory_limit_gib * PT_GIB;
    if (parse_list("--tp", a->tp_list, options->tp_values,
                   &options->tp_count) != 0 ||
        parse_list("--mbs", a->mbs_list, options->mbs_values,
                   &options->mbs_count) != 0 ||
        (a->beside_list != NULL &&
         parse_list("--beside", a->beside_list, options->beside_sms,
                    &options->beside_count) != 0))
        return -1;
    if (profiler_options_check(options, &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    options->progress = print_progress;
    return 0;
}

/* The NCCL curves, when asked for and possible; NULL with the reason in
 * reason otherwise. -1 when measuring them failed. */
static int measure_curves(const profile_arguments *a,
                          const profiler_options *options,
                          profiler_comm_result *comm, bool *measured,
                          char *reason, size_t reason_size)
{
    *measured = false;
    if (a->no_comm) {
        pt_copy_string(reason, reason_size, "--no-comm");
        return 0;
    }
    if (options->backend != BACKEND_CUDA) {
        pt_copy_string(reason, reason_size, "cpu backend");
        return 0;
    }
    if (!profiler_comm_available(reason, reason_size))
        return 0;
    pt_error err = {{0}};
    if (profiler_measure_comm(options, COMM_MIN_BYTES, COMM_MAX_BYTES, comm,
                              &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    *measured = true;
    return 0;
}

static void print_points(const model_shape *shape, const profiler_result *r)
{
    char tag[96];
    model_architecture_tag(shape, tag, sizeof tag);
    printf("# %s: %d points%s%s%s\n", shape->name, r->point_count,
           tag[0] != '\0' ? " (" : "", tag, tag[0] != '\0' ? ")" : "");
    bool stacked = false;
    for (int i = 0; i < r->point_count; i++)
        stacked = stacked || r->points[i].layers_stacked > 1;
    printf("# %3s %4s  %21s  %21s  %21s%s\n", "tp", "mbs",
           "embedding fwd/bwd ms", "layer fwd/bwd ms", "head fwd/bwd ms",
           stacked ? "  layers stacked" : "");
    for (int i = 0; i < r->point_count; i++) {
        const profiled_point *p = &r->points[i];
        printf("  %3d %4d  %10.4f %10.4f  %10.4f %10.4f  %10.4f %10.4f",
               p->tp, p->mbs, p->embedding.forward.median_s * 1e3,
               p->embedding.backward.median_s * 1e3,
               p->layer.forward.median_s * 1e3,
               p->layer.backward.median_s * 1e3,
               p->head.forward.median_s * 1e3,
               p->head.backward.median_s * 1e3);
        if (stacked)
            printf("  %14d", p->layers_stacked);
        printf("\n");
    }
    for (int i = 0; i < r->note_count; i++)
        printf("# note: %s: %s\n", shape->name, r->notes[i]);
}

static void print_summary(const profiler_writeup *ctx, const char *output)
{
    const profiler_result *r = &ctx->results[0];
    printf("# profile %s on %s", ctx->gpu, r->device.name);
    if (r->device.sms_used > 0)
        printf(" (%d of its %d SMs used)", r->device.sms_used,
               r->device.sms);
    printf("\n");
    for (int m = 0; m < ctx->model_count; m++)
        print_points(&ctx->shapes[m], &ctx->results[m]);
    printf("# optimizer: %.3g s per parameter (AdamW step of the layer "
           "stage, %.0f parameters, %.3f ms)\n",
           r->optimizer_s_per_param, r->layer_parameters,
           r->optimizer_layer.median_s * 1e3);
    if (ctx->comm == NULL)
        printf("# communication: not measured (%s)\n", ctx->comm_reason);
    int sets = ctx->comm != NULL ? ctx->comm->count_sets : 0;
    if (sets > 0)
        printf("# %4s %10s %14s %14s %14s %14s\n", "GPUs", "size",
               "all-reduce us", "send/recv us", "reduce-sc. us",
               "all-gather us");
    for (int c = 0; c < sets; c++) {
        const profiled_comm_curves *set = &ctx->comm->curves[c];
        for (int i = 0; i < ctx->comm->sample_count; i++) {
            char size[32], sendrecv[32] = "-";
            pt_format_bytes(set->allreduce[i].bytes, size, sizeof size);
            if (set->sendrecv[i].bytes > 0.0)
                snprintf(sendrecv, sizeof sendrecv, "%.2f",
                         set->sendrecv[i].time.median_s * 1e6);
            printf("# %4d %10s %14.2f %14s %14.2f %14.2f\n", set->gpus, size,
                   set->allreduce[i].time.median_s * 1e6, sendrecv,
                   set->reduce_scatter[i].time.median_s * 1e6,
                   set->all_gather[i].time.median_s * 1e6);
        }
    }
    char elapsed[32];
    pt_format_seconds(profiler_measured_seconds(ctx), elapsed,
                      sizeof elapsed);
    printf("# measured in %s; written to %s\n", elapsed, output);
}

/* The models of --model (a comma-separated list of files or bundled
 * names); -1 (printed) when one does not load or two share a shape key
 * (a profile holds one shape per key). */
static int load_models(const char *list, model_shape *shapes, int *count)
{
    char names[PT_PATH_MAX * 2];
    pt_copy_string(names, sizeof names, list);
    *count = 0;
    char *save = NULL;
    for (char *name = strtok_r(names, ",", &save); name != NULL;
         name = strtok_r(NULL, ",", &save)) {
        pt_error err = {{0}};
        char path[PT_PATH_MAX];
        if (*count == PROFILER_MAX_MODELS) {
            fprintf(stderr, "partita profile: --model: at most %d models\n",
                    PROFILER_MAX_MODELS);
            return -1;
        }
        model_shape *shape = &shapes[*count];
        if (cli_locate("models", name, path, sizeof path, &err) != 0 ||
            model_load_file(path, shape, &err) != 0) {
            cli_error("profile", err.message);
            return -1;
        }
        /* a profile's shape is keyed by its widths and its layer's
           architecture: two models alike in both are one shape */
        for (int i = 0; i < *count; i++) {
            profile_shape key = profile_shape_of_model(&shapes[i]);
            if (profile_shape_prices(&key, shape)) {
                fprintf(stderr, "partita profile: --model: %s and %s have "
                                "the same hidden, ffn_hidden, seq, vocab and "
                                "layer architecture (one shape of the "
                                "profile)\n",
                        shapes[i].name, shape->name);
                return -1;
            }
        }
        (*count)++;
    }
    if (*count == 0)
        return profile_bad_argument("--model", "a model file or name", list);
    return 0;
}

/* Measures every model, then the curves; results[0]'s device and
 * optimizer speak for the profile. 0, or -1 (printed). */
static int measure_all(const profile_arguments *a,
                       const profiler_options *options,
                       const model_shape *shapes, int model_count,
                       profiler_result *results, profiler_comm_result *comm,
                       bool *has_curves, char *reason, size_t reason_size)
{
    for (int m = 0; m < model_count; m++) {
        pt_error err = {{0}};
        if (model_count > 1)
            fprintf(stderr, "# model %s\n", shapes[m].name);
        if (profiler_measure_processes(&shapes[m], options, &results[m],
                                       &err) != 0) {
            fprintf(stderr, "partita profile: %s: %s\n", shapes[m].name,
                    err.message);
            return -1;
        }
    }
    return measure_curves(a, options, comm, has_curves, reason, reason_size);
}

/* The profile, built and checked by the profiler, written atomically;
 * then the summary. */
static int write_profile(const profiler_writeup *writeup, const char *output)
{
    pt_error err = {{0}};
    json_t *root = profiler_profile_json(writeup, output, &err);
    if (cli_write_json("profile", root, output, &err) != 0)
        return -1;
    print_summary(writeup, output);
    return 0;
}

static int check_gpu_name(const char *name)
{
    if (name == NULL || (name[0] != '\0' && strchr(name, '/') == NULL &&
                         strlen(name) < PT_NAME_MAX))
        return 0;
    return profile_bad_argument("--gpu-name", "a name without '/' (under 64 bytes)",
                        name);
}

static int measure_and_write(profile_arguments *a, int argc, char **argv)
{
    model_shape shapes[PROFILER_MAX_MODELS];
    int model_count = 0;
    profiler_options options;
    if (load_models(a->model, shapes, &model_count) != 0 ||
        build_options(a, &options) != 0 || check_gpu_name(a->gpu_name) != 0 ||
        (a->output != NULL &&
         cli_check_output("profile", a->output, false) != 0))
        return EXIT_BAD_INPUT;
    profiler_result *results = calloc((size_t)model_count, sizeof *results);
    profiler_comm_result *comm = calloc(1, sizeof *comm);
    int status = EXIT_FAILURE_RUN;
    char gpu[PT_NAME_MAX], output[PT_PATH_MAX], reason[256] = "";
    char command_line[2048], date_utc[32];
    bool has_curves = false;
    if (results == NULL || comm == NULL) {
        cli_error("profile", "out of memory");
    } else if (measure_all(a, &options, shapes, model_count, results, comm,
                           &has_curves, reason, sizeof reason) == 0) {
        profiler_default_gpu_name(&results[0].device, &options, gpu,
                                  sizeof gpu);
        if (a->gpu_name != NULL)
            pt_copy_string(gpu, sizeof gpu, a->gpu_name);
        if (a->output == NULL) {
            snprintf(output, sizeof output, "%s.json", gpu);
            a->output = output;
        }
        join_command_line(argc, argv, command_line, sizeof command_line);
        format_date_utc(date_utc, sizeof date_utc);
        profiler_writeup writeup = {
            .model_count = model_count, .shapes = shapes,
            .options = &options, .results = results,
            .comm = has_curves ? comm : NULL, .comm_reason = reason,
            .gpu = gpu, .command_line = command_line, .date_utc = date_utc,
            .sm_limit = a->sm_limit, .memory_limit_gib = a->memory_limit_gib};
        if (write_profile(&writeup, a->output) == 0)
            status = EXIT_OK;
    }
    free(results);
    free(comm);
    return status;
}

/* ------------------------------------------------------ --missing-only */

/* The tps of the options that shape `model` lacks in `have` (none of its
 * points at that tp) and the profiler can run; their count. A tp the
 * model cannot be split by is said (stderr) and left out. */
static int missing_tps(const profile *have, const model_shape *model,
                       const profiler_options *options, int *tps)
{
    int shape = profile_find_shape(have, model), count = 0;
    for (int i = 0; i < options->tp_count; i++) {
        int tp = options->tp_values[i];
        const char *refusal = profiler_tp_refusal(model, tp);
        if (refusal != NULL) {
            fprintf(stderr, "# model %s: tp %d not measured: %s (%d heads, "
                            "%d for keys and values)\n",
                    model->name, tp, refusal, model->heads,
                    model_kv_heads(model));
            continue;
        }
        bool held = false;
        for (int j = 0; shape >= 0 && j < have->shapes[shape].point_count;
             j++)
            held = held || have->shapes[shape].points[j].tp == tp;
        if (!held)
            tps[count++] = tp;
    }
    return count;
}

/* The profile's provenance.additions (made where it has none): what was
 * measured into the profile after it was written, one entry a command. */
static json_t *provenance_additions(profile *have)
{
    if (!json_is_object(have->provenance)) {
        json_decref(have->provenance);
        have->provenance = json_object();
    }
    json_t *additions = json_object_get(have->provenance, "additions");
    if (!json_is_array(additions)) {
        additions = json_array();
        json_object_set_new(have->provenance, "additions", additions);
    }
    return additions;
}

/* Adds the measured profile's points to `have` and records where they
 * came from under provenance.additions; the number added, -1 (printed). */
static int merge_measured(profile *have, const json_t *measured_json,
                          const char *output)
{
    pt_error err = {{0}};
    json_place place = {.file = output};
    profile measured;
    if (profile_from_json(measured_json, &place, &measured, &err) != 0) {
        cli_error("profile", err.message);
        return -1;
    }
    int added = -1;
    if (strcmp(measured.gpu, have->gpu) != 0) {
        fprintf(stderr, "partita profile: %s: a profile of %s; this device "
                        "profiles as %s (--gpu-name %s adds to it anyway)\n",
                output, have->gpu, measured.gpu, have->gpu);
    } else if (profile_add_points(have, &measured, &added, &err) != 0) {
        cli_error("profile", err.message);
        added = -1;
    } else {
        json_array_append(provenance_additions(have), measured.provenance);
    }
    profile_free(&measured);
    return added;
}

/* The measured models as a profile (the same builder as a whole
 * measurement), merged into `have` and written over -o atomically. */
static int write_additions(const profile_arguments *a, int argc, char **argv,
                           profile *have, const model_shape *shapes,
                           int count, const profiler_options *options,
                           const profiler_result *results)
{
    char gpu[PT_NAME_MAX], command_line[2048], date_utc[32];
    profiler_default_gpu_name(&results[0].device, &options[0], gpu,
                              sizeof gpu);
    if (a->gpu_name != NULL)
        pt_copy_string(gpu, sizeof gpu, a->gpu_name);
    join_command_line(argc, argv, command_line, sizeof command_line);
    format_date_utc(date_utc, sizeof date_utc);
    profiler_writeup writeup = {
        .model_count = count, .shapes = shapes, .options = &options[0],
        .results = results, .comm = NULL,
        .comm_reason = "--missing-only (the profile keeps its curves)",
        .gpu = gpu, .command_line = command_line, .date_utc = date_utc,
        .sm_limit = a->sm_limit, .memory_limit_gib = a->memory_limit_gib};
    pt_error err = {{0}};
    json_t *measured = profiler_profile_json(&writeup, a->output, &err);
    if (measured == NULL) {
        cli_error("profile", err.message);
        return EXIT_FAILURE_RUN;
    }
    int added = merge_measured(have, measured, a->output);
    json_decref(measured);
    if (added < 0)
        return EXIT_BAD_INPUT;
    /* the host at hand's AdamW and link, measured with the points: the
     * rates an offloaded optimizer is priced at on this machine */
    if (results[count - 1].host_adamw_s_per_param > 0.0)
        have->host_adamw_s_per_param =
            results[count - 1].host_adamw_s_per_param;
    if (results[count - 1].host_copy_s_per_param > 0.0)
        have->host_copy_s_per_param =
            results[count - 1].host_copy_s_per_param;
    json_t *root = profile_to_json(have, a->output, &err);
    if (root == NULL || json_write_file_atomic(root, a->output, &err) != 0) {
        json_decref(root);
        cli_error("profile", err.message);
        return EXIT_FAILURE_RUN;
    }
    json_decref(root);
    for (int m = 0; m < count; m++)
        print_points(&shapes[m], &results[m]);
    char elapsed[32];
    pt_format_seconds(profiler_measured_seconds(&writeup), elapsed,
                      sizeof elapsed);
    printf("# added %d points to %s (measured in %s)\n", added, a->output,
           elapsed);
    return EXIT_OK;
}

/* Measures what the profile -o names lacks of the models and adds it;
 * nothing (exit 0) when it lacks nothing. */
static int measure_missing(profile_arguments *a, int argc, char **argv)
{
    model_shape shapes[PROFILER_MAX_MODELS], wanted[PROFILER_MAX_MODELS];
    int model_count = 0, wanted_count = 0;
    profiler_options options, per_model[PROFILER_MAX_MODELS];
    profile have;
    pt_error err = {{0}};
    if (load_models(a->model, shapes, &model_count) != 0 ||
        build_options(a, &options) != 0 || check_gpu_name(a->gpu_name) != 0)
        return EXIT_BAD_INPUT;
    if (profile_load_file(a->output, &have, &err) != 0) {
        cli_error("profile", err.message);
        return EXIT_BAD_INPUT;
    }
    if (profile_layer_stack(&have) != options.layer_stack)
        fprintf(stderr, "# note: %s's layer entries were measured with "
                        "--layer-stack %d, the points added with %d (their "
                        "provenance under additions says so)\n",
                a->output, profile_layer_stack(&have), options.layer_stack);
    for (int m = 0; m < model_count; m++) {
        per_model[wanted_count] = options;
        per_model[wanted_count].tp_count = missing_tps(
            &have, &shapes[m], &options, per_model[wanted_count].tp_values);
        if (per_model[wanted_count].tp_count > 0)
            wanted[wanted_count++] = shapes[m];
    }
    if (wanted_count == 0) {
        printf("# %s holds every shape and tp asked for of %s: nothing to "
               "measure\n", a->output, a->model);
        profile_free(&have);
        return EXIT_OK;
    }
    profiler_result *results = calloc((size_t)wanted_count, sizeof *results);
    int status = results ? EXIT_OK : EXIT_FAILURE_RUN;
    for (int m = 0; m < wanted_count && status == EXIT_OK; m++) {
        fprintf(stderr, "# model %s: tp", wanted[m].name);
        for (int i = 0; i < per_model[m].tp_count; i++)
            fprintf(stderr, " %d", per_model[m].tp_values[i]);
        fprintf(stderr, " missing from %s\n", a->output);
        if (profiler_measure_processes(&wanted[m], &per_model[m],
                                       &results[m], &err) != 0) {
            fprintf(stderr, "partita profile: %s: %s\n", wanted[m].name,
                    err.message);
            status = EXIT_FAILURE_RUN;
        }
    }
    if (status == EXIT_OK)
        status = write_additions(a, argc, argv, &have, wanted, wanted_count,
                                 per_model, results);
    free(results);
    profile_free(&have);
    return status;
}

/* ------------------------------------------------------- --host-rates */

/* Notes the measurement under provenance.additions, as a completion's
 * points are: where the rates now in the profile came from. */
static void note_host_rates(profile *have, int argc, char **argv,
                            const profiler_result *result)
{
    char command_line[2048], date_utc[32];
    join_command_line(argc, argv, command_line, sizeof command_line);
    format_date_utc(date_utc, sizeof date_utc);
    json_t *entry = json_object();
    json_object_set_new(entry, "command", json_string(command_line));
    json_object_set_new(entry, "date_utc", json_string(date_utc));
    json_object_set_new(entry, "measured",
                        json_string("the host's rates alone (--host-rates): "
                                    "host_adamw_s_per_param and "
                                    "host_copy_s_per_param replaced"));
    json_object_set_new(entry, "host_adamw_s_per_param",
                        json_real(result->host_adamw_s_per_param));
    json_object_set_new(entry, "host_copy_s_per_param",
                        json_real(result->host_copy_s_per_param));
    json_array_append_new(provenance_additions(have), entry);
}

/* The host's rates alone, written into the profile -o names (every other
 * entry as it was), atomically. */
static int measure_host_rates(const profile_arguments *a, int argc,
                              char **argv)
{
    model_shape shapes[PROFILER_MAX_MODELS];
    int model_count = 0;
    profiler_options options;
    profile have;
    pt_error err = {{0}};
    if (load_models(a->model, shapes, &model_count) != 0 ||
        build_options(a, &options) != 0)
        return EXIT_BAD_INPUT;
    if (profile_load_file(a->output, &have, &err) != 0) {
        cli_error("profile", err.message);
        return EXIT_BAD_INPUT;
    }
    profiler_result result;
    if (profiler_measure_host_rates(&shapes[0], &options, &result, &err) !=
        0) {
        fprintf(stderr, "partita profile: %s: %s\n", shapes[0].name,
                err.message);
        profile_free(&have);
        return EXIT_FAILURE_RUN;
    }
    have.host_adamw_s_per_param = result.host_adamw_s_per_param;
    have.host_copy_s_per_param = result.host_copy_s_per_param;
    note_host_rates(&have, argc, argv, &result);
    json_t *root = profile_to_json(&have, a->output, &err);
    int status = EXIT_OK;
    if (root == NULL || json_write_file_atomic(root, a->output, &err) != 0) {
        cli_error("profile", err.message);
        status = EXIT_FAILURE_RUN;
    } else {
        printf("# host AdamW %.3g s a parameter (%.3g parameters/s), host "
               "link copies %.3g s a parameter (%.0f GB/s each way), "
               "measured in %.1f s on %s; written to %s\n",
               result.host_adamw_s_per_param,
               1.0 / result.host_adamw_s_per_param,
               result.host_copy_s_per_param,
               8.0 / result.host_copy_s_per_param / 1e9, result.elapsed_s,
               result.device.name, a->output);
    }
    json_decref(root);
    profile_free(&have);
    return status;
}

int command_profile_measure(int argc, char **argv)
{
    profile_arguments args;
    int status = profile_run_unless_measuring(argc, argv, &args);
    if (status != PROFILE_MEASURE)
        return status;
    if (args.host_rates)
        return measure_host_rates(&args, argc, argv);
    if (args.missing_only)
        return measure_missing(&args, argc, argv);
    return measure_and_write(&args, argc, argv);
}
