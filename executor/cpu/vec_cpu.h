/*
 * executor/cpu: the two vector loops every cpu reference op is built
 * from (ops_cpu.c, ops_llama_cpu.c), kept in one place so that the GPT
 * ops and the Llama ops sum in the same order: the grouped-query
 * attention with one key/value head per query head gives the bits of
 * the multi-head one. Internal to executor/cpu.
 */
#ifndef PARTITA_EXECUTOR_CPU_VEC_H
#define PARTITA_EXECUTOR_CPU_VEC_H

/* Dot product with eight partial sums in a fixed order: the compiler can
 * keep them in vector registers, and the result does not depend on the
 * machine. */
static inline float cpu_dot_product(const float *a, const float *b, int n)
{
    float partial[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int lane = 0; lane < 8; lane++)
            partial[lane] += a[i + lane] * b[i + lane];
    float sum = 0.0f;
    for (int lane = 0; lane < 8; lane++)
        sum += partial[lane];
    for (; i < n; i++)
        sum += a[i] * b[i];
    return sum;
}

/* y += alpha x, in runs of eight like cpu_dot_product: a loop of fixed
 * length is one the compiler vectorises at -O2, a loop of unknown length
 * with a scalar tail is not. */
static inline void cpu_add_scaled(float *restrict y, const float *restrict x,
                                  float alpha, int n)
{
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int lane = 0; lane < 8; lane++)
            y[i + lane] += alpha * x[i + lane];
    for (; i < n; i++)
        y[i] += alpha * x[i];
}

#endif
