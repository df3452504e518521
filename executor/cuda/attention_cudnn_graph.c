/*
 * The pieces of cuDNN's attention graphs (attention_cudnn_graph.h):
 * error messages, the graph's descriptors, tensors and operations, in
 * cuDNN's backend API.
 */
#include "executor/cuda/attention_cudnn_graph.h"

#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------- cuDNN errors */

int sdpa_fail(pt_error *err, const char *where, const char *call,
              const char *what, cudnnStatus_t status) {
    char detail[600];
    cudnnGetLastErrorString(detail, sizeof detail);
    return pt_fail(err, "cuDNN attention, %s: %s(%s) failed: %s%s%s", where,
                   call, what, cudnnGetErrorString(status),
                   detail[0] != '\0' ? ": " : "", detail);
}

void sdpa_graph_failed(graph *g, const char *call, const char *what,
                       cudnnStatus_t status) {
    if (g->failed)
        return;
    g->failed = true;
    char where[64];
    snprintf(where, sizeof where, "%s graph", g->name);
    sdpa_fail(g->err, where, call, what, status);
}

/* --------------------------------------------------- graph primitives */

cudnnBackendDescriptor_t
sdpa_graph_new(graph *g, cudnnBackendDescriptorType_t type, const char *what) {
    if (g->failed)
        return NULL;
    if (g->owned_count == GRAPH_MAX_DESCRIPTORS) {
        g->failed = true;
        pt_fail(g->err,
                "cuDNN attention, %s graph: more than %d "
                "descriptors (at %s)",
                g->name, GRAPH_MAX_DESCRIPTORS, what);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t status = cudnnBackendCreateDescriptor(type, &d);
    if (status != CUDNN_STATUS_SUCCESS) {
        sdpa_graph_failed(g, "cudnnBackendCreateDescriptor", what, status);
        return NULL;
    }
    g->owned[g->owned_count++] = d;
    return d;
}

void sdpa_graph_set_attribute(graph *g, cudnnBackendDescriptor_t d,
                              cudnnBackendAttributeName_t name,
                              cudnnBackendAttributeType_t type, int64_t count,
                              const void *values, const char *what) {
    if (g->failed)
        return;
    cudnnStatus_t status =
        cudnnBackendSetAttribute(d, name, type, count, values);
    if (status != CUDNN_STATUS_SUCCESS)
        sdpa_graph_failed(g, "cudnnBackendSetAttribute", what, status);
}

void sdpa_graph_finalize(graph *g, cudnnBackendDescriptor_t d,
                         const char *what) {
    if (g->failed)
        return;
    cudnnStatus_t status = cudnnBackendFinalize(d);
    if (status != CUDNN_STATUS_SUCCESS)
        sdpa_graph_failed(g, "cudnnBackendFinalize", what, status);
}

void sdpa_graph_add_operation(graph *g, cudnnBackendDescriptor_t op,
                              const char *what) {
    sdpa_graph_finalize(g, op, what);
    if (g->failed)
        return;
    if (g->operation_count == GRAPH_MAX_OPERATIONS) {
        g->failed = true;
        pt_fail(g->err,
                "cuDNN attention, %s graph: more than %d "
                "operations",
                g->name, GRAPH_MAX_OPERATIONS);
        return;
    }
    g->operations[g->operation_count++] = op;
}

void sdpa_graph_destroy(graph *g) {
    if (g == NULL)
        return;
    for (int i = g->owned_count - 1; i >= 0; i--)
        cudnnBackendDestroyDescriptor(g->owned[i]);
    free(g);
}

/* ------------------------------------------------------------ tensors */

cudnnBackendDescriptor_t sdpa_tensor(graph *g, const char *name, int64_t uid,
                                     cudnnDataType_t type,
                                     const tensor_shape *shape, bool is_virtual,
                                     bool by_value) {
    cudnnBackendDescriptor_t t =
        sdpa_graph_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR, name);
    int64_t alignment = TENSOR_ALIGNMENT;
    bool yes = true;
    SET(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type,
        "a tensor");
    SET(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, shape->dims,
        "a tensor");
    SET(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, shape->strides,
        "a tensor");
    SET(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid,
        "a tensor");
    SET(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment,
        "a tensor");
    if (is_virtual)
        SET(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &yes,
            "a tensor");
    if (by_value)
        SET(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &yes,
            "a tensor");
    sdpa_graph_finalize(g, t, name);
    return t;
}

/* A tensor that lives only inside cuDNN's fused kernels. */
cudnnBackendDescriptor_t sdpa_virtual_tensor(graph *g, const char *name,
                                             cudnnDataType_t type,
                                             const tensor_shape *shape) {
    return sdpa_tensor(g, name, g->next_uid++, type, shape, true, false);
}

/* An fp32 scalar passed by value (a host pointer in the variant pack). */
cudnnBackendDescriptor_t sdpa_scalar(graph *g, const char *name, int64_t uid) {
    static const tensor_shape one = {{1, 1, 1, 1}, {1, 1, 1, 1}};
    return sdpa_tensor(g, name, uid, CUDNN_DATA_FLOAT, &one, false, true);
}

/* ---------------------------------------------------------- operations */

/* y = mode(x[, b[, t]]) in math precision `math`; axis: GEN_INDEX's
 * (else negative). */
void sdpa_pointwise(graph *g, const char *label, cudnnPointwiseMode_t mode,
                    cudnnDataType_t math, int64_t axis,
                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                    cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw =
        sdpa_graph_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR, label);
    SET(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode,
        "a pointwise descriptor");
    SET(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &math,
        "a pointwise descriptor");
    if (axis >= 0)
        SET(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis,
            "a pointwise descriptor");
    sdpa_graph_finalize(g, pw, label);
    cudnnBackendDescriptor_t op =
        sdpa_graph_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, label);
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw, "a pointwise operation");
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "a pointwise operation");
    if (b != NULL)
        SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC,
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b, "a pointwise operation");
    if (t != NULL)
        SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC,
            CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t, "a pointwise operation");
    SET(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "a pointwise operation");
    sdpa_graph_add_operation(g, op, label);
}

/* Elementwise y = x op b (b broadcast), in fp32. */
void sdpa_binary(graph *g, const char *label, cudnnPointwiseMode_t mode,
                 cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t b,
                 cudnnBackendDescriptor_t y) {
    sdpa_pointwise(g, label, mode, CUDNN_DATA_FLOAT, -1, x, b, NULL, y);
}

void sdpa_unary(graph *g, const char *label, cudnnPointwiseMode_t mode,
                cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    sdpa_pointwise(g, label, mode, CUDNN_DATA_FLOAT, -1, x, NULL, NULL, y);
}

/* c = a b over the last two dimensions, batched over the first two,
 * accumulated in fp32. */
void sdpa_matmul(graph *g, const char *label, cudnnBackendDescriptor_t a,
                 cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnDataType_t math = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t desc =
        sdpa_graph_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR, label);
    SET(g, desc, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math,
        "a matmul descriptor");
    sdpa_graph_finalize(g, desc, label);
    cudnnBackendDescriptor_t op =
        sdpa_graph_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR, label);
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1, &a, "a matmul operation");
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1, &b, "a matmul operation");
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1, &c, "a matmul operation");
    SET(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR,
        1, &desc, "a matmul operation");
    sdpa_graph_add_operation(g, op, label);
}

/* y (..., 1) = reduction of x (..., n) over its last dimension. */
void sdpa_reduction(graph *g, const char *label, cudnnReduceTensorOp_t kind,
                    cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnDataType_t math = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t desc =
        sdpa_graph_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR, label);
    SET(g, desc, CUDNN_ATTR_REDUCTION_OPERATOR,
        CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &kind, "a reduction");
    SET(g, desc, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &math,
        "a reduction");
    sdpa_graph_finalize(g, desc, label);
    cudnnBackendDescriptor_t op =
        sdpa_graph_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR, label);
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "a reduction operation");
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "a reduction operation");
    SET(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &desc, "a reduction operation");
    sdpa_graph_add_operation(g, op, label);
}

/* y = x seen with other dimensions and strides (here: transposed). */
void sdpa_reshape(graph *g, const char *label, cudnnBackendDescriptor_t x,
                  cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op =
        sdpa_graph_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR, label);
    SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x, "a reshape");
    SET(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC,
        CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y, "a reshape");
    sdpa_graph_add_operation(g, op, label);
}
