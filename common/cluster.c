/* clusters/<name>.json: node types, their links and prices, and the
 * numbering of node instances ("a10[3]"); read and written here (plans
 * and run records embed it). */
#include "common/common.h"

#include <ctype.h>
#include <float.h>
#include <limits.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CLUSTER_MAX_GPUS_PER_NODE 1024
/* Beyond physical sense, and far enough inside a double that every sum
 * and product of the cost model stays finite: 1 MB/s to 100 TB/s within
 * a node, 1 Mbit/s to 1 Pbit/s between nodes, latencies up to a second,
 * a node-hour up to a million dollars. */
#define CLUSTER_MIN_BANDWIDTH 1e-3
#define CLUSTER_MAX_GBPS 1e5
#define CLUSTER_MAX_GBITPS 1e6
#define CLUSTER_MAX_LATENCY_US 1e6
#define CLUSTER_MAX_PRICE_PER_HOUR 1e6

static const char *const cluster_keys[] = {"name", "nodes", "links", NULL};
static const char *const node_keys[] = {
    "name", "count", "gpu", "gpus", "intra_node", "inter_node",
    "price_per_hour", "devices", "gpu_at_rest", NULL};
static const char *const link_keys[] = {"bandwidth_GBps", "bandwidth_Gbps",
                                        "latency_us", NULL};
static const char *const inter_keys[] = {"bandwidth_GBps", "bandwidth_Gbps",
                                         "latency_us", "nics", NULL};
static const char *const type_link_keys[] = {
    "between", "bandwidth_GBps", "bandwidth_Gbps", "latency_us", NULL};
static const char *const device_keys[] = {"index", "sm_limit",
                                          "memory_limit_gib", NULL};

/* The bytes of the character that starts at c, as a message quotes it:
 * a whole UTF-8 character ("é", not its first byte "\xc3"), or the byte
 * as \xNN where the text is not UTF-8 there. */
static void quote_character(const char *c, char *out, size_t size)
{
    unsigned char lead = (unsigned char)*c;
    int length = lead >= 0xf0 && lead <= 0xf4   ? 4
                 : lead >= 0xe0 && lead <= 0xef ? 3
                 : lead >= 0xc2 && lead <= 0xdf ? 2
                                                : 1;
    for (int i = 1; i < length; i++)
        if (((unsigned char)c[i] & 0xc0) != 0x80)
            length = 0;  /* a lead byte without its continuation */
    if (lead < 0x80 || length > 1)
        snprintf(out, size, "%.*s", lead < 0x80 ? 1 : length, c);
    else
        snprintf(out, size, "\\x%02x, not UTF-8", lead);
}

/* Names end up in node names ("a10[3]") and profile file names, so they
 * keep to characters that are safe in both. */
static int check_identifier(const char *text, const json_place *place,
                            const char *what, pt_error *err)
{
    if (text[0] == '\0')
        return json_place_fail(place, err, "must not be empty");
    for (const char *c = text; *c != '\0'; c++) {
        if (!isalnum((unsigned char)*c) && *c != '-' && *c != '_' &&
            *c != '.' && *c != '+') {
            char found[16];
            quote_character(c, found, sizeof found);
            return json_place_fail(
                place, err,
                "%s \"%s\" may hold only letters, digits, '-', '_', '.' and "
                "'+' (ASCII), found '%s'",
                what, text, found);
        }
    }
    if (strcmp(text, ".") == 0 || strcmp(text, "..") == 0)
        return json_place_fail(place, err, "%s \"%s\" is not a name", what,
                               text);
    return 0;
}

/* A link: bandwidth in exactly one unit, and a latency. */
static int link_from_json(const json_t *obj, const json_place *place,
                          const char *const *keys, link_spec *out,
                          pt_error *err)
{
    if (json_check_keys(obj, place, keys, err) != 0)
        return -1;
    double gigabytes_per_s = 0.0, gigabits_per_s = 0.0, latency_us = 0.0;
    bool has_bytes = json_object_get(obj, "bandwidth_GBps") != NULL;
    bool has_bits = json_object_get(obj, "bandwidth_Gbps") != NULL;
    if (has_bytes == has_bits)
        return json_place_fail(
            place, err,
            "give the bandwidth exactly once: bandwidth_GBps (gigabytes/s) "
            "or bandwidth_Gbps (gigabits/s)");
    if (json_get_number(obj, place, "bandwidth_GBps", false,
                        CLUSTER_MIN_BANDWIDTH, CLUSTER_MAX_GBPS,
                        &gigabytes_per_s, err) != 0 ||
        json_get_number(obj, place, "bandwidth_Gbps", false,
                        CLUSTER_MIN_BANDWIDTH, CLUSTER_MAX_GBITPS,
                        &gigabits_per_s, err) != 0 ||
        json_get_number(obj, place, "latency_us", true, 0.0,
                        CLUSTER_MAX_LATENCY_US, &latency_us, err) != 0)
        return -1;
    out->bandwidth_bytes_per_s =
        has_bytes ? gigabytes_per_s * 1e9 : gigabits_per_s * 1e9 / 8.0;
    out->latency_s = latency_us * 1e-6;
    return 0;
}

static int devices_from_json(const json_t *array, const json_place *place,
                             node_type *node, pt_error *err)
{
    if (!json_is_array(array))
        return json_place_fail(place, err, "must be an array of devices");
    size_t count = json_array_size(array);
    if ((long long)count != node->gpus)
        return json_place_fail(place, err,
                               "lists %zu devices, but the node has %d GPUs "
                               "(one device per GPU)",
                               count, node->gpus);
    if (count > PT_MAX_DEVICES)
        return json_place_fail(place, err, "at most %d devices, got %zu",
                               PT_MAX_DEVICES, count);
    for (size_t i = 0; i < count; i++) {
        json_place where = json_place_index(place, i);
        const json_t *entry = json_array_get(array, i);
        device_spec *device = &node->devices[i];
        long long index = 0, sm_limit = 0;
        double memory_limit_gib = 0.0;
        if (json_check_keys(entry, &where, device_keys, err) != 0 ||
            json_get_int(entry, &where, "index", true, 0, 1023, &index,
                         err) != 0 ||
            json_get_int(entry, &where, "sm_limit", false, 0, 100000,
                         &sm_limit, err) != 0 ||
            json_get_number(entry, &where, "memory_limit_gib", false, 0.0,
                            1e6, &memory_limit_gib, err) != 0)
            return -1;
        device->index = (int)index;
        device->sm_limit = (int)sm_limit;
        device->memory_limit_gib = memory_limit_gib;
    }
    node->device_count = (int)count;
    return 0;
}

/* The optional profile of the node's slices with their neighbours at
 * rest: only for slices of a GPU (a device with an sm_limit). */
static int at_rest_from_json(const json_t *obj, const json_place *place,
                             node_type *out, pt_error *err)
{
    if (json_object_get(obj, "gpu_at_rest") == NULL)
        return 0;
    json_place where = json_place_key(place, "gpu_at_rest");
    if (json_get_string(obj, place, "gpu_at_rest", true, out->gpu_at_rest,
                        sizeof out->gpu_at_rest, err) != 0 ||
        check_identifier(out->gpu_at_rest, &where, "GPU name", err) != 0)
        return -1;
    bool sliced = false;
    for (int i = 0; i < out->device_count; i++)
        sliced = sliced || out->devices[i].sm_limit > 0;
    if (!sliced)
        return json_place_fail(&where, err, "only for slices of a GPU: the "
                               "node lists no device with an sm_limit");
    return 0;
}

static int node_from_json(const json_t *obj, const json_place *place,
                          node_type *out, pt_error *err)
{
    if (json_check_keys(obj, place, node_keys, err) != 0)
        return -1;
    long long count = 1, gpus = 0;
    if (json_get_string(obj, place, "name", true, out->name,
                        sizeof out->name, err) != 0 ||
        json_get_int(obj, place, "count", false, 1, PT_MAX_NODES, &count,
                     err) != 0 ||
        json_get_string(obj, place, "gpu", true, out->gpu, sizeof out->gpu,
                        err) != 0 ||
        json_get_int(obj, place, "gpus", true, 1, CLUSTER_MAX_GPUS_PER_NODE,
                     &gpus, err) != 0 ||
        json_get_number(obj, place, "price_per_hour", false, 0.0,
                        CLUSTER_MAX_PRICE_PER_HOUR, &out->price_per_hour,
                        err) != 0)
        return -1;
    json_place name_place = json_place_key(place, "name");
    json_place gpu_place = json_place_key(place, "gpu");
    if (check_identifier(out->name, &name_place, "node name", err) != 0 ||
        check_identifier(out->gpu, &gpu_place, "GPU name", err) != 0)
        return -1;
    out->count = (int)count;
    out->gpus = (int)gpus;

    json_place intra_place = json_place_key(place, "intra_node");
    const json_t *intra = json_object_get(obj, "intra_node");
    if (intra == NULL)
        return json_place_fail(&intra_place, err, "missing (required)");
    if (link_from_json(intra, &intra_place, link_keys, &out->intra_node,
                       err) != 0)
        return -1;
    /* Absent inter_node is checked by the caller: it only matters when
     * the cluster has more than one node. */
    const json_t *inter = json_object_get(obj, "inter_node");
    if (inter != NULL) {
        json_place inter_place = json_place_key(place, "inter_node");
        long long nics = 0;
        if (link_from_json(inter, &inter_place, inter_keys, &out->nic,
                           err) != 0 ||
            json_get_int(inter, &inter_place, "nics", false, 1,
                         CLUSTER_MAX_GPUS_PER_NODE, &nics, err) != 0)
            return -1;
        out->nics = (int)nics;
        out->inter_node = out->nic;
        /* the node's NICs shared by its GPUs, at most one a GPU */
        if (nics > 0 && nics < out->gpus)
            out->inter_node.bandwidth_bytes_per_s *= (double)nics / out->gpus;
    }
    const json_t *devices = json_object_get(obj, "devices");
    if (devices != NULL) {
        json_place devices_place = json_place_key(place, "devices");
        if (devices_from_json(devices, &devices_place, out, err) != 0)
            return -1;
    }
    return at_rest_from_json(obj, place, out, err);
}

static int check_cluster_whole(const json_t *nodes, const json_place *place,
                               const cluster *c, pt_error *err)
{
    for (int i = 0; i < c->type_count; i++) {
        json_place where = json_place_index(place, (size_t)i);
        for (int j = 0; j < i; j++)
            if (strcmp(c->types[i].name, c->types[j].name) == 0) {
                json_place name_place = json_place_key(&where, "name");
                return json_place_fail(&name_place, err,
                                       "\"%s\" is already the name of "
                                       "nodes[%d]",
                                       c->types[i].name, j);
            }
        bool has_inter =
            json_object_get(json_array_get(nodes, (size_t)i), "inter_node") !=
            NULL;
        if (!has_inter && c->node_count > 1) {
            json_place inter_place = json_place_key(&where, "inter_node");
            return json_place_fail(&inter_place, err,
                                   "missing (required when the cluster has "
                                   "more than one node; it has %d)",
                                   c->node_count);
        }
    }
    return 0;
}

static int type_index_named(const cluster *c, const char *name)
{
    for (int t = 0; t < c->type_count; t++)
        if (strcmp(c->types[t].name, name) == 0)
            return t;
    return -1;
}

/* One entry of "links": the two node types it joins, by name. */
static int type_link_from_json(const json_t *entry, const json_place *where,
                               const cluster *c, type_link *out,
                               pt_error *err)
{
    if (json_check_keys(entry, where, type_link_keys, err) != 0)
        return -1;
    json_place between_place = json_place_key(where, "between");
    const json_t *between = json_object_get(entry, "between");
    if (!json_is_array(between) || json_array_size(between) != 2 ||
        !json_is_string(json_array_get(between, 0)) ||
        !json_is_string(json_array_get(between, 1)))
        return json_place_fail(&between_place, err, "must name two node "
                               "types, [\"a\", \"b\"]");
    int ends[2];
    for (int k = 0; k < 2; k++) {
        const char *name = json_string_value(json_array_get(between, k));
        ends[k] = type_index_named(c, name);
        if (ends[k] < 0)
            return json_place_fail(&between_place, err, "\"%s\" is not "
                                   "the name of a node type", name);
    }
    json_t *figures = json_deep_copy(entry);
    json_object_del(figures, "between");
    int status = link_from_json(figures, where, link_keys, &out->link, err);
    json_decref(figures);
    if (status != 0)
        return -1;
    for (int k = 0; k < 2; k++) {
        const node_type *node = &c->types[ends[k]];
        if (out->link.bandwidth_bytes_per_s >
            node->inter_node.bandwidth_bytes_per_s)
            return json_place_fail(where, err,
                                   "%.4g Gbit/s is faster than %s's "
                                   "inter_node (%.4g Gbit/s a GPU): a link "
                                   "between node types carries at most what "
                                   "their NICs do",
                                   out->link.bandwidth_bytes_per_s * 8e-9,
                                   node->name,
                                   node->inter_node.bandwidth_bytes_per_s *
                                       8e-9);
    }
    out->type_a = ends[0];
    out->type_b = ends[1];
    return 0;
}

/* The optional "links": slower links between particular node types. */
static int type_links_from_json(const json_t *obj, const json_place *place,
                                cluster *c, pt_error *err)
{
    const json_t *links = json_object_get(obj, "links");
    if (links == NULL)
        return 0;
    json_place links_place = json_place_key(place, "links");
    if (!json_is_array(links))
        return json_place_fail(&links_place, err, "must be an array of "
                               "links between node types");
    if (json_array_size(links) > CLUSTER_MAX_TYPE_LINKS)
        return json_place_fail(&links_place, err, "at most %d links, got "
                               "%zu", CLUSTER_MAX_TYPE_LINKS,
                               json_array_size(links));
    for (size_t i = 0; i < json_array_size(links); i++) {
        json_place where = json_place_index(&links_place, i);
        const json_t *entry = json_array_get(links, i);
        if (!json_is_object(entry))
            return json_place_fail(&where, err, "must be an object");
        type_link *link = &c->links[c->link_count];
        if (type_link_from_json(entry, &where, c, link, err) != 0)
            return -1;
        for (int j = 0; j < c->link_count; j++) {
            const type_link *other = &c->links[j];
            bool same = (other->type_a == link->type_a &&
                         other->type_b == link->type_b) ||
                        (other->type_a == link->type_b &&
                         other->type_b == link->type_a);
            if (same)
                return json_place_fail(&where, err, "joins the same node "
                                       "types as links[%d]", j);
        }
        c->link_count++;
    }
    return 0;
}

int cluster_from_json(const json_t *obj, const json_place *place,
                      cluster *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    pt_copy_string(out->source_dir, sizeof out->source_dir, ".");
    if (json_check_keys(obj, place, cluster_keys, err) != 0 ||
        json_get_string(obj, place, "name", true, out->name,
                        sizeof out->name, err) != 0)
        return -1;
    if (out->name[0] == '\0') {
        json_place name_place = json_place_key(place, "name");
        return json_place_fail(&name_place, err, "must not be empty");
    }
    json_place nodes_place = json_place_key(place, "nodes");
    const json_t *nodes = json_object_get(obj, "nodes");
    if (nodes == NULL)
        return json_place_fail(&nodes_place, err, "missing (required)");
    if (!json_is_array(nodes) || json_array_size(nodes) == 0)
        return json_place_fail(&nodes_place, err,
                               "must be a non-empty array of node types");
    size_t type_count = json_array_size(nodes);
    if (type_count > PT_MAX_NODES)
        return json_place_fail(&nodes_place, err,
                               "at most %d node types, got %zu", PT_MAX_NODES,
                               type_count);
    out->types = calloc(type_count, sizeof *out->types);
    if (out->types == NULL)
        return json_place_fail(&nodes_place, err, "out of memory");
    out->type_count = (int)type_count;
    for (size_t i = 0; i < type_count; i++) {
        json_place where = json_place_index(&nodes_place, i);
        if (node_from_json(json_array_get(nodes, i), &where, &out->types[i],
                           err) != 0) {
            cluster_free(out);
            return -1;
        }
        out->node_count += out->types[i].count;
        if (out->node_count > PT_MAX_NODES) {
            cluster_free(out);
            return json_place_fail(&nodes_place, err,
                                   "more than %d nodes in all", PT_MAX_NODES);
        }
    }
    if (check_cluster_whole(nodes, &nodes_place, out, err) != 0 ||
        type_links_from_json(obj, place, out, err) != 0) {
        cluster_free(out);
        return -1;
    }
    return 0;
}

int cluster_load_file(const char *path, cluster *out, pt_error *err)
{
    memset(out, 0, sizeof *out);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    json_place place = json_place_root(path);
    int status = cluster_from_json(root, &place, out, err);
    json_decref(root);
    if (status == 0)
        pt_directory_of(path, out->source_dir, sizeof out->source_dir);
    return status;
}

/* ---------------------------------------------------------- writing */

static json_t *link_to_json(const link_spec *link, bool in_gigabits)
{
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    int failures = 0;
    if (in_gigabits)
        json_put(obj, "bandwidth_Gbps",
                 json_real(link->bandwidth_bytes_per_s * 8.0 / 1e9),
                 &failures);
    else
        json_put(obj, "bandwidth_GBps",
                 json_real(link->bandwidth_bytes_per_s / 1e9), &failures);
    json_put(obj, "latency_us", json_real(link->latency_s * 1e6), &failures);
    if (failures > 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

static json_t *devices_to_json(const node_type *type)
{
    json_t *devices = json_array();
    for (int i = 0; devices != NULL && i < type->device_count; i++) {
        const device_spec *device = &type->devices[i];
        json_t *entry = json_object();
        int failures = entry == NULL;
        if (entry != NULL) {
            json_put(entry, "index", json_integer(device->index), &failures);
            if (device->sm_limit > 0)
                json_put(entry, "sm_limit", json_integer(device->sm_limit),
                         &failures);
            if (device->memory_limit_gib > 0)
                json_put(entry, "memory_limit_gib",
                         json_real(device->memory_limit_gib), &failures);
        }
        if (failures > 0 || json_array_append_new(devices, entry) != 0) {
            json_decref(devices);
            return NULL;
        }
    }
    return devices;
}

static json_t *node_type_to_json(const node_type *type)
{
    json_t *obj = json_object();
    if (obj == NULL)
        return NULL;
    int failures = 0;
    json_put(obj, "name", json_string(type->name), &failures);
    json_put(obj, "count", json_integer(type->count), &failures);
    json_put(obj, "gpu", json_string(type->gpu), &failures);
    if (type->gpu_at_rest[0] != '\0')
        json_put(obj, "gpu_at_rest", json_string(type->gpu_at_rest),
                 &failures);
    json_put(obj, "gpus", json_integer(type->gpus), &failures);
    json_put(obj, "intra_node", link_to_json(&type->intra_node, false),
             &failures);
    /* A single node may have no inter-node link; write none then, as the
     * reader rejects a zero bandwidth. */
    if (type->inter_node.bandwidth_bytes_per_s > 0) {
        json_t *inter = link_to_json(&type->nic, true);
        if (inter != NULL && type->nics > 0)
            json_put(inter, "nics", json_integer(type->nics), &failures);
        json_put(obj, "inter_node", inter, &failures);
    }
    json_put(obj, "price_per_hour", json_real(type->price_per_hour),
             &failures);
    if (type->device_count > 0)
        json_put(obj, "devices", devices_to_json(type), &failures);
    if (failures > 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

static json_t *type_links_to_json(const cluster *c)
{
    json_t *links = json_array();
    for (int i = 0; links != NULL && i < c->link_count; i++) {
        const type_link *link = &c->links[i];
        json_t *entry = link_to_json(&link->link, true);
        json_t *between = json_array();
        int failures = entry == NULL || between == NULL;
        if (failures == 0) {
            json_array_append_new(between,
                                  json_string(c->types[link->type_a].name));
            json_array_append_new(between,
                                  json_string(c->types[link->type_b].name));
            json_put(entry, "between", between, &failures);
            between = NULL;
        }
        json_decref(between);
        if (failures > 0 || json_array_append_new(links, entry) != 0) {
            json_decref(links);
            return NULL;
        }
    }
    return links;
}

json_t *cluster_to_json(const cluster *c)
{
    json_t *obj = json_object();
    json_t *nodes = json_array();
    int failures = obj == NULL || nodes == NULL;
    for (int i = 0; failures == 0 && i < c->type_count; i++)
        if (json_array_append_new(nodes, node_type_to_json(&c->types[i])) !=
            0)
            failures++;
    if (failures == 0) {
        json_put(obj, "name", json_string(c->name), &failures);
        json_put(obj, "nodes", nodes, &failures);
        nodes = NULL;
    }
    if (failures == 0 && c->link_count > 0)
        json_put(obj, "links", type_links_to_json(c), &failures);
    json_decref(nodes);
    if (failures > 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

void cluster_free(cluster *c)
{
    if (c == NULL)
        return;
    free(c->types);
    c->types = NULL;
    c->type_count = 0;
    c->node_count = 0;
}

int cluster_copy(cluster *dst, const cluster *src, pt_error *err)
{
    *dst = *src;
    dst->types = NULL;
    if (src->type_count > 0) {
        dst->types = malloc((size_t)src->type_count * sizeof *dst->types);
        if (dst->types == NULL) {
            dst->type_count = 0;
            dst->node_count = 0;
            return pt_fail(err, "cluster %s: out of memory", src->name);
        }
        memcpy(dst->types, src->types,
               (size_t)src->type_count * sizeof *dst->types);
    }
    return 0;
}

int cluster_node_type(const cluster *c, int node)
{
    if (node < 0)
        return -1;
    for (int type = 0; type < c->type_count; type++) {
        if (node < c->types[type].count)
            return type;
        node -= c->types[type].count;
    }
    return -1;
}

int cluster_node_ordinal(const cluster *c, int node)
{
    if (node < 0)
        return -1;
    for (int type = 0; type < c->type_count; type++) {
        if (node < c->types[type].count)
            return node;
        node -= c->types[type].count;
    }
    return -1;
}

void cluster_node_name(const cluster *c, int node, char *out, size_t size)
{
    int type = cluster_node_type(c, node);
    if (type < 0) {
        snprintf(out, size, "node%d?", node);
        return;
    }
    snprintf(out, size, "%s[%d]", c->types[type].name,
             cluster_node_ordinal(c, node));
}

int cluster_find_node(const cluster *c, const char *name)
{
    const char *bracket = strrchr(name, '[');
    if (bracket == NULL || bracket == name)
        return -1;
    size_t type_length = (size_t)(bracket - name);
    const char *digits = bracket + 1;
    /* Only the canonical spelling "a10[3]": no sign, space or leading 0. */
    if (!isdigit((unsigned char)digits[0]) ||
        (digits[0] == '0' && digits[1] != ']'))
        return -1;
    char *end;
    long ordinal = strtol(digits, &end, 10);
    if (end[0] != ']' || end[1] != '\0' || ordinal > INT_MAX)
        return -1;
    int first = 0;
    for (int type = 0; type < c->type_count; type++) {
        const node_type *node = &c->types[type];
        if (strlen(node->name) == type_length &&
            strncmp(node->name, name, type_length) == 0)
            return ordinal < node->count ? first + (int)ordinal : -1;
        first += node->count;
    }
    return -1;
}

int cluster_gpu_count(const cluster *c)
{
    int gpus = 0;
    for (int type = 0; type < c->type_count; type++)
        gpus += c->types[type].count * c->types[type].gpus;
    return gpus;
}

int cluster_node_gpus(const cluster *c, int node)
{
    int type = cluster_node_type(c, node);
    return type < 0 ? 0 : c->types[type].gpus;
}

link_spec cluster_type_link(const cluster *c, int type_a, int type_b)
{
    for (int i = 0; i < c->link_count; i++) {
        const type_link *link = &c->links[i];
        if ((link->type_a == type_a && link->type_b == type_b) ||
            (link->type_a == type_b && link->type_b == type_a))
            return link->link;
    }
    const link_spec *a = &c->types[type_a].inter_node;
    const link_spec *b = &c->types[type_b].inter_node;
    link_spec slower = {
        fmin(a->bandwidth_bytes_per_s, b->bandwidth_bytes_per_s),
        fmax(a->latency_s, b->latency_s)};
    return slower;
}

link_spec cluster_link(const cluster *c, int node_a, int node_b)
{
    link_spec none = {0.0, 0.0};
    int type_a = cluster_node_type(c, node_a);
    int type_b = cluster_node_type(c, node_b);
    if (type_a < 0 || type_b < 0)
        return none;
    if (node_a == node_b)
        return c->types[type_a].intra_node;
    return cluster_type_link(c, type_a, type_b);
}
