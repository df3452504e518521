/* interop: a plan as a Megatron-LM launch, a bash script that runs
 * pretrain_gpt.py under torchrun (one per node) or srun with the plan's
 * degrees, batch sizes, model shape, precision, memory levers and
 * partition, its ranks on the hosts in the plan's node order. Flags as
 * Megatron-LM's megatron/training/arguments.py names them (docs/interop.md
 * gives the version and every mapping). */
#include "interop/interop.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Megatron-LM splits the heads and the feed-forward columns over the
 * tensor-parallel ranks and stops at start-up when they do not divide. */
static int check_megatron_can_run(const plan *p, pt_error *err)
{
    int tp = p->config.tp;
    int ffn = p->model.ffn_hidden > 0 ? p->model.ffn_hidden
                                      : 4 * p->model.hidden;
    if (p->model.heads % tp != 0)
        return pt_fail(err,
                       "plan.tp: Megatron-LM needs the %d attention heads "
                       "divisible by tp %d",
                       p->model.heads, tp);
    if (ffn % tp != 0)
        return pt_fail(err,
                       "plan.tp: Megatron-LM needs the feed-forward width %d "
                       "divisible by tp %d",
                       ffn, tp);
    int kv = model_kv_heads(&p->model);
    if (kv != p->model.heads && kv % tp != 0)
        return pt_fail(err,
                       "plan.tp: Megatron-LM needs the %d key/value heads "
                       "(--num-query-groups) divisible by tp %d; it does "
                       "not copy them over ranks as the estimate did",
                       kv, tp);
    if (parallel_zero_stage(&p->config) >= 2 || p->config.offload_optimizer)
        return pt_fail(err,
                       "plan.zero: Megatron-LM has the distributed optimizer "
                       "(ZeRO-1) only, not ZeRO-%d or optimizer offload: "
                       "export this plan for DeepSpeed",
                       parallel_zero_stage(&p->config));
    return 0;
}

/* A path in a comment: one line, whatever the file is called. */
static void print_comment_text(FILE *out, const char *text)
{
    for (const char *c = text; *c != '\0'; c++)
        fputc((unsigned char)*c < ' ' ? '?' : *c, out);
}

/* "0-3" or "5". */
static void format_range(int first, int last, char *out, size_t size)
{
    if (first == last)
        snprintf(out, size, "%d", first);
    else
        snprintf(out, size, "%d-%d", first, last);
}

/* One comment line per stage: its layers, ranks and hosts. */
static void print_stage_table(FILE *out, const plan *p,
                              const interop_host *hosts)
{
    int per_stage = parallel_ranks_per_stage(&p->config);
    fprintf(out, "# stage  layers  ranks        hosts    cluster nodes, GPU\n");
    for (int s = 0; s < p->config.pp; s++) {
        int first = parallel_stage_first_rank(&p->config, s);
        int first_host, last_host;
        char nodes[3 * PT_NAME_MAX], ranks[32], host_range[32];
        interop_stage_hosts(p, hosts, s, &first_host, &last_host, nodes,
                            sizeof nodes);
        format_range(first, first + per_stage - 1, ranks, sizeof ranks);
        format_range(first_host, last_host, host_range, sizeof host_range);
        fprintf(out, "# %5d  %6d  %-11s  %-7s  %s\n", s, p->partition[s],
                ranks, host_range, nodes);
    }
}

/* "# note: TEXT", wrapped at 78 columns with "#   " before the rest. */
static void print_note(FILE *out, const char *text)
{
    const char *lead = "# note: ";
    size_t width = 78 - strlen(lead);
    while (*text != '\0') {
        size_t length = strlen(text);
        size_t cut = length;
        if (length > width) {
            cut = width;
            while (cut > 0 && text[cut] != ' ')
                cut--;
            if (cut == 0)
                cut = width;
        }
        fprintf(out, "%s%.*s\n", lead, (int)cut, text);
        text += cut;
        while (*text == ' ')
            text++;
        lead = "#       ";
    }
}

static void print_header(FILE *out, const plan *p, const char *plan_file,
                         const interop_host *hosts,
                         const interop_notes *notes)
{
    const parallel_config *c = &p->config;
    const model_shape *m = &p->model;
    char balance[PT_MAX_STAGES * 6];
    interop_balance_list(p, balance, sizeof balance);
    fprintf(out, "#!/usr/bin/env bash\n# Megatron-LM launch of ");
    print_comment_text(out, plan_file);
    fprintf(out,
            "\n# written by partita export %s (docs/interop.md). Flags as "
            "Megatron-LM's\n# megatron/training/arguments.py names them: "
            "Megatron-core 0.9 and later,\n# 0.13 and later where the "
            "partition needs --pipeline-model-parallel-layout.\n#\n",
            PARTITA_VERSION);
    fprintf(out,
            "# model %s: %d layers, hidden %d, %d heads, ffn %d,\n"
            "#   sequence %d tokens, vocabulary %d, embeddings %s\n",
            m->name, m->layers, m->hidden, m->heads,
            m->ffn_hidden > 0 ? m->ffn_hidden : 4 * m->hidden, m->seq,
            m->vocab, m->tied_embeddings ? "tied" : "untied");
    if (!model_is_gpt(m))
        fprintf(out, "#   %s, %s, %s positions, %d key/value heads, "
                "%s; %.0f parameters\n",
                model_norm_name(m->norm), model_mlp_name(m->mlp),
                model_positions_name(m->positions), model_kv_heads(m),
                m->bias == MODEL_BIAS_ALL   ? "biases"
                : m->bias == MODEL_BIAS_QKV ? "biases on q, k, v only"
                                            : "no biases",
                model_parameter_count(m));
    fprintf(out,
            "# %d GPUs on %d nodes: tp %d x dp %d x pp %d; micro-batch %d, "
            "global batch %d\n#   (%d micro-batches); schedule %s; %s; "
            "recompute %s;\n#   distributed optimizer %s; virtual stages "
            "%d a rank; sequence parallel %s\n",
            plan_gpu_count(p), p->node_order_count, c->tp, c->dp, c->pp,
            c->mbs, c->gbs, parallel_microbatches(c),
            schedule_name(c->schedule), precision_name(c->precision),
            c->recompute             ? "full"
            : c->selective_recompute ? "selective"
                                     : "none",
            c->distributed_optimizer ? "on" : "off",
            parallel_virtual_stages(c), c->sequence_parallel ? "on" : "off");
    fprintf(out, "# partition (layers per stage, FASOP's --balance): %s\n",
            balance);
    fprintf(out, "# priced for the %s runtime%s%s\n#\n",
            runtime_name(c->runtime),
            c->runtime == RUNTIME_MEGATRON
                ? ""
                : " (set \"runtime\": \"megatron\" in the plan and "
                  "estimate it again for Megatron-LM's memory and time)",
            c->tf32 ? "; fp32 matmuls on TF32: run with "
                      "torch.backends.cuda.matmul.allow_tf32 = True"
                    : "");
    print_stage_table(out, p, hosts);
    fprintf(out, "#\n");
    for (int i = 0; i < notes->count; i++)
        print_note(out, notes->text[i]);
    if (notes->count > 0)
        fprintf(out, "#\n");
    fprintf(out,
            "# Put your machines in HOSTS (same order, each with the GPU type "
            "above), then\n"
            "# on host i:  NODE_RANK=i MEGATRON=/path/to/Megatron-LM bash "
            "THIS_SCRIPT ARGS\n"
            "# or once inside a Slurm allocation:  LAUNCHER=srun "
            "MEGATRON=... bash THIS_SCRIPT ARGS\n"
            "# ARGS go to pretrain_gpt.py after the plan's flags: data, "
            "tokenizer,\n"
            "# --train-iters, --lr... (the last of a repeated flag wins).\n"
            "set -euo pipefail\n\n");
}

/* HOSTS=(...) and GPUS=(...), wrapped at about 78 columns. */
static void print_host_arrays(FILE *out, const plan *p,
                              const interop_host *hosts)
{
    fprintf(out,
            "# The hosts in pipeline order: host i takes the GPUS[i] ranks "
            "after those of\n# the hosts before it, as the plan places "
            "them.\n");
    for (int pass = 0; pass < 2; pass++) {
        int column = fprintf(out, pass == 0 ? "HOSTS=(" : "GPUS=(");
        for (int i = 0; i < p->node_order_count; i++) {
            char item[PT_NAME_MAX + 2];
            if (pass == 0)
                snprintf(item, sizeof item, "%s", hosts[i].host);
            else
                snprintf(item, sizeof item, "%d", hosts[i].gpus);
            int width = (int)strlen(item) + (i > 0 ? 1 : 0);
            if (i > 0 && column + width > 77) {
                fprintf(out, "\n   ");
                column = 3;
            }
            column += fprintf(out, "%s%s", i > 0 ? " " : "", item);
        }
        fprintf(out, ")\n");
    }
    fprintf(out,
            "MASTER_ADDR=${MASTER_ADDR:-${HOSTS[0]}}\n"
            "MASTER_PORT=${MASTER_PORT:-6000}\n"
            "PRETRAIN=${MEGATRON:-.}/pretrain_gpt.py\n"
            "# as Megatron-LM's own examples: kernels queue in issue order\n"
            "export CUDA_DEVICE_MAX_CONNECTIONS=1\n\n");
}

static int print_partition_args(FILE *out, const plan *p, pt_error *err)
{
    megatron_partition split = interop_megatron_partition(p);
    if (split.split == MEGATRON_SPLIT_FIRST_LAST) {
        if (split.first_layers > 0)
            fprintf(out, "    --decoder-first-pipeline-num-layers %d\n",
                    split.first_layers);
        if (split.last_layers > 0)
            fprintf(out, "    --decoder-last-pipeline-num-layers %d\n",
                    split.last_layers);
    } else if (split.split == MEGATRON_SPLIT_LAYOUT) {
        size_t size = (size_t)p->config.pp *
                          parallel_virtual_stages(&p->config) * 16 + 8;
        char *layout = malloc(size);
        if (layout == NULL)
            return pt_fail(err, "out of memory writing the layout");
        int status = interop_megatron_layout(p, layout, size, err);
        if (status == 0)
            fprintf(out, "    --pipeline-model-parallel-layout '%s'\n",
                    layout);
        free(layout);
        return status;
    }
    return 0;
}

/* The layer's flags where it is not GPT-2's (Megatron-LM's defaults):
 * RMSNorm and its epsilon, SwiGLU, rotary positions and their base,
 * grouped-query attention, biases. */
static void print_architecture_args(FILE *out, const model_shape *m)
{
    if (m->norm == MODEL_NORM_RMSNORM)
        fprintf(out, "    --normalization RMSNorm --norm-epsilon %g\n",
                model_norm_eps(m));
    if (m->mlp == MODEL_MLP_SWIGLU)
        fprintf(out, "    --swiglu\n");
    if (m->positions == MODEL_POSITIONS_ROPE)
        fprintf(out, "    --position-embedding-type rope --rotary-base "
                     "%.0f\n", m->rope_base);
    if (model_kv_heads(m) != m->heads)
        fprintf(out, "    --group-query-attention --num-query-groups %d\n",
                model_kv_heads(m));
    if (m->bias != MODEL_BIAS_ALL)
        fprintf(out, "    --disable-bias-linear%s\n",
                m->bias == MODEL_BIAS_QKV ? " --add-qkv-bias" : "");
}

static int print_plan_args(FILE *out, const plan *p, pt_error *err)
{
    const parallel_config *c = &p->config;
    const model_shape *m = &p->model;
    fprintf(out,
            "PLAN_ARGS=(\n"
            "    --tensor-model-parallel-size %d\n"
            "    --pipeline-model-parallel-size %d\n",
            c->tp, c->pp);
    if (print_partition_args(out, p, err) != 0)
        return -1;
    fprintf(out,
            "    --num-layers %d\n    --hidden-size %d\n"
            "    --num-attention-heads %d\n    --ffn-hidden-size %d\n"
            "    --seq-length %d\n    --max-position-embeddings %d\n"
            "    --micro-batch-size %d\n    --global-batch-size %d\n",
            m->layers, m->hidden, m->heads,
            m->ffn_hidden > 0 ? m->ffn_hidden : 4 * m->hidden, m->seq, m->seq,
            c->mbs, c->gbs);
    if (!m->tied_embeddings)
        fprintf(out, "    --untie-embeddings-and-output-weights\n");
    print_architecture_args(out, m);
    if (c->precision == PRECISION_BF16)
        fprintf(out, "    --bf16\n");
    else if (c->precision == PRECISION_FP16)
        fprintf(out, "    --fp16\n");
    if (c->recompute)
        fprintf(out, "    --recompute-granularity full --recompute-method "
                     "uniform --recompute-num-layers 1\n");
    else if (c->selective_recompute)
        fprintf(out, "    --recompute-granularity selective\n");
    if (c->distributed_optimizer)
        fprintf(out, "    --use-distributed-optimizer\n");
    /* a layout of pp x v stages gives v itself */
    if (parallel_virtual_stages(c) > 1 &&
        interop_megatron_partition(p).split != MEGATRON_SPLIT_LAYOUT)
        fprintf(out, "    --num-virtual-stages-per-pipeline-rank %d\n",
                c->virtual_stages);
    if (c->sequence_parallel)
        fprintf(out, "    --sequence-parallel\n");
    /* the runtime's options the plan was priced with (docs/cost-model.md,
     * section 13) */
    if (parallel_attention(c) == ATTENTION_UNFUSED)
        fprintf(out, "    --attention-backend unfused\n");
    if (c->overlap_grad_reduce)
        fprintf(out, "    --overlap-grad-reduce\n");
    if (c->overlap_param_gather)
        fprintf(out, "    --overlap-param-gather\n");
    /* Transformer Engine's attention backward is deterministic only
     * with NVTE_ALLOW_NONDETERMINISTIC_ALGO=0, exported before launch */
    if (c->deterministic)
        fprintf(out, "    --deterministic-mode\n");
    fprintf(out, "    # an iteration line, with TFLOP/s, every 10 iterations\n"
                 "    --log-interval 10 --log-throughput\n)\n\n");
    return 0;
}

static void print_launch(FILE *out, const plan *p)
{
    int gpus = plan_gpu_count(p);
    int nodes = p->node_order_count;
    if (p->config.deterministic)
        fprintf(out, "# the plan is deterministic: Transformer Engine's "
                     "attention too\n"
                     "export NVTE_ALLOW_NONDETERMINISTIC_ALGO=0\n");
    fprintf(out,
            "case ${LAUNCHER:-torchrun} in\n"
            "torchrun)\n"
            "    # static rendezvous: host i of HOSTS is node rank i\n"
            "    NODE_RANK=${NODE_RANK:?set NODE_RANK to the index of this "
            "host in HOSTS, 0-%d}\n"
            "    exec torchrun --nnodes %d --node-rank \"$NODE_RANK\" \\\n"
            "        --nproc-per-node \"${GPUS[$NODE_RANK]}\" \\\n"
            "        --master-addr \"$MASTER_ADDR\" --master-port "
            "\"$MASTER_PORT\" \\\n"
            "        \"$PRETRAIN\" \"${PLAN_ARGS[@]}\" \"$@\"\n"
            "    ;;\n",
            nodes - 1, nodes);
    fprintf(out,
            "srun)\n"
            "    # one task per GPU, on the host the plan gives its rank: "
            "Slurm's arbitrary\n"
            "    # distribution reads one host per task from SLURM_HOSTFILE\n"
            "    SLURM_HOSTFILE=$(mktemp)\n"
            "    export SLURM_HOSTFILE MASTER_ADDR MASTER_PORT WORLD_SIZE=%d\n"
            "    for i in \"${!HOSTS[@]}\"; do\n"
            "        for ((g = 0; g < GPUS[i]; g++)); do echo "
            "\"${HOSTS[i]}\"; done\n"
            "    done >\"$SLURM_HOSTFILE\"\n"
            "    exec srun --ntasks %d --distribution arbitrary \\\n"
            "        bash -c 'RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID "
            "exec python \"$@\"' \\\n"
            "        megatron \"$PRETRAIN\" \"${PLAN_ARGS[@]}\" \"$@\"\n"
            "    ;;\n"
            "*)\n"
            "    echo \"LAUNCHER must be torchrun or srun, got '$LAUNCHER'\" "
            ">&2\n"
            "    exit 2\n"
            "    ;;\n"
            "esac\n",
            gpus, gpus);
}

char *interop_megatron_script(const plan *p, const char *plan_file,
                              pt_error *err)
{
    if (check_megatron_can_run(p, err) != 0)
        return NULL;
    interop_host *hosts = interop_hosts(p, err);
    if (hosts == NULL)
        return NULL;
    interop_notes notes;
    interop_notes_of(p, INTEROP_MEGATRON, &notes);
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    if (out == NULL) {
        free(hosts);
        pt_fail(err, "out of memory writing the Megatron-LM launch");
        return NULL;
    }
    print_header(out, p, plan_file, hosts, &notes);
    print_host_arrays(out, p, hosts);
    int status = print_plan_args(out, p, err);
    print_launch(out, p);
    free(hosts);
    if (fclose(out) != 0 || text == NULL) {
        free(text);
        pt_fail(err, "out of memory writing the Megatron-LM launch");
        return NULL;
    }
    if (status != 0) {
        free(text);
        return NULL;
    }
    return text;
}
