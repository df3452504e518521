/*
 * Checkpoints: a directory of named binary blobs, each written atomically
 * into a fresh generation folder, and a manifest of sizes and CRC-32s
 * written last. Whatever point a save dies at, the manifest on disk names
 * a complete, verified generation: the new one or the previous one. The
 * newest few generations are kept (checkpoint_writer.keep), each with its
 * own copy of its manifest, so an older one loads from its folder.
 */
#include "executor/run/run.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define MANIFEST_FORMAT "partita-checkpoint"
#define MANIFEST_VERSION 1
#define GENERATION_PREFIX "gen-"

/* ---------------------------------------------------------------- crc32 */

/* Entry n is the CRC of the byte n alone, for the reflected polynomial
 * 0xEDB88320; a test recomputes every entry bit by bit. */
static const uint32_t crc32_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u,
    0x706af48fu, 0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u,
    0xe0d5e91eu, 0x97d2d988u, 0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u,
    0x90bf1d91u, 0x1db71064u, 0x6ab020f2u, 0xf3b97148u, 0x84be41deu,
    0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u, 0x136c9856u,
    0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u,
    0xa2677172u, 0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu,
    0x35b5a8fau, 0x42b2986cu, 0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u,
    0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u, 0x26d930acu, 0x51de003au,
    0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u, 0xcfba9599u,
    0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u,
    0x01db7106u, 0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu,
    0x9fbfe4a5u, 0xe8b8d433u, 0x7807c9a2u, 0x0f00f934u, 0x9609a88eu,
    0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du, 0x91646c97u, 0xe6635c01u,
    0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu, 0x6c0695edu,
    0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u,
    0xfbd44c65u, 0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u,
    0x4adfa541u, 0x3dd895d7u, 0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au,
    0x346ed9fcu, 0xad678846u, 0xda60b8d0u, 0x44042d73u, 0x33031de5u,
    0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau, 0xbe0b1010u,
    0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u,
    0x2eb40d81u, 0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u,
    0x03b6e20cu, 0x74b1d29au, 0xead54739u, 0x9dd277afu, 0x04db2615u,
    0x73dc1683u, 0xe3630b12u, 0x94643b84u, 0x0d6d6a3eu, 0x7a6a5aa8u,
    0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u, 0xf00f9344u,
    0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au,
    0x67dd4accu, 0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u,
    0xd6d6a3e8u, 0xa1d1937eu, 0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u,
    0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu, 0xd80d2bdau, 0xaf0a1b4cu,
    0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u, 0x316e8eefu,
    0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu,
    0xb2bd0b28u, 0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u,
    0x2cd99e8bu, 0x5bdeae1du, 0x9b64c2b0u, 0xec63f226u, 0x756aa39cu,
    0x026d930au, 0x9c0906a9u, 0xeb0e363fu, 0x72076785u, 0x05005713u,
    0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u, 0x92d28e9bu,
    0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u,
    0x18b74777u, 0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu,
    0x8f659effu, 0xf862ae69u, 0x616bffd3u, 0x166ccf45u, 0xa00ae278u,
    0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u, 0xa7672661u, 0xd06016f7u,
    0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu, 0x40df0b66u,
    0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u,
    0xcdd70693u, 0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u,
    0x5d681b02u, 0x2a6f2b94u, 0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu,
    0x2d02ef8du,
};

/* Slicing by 8: crc32_slices[t][n] is the CRC of byte n followed by t
 * zero bytes, so eight table reads advance the CRC by eight bytes at
 * once, about five times the byte-at-a-time rate (a checkpoint's tens
 * of GB are summed when written and twice when loaded). Filled once
 * from crc32_table. */
static uint32_t crc32_slices[8][256];
static pthread_once_t crc32_slices_once = PTHREAD_ONCE_INIT;

static void crc32_slices_fill(void)
{
    for (int n = 0; n < 256; n++)
        crc32_slices[0][n] = crc32_table[n];
    for (int t = 1; t < 8; t++)
        for (int n = 0; n < 256; n++) {
            uint32_t before = crc32_slices[t - 1][n];
            crc32_slices[t][n] =
                (before >> 8) ^ crc32_table[before & 0xff];
        }
}

uint32_t pt_crc32_update(uint32_t crc, const void *data, size_t size)
{
    pthread_once(&crc32_slices_once, crc32_slices_fill);
    const uint32_t(*slice)[256] = (const uint32_t(*)[256])crc32_slices;
    const unsigned char *bytes = data;
    crc = ~crc;
    for (; size >= 8; size -= 8, bytes += 8) {
        /* the little-endian words of the next eight bytes */
        uint32_t low = (uint32_t)bytes[0] | (uint32_t)bytes[1] << 8 |
                       (uint32_t)bytes[2] << 16 | (uint32_t)bytes[3] << 24;
        uint32_t high = (uint32_t)bytes[4] | (uint32_t)bytes[5] << 8 |
                        (uint32_t)bytes[6] << 16 | (uint32_t)bytes[7] << 24;
        low ^= crc;
        crc = slice[7][low & 0xff] ^ slice[6][(low >> 8) & 0xff] ^
              slice[5][(low >> 16) & 0xff] ^ slice[4][low >> 24] ^
              slice[3][high & 0xff] ^ slice[2][(high >> 8) & 0xff] ^
              slice[1][(high >> 16) & 0xff] ^ slice[0][high >> 24];
    }
    for (size_t i = 0; i < size; i++)
        crc = crc32_table[(crc ^ bytes[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t pt_crc32(const void *data, size_t size)
{
    return pt_crc32_update(0, data, size);
}

/* --------------------------------------------------------- crash points */

/*
 * A save must leave a loadable checkpoint whatever instant it dies at. To
 * test that, the test executor_run_checkpoint_kill compiles this file with
 * PARTITA_CHECKPOINT_CRASH_POINTS and runs saves in a child process with
 * $PARTITA_CHECKPOINT_KILL_AT set to K: the child sends itself SIGKILL
 * right after the K-th step of its saves that touches the disk (a
 * directory made, a file created, half or all of its bytes written, a
 * file or directory synced, renamed or removed), for every K in turn. The
 * library that partita links has no crash points and never reads the
 * variable.
 */
#ifdef PARTITA_CHECKPOINT_CRASH_POINTS
/* Steps taken by this process's saves while the variable is set: test
 * builds only, where one child process makes one count. */
static long crash_steps_taken;

static void crash_point(void)
{
    const char *kill_at = getenv("PARTITA_CHECKPOINT_KILL_AT");
    if (kill_at != NULL && ++crash_steps_taken == atol(kill_at))
        raise(SIGKILL);
}
#else
static void crash_point(void)
{
}
#endif

/* pt_write_file_atomic (common/atomic_file.c) step by step, with a crash
 * point after each step: a temporary file beside target, the first half
 * of the bytes, the rest, fsync and close, rename. */
static int write_file_in_steps(const char *target, const void *data,
                               size_t size, pt_error *err)
{
    char temp_path[PT_PATH_MAX + 160];
    int fd = pt_temp_file_beside(target, temp_path, sizeof temp_path, err);
    if (fd < 0)
        return -1;
    crash_point();
    size_t half = size / 2;
    int written = pt_write_fully(fd, data, half);
    crash_point();
    if (written == 0)
        written = pt_write_fully(fd, (const char *)data + half, size - half);
    if (written != 0) {
        int saved = errno;
        close(fd);
        unlink(temp_path);
        return pt_fail(err, "%s: write failed: %s", temp_path,
                       strerror(saved));
    }
    crash_point();
    if (pt_finish_temp_file(fd, temp_path, err) != 0)
        return -1;
    crash_point();
    if (pt_rename_into_place(temp_path, target, err) != 0)
        return -1;
    crash_point();
    return 0;
}

/* ---------------------------------------------------------------- paths */

static bool valid_blob_name(const char *name)
{
    size_t length = strlen(name);
    if (length == 0 || length >= PT_NAME_MAX || name[0] == '.' ||
        strcmp(name, CHECKPOINT_GENERATION_MANIFEST) == 0)
        return false;
    for (size_t i = 0; i < length; i++) {
        char c = name[i];
        bool allowed = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                       (c >= '0' && c <= '9') || c == '_' || c == '.' ||
                       c == '-';
        if (!allowed)
            return false;
    }
    return true;
}

static void generation_dir(const char *dir, uint64_t generation, char *out,
                           size_t size)
{
    snprintf(out, size, "%s/" GENERATION_PREFIX "%06" PRIu64, dir, generation);
}

static void blob_path(const char *dir, uint64_t generation, const char *name,
                      char *out, size_t size)
{
    char folder[PT_PATH_MAX + 32];
    generation_dir(dir, generation, folder, sizeof folder);
    snprintf(out, size, "%s/%s", folder, name);
}

static void manifest_path(const char *dir, char *out, size_t size)
{
    snprintf(out, size, "%s/" CHECKPOINT_MANIFEST, dir);
}

/* The generation a directory entry names ("gen-000012" -> 12), or 0. */
static uint64_t parse_generation(const char *entry)
{
    size_t prefix = strlen(GENERATION_PREFIX);
    if (strncmp(entry, GENERATION_PREFIX, prefix) != 0 || entry[prefix] == '\0')
        return 0;
    uint64_t generation = 0;
    for (const char *c = entry + prefix; *c != '\0'; c++) {
        if (*c < '0' || *c > '9' || generation > UINT64_MAX / 10 - 1)
            return 0;
        generation = generation * 10 + (uint64_t)(*c - '0');
    }
    return generation;
}

int checkpoint_make_directories(const char *dir, pt_error *err)
{
    char path[PT_PATH_MAX];
    pt_copy_string(path, sizeof path, dir);
    if (path[0] == '\0')
        return pt_fail(err, "checkpoint directory: empty path");
    for (char *slash = path + 1; ; slash++) {
        bool end = *slash == '\0';
        if (!end && *slash != '/')
            continue;
        *slash = '\0';
        if (mkdir(path, 0777) == 0)
            crash_point();
        else if (errno != EEXIST)
            return pt_fail(err, "%s: cannot create directory: %s", path,
                           strerror(errno));
        if (end)
            break;
        *slash = '/';
    }
    struct stat info;
    if (stat(dir, &info) != 0 || !S_ISDIR(info.st_mode))
        return pt_fail(err, "%s: not a directory", dir);
    return 0;
}

/* Removes one generation folder and the blob files in it. Best effort:
 * a leftover folder costs disk space, never correctness. */
static void remove_generation(const char *dir, uint64_t generation)
{
    char folder[PT_PATH_MAX + 32];
    generation_dir(dir, generation, folder, sizeof folder);
    DIR *listing = opendir(folder);
    if (listing != NULL) {
        struct dirent *entry;
        while ((entry = readdir(listing)) != NULL)
            if (strcmp(entry->d_name, ".") != 0 &&
                strcmp(entry->d_name, "..") != 0 &&
                unlinkat(dirfd(listing), entry->d_name, 0) == 0)
                crash_point();
        closedir(listing);
    }
    if (rmdir(folder) == 0)
        crash_point();
}

/* Lists the generation folders of dir and returns the highest (0 when
 * none). With remove_leftovers, removes those above `current`, which a
 * save that died before its commit left, and the manifest temporaries
 * such a save leaves; older folders are generations kept on purpose. */
static uint64_t scan_generations(const char *dir, uint64_t current,
                                 bool remove_leftovers)
{
    DIR *listing = opendir(dir);
    if (listing == NULL)
        return 0;
    uint64_t highest = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        uint64_t generation = parse_generation(entry->d_name);
        if (generation > highest)
            highest = generation;
        if (generation > current && remove_leftovers)
            remove_generation(dir, generation);
        bool manifest_temp =
            strncmp(entry->d_name, CHECKPOINT_MANIFEST ".tmp.",
                    strlen(CHECKPOINT_MANIFEST ".tmp.")) == 0;
        if (remove_leftovers && manifest_temp &&
            unlinkat(dirfd(listing), entry->d_name, 0) == 0)
            crash_point();
    }
    closedir(listing);
    return highest;
}

static int compare_generations_newest_first(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x < y) - (x > y);
}

/* After a commit of `newest`: removes the generation folders beyond the
 * `keep` newest (keep < 1 counts as 1). Best effort, like
 * remove_generation. */
static void keep_newest_generations(const char *dir, uint64_t newest,
                                    int keep)
{
    DIR *listing = opendir(dir);
    if (listing == NULL)
        return;
    uint64_t *found = NULL;
    size_t count = 0, capacity = 0;
    struct dirent *entry;
    while ((entry = readdir(listing)) != NULL) {
        uint64_t generation = parse_generation(entry->d_name);
        if (generation == 0 || generation > newest)
            continue;
        if (count == capacity) {
            size_t grown = capacity > 0 ? 2 * capacity : 16;
            uint64_t *bigger = realloc(found, grown * sizeof *found);
            if (bigger == NULL)
                break;
            found = bigger;
            capacity = grown;
        }
        found[count++] = generation;
    }
    closedir(listing);
    qsort(found, count, sizeof *found, compare_generations_newest_first);
    for (size_t i = keep > 1 ? (size_t)keep : 1; i < count; i++)
        remove_generation(dir, found[i]);
    free(found);
}

/* --------------------------------------------------------------- writer */

int checkpoint_writer_begin(checkpoint_writer *w, const char *dir,
                            pt_error *err)
{
    memset(w, 0, sizeof *w);
    if (strlen(dir) + 64 >= sizeof w->dir)
        return pt_fail(err, "%s: checkpoint directory path too long", dir);
    pt_copy_string(w->dir, sizeof w->dir, dir);
    if (checkpoint_check_ours(dir, err) != 0 ||
        checkpoint_make_directories(dir, err) != 0)
        return -1;
    /* Folders above the committed generation are leftovers of a save
     * that died before its commit. Without a readable manifest we cannot
     * tell which folder is current, so nothing is removed until our
     * commit. */
    checkpoint_manifest current;
    bool have_current = checkpoint_exists(dir) &&
                        checkpoint_read_manifest(dir, &current, NULL) == 0;
    uint64_t highest = scan_generations(
        dir, have_current ? current.generation : 0, have_current);
    if (have_current && current.generation > highest)
        highest = current.generation;
    w->generation = highest + 1;
    char folder[PT_PATH_MAX + 32];
    generation_dir(dir, w->generation, folder, sizeof folder);
    if (mkdir(folder, 0777) != 0)
        return pt_fail(err, "%s: cannot create directory: %s", folder,
                       strerror(errno));
    crash_point();
    w->active = true;
    return 0;
}

static int check_new_blob(const checkpoint_writer *w, const char *name,
                          pt_error *err)
{
    if (!w->active)
        return pt_fail(err, "%s: no checkpoint save in progress (begin one "
                       "first; any failed write ends it)", w->dir);
    if (!valid_blob_name(name))
        return pt_fail(err, "%s: blob name \"%s\" must be 1-%d characters of "
                       "A-Z a-z 0-9 _ . - and not start with '.'", w->dir,
                       name, PT_NAME_MAX - 1);
    if (w->blob_count == CHECKPOINT_MAX_BLOBS)
        return pt_fail(err, "%s: more than %d blobs in one checkpoint", w->dir,
                       CHECKPOINT_MAX_BLOBS);
    for (int b = 0; b < w->blob_count; b++)
        if (strcmp(w->blobs[b].name, name) == 0)
            return pt_fail(err, "%s: blob \"%s\" written twice", w->dir, name);
    return 0;
}

int checkpoint_write_blob(checkpoint_writer *w, const char *name,
                          const void *data, size_t size, pt_error *err)
{
    if (check_new_blob(w, name, err) != 0) {
        checkpoint_writer_abort(w);
        return -1;
    }
    char path[PT_PATH_MAX + 128];
    blob_path(w->dir, w->generation, name, path, sizeof path);
    if (write_file_in_steps(path, data, size, err) != 0) {
        checkpoint_writer_abort(w);
        return -1;
    }
    checkpoint_blob *blob = &w->blobs[w->blob_count++];
    pt_copy_string(blob->name, sizeof blob->name, name);
    blob->bytes = size;
    blob->crc32 = pt_crc32(data, size);
    return 0;
}

static char *encode_manifest(const checkpoint_writer *w)
{
    json_t *blobs = json_array();
    for (int b = 0; b < w->blob_count; b++) {
        char crc[16];
        snprintf(crc, sizeof crc, "%08" PRIx32, w->blobs[b].crc32);
        json_array_append_new(
            blobs, json_pack("{s:s, s:I, s:s}", "name", w->blobs[b].name,
                             "bytes", (json_int_t)w->blobs[b].bytes, "crc32",
                             crc));
    }
    json_t *manifest = json_pack(
        "{s:s, s:i, s:I, s:o}", "format", MANIFEST_FORMAT, "version",
        MANIFEST_VERSION, "generation", (json_int_t)w->generation, "blobs",
        blobs);
    size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER;
    char *text = manifest != NULL ? json_dumps(manifest, flags) : NULL;
    json_decref(manifest);
    return text;
}

int checkpoint_writer_commit(checkpoint_writer *w, pt_error *err)
{
    if (!w->active)
        return pt_fail(err, "%s: no checkpoint save in progress", w->dir);
    if (w->joined)
        return pt_fail(err, "%s: only the process that began the save "
                            "commits it",
                       w->dir);
    char folder[PT_PATH_MAX + 32], path[PT_PATH_MAX + 32];
    generation_dir(w->dir, w->generation, folder, sizeof folder);
    manifest_path(w->dir, path, sizeof path);
    char *text = encode_manifest(w);
    if (text == NULL) {
        checkpoint_writer_abort(w);
        return pt_fail(err, "%s: out of memory for the manifest", path);
    }
    /* The generation's own copy of its manifest, which lets it load from
     * its folder once newer ones exist; then the blobs' renames must be
     * durable before the manifest names them. */
    char copy_path[PT_PATH_MAX + 64];
    snprintf(copy_path, sizeof copy_path, "%s/%s", folder,
             CHECKPOINT_GENERATION_MANIFEST);
    int result = write_file_in_steps(copy_path, text, strlen(text), err);
    if (result == 0)
        result = pt_sync_directory(folder, err);
    crash_point();
    if (result == 0)
        result = pt_sync_directory(w->dir, err);
    crash_point();
    if (result == 0)
        result = write_file_in_steps(path, text, strlen(text), err);
    free(text);
    if (result != 0) {
        checkpoint_writer_abort(w);
        return -1;
    }
    w->active = false;
    if (pt_sync_directory(w->dir, err) != 0)
        return -1;
    crash_point();
    scan_generations(w->dir, w->generation, true);
    keep_newest_generations(w->dir, w->generation, w->keep);
    return 0;
}

void checkpoint_writer_abort(checkpoint_writer *w)
{
    if (!w->active)
        return;
    w->active = false;
    if (!w->joined) {
        remove_generation(w->dir, w->generation);
        return;
    }
    for (int b = 0; b < w->blob_count; b++) {
        char path[PT_PATH_MAX + 128];
        blob_path(w->dir, w->generation, w->blobs[b].name, path,
                  sizeof path);
        unlink(path);
    }
}

int checkpoint_writer_join(checkpoint_writer *w, const char *dir,
                           uint64_t generation, pt_error *err)
{
    memset(w, 0, sizeof *w);
    if (strlen(dir) + 64 >= sizeof w->dir)
        return pt_fail(err, "%s: checkpoint directory path too long", dir);
    pt_copy_string(w->dir, sizeof w->dir, dir);
    char folder[PT_PATH_MAX + 32];
    generation_dir(dir, generation, folder, sizeof folder);
    struct stat info;
    if (stat(folder, &info) != 0 || !S_ISDIR(info.st_mode))
        return pt_fail(err, "%s: the generation folder the save began is "
                            "not there (is %s shared by every process?)",
                       folder, dir);
    w->generation = generation;
    w->joined = true;
    w->active = true;
    return 0;
}

int checkpoint_writer_add(checkpoint_writer *w, const checkpoint_blob *blob,
                          pt_error *err)
{
    if (w->joined) {
        checkpoint_writer_abort(w);
        return pt_fail(err, "%s: a joined writer does not commit, so it "
                            "takes no other blobs",
                       w->dir);
    }
    if (check_new_blob(w, blob->name, err) != 0) {
        checkpoint_writer_abort(w);
        return -1;
    }
    w->blobs[w->blob_count++] = *blob;
    return 0;
}

/* --------------------------------------------------------------- reader */

/* The manifest a load of dir reads: dir/manifest.json (the checkpoint
 * directory), else dir/generation.json (dir is one of its generation
 * folders, whose blobs sit beside it). false when neither is there. */
static bool find_manifest(const char *dir, char *path, size_t size,
                          bool *in_generation_folder)
{
    manifest_path(dir, path, size);
    *in_generation_folder = false;
    if (access(path, F_OK) == 0)
        return true;
    snprintf(path, size, "%s/" CHECKPOINT_GENERATION_MANIFEST, dir);
    *in_generation_folder = true;
    return access(path, F_OK) == 0;
}

/* Where a blob of a manifest read from dir is. */
static void stored_blob_path(const char *dir, const checkpoint_manifest *m,
                             const char *name, char *out, size_t size)
{
    if (m->in_generation_folder)
        snprintf(out, size, "%s/%s", dir, name);
    else
        blob_path(dir, m->generation, name, out, size);
}

/* A manifest is ours when its "format" says so, whatever else is wrong
 * with it: another program's manifest.json is never read as a damaged
 * checkpoint, nor replaced. */
static int check_manifest_format(const json_t *root, const char *path,
                                 pt_error *err)
{
    const char *format =
        json_string_value(json_object_get(root, "format"));
    if (format != NULL && strcmp(format, MANIFEST_FORMAT) == 0)
        return 0;
    return pt_fail(err, "%s: not a Partita checkpoint (its \"format\" is "
                        "not \"%s\"): the file belongs to another program",
                   path, MANIFEST_FORMAT);
}

int checkpoint_check_ours(const char *dir, pt_error *err)
{
    char path[PT_PATH_MAX + 32];
    bool in_folder;
    if (!find_manifest(dir, path, sizeof path, &in_folder))
        return 0;
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL) {
        pt_error_prefix(err, "not a Partita checkpoint");
        return -1;
    }
    int status = check_manifest_format(root, path, err);
    json_decref(root);
    return status;
}

bool checkpoint_exists(const char *dir)
{
    char path[PT_PATH_MAX + 32];
    bool in_folder;
    return find_manifest(dir, path, sizeof path, &in_folder);
}

static int parse_crc(const char *text, const json_place *place, uint32_t *out,
                     pt_error *err)
{
    bool hex = strlen(text) == 8;
    for (int i = 0; hex && i < 8; i++)
        hex = strchr("0123456789abcdefABCDEF", text[i]) != NULL;
    if (!hex)
        return pt_fail(err, "%s: %s: \"%s\" is not 8 hexadecimal digits",
                       place->file, place->path, text);
    *out = (uint32_t)strtoul(text, NULL, 16);
    return 0;
}

static int parse_blob(const json_t *entry, const json_place *place,
                      checkpoint_blob *out, pt_error *err)
{
    static const char *const keys[] = {"name", "bytes", "crc32", NULL};
    long long bytes = 0;
    char crc[16];
    if (json_expect_object(entry, place, err) != 0 ||
        json_check_keys(entry, place, keys, err) != 0 ||
        json_get_string(entry, place, "name", true, out->name,
                        sizeof out->name, err) != 0 ||
        json_get_int(entry, place, "bytes", true, 0, INT64_MAX, &bytes,
                     err) != 0 ||
        json_get_string(entry, place, "crc32", true, crc, sizeof crc,
                        err) != 0)
        return -1;
    json_place crc_place = json_place_key(place, "crc32");
    if (parse_crc(crc, &crc_place, &out->crc32, err) != 0)
        return -1;
    if (!valid_blob_name(out->name))
        return pt_fail(err, "%s: %s.name: \"%s\" is not a valid blob name",
                       place->file, place->path, out->name);
    out->bytes = (uint64_t)bytes;
    return 0;
}

static int parse_manifest(const json_t *root, const json_place *place,
                          checkpoint_manifest *out, pt_error *err)
{
    static const char *const keys[] = {"format", "version", "generation",
                                       "blobs", NULL};
    char format[64];
    long long version = 0, generation = 0;
    if (check_manifest_format(root, place->file, err) != 0 ||
        json_check_keys(root, place, keys, err) != 0 ||
        json_get_string(root, place, "format", true, format, sizeof format,
                        err) != 0)
        return -1;
    if (json_get_int(root, place, "version", true, MANIFEST_VERSION,
                     MANIFEST_VERSION, &version, err) != 0 ||
        json_get_int(root, place, "generation", true, 1, INT64_MAX,
                     &generation, err) != 0)
        return -1;
    out->generation = (uint64_t)generation;
    json_place blobs_place = json_place_key(place, "blobs");
    const json_t *blobs = json_object_get(root, "blobs");
    if (!json_is_array(blobs))
        return pt_fail(err, "%s: blobs: must be an array", place->file);
    if (json_array_size(blobs) > CHECKPOINT_MAX_BLOBS)
        return pt_fail(err, "%s: blobs: %zu entries, at most %d", place->file,
                       json_array_size(blobs), CHECKPOINT_MAX_BLOBS);
    out->blob_count = (int)json_array_size(blobs);
    for (int b = 0; b < out->blob_count; b++) {
        json_place entry = json_place_index(&blobs_place, (size_t)b);
        if (parse_blob(json_array_get(blobs, (size_t)b), &entry,
                       &out->blobs[b], err) != 0)
            return -1;
        for (int earlier = 0; earlier < b; earlier++)
            if (strcmp(out->blobs[earlier].name, out->blobs[b].name) == 0)
                return pt_fail(err, "%s: %s.name: \"%s\" appears twice",
                               place->file, entry.path, out->blobs[b].name);
    }
    return 0;
}

/* Why dir has no manifest: a generation folder (gen-NNNNNN) lacks its
 * own copy, generation.json; a checkpoint folder lacks manifest.json. */
static int describe_missing_manifest(const char *dir, pt_error *err)
{
    const char *base = strrchr(dir, '/');
    base = base != NULL ? base + 1 : dir;
    if (parse_generation(base) != 0)
        return pt_fail(err, "%s: no %s: this generation was not committed "
                            "(or its copy of the manifest was removed); "
                            "load the checkpoint folder above it instead",
                       dir, CHECKPOINT_GENERATION_MANIFEST);
    return pt_fail(err, "%s: no %s: no checkpoint was committed here (a "
                        "save that died before its commit leaves none)",
                   dir, CHECKPOINT_MANIFEST);
}

int checkpoint_read_manifest(const char *dir, checkpoint_manifest *out,
                             pt_error *err)
{
    char path[PT_PATH_MAX + 32];
    memset(out, 0, sizeof *out);
    bool in_folder = false;
    if (!find_manifest(dir, path, sizeof path, &in_folder))
        return describe_missing_manifest(dir, err);
    json_t *root = pt_json_load_file(path, err);
    if (root == NULL)
        return -1;
    json_place place = {.file = path, .path = ""};
    int result = parse_manifest(root, &place, out, err);
    json_decref(root);
    out->in_generation_folder = in_folder;
    return result;
}

/* Maps a blob's file and checks its size and checksum against the manifest.
 * *map is NULL for an empty blob. */
static int map_verified_blob(const char *dir, const checkpoint_manifest *m,
                             const checkpoint_blob *blob,
                             const unsigned char **map, pt_error *err)
{
    char path[PT_PATH_MAX + 128];
    stored_blob_path(dir, m, blob->name, path, sizeof path);
    *map = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return pt_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat info;
    if (fstat(fd, &info) != 0) {
        int saved = errno;
        close(fd);
        return pt_fail(err, "%s: cannot stat: %s", path, strerror(saved));
    }
    if (!S_ISREG(info.st_mode)) {
        close(fd);
        return pt_fail(err, "%s: %s, not the blob the manifest records", path,
                       S_ISDIR(info.st_mode) ? "is a directory"
                                             : "is not a regular file");
    }
    if ((uint64_t)info.st_size != blob->bytes) {
        close(fd);
        return pt_fail(err, "%s: %lld bytes, the manifest records %" PRIu64
                       " (truncated or overwritten)", path,
                       (long long)info.st_size, blob->bytes);
    }
    if (blob->bytes > 0) {
        void *mapped = mmap(NULL, blob->bytes, PROT_READ, MAP_PRIVATE, fd, 0);
        if (mapped == MAP_FAILED) {
            int saved = errno;
            close(fd);
            return pt_fail(err, "%s: cannot map: %s", path, strerror(saved));
        }
        *map = mapped;
    }
    close(fd);
    uint32_t crc = pt_crc32(*map, blob->bytes);
    if (crc != blob->crc32) {
        if (*map != NULL)
            munmap((void *)*map, blob->bytes);
        *map = NULL;
        return pt_fail(err, "%s: checksum mismatch: CRC-32 %08" PRIx32 ", the "
                       "manifest records %08" PRIx32 " (the file is corrupt)",
                       path, crc, blob->crc32);
    }
    return 0;
}

static void unmap_blob(const unsigned char *map, const checkpoint_blob *blob)
{
    if (map != NULL)
        munmap((void *)map, blob->bytes);
}

int checkpoint_verify_observed(const char *dir, checkpoint_progress progress,
                               void *data, pt_error *err)
{
    checkpoint_manifest manifest;
    if (checkpoint_read_manifest(dir, &manifest, err) != 0)
        return -1;
    uint64_t total = 0, done = 0;
    for (int b = 0; b < manifest.blob_count; b++)
        total += manifest.blobs[b].bytes;
    for (int b = 0; b < manifest.blob_count; b++) {
        const unsigned char *map;
        if (map_verified_blob(dir, &manifest, &manifest.blobs[b], &map,
                              err) != 0)
            return -1;
        unmap_blob(map, &manifest.blobs[b]);
        done += manifest.blobs[b].bytes;
        if (progress != NULL)
            progress("checked", done, total, b + 1, manifest.blob_count,
                     data);
    }
    return 0;
}

int checkpoint_verify(const char *dir, pt_error *err)
{
    return checkpoint_verify_observed(dir, NULL, NULL, err);
}

static int find_blob(const char *dir, const checkpoint_manifest *m,
                     const char *name, const checkpoint_blob **out,
                     pt_error *err)
{
    for (int b = 0; b < m->blob_count; b++)
        if (strcmp(m->blobs[b].name, name) == 0) {
            *out = &m->blobs[b];
            return 0;
        }
    char held[512] = "";
    for (int b = 0; b < m->blob_count; b++) {
        size_t used = strlen(held);
        snprintf(held + used, sizeof held - used, "%s%s", b ? ", " : "",
                 m->blobs[b].name);
    }
    return pt_fail(err, "%s/%s: no blob named \"%s\" (it holds: %s)", dir,
                   CHECKPOINT_MANIFEST, name, m->blob_count ? held : "none");
}

int checkpoint_blob_size(const char *dir, const char *name, uint64_t *bytes,
                         pt_error *err)
{
    checkpoint_manifest manifest;
    const checkpoint_blob *blob = NULL;
    if (checkpoint_read_manifest(dir, &manifest, err) != 0 ||
        find_blob(dir, &manifest, name, &blob, err) != 0)
        return -1;
    *bytes = blob->bytes;
    return 0;
}

int checkpoint_read_blob(const char *dir, const char *name, void *buffer,
                         size_t size, pt_error *err)
{
    checkpoint_manifest manifest;
    const checkpoint_blob *blob = NULL;
    if (checkpoint_read_manifest(dir, &manifest, err) != 0 ||
        find_blob(dir, &manifest, name, &blob, err) != 0)
        return -1;
    if (blob->bytes != size)
        return pt_fail(err, "%s: blob \"%s\" holds %" PRIu64 " bytes, the "
                       "buffer to restore it into has %zu", dir, name,
                       blob->bytes, size);
    const unsigned char *map;
    if (map_verified_blob(dir, &manifest, blob, &map, err) != 0)
        return -1;
    if (size > 0)
        memcpy(buffer, map, size);
    unmap_blob(map, blob);
    return 0;
}
