/*
 * Private to the cuda backend: the Llama family's transformer layer
 * (passes_llama.c), which passes.c runs for every model that is not
 * GPT-2's.
 */
#ifndef PARTITA_EXECUTOR_CUDA_PASSES_LLAMA_H
#define PARTITA_EXECUTOR_CUDA_PASSES_LLAMA_H

#include "executor/cuda/cuda_stage.h"

/* The Llama family's layer (passes_llama.c), forward and backward, with
 * the contract of passes.c's GPT-2 layer: the forward's input lacks
 * input_skip until its first norm adds it (NULL: whole), its output may
 * lack residual_mid (pass_skip_past_layer); the stream's gradient in
 * scratch.d_stream_bf16, replaced by that of the layer's input. */
int cuda_llama_layer_forward(model_stage *stage, layer_activations *act,
                             const layer_offsets *o, pt_bf16 *input,
                             const pt_bf16 *input_skip, const stage_dims *d,
                             pt_error *err);
int cuda_llama_layer_backward(model_stage *stage, const layer_offsets *o,
                              const layer_activations *act,
                              const pt_bf16 *input, const stage_dims *d,
                              pt_error *err);

#endif
