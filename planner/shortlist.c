/*
 * The shortlist: the best scored placements seen, in one total order
 * (score, then task, then the bytes of the key) that neither the thread
 * count nor the order in which they were found can change. A placement
 * whose task and key equal one on the list costs the same in every
 * respect (search_tree.c), so only one of them is kept.
 */
#include "planner/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Key bytes per stage: slow, small, next and dp curve types, whether the
 * pace-setting tp group spans nodes, the nodes of the dp group; the tp,
 * next and dp links and the dp group's link inside its nodes. */
#define KEY_STAGE_INTS 7
#define KEY_STAGE_LINKS 5
#define KEY_LINK_BYTES (2 * sizeof(double))
#define KEY_STAGE_BYTES (KEY_STAGE_INTS * sizeof(int32_t) + \
                         KEY_STAGE_LINKS * KEY_LINK_BYTES)
/* and after the stages, the embedding link and its curve type */
#define KEY_TAIL_BYTES (KEY_LINK_BYTES + sizeof(int32_t))

int shortlist_key_bytes(int pp)
{
    return pp * (int)KEY_STAGE_BYTES + (int)KEY_TAIL_BYTES;
}

static unsigned char *put_int(unsigned char *out, int value)
{
    int32_t fixed = value;
    memcpy(out, &fixed, sizeof fixed);
    return out + sizeof fixed;
}

static unsigned char *put_link(unsigned char *out, link_spec link)
{
    memcpy(out, &link.bandwidth_bytes_per_s, sizeof(double));
    memcpy(out + sizeof(double), &link.latency_s, sizeof(double));
    return out + KEY_LINK_BYTES;
}

int shortlist_key_write(const stage_facts *facts, int pp, bool dp_of_one,
                        link_spec embedding_link, int embedding_curve,
                        unsigned char *out)
{
    unsigned char *cursor = out;
    /* links that cost nothing are left out, so that placements that cost
       the same have the same key: a tp group inside one node (priced by
       its type), the last stage's next link, a dp group of one */
    link_spec none = {0.0, 0.0};
    for (int s = 0; s < pp; s++) {
        const stage_placement *p = &facts[s].place;
        bool last = s == pp - 1, alone = dp_of_one;
        cursor = put_int(cursor, p->slow_type);
        cursor = put_int(cursor, p->small_type);
        cursor = put_int(cursor, last ? -1 : p->next_curve_type);
        cursor = put_int(cursor, alone ? -1 : p->dp_curve_type);
        cursor = put_int(cursor, p->tp_spans_nodes);
        cursor = put_link(cursor, p->tp_spans_nodes ? p->tp_link : none);
        cursor = put_int(cursor, p->tp_spans_nodes ? p->tp_nodes : 1);
        cursor = put_link(cursor,
                          p->tp_spans_nodes ? p->tp_intra_link : none);
        cursor = put_link(cursor, last ? none : p->next_link);
        cursor = put_link(cursor, alone ? none : p->dp_link);
        cursor = put_int(cursor, alone ? -1 : p->dp_nodes);
        cursor = put_link(cursor, alone ? none : p->dp_intra_link);
    }
    cursor = put_link(cursor, pp > 1 ? embedding_link : none);
    cursor = put_int(cursor, pp > 1 ? embedding_curve : -1);
    return (int)(cursor - out);
}

int shortlist_open(shortlist *list, int capacity, int max_nodes, int max_pp,
                   pt_error *err)
{
    memset(list, 0, sizeof *list);
    list->capacity = capacity;
    list->max_nodes = max_nodes;
    list->max_pp = max_pp;
    list->max_key = shortlist_key_bytes(max_pp);
    size_t per_slot = (size_t)max_nodes + (size_t)max_pp * sizeof(int) +
                      (size_t)list->max_key;
    per_slot = (per_slot + 7) & ~(size_t)7;
    list->slots = calloc((size_t)capacity, sizeof *list->slots);
    list->sorted = malloc((size_t)capacity * sizeof *list->sorted);
    list->storage = malloc((size_t)capacity * per_slot);
    if (!list->slots || !list->sorted || !list->storage) {
        shortlist_close(list);
        return pt_fail(err, "search: out of memory for the shortlist");
    }
    for (int i = 0; i < capacity; i++) {
        unsigned char *base = list->storage + (size_t)i * per_slot;
        list->slots[i].partition = (int *)base;
        list->slots[i].key = base + (size_t)max_pp * sizeof(int);
        list->slots[i].node_types = list->slots[i].key + list->max_key;
    }
    return 0;
}

void shortlist_close(shortlist *list)
{
    free(list->slots);
    free(list->sorted);
    free(list->storage);
    memset(list, 0, sizeof *list);
}

void shortlist_clear(shortlist *list)
{
    list->count = 0;
}

const candidate *shortlist_at(const shortlist *list, int position)
{
    return &list->slots[list->sorted[position]];
}

double shortlist_threshold(const shortlist *list)
{
    if (list->count < list->capacity)
        return INFINITY;
    return shortlist_at(list, list->count - 1)->score_s;
}

/* The total order: lower score, then lower task, then the key's bytes. */
static int compare_candidates(const candidate *a, const candidate *b)
{
    if (a->score_s != b->score_s)
        return a->score_s < b->score_s ? -1 : 1;
    if (a->task != b->task)
        return a->task < b->task ? -1 : 1;
    if (a->key_length != b->key_length)
        return a->key_length < b->key_length ? -1 : 1;
    return memcmp(a->key, b->key, (size_t)a->key_length);
}

static void copy_candidate(candidate *to, const candidate *from)
{
    to->score_s = from->score_s;
    to->task = from->task;
    to->node_count = from->node_count;
    to->pp = from->pp;
    to->key_length = from->key_length;
    memcpy(to->node_types, from->node_types, (size_t)from->node_count);
    memcpy(to->partition, from->partition, (size_t)from->pp * sizeof(int));
    memcpy(to->key, from->key, (size_t)from->key_length);
}

void shortlist_offer(shortlist *list, const candidate *offered)
{
    /* where it would go: after every candidate that comes before it */
    int position = list->count;
    while (position > 0) {
        int order = compare_candidates(offered,
                                       shortlist_at(list, position - 1));
        if (order == 0)
            return; /* the same placement class is there already */
        if (order > 0)
            break;
        position--;
    }
    if (position >= list->capacity)
        return;
    int slot;
    if (list->count < list->capacity) {
        slot = list->count++;
    } else {
        slot = list->sorted[list->count - 1]; /* the worst leaves */
    }
    for (int i = list->count - 1; i > position; i--)
        list->sorted[i] = list->sorted[i - 1];
    list->sorted[position] = slot;
    copy_candidate(&list->slots[slot], offered);
}

void ranked_take_figures(ranked_plan *out, const simulated_figures *f)
{
    out->step_time_s = f->step_time_s;
    out->tokens_per_s = f->tokens_per_s;
    out->tflops_per_gpu = f->tflops_per_gpu;
    out->cost_per_step_usd = f->cost_per_step_usd;
    memcpy(out->peak_memory_gib_by_type, f->peak_memory_gib_by_type,
           sizeof out->peak_memory_gib_by_type);
}
