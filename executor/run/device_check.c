/*
 * A plan against the GPUs this machine has, checked before anything is
 * allocated: enough devices, each rank's device of the GPU type the
 * cluster file names, SM and memory limits the devices can honour, and
 * the memory each rank needs. Pure: the caller queries the devices (the
 * CUDA runtime) and sizes the ranks; this file only compares, so it is
 * tested with made-up device lists.
 */
#include "executor/run/run.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ mapping */

int plan_rank_device(const plan *p, int rank, device_spec *out)
{
    int local = rank;
    for (int i = 0; rank >= 0 && i < p->node_order_count; i++) {
        int node = p->node_order[i];
        int gpus = cluster_node_gpus(&p->cluster, node);
        if (local >= gpus) {
            local -= gpus;
            continue;
        }
        const node_type *type =
            &p->cluster.types[cluster_node_type(&p->cluster, node)];
        if (type->device_count > local)
            *out = type->devices[local];
        else
            *out = (device_spec){.index = rank};
        return 0;
    }
    return -1;
}

/* ---------------------------------------------------------- type names */

/* The words of a name: runs of letters and digits, upper-cased. */
enum { NAME_MAX_WORDS = 16 };
typedef struct name_words {
    int count;
    char word[NAME_MAX_WORDS][PT_NAME_MAX];
} name_words;

static void split_words(const char *text, name_words *out)
{
    out->count = 0;
    while (*text != '\0' && out->count < NAME_MAX_WORDS) {
        if (!isalnum((unsigned char)*text)) {
            text++;
            continue;
        }
        char *word = out->word[out->count++];
        size_t len = 0;
        for (; isalnum((unsigned char)*text); text++)
            if (len + 1 < PT_NAME_MAX)
                word[len++] = (char)toupper((unsigned char)*text);
        word[len] = '\0';
    }
}

static bool has_digit(const char *word)
{
    return strpbrk(word, "0123456789") != NULL;
}

/* The model a cluster GPU type names: its words up to the first that holds
 * a digit, joined ("H200" of "H200-40SM", "A100" of "A100-40GB" and of
 * "A100-FASOP", "RTX3090" of "RTX-3090"); a trailing "-NNSM" (an SM limit
 * in the name) is not part of it. Empty when there is no word. */
static void gpu_type_key(const char *cluster_gpu, char *out, size_t size)
{
    name_words words;
    split_words(cluster_gpu, &words);
    int last = words.count - 1;
    if (last > 0) {
        const char *w = words.word[last];
        size_t len = strlen(w);
        if (len > 2 && strcmp(w + len - 2, "SM") == 0 &&
            strspn(w, "0123456789") == len - 2)
            words.count--;
    }
    int end = 0;
    while (end < words.count && !has_digit(words.word[end]))
        end++;
    if (end == words.count)
        end = 0; /* no model number: the first word alone */
    out[0] = '\0';
    for (int i = 0; i <= end && i < words.count; i++)
        strncat(out, words.word[i], size - strlen(out) - 1);
}

bool gpu_name_matches(const char *cluster_gpu, const char *device_name)
{
    char key[PT_NAME_MAX * 2];
    gpu_type_key(cluster_gpu, key, sizeof key);
    if (key[0] == '\0')
        return false;
    /* Whole words of the device name, one or several adjacent ones
     * joined: "A10" does not match "A100", "RTX3090" matches
     * "GeForce RTX 3090". */
    name_words words;
    split_words(device_name, &words);
    size_t key_len = strlen(key);
    for (int first = 0; first < words.count; first++) {
        size_t matched = 0;
        for (int i = first; i < words.count; i++) {
            size_t len = strlen(words.word[i]);
            if (strncmp(key + matched, words.word[i], len) != 0)
                break;
            matched += len;
            if (matched == key_len)
                return true;
        }
    }
    return false;
}

/* ------------------------------------------------------------- checks */

/* What one rank runs on, gathered once for the checks and messages. */
typedef struct rank_placement {
    int rank;
    device_spec spec;
    const local_device *device;   /* NULL: not on this machine */
    const node_type *type;
    char label[PT_NAME_MAX * 4];  /* "rank 1 (stage 1, H200-40SM on node
                                     h200x2[0] device 1)" */
} rank_placement;

static const local_device *find_device(const local_device *devices,
                                       int device_count, int index)
{
    for (int d = 0; d < device_count; d++)
        if (devices[d].index == index)
            return &devices[d];
    return NULL;
}

static void place_rank(const plan *p, int rank, const local_device *devices,
                       int device_count, rank_placement *out)
{
    int node = plan_rank_node(p, rank);
    char node_name[PT_NAME_MAX + 16];
    cluster_node_name(&p->cluster, node, node_name, sizeof node_name);
    out->rank = rank;
    plan_rank_device(p, rank, &out->spec);
    out->device = find_device(devices, device_count, out->spec.index);
    out->type = &p->cluster.types[cluster_node_type(&p->cluster, node)];
    snprintf(out->label, sizeof out->label,
             "rank %d (stage %d, %s on node %s device %d)", rank,
             plan_stage_of_rank(p, rank), out->type->gpu, node_name,
             out->spec.index);
}

/* The plan's ranks against the node order and this machine's device
 * count, before any rank is looked at closely. */
static int check_gpu_count(const plan *p, int rank_count, int device_count,
                           pt_error *err)
{
    const parallel_config *c = &p->config;
    int provided = plan_gpu_count(p);
    char degrees[96];
    if (plan_first_asymmetric_stage(p) >= 0)
        snprintf(degrees, sizeof degrees, "its %d stages' tp x dp", c->pp);
    else
        snprintf(degrees, sizeof degrees, "pp %d x dp %d x tp %d", c->pp,
                 c->dp, c->tp);
    if (provided != rank_count)
        return pt_fail(err, "the plan needs %d GPUs (%s), its node order "
                       "provides %d", rank_count, degrees, provided);
    bool explicit_devices = false;
    for (int t = 0; t < p->cluster.type_count; t++)
        explicit_devices |= p->cluster.types[t].device_count > 0;
    /* Without device lists rank r runs on device r; with them, each
     * rank's device is checked by index below. */
    if (!explicit_devices && rank_count > device_count)
        return pt_fail(err, "the plan needs %d GPUs (%s), this machine has "
                       "%d", rank_count, degrees, device_count);
    return 0;
}

/* One rank against its own device: present, of the cluster's type, with
 * SM and memory limits it can honour, and the rank's memory within its
 * memory limit. */
static int check_rank(const rank_placement *r, const double *needed_bytes,
                      int device_count, pt_error *err)
{
    const local_device *d = r->device;
    char need[32], have[32];
    if (d == NULL)
        return pt_fail(err, "%s: this machine has no device %d (it has %d "
                       "device%s)", r->label, r->spec.index, device_count,
                       device_count == 1 ? "" : "s");
    if (!gpu_name_matches(r->type->gpu, d->name))
        return pt_fail(err, "%s: the cluster file says %s, but device %d is "
                       "%s", r->label, r->type->gpu, d->index, d->name);
    if (r->spec.sm_limit > d->multiprocessors)
        return pt_fail(err, "%s: sm_limit %d SMs, but device %d %s has %d "
                       "SMs", r->label, r->spec.sm_limit, d->index, d->name,
                       d->multiprocessors);
    double limit_bytes = r->spec.memory_limit_gib * PT_GIB;
    if (limit_bytes > d->total_memory_bytes) {
        pt_format_bytes(limit_bytes, need, sizeof need);
        pt_format_bytes(d->total_memory_bytes, have, sizeof have);
        return pt_fail(err, "%s: memory_limit_gib %s, but device %d %s has "
                       "%s", r->label, need, d->index, d->name, have);
    }
    if (needed_bytes != NULL && limit_bytes > 0 &&
        needed_bytes[r->rank] > limit_bytes) {
        pt_format_bytes(needed_bytes[r->rank], need, sizeof need);
        pt_format_bytes(limit_bytes, have, sizeof have);
        return pt_fail(err, "%s needs %s, its memory_limit_gib allows %s",
                       r->label, need, have);
    }
    return 0;
}

/* What the ranks on one device ask of it together. */
typedef struct device_demand {
    int rank_count;
    int first_rank;
    double needed_bytes;
    double limit_bytes;     /* sum of the memory limits set */
    int sm_limit_sum;
    bool shares_all_sms;    /* a rank without sm_limit is on it */
    char ranks[256];        /* "0, 1, 3" */
} device_demand;

static void add_demand(device_demand *demand, const rank_placement *r,
                       const double *needed_bytes)
{
    if (demand->rank_count++ == 0)
        demand->first_rank = r->rank;
    size_t used = strlen(demand->ranks);
    snprintf(demand->ranks + used, sizeof demand->ranks - used, "%s%d",
             used ? ", " : "", r->rank);
    if (needed_bytes != NULL)
        demand->needed_bytes += needed_bytes[r->rank];
    demand->limit_bytes += r->spec.memory_limit_gib * PT_GIB;
    demand->sm_limit_sum += r->spec.sm_limit;
    demand->shares_all_sms |= r->spec.sm_limit == 0;
}

/* The ranks of one device together: their memory within its free memory,
 * and, when it is split between emulated GPUs, their SM and memory limits
 * within what it has. */
static int check_device(const local_device *d, const device_demand *demand,
                        const rank_placement *first, pt_error *err)
{
    char need[32], have[32];
    if (demand->needed_bytes > d->free_memory_bytes) {
        pt_format_bytes(demand->needed_bytes, need, sizeof need);
        pt_format_bytes(d->free_memory_bytes, have, sizeof have);
        if (demand->rank_count == 1)
            return pt_fail(err, "%s needs %s, device %d %s has %s free",
                           first->label, need, d->index, d->name, have);
        return pt_fail(err, "ranks %s share device %d %s and need %s "
                       "together, it has %s free", demand->ranks, d->index,
                       d->name, need, have);
    }
    if (demand->rank_count < 2)
        return 0;
    if (!demand->shares_all_sms && demand->sm_limit_sum > d->multiprocessors)
        return pt_fail(err, "ranks %s share device %d %s with sm_limit %d "
                       "SMs together, it has %d SMs", demand->ranks,
                       d->index, d->name, demand->sm_limit_sum,
                       d->multiprocessors);
    if (demand->limit_bytes > d->total_memory_bytes) {
        pt_format_bytes(demand->limit_bytes, need, sizeof need);
        pt_format_bytes(d->total_memory_bytes, have, sizeof have);
        return pt_fail(err, "ranks %s share device %d %s with "
                       "memory_limit_gib %s together, it has %s",
                       demand->ranks, d->index, d->name, need, have);
    }
    return 0;
}

int device_check_plan(const plan *p, const local_device *devices,
                      int device_count, const double *needed_bytes,
                      pt_error *err)
{
    int rank_count = plan_rank_count(p);
    if (check_gpu_count(p, rank_count, device_count, err) != 0)
        return -1;
    rank_placement *ranks = calloc((size_t)rank_count, sizeof *ranks);
    device_demand *demands = calloc((size_t)device_count + 1,
                                    sizeof *demands);
    int status = ranks != NULL && demands != NULL
                     ? 0
                     : pt_fail(err, "out of memory checking %d ranks",
                               rank_count);
    for (int r = 0; status == 0 && r < rank_count; r++) {
        place_rank(p, r, devices, device_count, &ranks[r]);
        status = check_rank(&ranks[r], needed_bytes, device_count, err);
        if (status == 0)
            add_demand(&demands[ranks[r].device - devices], &ranks[r],
                       needed_bytes);
    }
    for (int d = 0; status == 0 && d < device_count; d++)
        if (demands[d].rank_count > 0)
            status = check_device(&devices[d], &demands[d],
                                  &ranks[demands[d].first_rank], err);
    free(ranks);
    free(demands);
    return status;
}
