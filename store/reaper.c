/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The reaper: forgets deleted subvolumes, drops the layers nothing
 * reaches, folds layers into their only child and frees the blocks nothing
 * references (mark and sweep over the live layers' block sets).
 *
 * Blocks are unindexed only while the reaper holds the GC lock exclusively.
 * Writers hold it shared from their first new reference to a block until
 * their commit, so that no block is freed between a writer's dedup hit and
 * the commit that makes its reference visible to the mark phase. Once
 * unindexed, a block is reached by no writer: its record is punched out
 * after the lock is let go. A second
 * lock, gc-intent, keeps new writers from starving a waiting reaper.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/ioprio.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc-util.h"
#include "fd-util.h"
#include "sqlite-util.h"
#include "store-internal.h"
#include "time-util.h"

/* Layer files with no catalog row are removed only once they are this old:
 * a subvolume being created writes its layer before its row commits. */
#define ORPHAN_LAYER_AGE_SEC 60

static int open_lock(Store *s, const char *name) {
        int fd = openat(s->locks_fd, name, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        return fd < 0 ? -errno : fd;
}

static int flock_retry(int fd, int op) {
        while (flock(fd, op) < 0)
                if (errno != EINTR)
                        return -errno;
        return 0;
}

/* Takes gc-intent, then gc, both with op (LOCK_SH or LOCK_EX). */
static int gc_locks_take(Store *s, int op, int *ret_intent, int *ret_gc) {
        _cleanup_close_ int intent = -EBADF, gc = -EBADF;
        int r;

        intent = open_lock(s, "gc-intent.lock");
        if (intent < 0)
                return intent;
        r = flock_retry(intent, op);
        if (r < 0)
                return r;
        gc = open_lock(s, "gc.lock");
        if (gc < 0)
                return gc;
        r = flock_retry(gc, op);
        if (r < 0)
                return r;
        *ret_intent = TAKE_FD(intent);
        *ret_gc = TAKE_FD(gc);
        return 0;
}

int gc_lock_shared(Store *s, int *ret_fd) {
        _cleanup_close_ int intent = -EBADF;

        /* The intent lock is only passed through: a waiting reaper holds it
         * exclusively and so keeps new writers out until it has run. */
        return gc_locks_take(s, LOCK_SH, &intent, ret_fd);
}

/* As gc_lock_shared(), but -EAGAIN at once where that would wait: for
 * work that can as well be left to the next commit. */
int gc_try_lock_shared(Store *s, int *ret_fd) {
        _cleanup_close_ int intent = -EBADF;

        return gc_locks_take(s, LOCK_SH | LOCK_NB, &intent, ret_fd);
}

void gc_unlock(int *fd) {
        *fd = safe_close(*fd);
}

/* ---- a set of digests, open addressing ---- */

typedef struct DigestSet {
        Digest *slots;
        uint8_t *used;
        size_t n, capacity;
} DigestSet;

static void digest_set_done(DigestSet *set) {
        free(set->slots);
        free(set->used);
}

static size_t digest_hash(const Digest *d, size_t capacity) {
        uint64_t h;

        memcpy(&h, d->bytes, sizeof h); /* digests are uniform already */
        return (size_t) (h & (capacity - 1));
}

static int digest_set_add(DigestSet *set, const Digest *d);

static int digest_set_grow(DigestSet *set) {
        DigestSet bigger = { .capacity = MAX(set->capacity * 2, 1024u) };
        int r;

        bigger.slots = malloc(bigger.capacity * sizeof *bigger.slots);
        bigger.used = calloc(bigger.capacity, 1);
        if (!bigger.slots || !bigger.used) {
                digest_set_done(&bigger);
                return -ENOMEM;
        }
        for (size_t i = 0; i < set->capacity; i++)
                if (set->used[i]) {
                        r = digest_set_add(&bigger, &set->slots[i]);
                        if (r < 0) {
                                digest_set_done(&bigger);
                                return r;
                        }
                }
        digest_set_done(set);
        *set = bigger;
        return 0;
}

static bool digest_set_contains(const DigestSet *set, const Digest *d) {
        if (set->capacity == 0)
                return false;
        for (size_t i = digest_hash(d, set->capacity);; i = (i + 1) & (set->capacity - 1)) {
                if (!set->used[i])
                        return false;
                if (memcmp(set->slots[i].bytes, d->bytes, sizeof d->bytes) == 0)
                        return true;
        }
}

static int digest_set_add(DigestSet *set, const Digest *d) {
        int r;

        if ((set->n + 1) * 2 > set->capacity) {
                r = digest_set_grow(set);
                if (r < 0)
                        return r;
        }
        for (size_t i = digest_hash(d, set->capacity);; i = (i + 1) & (set->capacity - 1)) {
                if (!set->used[i]) {
                        set->used[i] = 1;
                        set->slots[i] = *d;
                        set->n++;
                        return 0;
                }
                if (memcmp(set->slots[i].bytes, d->bytes, sizeof d->bytes) == 0)
                        return 0;
        }
}

/* ---- settings, and the pace of a reaper ---- */

/* A damaged setting (logged, and named by scrub) is not used: its default
 * is, until it is set again. */
static int setting_get(Store *s, const char *key, int64_t *ret) {
        int r;

        r = catalog_meta_get_int(s, key, ret);
        if (r == -EUCLEAN) {
                *ret = 0;
                return 0;
        }
        return r;
}

int store_reaper_settings(Store *s, StoreReaperSettings *ret) {
        int64_t paused = 0, rate = 0, hurry_until = 0;
        uint64_t now = now_usec();
        int r;

        r = setting_get(s, "reaper_paused", &paused);
        if (r >= 0)
                r = setting_get(s, "reaper_rate", &rate);
        if (r >= 0)
                r = setting_get(s, "reaper_hurry_until", &hurry_until);
        if (r < 0)
                return r;
        *ret = (StoreReaperSettings) {
                .paused = paused != 0,
                .rate_bytes_per_sec = (uint64_t) MAX(rate, 0),
                /* Wall clock time, which every process reads alike; a
                 * clock that jumps ends a hurry early, never late. */
                .hurried = hurry_until > 0 && (uint64_t) hurry_until > now &&
                           (uint64_t) hurry_until - now <= STORE_REAPER_HURRY_USEC,
        };
        return 0;
}

int store_reaper_hurry(Store *s, bool hurry) {
        return catalog_meta_set_int(s, "reaper_hurry_until", hurry ? (int64_t) (now_usec() + STORE_REAPER_HURRY_USEC) : 0);
}

int store_reaper_set_paused(Store *s, bool paused) {
        return catalog_meta_set_int(s, "reaper_paused", paused);
}

int store_reaper_set_rate(Store *s, uint64_t bytes_per_sec) {
        if (bytes_per_sec > (uint64_t) INT64_MAX)
                return -EINVAL;
        return catalog_meta_set_int(s, "reaper_rate", (int64_t) bytes_per_sec);
}

/* Keeps a reaper within its rate, and stops it when it is paused. The
 * settings are read again every half second. */
struct Pace {
        Store *store;
        StoreReaperSettings settings;
        uint64_t checked_usec;
        uint64_t start_usec;
        uint64_t bytes;
        /* What folds wrote: it counts against the rate, not as progress. */
        uint64_t written;
        /* Progress: bytes freed of those the deleted subvolumes and dead
         * layers held at the start (an estimate: the sum of their layers'
         * counts). */
        store_progress_cb progress;
        void *userdata;
        uint64_t total;
        uint64_t progress_usec;
};

#define PROGRESS_USEC (200 * 1000)

#define PACE_CHECK_USEC 500000

static int pace_start(Store *s, Pace *ret) {
        *ret = (Pace) { .store = s, .start_usec = monotonic_usec() };
        ret->checked_usec = ret->start_usec;
        return store_reaper_settings(s, &ret->settings);
}

static int pace_refresh(Pace *p, uint64_t now) {
        int r;

        if (now - p->checked_usec <= PACE_CHECK_USEC)
                return 0;
        r = store_reaper_settings(p->store, &p->settings);
        if (r < 0)
                return r;
        p->checked_usec = now;
        return 0;
}

/* Sleeps until the bytes freed and written so far are within the rate, a
 * second at most at a time, so that a new rate or a pause is seen soon. */
static void pace_throttle(Pace *p, uint64_t now) {
        uint64_t due;

        if (p->settings.rate_bytes_per_sec == 0 || p->settings.hurried)
                return;
        due = p->start_usec + (p->bytes + p->written) * 1000000 / p->settings.rate_bytes_per_sec;
        if (due > now)
                (void) usleep((useconds_t) MIN(due - now, (uint64_t) 1000000));
}

int pace_step(Pace *p, uint64_t bytes) {
        uint64_t now = monotonic_usec();
        int r;

        r = pace_refresh(p, now);
        if (r < 0)
                return r;
        if (p->settings.paused)
                return -EAGAIN;
        p->bytes += bytes;
        if (p->progress && ratelimit_due(&p->progress_usec, PROGRESS_USEC, false))
                p->progress(MIN(p->bytes, p->total), p->total, p->userdata);
        pace_throttle(p, now);
        return 0;
}

void pace_wrote(Pace *p, uint64_t bytes) {
        uint64_t now = monotonic_usec();

        (void) pace_refresh(p, now);
        p->written += bytes;
        pace_throttle(p, now);
}

/* ---- what a reap took away and has not freed yet ---- */

/* Dropping a layer's row and unindexing a block hide their bytes from the
 * space estimate before the files and records are gone. A reap paused,
 * killed or crashed in between would leave them freed by no one: the
 * estimate would show nothing waiting, and the daemon starts reaps by it.
 * So the reap counts them here, in the transaction that hides them, and
 * forgets them once it has freed everything. */
#define META_PENDING "reaper_pending_bytes"

uint64_t reaper_pending_bytes(Store *s) {
        int64_t v = 0;

        return catalog_meta_get_int(s, META_PENDING, &v) >= 0 && v > 0 ? (uint64_t) v : 0;
}

static int pending_set(Store *s, uint64_t bytes) {
        return catalog_meta_set_int(s, META_PENDING, (int64_t) MIN(bytes, (uint64_t) INT64_MAX));
}

/* ---- phases ---- */

static int forget_deleted_subvolumes(Store *s, uint64_t *ret_n) {
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_exec(s->catalog, "DELETE FROM subvolumes WHERE deleted = 1");
        if (r < 0)
                return r;
        *ret_n = (uint64_t) sqlite3_changes(s->catalog);
        return 0;
}

static int drop_dead_layers(Store *s, Pace *pace, StoreReapStats *stats) {
        _cleanup_free_ uint64_t *ids = NULL;
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        size_t n = 0;
        int r;

        uint64_t hidden = 0;

        r = catalog_dead_layers(s, &ids, &n);
        if (r < 0 || n == 0)
                return r;
        for (size_t i = 0; i < n; i++)
                hidden += layer_reclaimable_bytes(s, ids[i]);

        {
                CATALOG_LOCKED(s);
                r = sqlite_begin(s->catalog);
                if (r < 0)
                        return r;
                r = sqlite_prepare(s->catalog, "DELETE FROM layers WHERE id = ?1", &st);
                for (size_t i = 0; r >= 0 && i < n; i++) {
                        sqlite3_bind_int64(st, 1, (sqlite3_int64) ids[i]);
                        r = sqlite_step_done(st);
                }
                if (r >= 0)
                        r = pending_set(s, reaper_pending_bytes(s) + hidden);
                if (r >= 0)
                        r = sqlite_commit(s->catalog);
                if (r < 0) {
                        sqlite_rollback(s->catalog);
                        return r;
                }
        }

        /* The rows are gone first: a crash now leaves files without rows,
         * which the next reap removes. */
        for (size_t i = 0; i < n; i++) {
                uint64_t bytes = layer_file_bytes(s, ids[i]);

                (void) layer_unlink(s, ids[i]);
                stats->bytes_freed += bytes;
                stats->layers_dropped++;
                r = pace_step(pace, bytes);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Layer files that no catalog row names: left by a crash. */
static int remove_orphan_layer_files(Store *s, StoreReapStats *stats) {
        _cleanup_closedir_ DIR *d = opendir_dup(s->layers_fd);
        struct dirent *de;
        uint64_t now = now_usec() / 1000000;

        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                struct stat st;
                char *end;
                uint64_t id = strtoull(de->d_name, &end, 10);

                if (end == de->d_name || *end != '.')
                        continue;
                if (fstatat(dirfd(d), de->d_name, &st, 0) < 0 ||
                    (uint64_t) st.st_mtime + ORPHAN_LAYER_AGE_SEC > now)
                        continue;
                if (catalog_id_known(s, "layers", id) != 0)
                        continue;
                stats->bytes_freed += (uint64_t) st.st_blocks * 512;
                (void) unlinkat(dirfd(d), de->d_name, 0);
        }
        return 0;
}

static int mark_digests(sqlite3 *db, const char *sql, DigestSet *live, bool *ret_damaged) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_prepare(db, sql, &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                Digest d;

                if (!sqlite3_column_int(st, 1))
                        *ret_damaged = true;
                if (sqlite3_column_bytes(st, 0) != sizeof d.bytes)
                        continue;
                memcpy(d.bytes, sqlite3_column_blob(st, 0), sizeof d.bytes);
                r = digest_set_add(live, &d);
                if (r < 0)
                        return r;
        }
        return r;
}

/* Marks the blocks the layer references. Should a row of its block set be
 * damaged, its digest may be wrong: every digest its extents name is
 * marked too, so that no block in use is ever swept. */
static int mark_layer(Store *s, uint64_t id, DigestSet *live) {
        _cleanup_sqlite_ sqlite3 *db = NULL;
        bool damaged = false;
        int r;

        r = layer_open(s, id, LAYER_READ, &db);
        if (r == -ENOENT)
                return 0;
        if (r < 0)
                return r;
        r = mark_digests(db, layer_has_row_checks(db, "main")
                                     ? "SELECT digest, row_check IS " BLOCKREF_CHECK " FROM blockrefs"
                                     : "SELECT digest, 1 FROM blockrefs",
                         live, &damaged);
        if (r < 0 || !damaged)
                return r;
        block_count_corruption(s);
        return mark_digests(db, "SELECT DISTINCT digest, 1 FROM extents WHERE digest IS NOT NULL", live, &damaged);
}

static int block_row_compare(const void *a, const void *b) {
        const BlockRow *x = a, *y = b;

        if (x->loc.pack != y->loc.pack)
                return x->loc.pack < y->loc.pack ? -1 : 1;
        return x->loc.offset < y->loc.offset ? -1 : x->loc.offset > y->loc.offset;
}

/* Unindexes the blocks the mark phase did not reach, then punches them
 * out of their packs. In that order: after a crash in between, a record
 * is left unindexed (space to reclaim), never an index entry whose data is
 * gone that a writer could deduplicate against. The GC locks (*intent,
 * *gc) are let go in between: no writer can reach an unindexed block, and
 * the punching goes at the reaper's rate, which writers storing blocks
 * must not wait for. */
static int sweep_blocks(Store *s, const DigestSet *live, int *intent, int *gc, Pace *pace,
                        StoreReapStats *stats) {
        _cleanup_free_ BlockRow *dead = NULL;
        size_t n = 0, allocated = 0;
        uint64_t hidden = 0;
        int r;

        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL, *del = NULL, *forget = NULL;

                CATALOG_LOCKED(s);
                r = sqlite_begin(s->catalog);
                if (r < 0)
                        return r;
                r = sqlite_prepare(s->catalog, "SELECT digest, pack, offset, stored_len, raw_len FROM blocks", &st);
                if (r >= 0)
                        r = sqlite_prepare(s->catalog, "DELETE FROM blocks WHERE digest = ?1", &del);
                /* A block freed is forgotten as damaged too. */
                if (r >= 0)
                        r = sqlite_prepare(s->catalog, "DELETE FROM damaged_blocks WHERE digest = ?1", &forget);
                while (r >= 0 && (r = sqlite_step_row(st)) > 0) {
                        Digest d;

                        if (sqlite3_column_bytes(st, 0) != sizeof d.bytes)
                                continue;
                        memcpy(d.bytes, sqlite3_column_blob(st, 0), sizeof d.bytes);
                        if (digest_set_contains(live, &d))
                                continue;
                        if (!GREEDY_REALLOC(dead, allocated, n + 1)) {
                                r = -ENOMEM;
                                break;
                        }
                        dead[n++] = (BlockRow) {
                                .digest = d,
                                .loc = {
                                        .pack = (uint64_t) sqlite3_column_int64(st, 1),
                                        .offset = (uint64_t) sqlite3_column_int64(st, 2),
                                        .stored_len = (uint32_t) sqlite3_column_int(st, 3),
                                        .raw_len = (uint32_t) sqlite3_column_int(st, 4),
                                },
                        };
                        hidden += sizeof(PackRecordHeader) + dead[n - 1].loc.stored_len;
                        sqlite3_bind_blob(del, 1, d.bytes, sizeof d.bytes, SQLITE_STATIC);
                        r = sqlite_step_done(del);
                        if (r >= 0) {
                                sqlite3_bind_blob(forget, 1, d.bytes, sizeof d.bytes, SQLITE_STATIC);
                                r = sqlite_step_done(forget);
                        }
                }
                /* The layers dropped before counted most of these already. */
                if (r >= 0 && hidden > reaper_pending_bytes(s))
                        r = pending_set(s, hidden);
                if (r >= 0)
                        r = sqlite_commit(s->catalog);
                if (r < 0) {
                        sqlite_rollback(s->catalog);
                        return r;
                }
        }
        gc_unlock(gc);
        gc_unlock(intent);

        /* Once unindexed, the blocks are garbage either way: a pause leaves
         * the rest of their records for the reclaim of a later reap. */
        if (n > 0)
                qsort(dead, n, sizeof *dead, block_row_compare);
        for (size_t i = 0, j; i < n; i = j) {
                uint64_t punched = 0;

                /* Paced record by record, punched pack by pack. */
                for (j = i; j < n && dead[j].loc.pack == dead[i].loc.pack; j++) {
                        uint64_t bytes = sizeof(PackRecordHeader) + dead[j].loc.stored_len;

                        r = pace_step(pace, bytes);
                        if (r < 0)
                                return r;
                        stats->blocks_freed++;
                        punched += bytes;
                }
                /* A pack left with no live block that no writer holds
                 * goes whole, below, and counts as its file. */
                r = catalog_pack_has_blocks(s, dead[i].loc.pack);
                if (r == 0)
                        r = pack_is_written(s, dead[i].loc.pack);
                if (r > 0) {
                        r = pack_punch(s, dead[i].loc.pack, dead + i, j - i);
                        stats->bytes_freed += punched;
                        if (r >= 0)
                                r = pending_set(s, reaper_pending_bytes(s) - MIN(reaper_pending_bytes(s), punched));
                }
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Packs without live blocks that no writer holds. */
static int remove_empty_packs(Store *s, StoreReapStats *stats) {
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0;
        int r;

        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;

                CATALOG_LOCKED(s);
                r = sqlite_prepare(s->catalog,
                                   "SELECT id FROM packs WHERE id NOT IN (SELECT DISTINCT pack FROM blocks) "
                                   "AND row_check IS " PACK_CHECK_OF("packs."), &st);
                if (r >= 0)
                        r = sqlite_collect_ids(st, &ids, &n);
                if (r < 0)
                        return r;
        }

        for (size_t i = 0; i < n; i++) {
                _cleanup_close_ int fd = -EBADF;
                _cleanup_stmt_ sqlite3_stmt *del = NULL;
                struct stat st = {};
                char name[32];

                snprintf(name, sizeof name, "%" PRIu64 ".pack", ids[i]);
                fd = openat(s->packs_fd, name, O_RDWR | O_CLOEXEC);
                if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) < 0)
                        continue; /* a writer appends to it */
                /* Its dead blocks, and what a writer stored and never indexed. */
                if (fd >= 0)
                        (void) fstat(fd, &st);
                if (unlinkat(s->packs_fd, name, 0) >= 0)
                        stats->bytes_freed += (uint64_t) st.st_blocks * 512;

                CATALOG_LOCKED(s);
                r = sqlite_prepare(s->catalog, "DELETE FROM packs WHERE id = ?1", &del);
                if (r < 0)
                        return r;
                sqlite3_bind_int64(del, 1, (sqlite3_int64) ids[i]);
                r = sqlite_step_done(del);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Punches out of a pack everything between its indexed records: records a
 * crashed writer appended but never indexed, and duplicates that lost the
 * race to the index. Only packs that no writer holds, and the index is read
 * once the pack is locked: its writer may have indexed blocks until then. */
static int reclaim_pack_gaps(Store *s, uint64_t pack, StoreReapStats *stats) {
        _cleanup_free_ BlockRow *rows = NULL;
        _cleanup_close_ int fd = -EBADF;
        uint64_t end = 0;
        struct stat st;
        char name[32];
        size_t n = 0;
        int r;

        snprintf(name, sizeof name, "%" PRIu64 ".pack", pack);
        fd = openat(s->packs_fd, name, O_RDWR | O_CLOEXEC);
        if (fd < 0)
                return errno == ENOENT ? 0 : -errno;
        if (flock(fd, LOCK_EX | LOCK_NB) < 0)
                return 0; /* a writer appends to it */
        if (fstat(fd, &st) < 0)
                return -errno;
        r = catalog_list_blocks(s, pack, &rows, &n);
        if (r < 0)
                return r;

        for (size_t i = 0; i <= n; i++) {
                uint64_t start = i < n ? rows[i].loc.offset : (uint64_t) st.st_size;

                if (start > end && start - end >= 4096) {
                        if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t) end,
                                      (off_t) (start - end)) < 0)
                                return errno == EOPNOTSUPP ? 0 : -errno;
                }
                if (i < n)
                        end = MAX(end, rows[i].loc.offset + sizeof(PackRecordHeader) + rows[i].loc.stored_len);
        }
        /* Nothing indexed lies past end: a torn record at most. */
        if ((uint64_t) st.st_size > end) {
                if (ftruncate(fd, (off_t) end) < 0)
                        return -errno;
                stats->bytes_freed += (uint64_t) st.st_size - end;
        }
        return 0;
}

static int reclaim_unindexed_records(Store *s, StoreReapStats *stats) {
        _cleanup_free_ uint64_t *packs = NULL;
        size_t n_packs = 0;
        int r;

        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;

                CATALOG_LOCKED(s);
                /* A damaged record names no pack to be believed. */
                r = sqlite_prepare(s->catalog, "SELECT id FROM packs WHERE row_check IS " PACK_CHECK_OF("packs.")
                                               " ORDER BY id", &st);
                if (r >= 0)
                        r = sqlite_collect_ids(st, &packs, &n_packs);
                if (r < 0)
                        return r;
        }
        for (size_t p = 0; p < n_packs; p++) {
                r = reclaim_pack_gaps(s, packs[p], stats);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int collect_garbage(Store *s, Pace *pace, StoreReapStats *stats) {
        _cleanup_close_ int intent = -EBADF, gc = -EBADF;
        _cleanup_free_ uint64_t *live_layers = NULL;
        _cleanup_(digest_set_done) DigestSet live = {};
        size_t n = 0;
        int r;

        r = gc_locks_take(s, LOCK_EX, &intent, &gc);
        if (r < 0)
                return r;

        r = catalog_live_layers(s, &live_layers, &n);
        if (r < 0)
                return r;
        for (size_t i = 0; i < n; i++) {
                r = mark_layer(s, live_layers[i], &live);
                if (r < 0)
                        return r;
        }
        r = sweep_blocks(s, &live, &intent, &gc, pace, stats);
        if (r < 0)
                return r;
        /* Held again: a writer may have stored a block in a pack that
         * looks empty, and not yet indexed it. */
        r = gc_locks_take(s, LOCK_EX, &intent, &gc);
        if (r < 0)
                return r;
        r = remove_empty_packs(s, stats);
        if (r < 0)
                return r;
        return reclaim_unindexed_records(s, stats);
}

/* What there is to free, for progress. */
static uint64_t reclaimable_bytes(Store *s) {
        StoreSpace space;

        return store_space(s, &space) >= 0 ? space.reclaimable_bytes : 0;
}

int reaper_lock(Store *s, bool wait, const char *waiter, pid_t *ret_holder) {
        _cleanup_close_ int lock = -EBADF;
        pid_t holder;
        int r;

        lock = open_lock(s, "reaper.lock");
        if (lock < 0)
                return lock;
        if (flock(lock, LOCK_EX | LOCK_NB) < 0) {
                if (errno != EWOULDBLOCK)
                        return -errno;
                if (read_pid_file(s->locks_fd, "reaper.lock", &holder) < 0)
                        holder = 0;
                if (!wait) {
                        if (ret_holder)
                                *ret_holder = holder;
                        return -EBUSY;
                }
                if (waiter)
                        store_log("%s waits for process %d to finish reaping", waiter, (int) holder);
                r = flock_retry(lock, LOCK_EX);
                if (r < 0)
                        return r;
        }
        r = write_pid_file(lock, "");
        if (r < 0)
                return r;
        return TAKE_FD(lock);
}

/* What the reaper frees follows from the catalog's records of subvolumes
 * and of the layers they stand on: one damaged could make it take live
 * layers for dead. Deleting the subvolume mends it (its record goes; a
 * layer only it stood on is dropped). */
static int catalog_sound(Store *s) {
        CatalogDamage *damage = NULL;
        size_t n = 0;
        int r;

        r = catalog_damaged_records(s, true, &damage, &n, NULL);
        if (r < 0)
                return r;
        catalog_damage_array_free(damage, n);
        if (n == 0)
                return 0;
        store_log("the catalog has %zu damaged records of subvolumes or layers: nothing is freed while it has. "
                  "'cowbox-store scrub' names them; deleting their subvolumes mends it", n);
        return -EUCLEAN;
}

/* The reap itself, by the holder of the reaper's lock. */
static int reap_locked(Store *s, store_progress_cb progress, void *userdata, StoreReapStats *ret) {
        StoreReapStats stats = {};
        Pace pace;
        int r;

        /* A long-lived process (cowboxd) opened the store when there was
         * room: on a disk filled since, the reap needs the reserve. */
        space_update(s);
        r = pace_start(s, &pace);
        if (r >= 0 && pace.settings.paused)
                r = -EAGAIN;
        if (r >= 0 && progress) {
                pace.progress = progress;
                pace.userdata = userdata;
                pace.total = reclaimable_bytes(s);
                progress(0, pace.total, userdata);
        }
        if (r >= 0)
                r = catalog_sound(s);
        if (r >= 0)
                r = forget_deleted_subvolumes(s, &stats.subvolumes_forgotten);
        if (r >= 0)
                r = subvolume_locks_prune(s);
        /* The layers of the subvolumes just forgotten go before the folds:
         * a layer is folded only once it has a single child, and their
         * space is what a fold's copy may need. */
        if (r >= 0)
                r = drop_dead_layers(s, &pace, &stats);
        if (r >= 0)
                r = pace_step(&pace, 0);
        if (r >= 0)
                r = fold_layers(s, &pace, &stats);
        if (r >= 0)
                r = remove_orphan_layer_files(s, &stats);
        if (r >= 0)
                r = collect_garbage(s, &pace, &stats);
        /* Everything hidden is freed now, by this reap or an earlier one. */
        if (r >= 0)
                r = pending_set(s, 0);
        space_update(s);
        if (r >= 0 && progress)
                progress(MAX(pace.bytes, pace.total), MAX(pace.bytes, pace.total), userdata);
        if (ret)
                *ret = stats;
        return r;
}

int store_reap(Store *s, bool wait, store_progress_cb progress, void *userdata, StoreReapStats *ret,
               pid_t *ret_holder) {
        _cleanup_close_ int lock = -EBADF;

        lock = reaper_lock(s, wait, NULL, ret_holder);
        if (lock < 0)
                return lock;
        return reap_locked(s, progress, userdata, ret);
}

/* Takes the reaper's lock for a reap in the background, or returns
 * -EALREADY when another reap waits for it already: that one frees what
 * the running reap leaves, so one waiter is enough. A burst of deletes
 * would otherwise queue a process each, every one with the store open,
 * and those could keep an explicit reap waiting behind them. */
static int reaper_lock_unless_queued(Store *s) {
        _cleanup_close_ int queue = -EBADF;
        int lock;

        lock = reaper_lock(s, false, NULL, NULL);
        if (lock != -EBUSY)
                return lock;
        queue = open_lock(s, "reaper-queue.lock");
        if (queue < 0)
                return queue;
        if (flock(queue, LOCK_EX | LOCK_NB) < 0)
                return errno == EWOULDBLOCK ? -EALREADY : -errno;
        return reaper_lock(s, true, NULL, NULL);
}

/* The background reaper yields to the work that goes on meanwhile: a nice
 * CPU priority and the lowest best-effort I/O priority (not the idle
 * class, which a busy disk could starve for good). The daemon's reaper
 * gets a cgroup of its own instead. */
#define REAPER_NICE 10
#define REAPER_IO_LEVEL 7

static void reaper_yield(void) {
        (void) setpriority(PRIO_PROCESS, 0, REAPER_NICE);
        (void) syscall(SYS_ioprio_set, IOPRIO_WHO_PROCESS, 0, IOPRIO_PRIO_VALUE(IOPRIO_CLASS_BE, REAPER_IO_LEVEL));
}

int store_reap_in_background(Store *s) {
        pid_t pid;
        int status;

        /* Double fork: the reaper is re-parented to init and never becomes
         * a zombie of the caller. */
        pid = fork();
        if (pid < 0)
                return -errno;
        if (pid == 0) {
                _cleanup_free_ char *path = strdup(s->path);
                _cleanup_close_ int lock = -EBADF;
                Store *t = NULL;
                int r;

                /* Here, while the caller waits for us: see store.h. */
                store_close_inherited();
                if (!path || setsid() < 0 || fork() != 0)
                        _exit(EXIT_SUCCESS);
                (void) signal(SIGHUP, SIG_IGN);
                for (int fd = 0; fd < 3; fd++) {
                        int null = open("/dev/null", O_RDWR | O_CLOEXEC);
                        if (null >= 0 && null != fd) {
                                (void) dup2(null, fd);
                                (void) close(null);
                        }
                }
                reaper_yield();
                if (store_open(path, &t) < 0)
                        _exit(EXIT_FAILURE);
                (void) store_log_to_file(t);
                lock = reaper_lock_unless_queued(t);
                r = lock < 0 ? lock : reap_locked(t, NULL, NULL, NULL);
                if (r == -EALREADY)
                        r = 0;
                if (r < 0 && r != -EAGAIN) /* paused: it waits for --resume */
                        store_log("reaping in the background failed: %s; the next reap takes it up",
                                  strerror(-r));
                store_close(t);
                _exit(r < 0 ? EXIT_FAILURE : EXIT_SUCCESS);
        }
        while (waitpid(pid, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        return 0;
}
