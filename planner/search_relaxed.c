/*
 * The relaxed partition (docs/planner.md, "Floors, and why the search is
 * exact"): the placed stages keep their exact terms, the stages still to
 * come are relaxed into the best stages their GPUs could possibly form,
 * and the partition problem of the whole lot is solved exactly. Both the
 * bound (search_bound.c) and the per-step-work walk (search_tail.c) solve
 * it, which is why it stands in a file of its own.
 *
 * The relaxed stages: take the GPUs left fastest first, S = dp x tp at a
 * time; the i-th group's slowest GPU gives relaxed stage i its pace.
 * Sorted by pace, the real stages are no faster, one by one (the i
 * fastest real stages hold i S GPUs, all at most as slow as the i-th).
 * Each real stage holds a GPU at least as slow as its relaxed partner, of
 * a type whose send and memory then bound the stage's. Memory is bounded
 * two ways, each valid alone, and the higher floor is kept: by type
 * (the most layers that type fits at any position left) or by position
 * (the most layers any type left fits there, the roomiest positions
 * given to the fastest stages, which an exchange of two stages' layers
 * shows to be the best pairing).
 */
#include "planner/internal.h"

#include <math.h>
#include <string.h>

/* Solves the partition problem in t->stages exactly; INFINITY when
 * nothing fits. */
static int solve(const bound_tables *t, search_memo *memo, double *value,
                 pt_error *err)
{
    partition_problem problem = {t->pp, t->layers, t->microbatches,
                                 t->stages};
    int status = search_solve_partition(memo, SOLVER_DP, &problem,
                                        t->layers_out, value, err);
    if (status == 0)
        *value = INFINITY;
    return status < 0 ? -1 : 0;
}


/* Fills ranks[0..n) for the GPUs left; ranks of equal kind share
 * first_eligible. */
static void rank_relaxed(const bound_tables *t, const int *gpus_left, int n,
                         relaxed *ranks)
{
    int order_index = 0;
    long long seen = 0;
    for (int i = 0; i < n; i++) {
        long long wanted = (long long)(i + 1) * t->stage_gpus;
        while (order_index + 1 < t->type_count &&
               seen + gpus_left[t->pace_order[order_index]] < wanted) {
            seen += gpus_left[t->pace_order[order_index]];
            order_index++;
        }
        double pace = t->pace[t->pace_order[order_index]];
        int eligible = order_index;
        while (eligible > 0 && t->pace[t->pace_order[eligible - 1]] >= pace)
            eligible--;
        relaxed *r = &ranks[i];
        r->pace = pace;
        r->first_eligible = eligible;
        r->send = INFINITY;
        r->head = INFINITY;
        for (int k = t->head_by_pace ? eligible : 0; k < t->type_count; k++) {
            int type = t->pace_order[k];
            if (gpus_left[type] > 0)
                r->head = fmin(r->head, t->head[type]);
        }
        for (int k = eligible; k < t->type_count; k++) {
            int type = t->pace_order[k];
            if (gpus_left[type] > 0)
                r->send = fmin(r->send, t->send[type]);
        }
    }
}

/* The most layers a real partner of rank r fits at positions [from, to):
 * over the types at least as slow (all types when caps need not order
 * like memory). -1 when none fits. */
static int rank_cap(const bound_tables *t, const int *gpus_left,
                    const relaxed *r, int from, int to)
{
    int best = -1;
    int first = t->caps_by_pace ? r->first_eligible : 0;
    for (int k = first; k < t->type_count; k++) {
        int type = t->pace_order[k];
        if (gpus_left[type] == 0)
            continue;
        for (int s = from; s < to; s++)
            if (bound_pure_cap(t, type, s) > best)
                best = bound_pure_cap(t, type, s);
    }
    return best;
}

/* Whether rank i starts a new kind (ranks of one kind are alike). */
static bool new_kind(const relaxed *ranks, int i)
{
    return i == 0 || ranks[i].first_eligible != ranks[i - 1].first_eligible ||
           ranks[i].pace != ranks[i - 1].pace;
}

/* Memory by type: every relaxed stage fits what its types fit at the
 * roomiest position left; the head goes to one of them, whichever kind
 * gives the lowest floor. */
static int floor_by_type(const bound_tables *t, search_memo *memo,
                         const int *gpus_left, int complete,
                         const relaxed *ranks, const int *rank_caps,
                         double *out, pt_error *err)
{
    int n = t->pp - complete;
    for (int i = 0; i < n; i++) {
        int cap = rank_cap(t, gpus_left, &ranks[i], complete, t->pp);
        if (rank_caps != NULL && rank_caps[i] < cap)
            cap = rank_caps[i];
        if (cap < 0) {
            *out = INFINITY;
            return 0;
        }
        t->stages[complete + i] = (partition_stage){ranks[i].send,
                                                    ranks[i].pace, cap};
    }
    *out = INFINITY;
    for (int i = 0; i < n; i++) {
        if (!new_kind(ranks, i))
            continue;
        partition_stage saved = t->stages[complete + i];
        t->stages[complete + i].fixed_s += ranks[i].head;
        if (rank_caps != NULL && rank_caps[t->pp + i] < saved.max_layers)
            t->stages[complete + i].max_layers = rank_caps[t->pp + i];
        double value = INFINITY;
        if (t->stages[complete + i].max_layers >= 0 &&
            solve(t, memo, &value, err) != 0)
            return -1;
        t->stages[complete + i] = saved;
        if (value < *out)
            memcpy(t->relaxed_layers, t->layers_out,
                   (size_t)t->pp * sizeof(int));
        *out = fmin(*out, value);
    }
    return 0;
}

/* Memory by position: the last position takes a stage of some kind with
 * the head and the room its types have there; the other positions take
 * the most any type left fits there, the roomiest to the fastest of the
 * other relaxed stages (an exchange of two stages' layers shows this
 * pairing is the best one). The lowest floor over the last stage's
 * kind. */
static int floor_by_position(const bound_tables *t, search_memo *memo,
                             const int *gpus_left, int complete,
                             const relaxed *ranks, double *out,
                             pt_error *err)
{
    int n = t->pp - complete, last = t->pp - 1;
    for (int i = 0; i + 1 < n; i++) {
        int best = -1;
        for (int type = 0; type < t->type_count; type++)
            if (gpus_left[type] > 0 &&
                bound_pure_cap(t, type, complete + i) > best)
                best = bound_pure_cap(t, type, complete + i);
        if (best < 0) {
            *out = INFINITY;
            return 0;
        }
        int position = i;
        while (position > 0 && t->cap_by_position[position - 1] < best) {
            t->cap_by_position[position] = t->cap_by_position[position - 1];
            position--;
        }
        t->cap_by_position[position] = best;
    }
    *out = INFINITY;
    for (int chosen = 0; chosen < n; chosen++) {
        if (!new_kind(ranks, chosen))
            continue;
        int cap = rank_cap(t, gpus_left, &ranks[chosen], last, last + 1);
        if (cap < 0)
            continue;
        t->stages[last] = (partition_stage){ranks[chosen].send +
                                                ranks[chosen].head,
                                            ranks[chosen].pace, cap};
        for (int i = 0, slot = 0; i < n; i++) {
            if (i == chosen)
                continue;
            t->stages[complete + slot] = (partition_stage){
                ranks[i].send, ranks[i].pace, t->cap_by_position[slot]};
            slot++;
        }
        double value;
        if (solve(t, memo, &value, err) != 0)
            return -1;
        *out = fmin(*out, value);
    }
    return 0;
}

int bound_relaxed(const bound_tables *t, search_memo *memo,
                  const partial_placement *partial, const int *caps,
                  const int *rank_caps, double extras, double threshold_s,
                  double *value, pt_error *err)
{
    int complete = partial->final_count + (partial->pending ? 1 : 0);
    int n = t->pp - complete;
    for (int s = 0; s < complete; s++) {
        const stage_terms *terms = &partial->facts[s].terms;
        int cap = terms->max_layers;
        if (caps != NULL && caps[s] < cap)
            cap = caps[s];
        t->stages[s] = (partition_stage){terms->fixed_s, terms->per_layer_s,
                                         cap};
    }
    if (partial->pending) {
        /* its send to the next stage is still unknown: at least what a
           node of its slowest or smallest type must take */
        const stage_placement *place = &partial->facts[complete - 1].place;
        t->stages[complete - 1].fixed_s +=
            fmax(t->send[place->slow_type], t->send[place->small_type]);
    }
    rank_relaxed(t, partial->gpus_left, n, t->ranks);
    double by_type, by_position = -INFINITY;
    if (floor_by_type(t, memo, partial->gpus_left, complete, t->ranks,
                      rank_caps, &by_type, err) != 0)
        return -1;
    /* the second floor only matters when the first leaves the subtree in
       (its pairing of positions with stages knows no caps by stage) */
    if (rank_caps == NULL &&
        (by_type + extras) * (1.0 - 1e-9) <= threshold_s &&
        floor_by_position(t, memo, partial->gpus_left, complete, t->ranks,
                          &by_position, err) != 0)
        return -1;
    *value = fmax(by_type, by_position);
    return 0;
}
