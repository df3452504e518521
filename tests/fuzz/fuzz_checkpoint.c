/*
 * Fuzzes the checkpoint manifest reader: the input is written as
 * <scratch>/ckpt/manifest.json, then checkpoint_read_manifest,
 * checkpoint_verify, checkpoint_blob_size and checkpoint_read_blob run on
 * it. Generation 1 holds one real blob, "weights" (16 bytes), so a
 * manifest that names it reaches the size and CRC-32 checks.
 */
#include "fuzz.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "executor/run/run.h"

enum { BLOB_BYTES = 16 };

/* Makes <scratch>/ckpt/gen-000001/weights once; the directory's path. */
static const char *checkpoint_dir(void)
{
    static char dir[600];
    if (dir[0] != '\0')
        return dir;
    const char *scratch = fuzz_scratch_dir();
    if (scratch == NULL)
        return NULL;
    char generation[640], blob[700];
    snprintf(dir, sizeof dir, "%s/ckpt", scratch);
    snprintf(generation, sizeof generation, "%s/gen-000001", dir);
    snprintf(blob, sizeof blob, "%s/weights", generation);
    static const char content[BLOB_BYTES] = "0123456789abcdef";
    if ((mkdir(dir, 0700) != 0 || mkdir(generation, 0700) != 0 ||
         fuzz_write_file(blob, content, sizeof content) != 0)) {
        dir[0] = '\0';
        return NULL;
    }
    return dir;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *dir = checkpoint_dir();
    if (dir == NULL)
        return 0;
    char manifest_path[700];
    snprintf(manifest_path, sizeof manifest_path, "%s/" CHECKPOINT_MANIFEST,
             dir);
    if (fuzz_write_file(manifest_path, data, size) != 0)
        return 0;
    checkpoint_manifest manifest;
    pt_error err;
    if (checkpoint_read_manifest(dir, &manifest, &err) != 0)
        return 0;
    if (manifest.blob_count < 0 || manifest.blob_count > CHECKPOINT_MAX_BLOBS)
        __builtin_trap();
    (void)checkpoint_exists(dir);
    (void)checkpoint_verify(dir, &err);
    for (int b = 0; b < manifest.blob_count; b++) {
        uint64_t bytes = 0;
        unsigned char buffer[BLOB_BYTES];
        if (checkpoint_blob_size(dir, manifest.blobs[b].name, &bytes,
                                 &err) == 0 &&
            bytes <= sizeof buffer)
            (void)checkpoint_read_blob(dir, manifest.blobs[b].name, buffer,
                                       (size_t)bytes, &err);
    }
    return 0;
}
