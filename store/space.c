/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Free space. Writes are refused with ENOSPC while the host file system
 * still has room, so that what was accepted can always be stored and
 * committed: a margin is kept back for metadata, the SQLite journals and
 * cleaning up (unlink, truncate, delete and the reaper always proceed).
 * Data held in memory (dirty blocks) counts as used until it is stored.
 */

#include <errno.h>
#include <sys/statvfs.h>

#include "store-internal.h"

#define SPACE_CHECK_INTERVAL_USEC 100000
/* Each SQLite journal may grow by a few MiB before its checkpoint. */
#define SPACE_MARGIN_MIN (8ull << 20)
#define SPACE_MARGIN_MAX (256ull << 20)

static void space_refresh(Store *s) {
        struct statvfs sv;

        if (fstatvfs(s->dir_fd, &sv) < 0)
                return;
        s->space.free_bytes = (uint64_t) sv.f_bavail * sv.f_frsize;
        s->space.total_bytes = (uint64_t) sv.f_blocks * sv.f_frsize;
        s->space.checked_usec = now_usec();
}

uint64_t space_margin_of(uint64_t total_bytes) {
        return MIN(MAX(total_bytes / 32, (uint64_t) SPACE_MARGIN_MIN), (uint64_t) SPACE_MARGIN_MAX);
}

uint64_t space_margin(Store *s) {
        return space_margin_of(s->space.total_bytes);
}

static bool space_fits(Store *s, uint64_t bytes, SpaceUse use) {
        uint64_t margin = space_margin(s), needed;

        /* Metadata may use half of the margin, cleaning up all of it. */
        if (use == SPACE_METADATA)
                margin /= 2;
        needed = bytes + s->space.held_bytes + margin;
        return s->space.free_bytes >= needed;
}

int space_check(Store *s, uint64_t bytes, SpaceUse use) {
        MUTEX_LOCKED(&s->space.lock);

        if (use == SPACE_CLEANUP)
                return 0;
        if (now_usec() - s->space.checked_usec > SPACE_CHECK_INTERVAL_USEC)
                space_refresh(s);
        if (space_fits(s, bytes, use))
                return 0;
        /* Space may have come back since the last look. */
        space_refresh(s);
        return space_fits(s, bytes, use) ? 0 : -ENOSPC;
}

void space_hold(Store *s, uint64_t bytes) {
        MUTEX_LOCKED(&s->space.lock);
        s->space.held_bytes += bytes;
}

void space_release(Store *s, uint64_t bytes) {
        MUTEX_LOCKED(&s->space.lock);
        s->space.held_bytes -= MIN(s->space.held_bytes, bytes);
}
