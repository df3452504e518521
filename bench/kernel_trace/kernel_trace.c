/*
 * A kernel tracer for any CUDA program, ours or a peer's (llm.c): loaded
 * by the driver through CUDA_INJECTION64_PATH, it records every kernel's
 * name, start, end, device, stream and launch (grid, block, registers,
 * shared memory) through CUPTI's activity API, and
 * every copy and fill as "[memcpy KIND BYTES]" or "[memset BYTES]" (the
 * device's time between kernels that no kernel shows), and writes them,
 * one line each, to $KERNEL_TRACE_OUT when the program exits. Kernels
 * run as they would without it (no replay, clocks left alone), so
 * kernel_table.py can cut the trace into steps and compare two programs
 * kernel kind by kernel kind (docs/benchmarks.md, "Against llm.c").
 *
 * With KERNEL_TRACE_API_ERRORS=1 it also prints, the moment it happens,
 * every CUDA runtime call that returned an error (but "not ready"), with
 * the call stack (addresses for addr2line): an error a later
 * cudaGetLastError reports against an innocent kernel launch is found
 * where it was made.
 */
#include <cupti.h>

#include <execinfo.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TRACE_BUFFER_BYTES (8u << 20)
#define TRACE_ALIGN 8

/* The records CUPTI hands back, kept until exit; grows by doubling. */
typedef struct kernel_record {
    uint64_t start_ns, end_ns;
    uint32_t device, stream; /* which GPU and which of its streams */
    char launch[64];         /* a kernel's grid, block, registers and
                                shared memory ("-" for a copy or fill):
                                two runs of one kernel name can differ
                                there (a product's split) */
    char *name;              /* owned */
} kernel_record;

static kernel_record *records;
static size_t record_count, record_capacity;
static int dropped;

static void CUPTIAPI give_buffer(uint8_t **buffer, size_t *size,
                                 size_t *max_records)
{
    /* CUPTI wants buffers aligned to 8 bytes */
    *buffer = aligned_alloc(TRACE_ALIGN, TRACE_BUFFER_BYTES);
    *size = *buffer != NULL ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void keep(uint64_t start_ns, uint64_t end_ns, uint32_t device,
                 uint32_t stream, const char *launch, const char *what)
{
    if (record_count == record_capacity) {
        size_t capacity = record_capacity ? 2 * record_capacity : 65536;
        kernel_record *grown = realloc(records, capacity * sizeof *grown);
        if (grown == NULL) {
            dropped++;
            return;
        }
        records = grown;
        record_capacity = capacity;
    }
    char *name = strdup(what != NULL ? what : "?");
    if (name == NULL) {
        dropped++;
        return;
    }
    kernel_record *r = &records[record_count++];
    *r = (kernel_record){start_ns, end_ns, device, stream, {0}, name};
    snprintf(r->launch, sizeof r->launch, "%s", launch);
}

/* One activity record: a kernel, a copy or a fill. */
static void keep_record(const CUpti_Activity *record)
{
    char what[64];
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL ||
        record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
        const CUpti_ActivityKernel10 *k =
            (const CUpti_ActivityKernel10 *)record;
        char launch[64];
        snprintf(launch, sizeof launch, "%dx%dx%d/%dx%dx%d/r%u/s%d",
                 k->gridX, k->gridY, k->gridZ, k->blockX, k->blockY,
                 k->blockZ, (unsigned)k->registersPerThread,
                 (int)(k->staticSharedMemory + k->dynamicSharedMemory));
        keep(k->start, k->end, k->deviceId, k->streamId, launch, k->name);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const CUpti_ActivityMemcpy6 *c = (const CUpti_ActivityMemcpy6 *)record;
        snprintf(what, sizeof what, "[memcpy %u %llu]", c->copyKind,
                 (unsigned long long)c->bytes);
        keep(c->start, c->end, c->deviceId, c->streamId, "-", what);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
        const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)record;
        snprintf(what, sizeof what, "[memset %llu]",
                 (unsigned long long)m->bytes);
        keep(m->start, m->end, m->deviceId, m->streamId, "-", what);
    }
}

static void CUPTIAPI take_buffer(CUcontext context, uint32_t stream,
                                 uint8_t *buffer, size_t size, size_t valid)
{
    (void)context;
    (void)stream;
    (void)size;
    CUpti_Activity *record = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) ==
           CUPTI_SUCCESS)
        keep_record(record);
    size_t lost = 0;
    if (cuptiActivityGetNumDroppedRecords(context, stream, &lost) ==
            CUPTI_SUCCESS &&
        lost > 0)
        dropped += (int)lost;
    free(buffer);
}

static void write_trace(void)
{
    cuptiActivityFlushAll(1);
    const char *path = getenv("KERNEL_TRACE_OUT");
    if (path == NULL || path[0] == '\0')
        path = "kernel_trace.tsv";
    FILE *out = fopen(path, "w");
    if (out == NULL) {
        fprintf(stderr, "kernel_trace: cannot write %s\n", path);
        return;
    }
    fprintf(out, "start_ns\tend_ns\tdevice\tstream\tlaunch\tname\n");
    for (size_t i = 0; i < record_count; i++)
        fprintf(out, "%llu\t%llu\t%u\t%u\t%s\t%s\n",
                (unsigned long long)records[i].start_ns,
                (unsigned long long)records[i].end_ns, records[i].device,
                records[i].stream, records[i].launch, records[i].name);
    fclose(out);
    fprintf(stderr, "kernel_trace: %zu kernels, copies and fills to %s%s\n",
            record_count,
            path, dropped ? " (some records were dropped)" : "");
}

/* Runtime calls that fail: named on stderr with the stack that made them. */
static void CUPTIAPI on_runtime_call(void *userdata,
                                     CUpti_CallbackDomain domain,
                                     CUpti_CallbackId id, const void *data)
{
    (void)userdata;
    (void)id;
    const CUpti_CallbackData *call = data;
    if (domain != CUPTI_CB_DOMAIN_RUNTIME_API ||
        call->callbackSite != CUPTI_API_EXIT ||
        call->functionReturnValue == NULL)
        return;
    /* a cudaError_t; 600 is cudaErrorNotReady, a query's answer */
    int status = *(const int *)call->functionReturnValue;
    if (status == 0 || status == 600)
        return;
    fprintf(stderr, "kernel_trace: %s returned error %d; called from:\n",
            call->functionName, status);
    void *frames[24];
    backtrace_symbols_fd(frames, backtrace(frames, 24), 2);
}

static void watch_runtime_errors(void)
{
    static CUpti_SubscriberHandle subscriber;
    if (cuptiSubscribe(&subscriber, on_runtime_call, NULL) != CUPTI_SUCCESS ||
        cuptiEnableDomain(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API) !=
            CUPTI_SUCCESS)
        fprintf(stderr, "kernel_trace: CUPTI refused the runtime callbacks\n");
}

/* Called by the CUDA driver when it loads this library. */
int InitializeInjection(void);
int InitializeInjection(void)
{
    if (cuptiActivityRegisterCallbacks(give_buffer, take_buffer) !=
            CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) !=
            CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS ||
        cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
        fprintf(stderr, "kernel_trace: CUPTI refused the activity trace\n");
        return 0;
    }
    atexit(write_trace);
    const char *api_errors = getenv("KERNEL_TRACE_API_ERRORS");
    if (api_errors != NULL && strcmp(api_errors, "1") == 0)
        watch_runtime_errors();
    return 1;
}
