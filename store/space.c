/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Free space. Writes are refused with ENOSPC while the host file system
 * still has room, so that what was accepted can always be stored and
 * committed: a margin is kept back for metadata, the SQLite journals and
 * cleaning up (unlink, truncate, delete and the reaper always proceed).
 * Data held in memory (dirty blocks) counts as used until it is stored.
 *
 * Each process knows only what it holds itself: several writing at once
 * could each take what is free. Near the margin every check looks at the
 * disk again, and writers keep little in memory (space_low()), so that
 * what the others have stored is seen and what they hold stays small.
 *
 * The margin only holds while the store is the one filling the disk. For
 * when something else fills it, the store keeps a reserve file: space
 * taken while there is plenty, given back when the disk is nearly full,
 * so that the store can still open its databases (SQLite must extend the
 * WAL index even to read), delete and reap; made again once there is room.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "fd-util.h"
#include "store-internal.h"
#include "time-util.h"

#define SPACE_CHECK_INTERVAL_USEC 100000
/* Free space above the margin under which the store is low on space: what
 * four writers may each hold in memory otherwise (DIRTY_MAX blocks). */
#define SPACE_LOW_BYTES (256ull << 20)
/* Each SQLite journal may grow by a few MiB before its checkpoint. */
#define SPACE_MARGIN_MIN (8ull << 20)
#define SPACE_MARGIN_MAX (256ull << 20)
#define RESERVE_FILE "reserve"
#define RESERVE_MAX (16ull << 20)

uint64_t space_margin_of(uint64_t total_bytes) {
        return MIN(MAX(total_bytes / 32, (uint64_t) SPACE_MARGIN_MIN), (uint64_t) SPACE_MARGIN_MAX);
}

uint64_t space_reserve_of(uint64_t total_bytes) {
        return MIN(space_margin_of(total_bytes) / 2, (uint64_t) RESERVE_MAX);
}

/* Made whole before it gets its name: a reserve file is never short. */
static void reserve_make(int dir_fd, uint64_t size) {
        _cleanup_close_ int fd = -EBADF;
        char path[64];

        fd = openat(dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
        if (fd < 0)
                return;         /* a file system without O_TMPFILE: no reserve */
        if (fallocate(fd, 0, 0, (off_t) size) < 0)
                return;
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        (void) linkat(AT_FDCWD, path, dir_fd, RESERVE_FILE, AT_SYMLINK_FOLLOW); /* EEXIST: made meanwhile */
}

/* Gives the reserve back when free space is nearly gone (1 if it did),
 * makes it when there is room for it above the margin. */
static int reserve_adjust(int dir_fd, uint64_t free_bytes, uint64_t total_bytes) {
        uint64_t margin = space_margin_of(total_bytes), size = space_reserve_of(total_bytes);
        struct stat st;

        if (free_bytes < margin / 4)
                return unlinkat(dir_fd, RESERVE_FILE, 0) >= 0;
        if (free_bytes >= margin + size && fstatat(dir_fd, RESERVE_FILE, &st, AT_SYMLINK_NOFOLLOW) < 0 &&
            errno == ENOENT)
                reserve_make(dir_fd, size);
        return 0;
}

/* What anyone may write: root's share of the free blocks is not counted,
 * nor (ext4) those kept for its own metadata, which nobody may write. */
static int statvfs_bytes(int dir_fd, uint64_t *ret_free, uint64_t *ret_total) {
        struct statvfs sv;

        if (fstatvfs(dir_fd, &sv) < 0)
                return -errno;
        *ret_free = (uint64_t) sv.f_bavail * sv.f_frsize;
        *ret_total = (uint64_t) sv.f_blocks * sv.f_frsize;
        return 0;
}

uint64_t space_reserve_held(int dir_fd) {
        struct stat st;

        if (fstatat(dir_fd, RESERVE_FILE, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
                return 0;
        return (uint64_t) st.st_size;
}

static void space_refresh(Store *s) {
        uint64_t free_bytes = 0, total_bytes = 0;

        if (statvfs_bytes(s->dir_fd, &free_bytes, &total_bytes) < 0)
                return;
        if (reserve_adjust(s->dir_fd, free_bytes, total_bytes) > 0 &&
            statvfs_bytes(s->dir_fd, &free_bytes, &total_bytes) < 0)
                return;
        s->space.free_bytes = free_bytes;
        s->space.total_bytes = total_bytes;
        s->space.checked_usec = monotonic_usec();
}

void space_update(Store *s) {
        MUTEX_LOCKED(&s->space.lock);
        space_refresh(s);
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

static bool space_is_low(Store *s) {
        return s->space.free_bytes < space_margin(s) + SPACE_LOW_BYTES;
}

bool space_low(Store *s) {
        MUTEX_LOCKED(&s->space.lock);
        return space_is_low(s);
}

/* Whether size bytes can be written now, asked of the file system: the
 * blocks a file system keeps for root (ext4: 5% unless tune2fs said
 * otherwise) are not in what statvfs() says anyone may write, and only the
 * file system knows whether this process may write them and how many it
 * keeps for itself. */
static bool space_probe(int dir_fd, uint64_t size) {
        _cleanup_close_ int fd = openat(dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);

        return fd >= 0 && fallocate(fd, 0, 0, (off_t) size) >= 0;
}

static int space_check_cleanup(Store *s) {
        uint64_t floor = space_reserve_of(s->space.total_bytes) / 4, now;

        if (space_is_low(s))
                space_refresh(s);
        if (s->space.free_bytes >= floor)
                return 0;
        /* What everyone may write is gone; root's share may be left, on
         * a disk that users filled. Asked at most so often: what cleaning
         * up writes meanwhile is a few rows. */
        now = monotonic_usec();
        if (now - s->space.probed_usec >= SPACE_CHECK_INTERVAL_USEC) {
                s->space.probe_fits = space_probe(s->dir_fd, floor);
                s->space.probed_usec = now;
        }
        return s->space.probe_fits ? 0 : -ENOSPC;
}

int space_check(Store *s, uint64_t bytes, SpaceUse use) {
        MUTEX_LOCKED(&s->space.lock);

        /* Removing a name of a layer below adds a row that hides it: on a
         * disk another program filled, cleaning up stops at a floor, kept
         * for the commit of what it did and for the store's own deletes
         * and reaps, which free space whatever the layers hold. */
        if (use == SPACE_CLEANUP)
                return space_check_cleanup(s);
        if (space_is_low(s) || monotonic_usec() - s->space.checked_usec > SPACE_CHECK_INTERVAL_USEC)
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

void space_used(Store *s, uint64_t bytes) {
        MUTEX_LOCKED(&s->space.lock);
        s->space.free_bytes -= MIN(s->space.free_bytes, bytes);
}
