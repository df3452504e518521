/*
 * The search's memo tables: open addressing with linear probing over a
 * word-at-a-time multiplicative hash; keys and values in one growing
 * arena.
 */
#include "planner/internal.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

uint64_t memo_hash(const void *key, size_t length)
{
    /* eight bytes at a time, each mixed in by a multiply and a shift */
    const unsigned char *bytes = key;
    uint64_t hash = 0x9e3779b97f4a7c15ULL ^ length;
    size_t i = 0;
    for (; i + 8 <= length; i += 8) {
        uint64_t word;
        memcpy(&word, bytes + i, sizeof word);
        hash = (hash ^ word) * 0xff51afd7ed558ccdULL;
        hash ^= hash >> 32;
    }
    for (; i < length; i++)
        hash = (hash ^ bytes[i]) * 0xc4ceb9fe1a85ec53ULL;
    hash ^= hash >> 29;
    hash *= 0x94d049bb133111ebULL;
    return hash ^ (hash >> 32);
}

void *memo_find(const memo_table *table, const void *key, size_t length,
                uint64_t hash)
{
    if (table->slot_count == 0)
        return NULL;
    size_t mask = table->slot_count - 1;
    for (size_t i = hash & mask;; i = (i + 1) & mask) {
        const memo_entry *entry = &table->slots[i];
        if (entry->key_length == 0)
            return NULL;
        if (entry->hash == hash && entry->key_length == length &&
            memcmp(table->arena + entry->key_offset, key, length) == 0)
            return table->arena + entry->value_offset;
    }
}

/* A huge memo's slot arrays: each growth takes a new one from the
 * reservation (zero: never touched before), the old ones left there. */
#define SLOT_HUGE_RESERVE ((size_t)64 << 20)

static memo_entry *new_slots(memo_table *table, size_t count)
{
    if (table->huge) {
        if (table->slot_room.base == NULL && table->slot_count == 0)
            region_open(&table->slot_room, SLOT_HUGE_RESERVE);
        memo_entry *slots = region_take(&table->slot_room,
                                        count * sizeof *slots);
        if (slots != NULL)
            return slots;
    }
    return calloc(count, sizeof(memo_entry));
}

static int grow_slots(memo_table *table)
{
    size_t count = table->slot_count ? 2 * table->slot_count : 1024;
    memo_entry *slots = new_slots(table, count);
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < table->slot_count; i++) {
        const memo_entry *entry = &table->slots[i];
        if (entry->key_length == 0)
            continue;
        size_t j = entry->hash & (count - 1);
        while (slots[j].key_length != 0)
            j = (j + 1) & (count - 1);
        slots[j] = *entry;
    }
    region_release(&table->slot_room, table->slots);
    table->slots = slots;
    table->slot_count = count;
    return 0;
}

/* An arena past this size moves to a reservation of address space
 * advised for huge pages (region.c says why), this large or more (then
 * grown by mremap as any arena: a reservation counts against a strict
 * overcommit limit, and the symmetric search's workers each hold
 * memos). */
#define ARENA_HUGE_FROM ((size_t)256 << 10)
#define ARENA_HUGE_RESERVE ((size_t)32 << 20)

/* The arena moved into a reservation of at least `size` bytes advised
 * for huge pages; 0, or -1 when none could be made (it stays). */
static int arena_to_huge(memo_table *table, size_t size)
{
    size_t reserve = size > ARENA_HUGE_RESERVE ? size : ARENA_HUGE_RESERVE;
    unsigned char *arena = mmap(NULL, reserve, PROT_READ | PROT_WRITE,
                                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                                -1, 0);
    if (arena == MAP_FAILED)
        return -1;
#ifdef MADV_HUGEPAGE
    madvise(arena, reserve, MADV_HUGEPAGE); /* advice: may be refused */
#endif
    if (table->arena != NULL) {
        memcpy(arena, table->arena, table->arena_used);
        munmap(table->arena, table->arena_size);
    }
    table->arena = arena;
    table->arena_size = reserve;
    table->arena_huge = true;
    return 0;
}

/* The arena grown to `size` bytes (at least). */
static int arena_grow(memo_table *table, size_t size)
{
    if (!table->arena_huge && (table->huge || table->arena != NULL) &&
        (table->huge || size > ARENA_HUGE_FROM) &&
        arena_to_huge(table, size) == 0)
        return 0;
    /* mapped pages of their own: growing moves the mapping, not the
       bytes (a realloc would copy them into pages touched anew) */
    void *arena = table->arena == NULL
                      ? mmap(NULL, size, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                      : mremap(table->arena, table->arena_size, size,
                               MREMAP_MAYMOVE);
    if (arena == MAP_FAILED)
        return -1;
    table->arena = arena;
    table->arena_size = size;
    return 0;
}

/* Room for `length` bytes in the arena, 8-byte aligned; its offset. */
static int arena_take(memo_table *table, size_t length, size_t *offset)
{
    size_t start = (table->arena_used + 7) & ~(size_t)7;
    if (start + length > table->arena_size) {
        size_t size = table->arena_size ? 2 * table->arena_size : 65536;
        while (size < start + length)
            size *= 2;
        if (arena_grow(table, size) != 0)
            return -1;
    }
    *offset = start;
    table->arena_used = start + length;
    return 0;
}

void *memo_insert(memo_table *table, const void *key, size_t length,
                  uint64_t hash, size_t value_length)
{
    /* at most half full, so probes stay short */
    if (2 * (table->entry_count + 1) > table->slot_count &&
        grow_slots(table) != 0)
        return NULL;
    memo_entry entry = {hash, 0, length, 0};
    if (arena_take(table, length, &entry.key_offset) != 0 ||
        arena_take(table, value_length, &entry.value_offset) != 0)
        return NULL;
    memcpy(table->arena + entry.key_offset, key, length);
    size_t mask = table->slot_count - 1;
    size_t i = hash & mask;
    while (table->slots[i].key_length != 0)
        i = (i + 1) & mask;
    table->slots[i] = entry;
    table->entry_count++;
    return table->arena + entry.value_offset;
}

void memo_clear(memo_table *table)
{
    if (table->slots != NULL)
        memset(table->slots, 0, table->slot_count * sizeof *table->slots);
    table->entry_count = 0;
    table->arena_used = 0;
}

size_t memo_bytes(const memo_table *table)
{
    return table->entry_count * 2 * sizeof *table->slots + table->arena_used;
}

void memo_free(memo_table *table)
{
    bool huge = table->huge;
    region_release(&table->slot_room, table->slots);
    region_close(&table->slot_room);
    if (table->arena != NULL)
        munmap(table->arena, table->arena_size);
    memset(table, 0, sizeof *table);
    table->huge = huge;
}
