/*
 * A bump allocator over one reservation of address space that the kernel
 * is asked to back with huge pages. The asymmetric search's tables fill
 * megabytes a few kilobytes at a time, and every first touch of a small
 * page is a page fault (on a virtual machine among the dearest things a
 * search does); a huge page is one fault for 2 MiB. Where the kernel
 * does not give huge pages the region still works, page by page, and
 * where no address space can be reserved its callers fall back to
 * malloc (region_take answers NULL).
 */
#include "planner/internal.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define REGION_ALIGN 64

void region_open(region *r, size_t reserve)
{
    *r = (region){0};
    void *base = mmap(NULL, reserve, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (base == MAP_FAILED)
        return;
#ifdef MADV_HUGEPAGE
    madvise(base, reserve, MADV_HUGEPAGE); /* advice: may be refused */
#endif
    r->base = base;
    r->reserved = reserve;
}

void *region_take(region *r, size_t bytes)
{
    size_t start = (r->used + REGION_ALIGN - 1) & ~(size_t)(REGION_ALIGN - 1);
    if (r->base == NULL || bytes > r->reserved - start ||
        start > r->reserved)
        return NULL;
    r->used = start + bytes;
    return r->base + start;
}

bool region_holds(const region *r, const void *p)
{
    uintptr_t at = (uintptr_t)p, base = (uintptr_t)r->base;
    return r->base != NULL && at >= base && at - base < r->reserved;
}

void region_release(region *r, void *p)
{
    if (!region_holds(r, p))
        free(p);
}

void region_reset(region *r)
{
    r->used = 0;
}

void region_close(region *r)
{
    if (r->base != NULL)
        munmap(r->base, r->reserved);
    *r = (region){0};
}
