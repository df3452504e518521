/* interop: a plan as a DeepSpeed ds_config: batch sizes, gradient
 * accumulation, ZeRO stage, precision and the pipeline engine's
 * activation checkpointing, plus a "partita" block that DeepSpeed does
 * not read: the partition as PipelineModule boundaries, the hostfile in
 * the plan's node order, the launch and the notes (docs/interop.md). */
#include "interop/interop.h"

#include <stdio.h>
#include <stdlib.h>

/* The PipelineModule boundaries of the partition, for a module whose
 * layer list is: the embedding, the transformer layers, the final norm,
 * the head. Stage s holds the entries parts[s] to parts[s + 1] - 1. */
static json_t *pipeline_parts(const plan *p)
{
    json_t *parts = json_array();
    int pp = p->config.pp;
    int boundary = 1; /* the embedding */
    json_array_append_new(parts, json_integer(0));
    for (int s = 0; s < pp - 1; s++) {
        boundary += p->partition[s];
        json_array_append_new(parts, json_integer(boundary));
    }
    json_array_append_new(parts, json_integer(p->model.layers + 3));
    return parts;
}

static json_t *layers_per_stage(const plan *p)
{
    json_t *layers = json_array();
    for (int s = 0; s < p->config.pp; s++)
        json_array_append_new(layers, json_integer(p->partition[s]));
    return layers;
}

/* Per stage, its nodes and their GPU type: "a100[0]..a100[11],
 * A100-40GB". */
static json_t *stage_nodes(const plan *p, const interop_host *hosts)
{
    json_t *list = json_array();
    for (int s = 0; s < p->config.pp; s++) {
        int first, last;
        char nodes[3 * PT_NAME_MAX];
        interop_stage_hosts(p, hosts, s, &first, &last, nodes, sizeof nodes);
        json_array_append_new(list, json_string(nodes));
    }
    return list;
}

/* "a10-0 slots=4", one per host in the plan's node order: the DeepSpeed
 * launcher numbers ranks host by host in the hostfile's order. */
static json_t *hostfile_lines(const plan *p, const interop_host *hosts)
{
    json_t *lines = json_array();
    for (int i = 0; i < p->node_order_count; i++) {
        char line[PT_NAME_MAX * 3];
        snprintf(line, sizeof line, "%s slots=%d", hosts[i].host,
                 hosts[i].gpus);
        json_array_append_new(lines, json_string(line));
    }
    return lines;
}

/* The model's flags for Megatron-DeepSpeed (its megatron/arguments.py
 * and Llama examples), the trainer that pairs a ds_config with a
 * Megatron-style model: its shape and, where the layer is not GPT-2's,
 * RMSNorm, SwiGLU, rotary positions, grouped-query attention, no
 * biases, the untied head. */
static json_t *megatron_deepspeed_args(const model_shape *m)
{
    char text[160];
    json_t *args = json_array();
    snprintf(text, sizeof text, "--num-layers %d --hidden-size %d "
             "--num-attention-heads %d --ffn-hidden-size %d",
             m->layers, m->hidden, m->heads, m->ffn_hidden);
    json_array_append_new(args, json_string(text));
    snprintf(text, sizeof text, "--seq-length %d --max-position-embeddings "
             "%d", m->seq, m->seq);
    json_array_append_new(args, json_string(text));
    if (m->norm == MODEL_NORM_RMSNORM)
        json_array_append_new(args, json_string("--normalization rmsnorm"));
    if (m->mlp == MODEL_MLP_SWIGLU)
        json_array_append_new(args, json_string("--swiglu"));
    if (m->positions == MODEL_POSITIONS_ROPE) {
        snprintf(text, sizeof text, "--use-rotary-position-embeddings "
                 "--rope-theta %.0f --no-position-embedding", m->rope_base);
        json_array_append_new(args, json_string(text));
    }
    if (model_kv_heads(m) != m->heads) {
        snprintf(text, sizeof text, "--num-key-value-heads %d",
                 model_kv_heads(m));
        json_array_append_new(args, json_string(text));
    }
    if (m->bias != MODEL_BIAS_ALL)
        json_array_append_new(args, json_string("--disable-bias-linear"));
    if (!m->tied_embeddings)
        json_array_append_new(
            args, json_string("--untie-embeddings-and-output-weights"));
    return args;
}

static json_t *note_list(const plan *p)
{
    interop_notes notes;
    interop_notes_of(p, INTEROP_DEEPSPEED, &notes);
    json_t *list = json_array();
    for (int i = 0; i < notes.count; i++)
        json_array_append_new(list, json_string(notes.text[i]));
    return list;
}

/* What DeepSpeed does not read: the plan's facts for whoever builds the
 * model and launches it. */
static json_t *partita_block(const plan *p, const char *plan_file,
                             pt_error *err)
{
    const parallel_config *c = &p->config;
    interop_host *hosts = interop_hosts(p, err);
    if (hosts == NULL)
        return NULL;
    json_t *block = json_object();
    json_t *pipeline = json_object();
    int failures = 0;
    char about[PT_PATH_MAX + 128];
    snprintf(about, sizeof about,
             "written by partita export %s from %s; DeepSpeed reads none "
             "of this block (docs/interop.md)",
             PARTITA_VERSION, plan_file);
    json_put(block, "about", json_string(about), &failures);
    json_put(block, "model", json_string(p->model.name), &failures);
    if (!model_is_gpt(&p->model)) {
        json_put(block, "architecture", model_to_json(&p->model), &failures);
        json_put(block, "parameters",
                 json_integer((json_int_t)model_parameter_count(&p->model)),
                 &failures);
        json_put(block, "megatron_deepspeed_args",
                 megatron_deepspeed_args(&p->model), &failures);
    }
    json_put(block, "tp", json_integer(c->tp), &failures);
    json_put(block, "dp", json_integer(c->dp), &failures);
    json_put(block, "pp", json_integer(c->pp), &failures);
    json_put(pipeline, "layers_per_stage", layers_per_stage(p), &failures);
    json_put(pipeline, "parts", pipeline_parts(p), &failures);
    json_put(pipeline, "parts_layer_list",
             json_string("embedding, transformer layers, final norm, head"),
             &failures);
    json_put(pipeline, "stage_nodes", stage_nodes(p, hosts), &failures);
    json_put(block, "pipeline", pipeline, &failures);
    json_put(block, "hostfile", hostfile_lines(p, hosts), &failures);
    free(hosts);
    json_put(block, "launch",
             json_string("deepspeed --hostfile hostfile train.py "
                         "--deepspeed --deepspeed_config ds_config.json"),
             &failures);
    json_put(block, "notes", note_list(p), &failures);
    if (failures > 0) {
        json_decref(block);
        pt_fail(err, "out of memory building the ds_config");
        return NULL;
    }
    return block;
}

json_t *interop_deepspeed_config(const plan *p, const char *plan_file,
                                 pt_error *err)
{
    const parallel_config *c = &p->config;
    json_t *root = json_object();
    json_t *zero = json_object();
    int failures = 0;
    json_put(root, "train_batch_size", json_integer(c->gbs), &failures);
    json_put(root, "train_micro_batch_size_per_gpu", json_integer(c->mbs),
             &failures);
    json_put(root, "gradient_accumulation_steps",
             json_integer(parallel_microbatches(c)), &failures);
    /* a step line every 10 steps, to compare with the estimate */
    json_put(root, "steps_per_print", json_integer(10), &failures);
    json_put(zero, "stage", json_integer(parallel_zero_stage(c)), &failures);
    if (c->offload_optimizer) {
        json_t *offload = json_object();
        json_put(offload, "device", json_string("cpu"), &failures);
        json_put(offload, "pin_memory", json_true(), &failures);
        json_put(zero, "offload_optimizer", offload, &failures);
    }
    json_put(root, "zero_optimization", zero, &failures);
    if (c->precision != PRECISION_FP32) {
        json_t *enabled = json_object();
        json_put(enabled, "enabled", json_true(), &failures);
        json_put(root, c->precision == PRECISION_BF16 ? "bf16" : "fp16",
                 enabled, &failures);
    }
    if (c->pp > 1) {
        json_t *pipeline = json_object();
        json_put(pipeline, "activation_checkpoint_interval",
                 json_integer(c->recompute ? 1 : 0), &failures);
        json_put(root, "pipeline", pipeline, &failures);
    }
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building the ds_config");
        return NULL;
    }
    json_t *block = partita_block(p, plan_file, err);
    if (block == NULL) {
        json_decref(root);
        return NULL;
    }
    json_put(root, "partita", block, &failures);
    if (failures > 0) {
        json_decref(root);
        pt_fail(err, "out of memory building the ds_config");
        return NULL;
    }
    return root;
}
