/*
 * The pieces cuDNN's attention graphs are built from (attention_cudnn.c):
 * a graph under construction that owns its descriptors and keeps its
 * first failure, tensors, and the operations the forward and backward
 * graphs use, each failing into the graph's pt_error with cuDNN's
 * message. Private to executor/cuda.
 */
#ifndef PARTITA_EXECUTOR_CUDA_ATTENTION_CUDNN_GRAPH_H
#define PARTITA_EXECUTOR_CUDA_ATTENTION_CUDNN_GRAPH_H

#include <stdbool.h>
#include <stdint.h>

#include <cudnn_graph.h>

#include "common/common.h"

#define GRAPH_MAX_DESCRIPTORS 112
#define GRAPH_MAX_OPERATIONS 32
#define TENSOR_ALIGNMENT 16

/* A graph being built: every descriptor made for it (destroyed together,
 * after its plan), its operations in order, and the first failure,
 * after which every step does nothing (one check at the end). */
typedef struct graph {
    cudnnBackendDescriptor_t owned[GRAPH_MAX_DESCRIPTORS];
    int owned_count;
    cudnnBackendDescriptor_t operations[GRAPH_MAX_OPERATIONS];
    int operation_count;
    int64_t next_uid;
    const char *name; /* "forward" or "backward" */
    pt_error *err;
    bool failed;
} graph;

typedef struct tensor_shape {
    int64_t dims[4];
    int64_t strides[4];
} tensor_shape;

/* The attribute's name and the object it is set on, for messages. */
#define SET(g, d, name, type, count, values, object)                           \
    sdpa_graph_set_attribute((g), (d), (name), (type), (count), (values),      \
                             #name " of " object)

/* cuDNN's failure as a pt_error (the call, the attribute, cuDNN's own
 * message); the graph's first failure, after which its steps do nothing */
int sdpa_fail(pt_error *err, const char *where, const char *call,
              const char *what, cudnnStatus_t status);
void sdpa_graph_failed(graph *g, const char *call, const char *what,
                       cudnnStatus_t status);
/* descriptors the graph owns, set, finalized, added as operations, and
 * destroyed with the graph */
cudnnBackendDescriptor_t
sdpa_graph_new(graph *g, cudnnBackendDescriptorType_t type, const char *what);
void sdpa_graph_set_attribute(graph *g, cudnnBackendDescriptor_t d,
                              cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t count,
                              const void *values, const char *what);
void sdpa_graph_finalize(graph *g, cudnnBackendDescriptor_t d,
                         const char *what);
void sdpa_graph_add_operation(graph *g, cudnnBackendDescriptor_t op,
                              const char *what);
void sdpa_graph_destroy(graph *g);
/* tensors: the caller's memory (uid), virtual ones, host scalars */
cudnnBackendDescriptor_t sdpa_tensor(graph *g, const char *name, int64_t uid,
                                     cudnnDataType_t type,
                                     const tensor_shape *shape, bool is_virtual,
                                     bool by_value);
cudnnBackendDescriptor_t sdpa_virtual_tensor(graph *g, const char *name,
                                             cudnnDataType_t type,
                                             const tensor_shape *shape);
cudnnBackendDescriptor_t sdpa_scalar(graph *g, const char *name, int64_t uid);
/* the operations the attention graphs use */
void sdpa_pointwise(graph *g, const char *label, cudnnPointwiseMode_t mode,
                    cudnnDataType_t math, int64_t axis,
                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y);
void sdpa_binary(graph *g, const char *label, cudnnPointwiseMode_t mode,
                 cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y);
void sdpa_unary(graph *g, const char *label, cudnnPointwiseMode_t mode,
                cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
void sdpa_matmul(graph *g, const char *label, cudnnBackendDescriptor_t a,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c);
void sdpa_reduction(graph *g, const char *label, cudnnReduceTensorOp_t kind,
                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y);
void sdpa_reshape(graph *g, const char *label, cudnnBackendDescriptor_t x,
                  cudnnBackendDescriptor_t y);

#endif
