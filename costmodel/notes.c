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
    costmodel_add_note_text(cm, text);
}

void costmodel_add_note_text(costmodel *cm, const char *text)
{
    for (int i = 0; i < cm->note_count; i++)
        if (strncmp(cm->notes[i], text, sizeof cm->notes[0] - 1) == 0)
            return;
    if (cm->note_count >= COSTMODEL_MAX_NOTES)
        return;
    pt_copy_string(cm->notes[cm->note_count], sizeof cm->notes[0],
                   cm->note_count == COSTMODEL_MAX_NOTES - 1
                       ? "further notes left out (the list is full)"
                       : text);
    cm->note_count++;
}
