/*
 * partita profile --derive GPU --from P1.json,P2.json [-o OUT]: fits the
 * roofline (costmodel/roofline.c) on measured or published profiles and
 * writes the `derived` profile of a GPU of profiles/specs.json.
 * `partita profile` (cli/cmd_profile.c) hands its arguments here when
 * --derive is given; it runs in `partita`, never loading the GPU stack.
 * docs/profiles.md describes the model and the outputs.
 */
#include "cli/cli.h"

#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_COMMAND_TEXT 2048

typedef struct derive_arguments {
    const char *command;      /* argv[0], "profile": names it in messages */
    const char *gpu;          /* --derive */
    const char *from;         /* --from, comma-separated */
    const char *output;       /* -o, NULL: print only */
    const char *specs;        /* --specs */
    const char *profiles;     /* --profiles */
    const char *compare;      /* --compare */
    const char *date;         /* --date */
    double link_GBps;         /* --link-GBps, for --compare */
    double link_latency_us;   /* --link-latency-us */
    bool points;              /* --points */
} derive_arguments;

/* The profiles fitted on, with the names and files as given. */
typedef struct derive_sources {
    int count;
    profile profiles[ROOFLINE_MAX_SOURCES];
    char files[ROOFLINE_MAX_SOURCES][PT_PATH_MAX];
    const char *file_names[ROOFLINE_MAX_SOURCES];
} derive_sources;

static void print_derive_help(const char *command)
{
    printf(
        "usage: partita %s --derive GPU --from P1.json,P2.json [-o OUT]\n"
        "\n"
        "Fits a per-kernel roofline (FLOPs and bytes of every kernel of the\n"
        "embedding, a transformer layer and the head) on the given measured\n"
        "or published profiles, then writes the derived profile of GPU: its\n"
        "spec figures from profiles/specs.json and the fitted parameters.\n"
        "A derived profile prices any layer shape (docs/profiles.md).\n"
        "\n"
        "  --derive GPU         row of the spec table: A10, RTX3090, A100-40GB,\n"
        "                       A100-80GB, V100-16GB, V100-32GB, H100, H200\n"
        "  --from LIST          profiles to fit on, comma-separated: files or\n"
        "                       profile names (searched like a cluster's GPUs)\n"
        "  -o, --output FILE    derived profile to write (default: none, only\n"
        "                       print the fit)\n"
        "  --specs FILE         spec table (default: the bundled specs.json)\n"
        "  --profiles DIR       look for --from and --compare names here first\n"
        "  --points             print every fitted time with its error\n"
        "  --compare REF        print the derived times against profile REF,\n"
        "                       layer by layer (a markdown table)\n"
        "  --link-GBps B, --link-latency-us L\n"
        "                       intra-node link REF's tp > 1 times ran on; the\n"
        "                       cost model adds the tp all-reduces over it\n"
        "  --date YYYY-MM-DD    date written to the provenance (default today)\n",
        command);
}

static int parse_number(const char *value, const char *option, double min,
                        double *out)
{
    char *end = NULL;
    double number = strtod(value, &end);
    if (end == value || *end != '\0' || !isfinite(number) || number < min) {
        fprintf(stderr, "partita profile: %s: expected a number >= %g, got "
                        "'%s'\n", option, min, value);
        return -1;
    }
    *out = number;
    return 0;
}

/* Returns 0 to go on, 1 when help was printed, -1 on a bad argument. */
static int parse_derive_arguments(int argc, char **argv, derive_arguments *a)
{
    enum { OPT_DERIVE = 256, OPT_FROM, OPT_SPECS, OPT_PROFILES, OPT_POINTS,
           OPT_COMPARE, OPT_LINK_GBPS, OPT_LINK_LATENCY, OPT_DATE, OPT_HELP };
    static const struct option options[] = {
        {"derive", required_argument, NULL, OPT_DERIVE},
        {"from", required_argument, NULL, OPT_FROM},
        {"output", required_argument, NULL, 'o'},
        {"specs", required_argument, NULL, OPT_SPECS},
        {"profiles", required_argument, NULL, OPT_PROFILES},
        {"points", no_argument, NULL, OPT_POINTS},
        {"compare", required_argument, NULL, OPT_COMPARE},
        {"link-GBps", required_argument, NULL, OPT_LINK_GBPS},
        {"link-latency-us", required_argument, NULL, OPT_LINK_LATENCY},
        {"date", required_argument, NULL, OPT_DATE},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0}};
    a->command = argv[0];
    optind = 1;
    opterr = 1;
    int option, status = 0;
    while (status == 0 &&
           (option = getopt_long(argc, argv, "o:h", options, NULL)) != -1) {
        switch (option) {
        case OPT_DERIVE: a->gpu = optarg; break;
        case OPT_FROM: a->from = optarg; break;
        case 'o': a->output = optarg; break;
        case OPT_SPECS: a->specs = optarg; break;
        case OPT_PROFILES: a->profiles = optarg; break;
        case OPT_POINTS: a->points = true; break;
        case OPT_COMPARE: a->compare = optarg; break;
        case OPT_LINK_GBPS:
            status = parse_number(optarg, "--link-GBps", 1e-9, &a->link_GBps);
            break;
        case OPT_LINK_LATENCY:
            status = parse_number(optarg, "--link-latency-us", 0.0,
                                  &a->link_latency_us);
            break;
        case OPT_DATE: a->date = optarg; break;
        case OPT_HELP:
        case 'h': print_derive_help(a->command); return 1;
        default: return -1;
        }
    }
    if (status != 0)
        return -1;
    if (optind < argc) {
        fprintf(stderr, "partita %s: unexpected argument '%s'\n", a->command,
                argv[optind]);
        return -1;
    }
    if (a->gpu == NULL || a->from == NULL) {
        fprintf(stderr, "partita %s: --derive and --from are required (see "
                        "'partita %s --help')\n", a->command, a->command);
        return -1;
    }
    return 0;
}

/* A file as given, or a profile name searched like a cluster's GPU
 * (whose file must then hold that GPU). */
static int load_profile(const char *name, const char *profile_dir,
                        char *path, size_t size, profile *out,
                        pt_error *err)
{
    FILE *file = fopen(name, "r");
    if (file != NULL) {
        fclose(file);
        pt_copy_string(path, size, name);
        return profile_load_file(path, out, err);
    }
    if (profile_find(name, profile_dir, NULL, path, size, err) != 0)
        return -1;
    return profile_load_for_gpu(path, name, out, err);
}

static int load_sources(const derive_arguments *a,
                        const gpu_spec_table *table, derive_sources *out,
                        pt_error *err)
{
    char list[PT_PATH_MAX * 4];
    pt_copy_string(list, sizeof list, a->from);
    char *cursor = NULL;
    for (char *name = strtok_r(list, ",", &cursor); name != NULL;
         name = strtok_r(NULL, ",", &cursor)) {
        if (out->count == ROOFLINE_MAX_SOURCES)
            return pt_fail(err, "--from: at most %d profiles",
                           ROOFLINE_MAX_SOURCES);
        int i = out->count;
        char *file = out->files[i];
        if (load_profile(name, a->profiles, file, PT_PATH_MAX,
                         &out->profiles[i], err) != 0)
            return -1;
        out->count++;
        out->file_names[i] = file;
        char said[512] = "";
        if (gpu_spec_complete_source(table, &out->profiles[i], said,
                                     sizeof said, err) != 0) {
            pt_error_prefix(err, "%s", file);
            return -1;
        }
        if (said[0] != '\0')
            printf("# %s\n", said);
    }
    if (out->count == 0)
        return pt_fail(err, "--from: no profile named");
    return 0;
}

static void free_sources(derive_sources *sources)
{
    for (int i = 0; i < sources->count; i++)
        profile_free(&sources->profiles[i]);
    sources->count = 0;
}

static void print_fit(const derive_arguments *a, const roofline_fit_result *f)
{
    const roofline_params *p = &f->params;
    printf("# %s: roofline fitted on %d profile%s, %d times (%d left out)\n",
           a->gpu, f->source_count, f->source_count == 1 ? "" : "s",
           f->all.points, f->all.left_out);
    printf("#   gemm_efficiency %.4g, gemm_half_work %.4g GFLOP/SM, "
           "attention_efficiency %.4g,\n#   bandwidth_efficiency %.4g, "
           "kernel_overhead %.4g us, bandwidth_saturation_sm_fraction "
           "%.4g\n",
           p->gemm_efficiency, p->gemm_half_work_flop / 1e9,
           p->attention_efficiency, p->bandwidth_efficiency,
           p->kernel_overhead_s * 1e6, p->bandwidth_saturation_sm_fraction);
    printf("\n| source | times fitted | left out | rms log error | "
           "max error |\n|---|---:|---:|---:|---:|\n");
    for (int i = 0; i <= f->source_count; i++) {
        const roofline_fit_error *e = i < f->source_count ? &f->sources[i]
                                                          : &f->all;
        printf("| %s | %d | %d | %.3f | %.1f %% |\n",
               i < f->source_count ? e->gpu : "all", e->points, e->left_out,
               e->rms_log_error, 100.0 * e->max_error);
    }
}

static const char *const part_names[] = {"embedding", "layer", "head"};

/* " (rmsnorm swiglu rope kv 8/32 nobias)" after a shape's width when its
 * layer is not GPT-2's (two Llama shapes may share hidden and seq with a
 * GPT-2 one), "" otherwise. */
static void architecture_suffix(const profile_shape *shape, char *out,
                                size_t size)
{
    model_shape layer = profile_shape_model(shape);
    char tag[64];
    model_architecture_tag(&layer, tag, sizeof tag);
    snprintf(out, size, "%s%s%s", tag[0] != '\0' ? " (" : "", tag,
             tag[0] != '\0' ? ")" : "");
}

static int print_points(const roofline_params *params,
                        const derive_sources *sources, pt_error *err)
{
    printf("\n| source | hidden | seq | tp | mbs | part | measured | "
           "model | error |\n|---|---:|---:|---:|---:|---|---:|---:|---:|\n");
    for (int i = 0; i < sources->count; i++) {
        const profile *source = &sources->profiles[i];
        roofline_observation *obs = NULL;
        int count = 0, left_out = 0;
        if (roofline_observations(params, source, &obs, &count, &left_out,
                                  err) != 0)
            return -1;
        for (int j = 0; j < count; j++) {
            const profile_shape *shape = &source->shapes[obs[j].shape_index];
            char suffix[80];
            architecture_suffix(shape, suffix, sizeof suffix);
            printf("| %s | %d%s | %d | %d | %d | %s %s | %.3f ms | %.3f ms | "
                   "%+.1f %% |\n",
                   source->gpu, shape->hidden, suffix, shape->seq, obs[j].tp,
                   obs[j].mbs, part_names[obs[j].part],
                   obs[j].backward ? "bwd" : "fwd", obs[j].measured_s * 1e3,
                   obs[j].predicted_s * 1e3,
                   100.0 * (obs[j].predicted_s / obs[j].measured_s - 1.0));
        }
        free(obs);
    }
    return 0;
}

/* "partita profile --derive A10 --from ... -o ..." as it was run. */
static void command_text(int argc, char **argv, char *out, size_t size)
{
    size_t used = (size_t)snprintf(out, size, "partita");
    for (int i = 0; i < argc && used < size; i++)
        used += (size_t)snprintf(out + used, size - used, " %s", argv[i]);
}

static void today(char *out, size_t size)
{
    time_t now = time(NULL);
    struct tm utc;
    gmtime_r(&now, &utc);
    strftime(out, size, "%Y-%m-%d", &utc);
}

/* The row --derive names; NULL (err lists the rows) when there is none. */
static const gpu_spec *find_spec(const gpu_spec_table *table,
                                 const char *specs, const char *gpu,
                                 pt_error *err)
{
    const gpu_spec *spec = gpu_spec_find(table, gpu);
    if (spec != NULL)
        return spec;
    char names[512] = "";
    for (int i = 0; i < table->count; i++)
        snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                 i ? ", " : "", table->specs[i].gpu);
    pt_fail(err, "--derive %s: %s has no such GPU (it has %s)", gpu, specs,
            names);
    return NULL;
}

/* The derived profile as JSON and, read back through the profile reader
 * (so that what is written is what loads), as a profile. */
static json_t *build_profile(const derive_arguments *a, int argc, char **argv,
                             const gpu_spec_table *table, const char *specs,
                             const derive_sources *sources,
                             const roofline_fit_result *fit, profile *out,
                             pt_error *err)
{
    const gpu_spec *spec = find_spec(table, specs, a->gpu, err);
    if (spec == NULL)
        return NULL;
    char command[MAX_COMMAND_TEXT], date[32];
    command_text(argc, argv, command, sizeof command);
    if (a->date != NULL)
        pt_copy_string(date, sizeof date, a->date);
    else
        today(date, sizeof date);
    derive_request request = {
        .spec = spec, .spec_file = specs, .spec_source = table->source,
        .sources = sources->profiles, .source_files = sources->file_names,
        .source_count = sources->count, .command = command, .date = date};
    json_t *root = derive_profile_json(&request, fit, err);
    if (root == NULL)
        return NULL;
    char label[PT_PATH_MAX + 32];
    snprintf(label, sizeof label, "%s (derived)",
             a->output ? a->output : a->gpu);
    json_place place = json_place_root(label);
    if (profile_from_json(root, &place, out, err) != 0) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* A one-node cluster of the derived GPU on the reference's link. */
static int comparison_cluster(const derive_arguments *a, const profile *derived,
                              const profile_shape *shape, cluster *out,
                              pt_error *err)
{
    int largest_tp = 1;
    for (int i = 0; i < shape->point_count; i++)
        if (shape->points[i].tp > largest_tp)
            largest_tp = shape->points[i].tp;
    if (largest_tp > 1 && !(a->link_GBps > 0.0))
        return pt_fail(err, "--compare: the reference has tp %d points; give "
                       "the intra-node link they ran on (--link-GBps, "
                       "--link-latency-us) for the tp all-reduces",
                       largest_tp);
    memset(out, 0, sizeof *out);
    out->types = calloc(1, sizeof *out->types);
    if (out->types == NULL)
        return pt_fail(err, "out of memory");
    pt_copy_string(out->name, sizeof out->name, "compare");
    out->type_count = 1;
    out->node_count = 1;
    node_type *node = &out->types[0];
    pt_copy_string(node->name, sizeof node->name, "node");
    pt_copy_string(node->gpu, sizeof node->gpu, derived->gpu);
    node->count = 1;
    node->gpus = largest_tp;
    node->intra_node = (link_spec){a->link_GBps * 1e9,
                                   a->link_latency_us * 1e-6};
    return 0;
}

static void print_comparison_row(const profile *ref, const profile_shape *shape,
                                 const profile_point *pt, int part,
                                 const type_costs *costs, double *log_sum,
                                 int *rows)
{
    const part_cost *measured[3] = {&pt->embedding, &pt->layer, &pt->head};
    /* a head timed fused (head.fused) ran its backward products in the
     * forward: the derived head's forward with them */
    double derived_forward[3] = {
        costs->embedding_forward_s, costs->layer_forward_s,
        costs->head_forward_s + (pt->head_fused ? costs->head_products_s
                                                : 0.0)};
    double ref_s = measured[part]->forward_s, ours = derived_forward[part];
    char suffix[80];
    architecture_suffix(shape, suffix, sizeof suffix);
    printf("| %s | h %d, s %d, V %d%s | %d | %d | %s | %.3f ms | %.3f ms | "
           "%+.0f %% |\n",
           ref->gpu, shape->hidden, shape->seq, shape->vocab, suffix, pt->tp,
           pt->mbs,
           part_names[part], ref_s * 1e3, ours * 1e3,
           100.0 * (ours / ref_s - 1.0));
    *log_sum += fabs(log(ours / ref_s));
    (*rows)++;
}

/* Forward times of the reference against the derived profile as the cost
 * model prices them (tp all-reduces included, as in the reference when
 * its layer times include them). */
static int print_comparison(const derive_arguments *a, const profile *derived,
                            pt_error *err)
{
    char path[PT_PATH_MAX];
    profile ref;
    if (load_profile(a->compare, a->profiles, path, sizeof path, &ref,
                     err) != 0)
        return -1;
    printf("\n| reference | shape | tp | mbs | part | reference fwd | %s fwd "
           "| error |\n|---|---|---:|---:|---|---:|---:|---:|\n",
           derived->gpu);
    double log_sum = 0.0;
    int rows = 0, status = 0;
    for (int s = 0; status == 0 && s < ref.shape_count; s++) {
        const profile_shape *shape = &ref.shapes[s];
        model_shape m = profile_shape_model(shape);
        cluster c;
        costmodel cm;
        if (comparison_cluster(a, derived, shape, &c, err) != 0) {
            status = -1;
            break;
        }
        status = costmodel_open_with_profiles(&cm, &m, &c, derived, err);
        for (int i = 0; status == 0 && i < shape->point_count; i++) {
            const profile_point *pt = &shape->points[i];
            parallel_config config = {.gbs = pt->mbs, .mbs = pt->mbs,
                                      .tp = pt->tp, .dp = 1, .pp = 1,
                                      .precision = PRECISION_FP16};
            type_costs costs;
            status = costmodel_type_costs(&cm, 0, &config, &costs, err);
            for (int part = 0; status == 0 && part < 3; part++)
                print_comparison_row(&ref, shape, pt, part, &costs, &log_sum,
                                     &rows);
        }
        costmodel_close(&cm);
        cluster_free(&c);
    }
    if (status == 0 && rows > 0)
        printf("\n# mean |ln(derived / reference)| over %d times: %.3f "
               "(a factor of %.2f)\n", rows, log_sum / rows,
               exp(log_sum / rows));
    profile_free(&ref);
    return status;
}

static int locate_specs(const derive_arguments *a, char *out, size_t size,
                        pt_error *err)
{
    if (a->specs != NULL) {
        pt_copy_string(out, size, a->specs);
        return 0;
    }
    if (cli_locate("profiles", "specs", out, size, err) != 0)
        return -1;
    /* "./profiles/specs.json" reads better in a provenance without "./" */
    if (strncmp(out, "./", 2) == 0)
        memmove(out, out + 2, strlen(out + 2) + 1);
    return 0;
}

/* The derived profile must not replace the spec table or a profile it
 * is fitted on. */
static int check_output_not_input(const derive_arguments *a,
                                  const char *specs,
                                  const derive_sources *sources,
                                  pt_error *err)
{
    if (pt_check_output_not_input(a->output, specs, "spec table", err) != 0)
        return -1;
    for (int i = 0; i < sources->count; i++)
        if (pt_check_output_not_input(a->output, sources->files[i],
                                      "profile", err) != 0)
            return -1;
    return 0;
}

/* Everything after the arguments: returns the exit status. */
static int derive(const derive_arguments *a, int argc, char **argv)
{
    pt_error err = {""};
    char specs[PT_PATH_MAX];
    gpu_spec_table table = {0};
    derive_sources *sources = calloc(1, sizeof *sources);
    roofline_fit_result fit;
    profile derived = {0};
    json_t *root = NULL;
    int status = EXIT_BAD_INPUT;
    if (sources == NULL) {
        cli_error(a->command, "out of memory");
        return EXIT_FAILURE_RUN;
    }
    if (locate_specs(a, specs, sizeof specs, &err) != 0 ||
        gpu_spec_table_load(specs, &table, &err) != 0 ||
        find_spec(&table, specs, a->gpu, &err) == NULL ||
        load_sources(a, &table, sources, &err) != 0 ||
        check_output_not_input(a, specs, sources, &err) != 0 ||
        roofline_fit(sources->profiles, sources->count, &fit, &err) != 0)
        goto done;
    print_fit(a, &fit);
    if (a->points && print_points(&fit.params, sources, &err) != 0)
        goto done;
    root = build_profile(a, argc, argv, &table, specs, sources, &fit,
                         &derived, &err);
    if (root == NULL)
        goto done;
    if (a->compare != NULL && print_comparison(a, &derived, &err) != 0)
        goto done;
    if (a->output != NULL) {
        if (json_write_file_atomic(root, a->output, &err) != 0) {
            status = EXIT_FAILURE_RUN;
            goto done;
        }
        printf("# wrote %s\n", a->output);
    }
    status = EXIT_OK;
done:
    if (status != EXIT_OK)
        cli_error(a->command, err.message);
    json_decref(root);
    profile_free(&derived);
    free_sources(sources);
    free(sources);
    gpu_spec_table_free(&table);
    return status;
}

int cmd_profile_derive(int argc, char **argv)
{
    derive_arguments arguments = {0};
    int parsed = parse_derive_arguments(argc, argv, &arguments);
    if (parsed != 0)
        return parsed > 0 ? EXIT_OK : EXIT_BAD_INPUT;
    if (arguments.output != NULL &&
        cli_check_output("profile", arguments.output, false) != 0)
        return EXIT_BAD_INPUT;
    return derive(&arguments, argc, argv);
}
