/*
 * Tables of measured training runs (docs/formats.md, "Runs table"): one
 * run a line of comma-separated values under a header naming the
 * columns, as published sets of runs come (vTrain's ground truth, the
 * table in shared/reference/published-runs/). Each row becomes the plan
 * it ran, built through the plan reader so that it is checked like any
 * plan, on a cluster of as many nodes of one type as its GPUs need.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"

/* A row's longest line and most columns: a table of runs is short. */
#define RUNS_LINE_MAX 4096
#define RUNS_COLUMNS_MAX 32

/* The columns a row must have, the columns it may have; any other is
 * carried for --where filters only. */
static const char *const required_columns[] = {
    "hidden", "heads", "layers", "seq", "gbs", "mbs", "tp", "dp", "pp",
    NULL};

typedef struct row_cells {
    int count;
    char *cells[RUNS_COLUMNS_MAX];
} row_cells;

/* Splits line (modified in place) at commas, trimming spaces and the
 * line end. */
static void split_row(char *line, row_cells *out)
{
    out->count = 0;
    line[strcspn(line, "\r\n")] = '\0';
    char *cursor = line;
    while (out->count < RUNS_COLUMNS_MAX) {
        char *comma = strchr(cursor, ',');
        if (comma)
            *comma = '\0';
        while (*cursor == ' ')
            cursor++;
        char *end = cursor + strlen(cursor);
        while (end > cursor && end[-1] == ' ')
            *--end = '\0';
        out->cells[out->count++] = cursor;
        if (!comma)
            break;
        cursor = comma + 1;
    }
}

static int column_index(const row_cells *header, const char *name)
{
    for (int i = 0; i < header->count; i++)
        if (strcmp(header->cells[i], name) == 0)
            return i;
    return -1;
}

/* A cell as a number; fails naming the file, line and column. */
static int cell_number(const char *path, long line, const char *column,
                       const char *text, double *out, pt_error *err)
{
    char *end = NULL;
    errno = 0;
    double value = strtod(text, &end);
    if (text[0] == '\0' || *end != '\0' || errno != 0)
        return pt_fail(err, "%s:%ld: column %s: '%s' is not a number", path,
                       line, column, text);
    *out = value;
    return 0;
}

/* Adds an integer column's value to obj under key. */
static int put_integer(json_t *obj, const char *key, const char *path,
                       long line, const row_cells *header,
                       const row_cells *row, pt_error *err)
{
    int i = column_index(header, key);
    double value = 0.0;
    if (cell_number(path, line, key, row->cells[i], &value, err) != 0)
        return -1;
    if (value != (double)(long long)value)
        return pt_fail(err, "%s:%ld: column %s: '%s' is not a whole number",
                       path, line, key, row->cells[i]);
    json_object_set_new(obj, key, json_integer((json_int_t)value));
    return 0;
}

/* The text of a column, or fallback when the table has no such column
 * (or the cell is empty). */
static const char *cell_or(const row_cells *header, const row_cells *row,
                           const char *column, const char *fallback)
{
    int i = column_index(header, column);
    return i >= 0 && row->cells[i][0] != '\0' ? row->cells[i] : fallback;
}

/* The plan of one row as JSON, for the plan reader. */
static json_t *row_plan_json(const char *path, long line,
                             const row_cells *header, const row_cells *row,
                             const runs_table_options *options,
                             pt_error *err)
{
    json_t *model = json_object(), *plan = json_object();
    char id[64];
    snprintf(id, sizeof id, "%s", cell_or(header, row, "id", ""));
    json_object_set_new(model, "name",
                        json_string(id[0] ? id : "published-run"));
    static const char *const model_keys[] = {"hidden", "heads", "layers",
                                             "seq", NULL};
    static const char *const degree_keys[] = {"gbs", "mbs", "tp", "dp",
                                              "pp", NULL};
    int status = 0;
    for (int k = 0; status == 0 && model_keys[k]; k++)
        status = put_integer(model, model_keys[k], path, line, header, row,
                             err);
    for (int k = 0; status == 0 && degree_keys[k]; k++)
        status = put_integer(plan, degree_keys[k], path, line, header, row,
                             err);
    double vocab = options->vocab;
    if (status == 0 && column_index(header, "vocab") >= 0)
        status = cell_number(path, line, "vocab",
                             cell_or(header, row, "vocab", "0"), &vocab, err);
    if (status == 0 && column_index(header, "ffn_hidden") >= 0)
        status = put_integer(model, "ffn_hidden", path, line, header, row,
                             err);
    if (status != 0) {
        json_decref(model);
        json_decref(plan);
        return NULL;
    }
    json_object_set_new(model, "vocab", json_integer((json_int_t)vocab));
    json_object_set_new(model, "tied_embeddings", json_true());
    json_object_set_new(plan, "model", model);
    static const char *const lever_keys[] = {"precision", "recompute",
                                             "runtime", "attention", NULL};
    const char *lever_defaults[] = {options->precision, options->recompute,
                                    options->runtime, options->attention};
    for (int k = 0; lever_keys[k]; k++) {
        const char *value = cell_or(header, row, lever_keys[k],
                                    lever_defaults[k]);
        if (value != NULL)
            json_object_set_new(plan, lever_keys[k], json_string(value));
    }
    return plan;
}

/* The cluster of a row: the template's one node type, as many nodes as
 * tp x dp x pp GPUs fill. */
static int row_cluster(const char *path, long line, const json_t *plan_obj,
                       const runs_table_options *options, json_t **out,
                       pt_error *err)
{
    json_t *copy = json_deep_copy(options->cluster);
    json_t *nodes = copy ? json_object_get(copy, "nodes") : NULL;
    json_t *node = json_array_get(nodes, 0);
    long long per_node = json_integer_value(json_object_get(node, "gpus"));
    long long gpus = 1;
    static const char *const degrees[] = {"tp", "dp", "pp", NULL};
    for (int k = 0; degrees[k]; k++)
        gpus *= json_integer_value(json_object_get(plan_obj, degrees[k]));
    if (json_array_size(nodes) != 1 || per_node < 1) {
        json_decref(copy);
        return pt_fail(err, "%s: the cluster of a runs table must have one "
                       "node type with its gpus (a run uses as many of its "
                       "nodes as it needs)", options->cluster_file);
    }
    if (gpus % per_node != 0 && gpus > per_node) {
        json_decref(copy);
        return pt_fail(err, "%s:%ld: tp x dp x pp = %lld GPUs do not fill "
                       "whole nodes of %lld GPUs (%s)", path, line, gpus,
                       per_node, options->cluster_file);
    }
    json_object_set_new(node, "count",
                        json_integer(gpus > per_node ? gpus / per_node : 1));
    if (gpus < per_node)
        json_object_set_new(node, "gpus", json_integer(gpus));
    *out = copy;
    return 0;
}

/* Whether the row passes the --where filter (column=value). */
static bool row_selected(const row_cells *header, const row_cells *row,
                         const runs_table_options *options)
{
    if (options->where_column == NULL)
        return true;
    const char *value = cell_or(header, row, options->where_column, NULL);
    return value != NULL && strcmp(value, options->where_value) == 0;
}

/* The header line, copied into header_line (the reader's line is valid
 * only until its next call). */
static int read_header(pt_line_reader *reader, const char *path,
                       char *header_line, row_cells *header, pt_error *err)
{
    char *line = NULL;
    size_t length = 0;
    int got = pt_line_reader_next(reader, &line, &length, err);
    if (got < 0)
        return -1;
    if (got == 0)
        return pt_fail(err, "%s: empty (a runs table opens with a header "
                       "line naming its columns)", path);
    memcpy(header_line, line, length + 1);
    split_row(header_line, header);
    for (int k = 0; required_columns[k]; k++)
        if (column_index(header, required_columns[k]) < 0)
            return pt_fail(err, "%s: the header has no column %s (a runs "
                           "table needs hidden, heads, layers, seq, gbs, "
                           "mbs, tp, dp, pp and measured_ms or measured_s)",
                           path, required_columns[k]);
    if (column_index(header, "measured_ms") < 0 &&
        column_index(header, "measured_s") < 0)
        return pt_fail(err, "%s: the header has no column measured_ms or "
                       "measured_s", path);
    return 0;
}

/* One row into runs[*count] when selected. */
static int read_row(const char *path, long line, const row_cells *header,
                    const row_cells *row, const runs_table_options *options,
                    measured_run *run, bool *taken, pt_error *err)
{
    *taken = false;
    if (row->count != header->count)
        return pt_fail(err, "%s:%ld: %d values under a header of %d columns",
                       path, line, row->count, header->count);
    if (!row_selected(header, row, options))
        return 0;
    bool in_ms = column_index(header, "measured_ms") >= 0;
    const char *column = in_ms ? "measured_ms" : "measured_s";
    double measured = 0.0;
    if (cell_number(path, line, column, cell_or(header, row, column, ""),
                    &measured, err) != 0)
        return -1;
    if (!(measured > 0.0))
        return pt_fail(err, "%s:%ld: column %s: %g is not a positive time",
                       path, line, column, measured);
    json_t *plan_obj = row_plan_json(path, line, header, row, options, err);
    json_t *cluster = NULL;
    if (plan_obj == NULL ||
        row_cluster(path, line, plan_obj, options, &cluster, err) != 0) {
        json_decref(plan_obj);
        return -1;
    }
    json_object_set_new(plan_obj, "cluster", cluster);
    int status = plan_from_json(plan_obj, path, &run->plan, err);
    json_decref(plan_obj);
    if (status != 0)
        return pt_fail(err, "%s:%ld: %s", path, line, err->message);
    snprintf(run->id, sizeof run->id, "%s", cell_or(header, row, "id", ""));
    if (run->id[0] == '\0')
        snprintf(run->id, sizeof run->id, "line %ld", line);
    run->measured_s = in_ms ? measured / 1000.0 : measured;
    *taken = true;
    return 0;
}

int runs_table_load(const char *path, const runs_table_options *options,
                    measured_run **out, int *count, pt_error *err)
{
    *out = NULL;
    *count = 0;
    if (options->cluster == NULL)
        return pt_fail(err, "%s: a runs table needs the cluster its runs ran "
                       "on (--cluster FILE)", path);
    pt_line_reader reader;
    if (pt_line_reader_open(&reader, path, RUNS_LINE_MAX - 1, err) != 0)
        return -1;
    char header_line[RUNS_LINE_MAX];
    row_cells header, row;
    int status = read_header(&reader, path, header_line, &header, err);
    int capacity = 0;
    char *line_text = NULL;
    size_t length = 0;
    while (status == 0) {
        int got = pt_line_reader_next(&reader, &line_text, &length, err);
        if (got <= 0) {
            status = got;
            break;
        }
        long line = (long)reader.line_number;
        if (line_text[strspn(line_text, " \r")] == '\0')
            continue;
        split_row(line_text, &row);
        if (*count == capacity) {
            int grown = capacity ? 2 * capacity : 16;
            measured_run *bigger = realloc(*out, (size_t)grown * sizeof **out);
            if (bigger == NULL) {
                status = pt_fail(err, "%s: out of memory", path);
                break;
            }
            *out = bigger;
            capacity = grown;
        }
        bool taken;
        memset(&(*out)[*count], 0, sizeof **out);
        status = read_row(path, line, &header, &row, options,
                          &(*out)[*count], &taken, err);
        if (status == 0 && taken)
            (*count)++;
    }
    pt_line_reader_close(&reader);
    if (status == 0 && *count == 0)
        status = pt_fail(err, "%s: no run%s", path,
                         options->where_column ? " matches the filter" : "");
    if (status != 0) {
        runs_table_free(*out, *count);
        *out = NULL;
        *count = 0;
    }
    return status;
}

void runs_table_free(measured_run *runs, int count)
{
    for (int i = 0; i < count; i++)
        plan_free(&runs[i].plan);
    free(runs);
}
