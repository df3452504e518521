/*
 * What `partita plan` is told to hold to: the degrees a user fixes or
 * limits (--tp, --pp, --dp, --mbs, each a value or a list) and the part
 * of the cluster to plan on (--nodes TYPE:COUNT,...). Parsed and checked
 * against the cluster here, before any search, so that a bad value costs
 * one line and exit status 2 and writes no file.
 */
#include "cli/cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int plan_parse_degree(const char *option, const char *value,
                      degree_choice *out)
{
    int values[SEARCH_MAX_CHOICES], count = 0;
    if (cli_parse_int_list("plan", option, value, 65536, values,
                           SEARCH_MAX_CHOICES, &count) != 0)
        return -1;
    out->count = 0;
    for (int i = 0; i < count; i++) {
        if (strcmp(option, "--tp") == 0 && (values[i] & (values[i] - 1))) {
            fprintf(stderr, "partita plan: --tp: %d is not a power of two "
                            "(tp groups split a layer's matrices evenly)\n",
                    values[i]);
            return -1;
        }
        bool seen = false;
        for (int k = 0; k < out->count; k++)
            seen = seen || out->values[k] == values[i];
        if (!seen)
            out->values[out->count++] = values[i];
    }
    return 0;
}

/* "a100, a10" into out: the types a message offers. */
static void type_names(const cluster *c, char *out, size_t size)
{
    size_t used = 0;
    out[0] = '\0';
    for (int t = 0; t < c->type_count && used < size; t++)
        used += (size_t)snprintf(out + used, size - used, "%s%s",
                                 t > 0 ? ", " : "", c->types[t].name);
}

/* One TYPE:COUNT of --nodes into counts[type]. */
static int parse_node_item(const cluster *pool, const char *item,
                           size_t length, int *counts, bool *named,
                           pt_error *err)
{
    const char *colon = memchr(item, ':', length);
    if (colon == NULL || colon == item)
        return pt_fail(err, "--nodes: expected TYPE:COUNT[,TYPE:COUNT...], "
                       "got '%.*s'", (int)length, item);
    size_t name_length = (size_t)(colon - item);
    int type = -1;
    for (int t = 0; t < pool->type_count && type < 0; t++)
        if (strlen(pool->types[t].name) == name_length &&
            strncmp(pool->types[t].name, item, name_length) == 0)
            type = t;
    if (type < 0) {
        char names[256];
        type_names(pool, names, sizeof names);
        return pt_fail(err, "--nodes: cluster %s has no node type '%.*s' "
                       "(its types: %s)", pool->name, (int)name_length, item,
                       names);
    }
    char digits[32];
    size_t digit_length = length - name_length - 1;
    snprintf(digits, sizeof digits, "%.*s", (int)digit_length, colon + 1);
    char *end = NULL;
    errno = 0;
    long count = strtol(digits, &end, 10);
    if (digit_length == 0 || digit_length >= sizeof digits || *end != '\0' ||
        errno != 0 || count < 0 || digits[0] == '+' || digits[0] == ' ')
        return pt_fail(err, "--nodes: %.*s: expected a count of nodes",
                       (int)length, item);
    if (named[type])
        return pt_fail(err, "--nodes: node type %s is named twice",
                       pool->types[type].name);
    if (count > pool->types[type].count)
        return pt_fail(err, "--nodes: %.*s asks for more nodes than the %d "
                       "of type %s that cluster %s has", (int)length, item,
                       pool->types[type].count, pool->types[type].name,
                       pool->name);
    named[type] = true;
    counts[type] = (int)count;
    return 0;
}

int plan_restrict_nodes(const cluster *pool, const char *spec,
                        cluster *out, pt_error *err)
{
    int counts[PLANNER_MAX_TYPES] = {0};
    bool named[PLANNER_MAX_TYPES] = {false};
    if (pool->type_count > PLANNER_MAX_TYPES)
        return pt_fail(err, "--nodes: cluster %s has %d node types; the "
                       "planner handles 1..%d", pool->name, pool->type_count,
                       PLANNER_MAX_TYPES);
    for (const char *at = spec;;) {
        const char *comma = strchr(at, ',');
        size_t length = comma ? (size_t)(comma - at) : strlen(at);
        if (parse_node_item(pool, at, length, counts, named, err) != 0)
            return -1;
        if (comma == NULL)
            break;
        at = comma + 1;
    }
    int total = 0;
    for (int t = 0; t < pool->type_count; t++)
        total += counts[t];
    if (total == 0)
        return pt_fail(err, "--nodes: %s leaves no node to plan on", spec);
    if (cluster_copy(out, pool, err) != 0)
        return -1;
    /* the pool's types in its order, unnamed ones with no nodes: a node
       of the part is the pool's node of its type and ordinal */
    out->node_count = total;
    for (int t = 0; t < pool->type_count; t++)
        out->types[t].count = counts[t];
    return 0;
}

void plan_map_to_pool(const cluster *pool, const int *type_counts,
                      ranked_plan *plan)
{
    int first_of[PLANNER_MAX_TYPES] = {0}, pool_first[PLANNER_MAX_TYPES];
    int next = 0, pool_next = 0;
    for (int t = 0; t < pool->type_count && t < PLANNER_MAX_TYPES; t++) {
        first_of[t] = next;
        pool_first[t] = pool_next;
        next += type_counts[t];
        pool_next += pool->types[t].count;
    }
    for (int i = 0; i < plan->node_count; i++) {
        int node = plan->node_order[i], type = 0;
        while (type + 1 < pool->type_count && type + 1 < PLANNER_MAX_TYPES &&
               node >= first_of[type] + type_counts[type])
            type++;
        plan->node_order[i] = pool_first[type] + node - first_of[type];
    }
}
