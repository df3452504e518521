/*
 * Private helpers of the data half of the executor (dataset writer, prep,
 * checkpoints): little-endian encoding and crash-safe file publishing.
 * Not part of the public interface; executor/data.h is.
 */
#ifndef PARTITA_EXECUTOR_DATA_IO_H
#define PARTITA_EXECUTOR_DATA_IO_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"

/* Little-endian loads and stores at any alignment. */
uint64_t load_le(const unsigned char *bytes, size_t width);
void store_le(unsigned char *bytes, uint64_t value, size_t width);

/* Writes all of data, retrying short writes and EINTR; 0 or -1 (errno). */
int write_fully(int fd, const void *data, size_t size);

/* Creates an empty temporary file beside target ("target.tmp.XXXXXX"),
 * names it in temp_path and returns its descriptor, or -1 with err. */
int temp_file_beside(const char *target, char *temp_path, size_t temp_size,
                     pt_error *err);

/* fsyncs and closes fd (before a rename: otherwise a crash can leave the
 * new name on an empty or partial file). On failure the temporary file is
 * removed. fd is closed either way. */
int finish_temp_file(int fd, const char *temp_path, pt_error *err);
/* Renames a finished temporary file to target; removes it on failure. */
int rename_into_place(const char *temp_path, const char *target,
                      pt_error *err);
/* finish_temp_file, then rename_into_place. */
int publish_temp_file(int fd, const char *temp_path, const char *target,
                      pt_error *err);

/* Writes data to target through a temporary file, fsync and rename; no
 * file is left under either name on failure. */
int write_file_atomically(const char *target, const void *data, size_t size,
                          pt_error *err);

/* fsyncs a directory so that renames and creations inside it last. */
int sync_directory(const char *dir, pt_error *err);

#endif
