/*
 * The cost model's notes: what the user should know about how the
 * profiles were stretched to price a plan. Every pricing step may add
 * one; this module only keeps the list (so pricing and the context that
 * owns the profiles do not call each other in a circle).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "costmodel/internal.h"

void costmodel_add_note(costmodel *cm, const char *format, ...)
{
    char text[sizeof cm->notes[0]];
    va_list args;
    va_start(args, format);
    vsnprintf(text, sizeof text, format, args);
    va_end(args);

    for (int i = 0; i < cm->note_count; i++)
        if (strcmp(cm->notes[i], text) == 0)
            return;
    if (cm->note_count >= COSTMODEL_MAX_NOTES)
        return;
    if (cm->note_count == COSTMODEL_MAX_NOTES - 1)
        pt_copy_string(text, sizeof text,
                       "further notes left out (the list is full)");
    pt_copy_string(cm->notes[cm->note_count], sizeof cm->notes[0], text);
    cm->note_count++;
}
