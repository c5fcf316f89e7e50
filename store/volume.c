/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A subvolume opened for serving: its stack of layers, the group commit of
 * the top layer, and the rows (inodes, entries, extents) seen through the
 * stack. The topmost layer that has a row wins; whiteouts and holes hide
 * what lies below.
 */

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <zstd.h>

#include "alloc-util.h"
#include "sqlite-util.h"
#include "time-util.h"
#include "volume-internal.h"
#include "xxhash-util.h"

#ifndef COMMIT_INTERVAL_MS
#define COMMIT_INTERVAL_MS 1000
#endif

int64_t timestamp_now(void) {
        return (int64_t) now_nsec();
}

#define NSEC_PER_SEC 1000000000
/* The seconds whose every nanosecond an int64_t holds. */
#define TIMESTAMP_SEC_MAX (INT64_MAX / NSEC_PER_SEC - 1)

int64_t timestamp_from_timespec(const struct timespec *ts) {
        if (ts->tv_sec > TIMESTAMP_SEC_MAX)
                return INT64_MAX;
        if (ts->tv_sec < -TIMESTAMP_SEC_MAX)
                return INT64_MIN;
        return (int64_t) ts->tv_sec * NSEC_PER_SEC + ts->tv_nsec;
}

struct timespec timestamp_to_timespec(int64_t ns) {
        int64_t sec = ns / NSEC_PER_SEC, nsec = ns % NSEC_PER_SEC;

        if (nsec < 0) {         /* before 1970: the second before, plus nanoseconds */
                sec--;
                nsec += NSEC_PER_SEC;
        }
        return (struct timespec) { .tv_sec = (time_t) sec, .tv_nsec = (long) nsec };
}

void inode_row_clear(InodeRow *row) {
        free(row->data);
        row->data = NULL;
        row->data_len = 0;
        row->has_data = false;
        free(row->stored);
        row->stored = NULL;
        row->stored_len = 0;
        row->content_unread = false;
}

/* Keeps the stored form of a compressed content, to put it back as it is
 * if it does not change. */
static void inline_keep_stored(InodeRow *row, const void *stored, size_t len, uint64_t check) {
        row->stored = malloc(MAX(len, 1u));
        if (!row->stored)
                return; /* it is compressed again, that is all */
        memcpy(row->stored, stored, len);
        row->stored_len = len;
        row->stored_zstd = true;
        row->stored_check = check;
        row->decoded_check = XXH3_64bits(row->data, row->data_len);
}

static void layer_finalize(VolumeLayer *l) {
        sqlite3_stmt **stmts[] = {
                &l->get_inode, &l->get_dentry, &l->list_dentries, &l->get_extent,
                &l->list_extents, &l->get_xattr, &l->list_xattrs, &l->copy_xattrs,
        };

        for (size_t i = 0; i < ELEMENTSOF(stmts); i++) {
                sqlite3_finalize(*stmts[i]);
                *stmts[i] = NULL;
        }
        if (l->db)
                sqlite3_close_v2(l->db);
        l->db = NULL;
        l->keys = mfree(l->keys);
        l->n_keys = 0;
        l->keyed = false;
}

/* Layers up to this size get their keys read: what a few snapshots' worth
 * of changes makes, not a whole tree, whose rows are most of the stack's
 * anyway. */
#define LAYER_KEYS_MAX_BYTES (1024 * 1024)

static int layer_load_keys(Store *s, VolumeLayer *l) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        if (layer_file_bytes(s, l->id) > LAYER_KEYS_MAX_BYTES)
                return 0;
        r = sqlite_prepare(l->db,
                           "SELECT ino FROM inodes UNION SELECT parent FROM dentries UNION SELECT ino FROM extents "
                           "UNION SELECT ino FROM xattrs ORDER BY 1", &st);
        if (r < 0)
                return r;
        r = sqlite_collect_ids(st, &l->keys, &l->n_keys);
        if (r < 0)
                return r;
        l->keyed = true;
        return 0;
}

bool layer_may_have(const VolumeLayer *l, uint64_t ino) {
        size_t lo = 0, hi = l->n_keys;

        if (!l->db)
                return false;
        if (!l->keyed)
                return true;
        while (lo < hi) {
                size_t mid = lo + (hi - lo) / 2;

                if (l->keys[mid] == ino)
                        return true;
                if (l->keys[mid] < ino)
                        lo = mid + 1;
                else
                        hi = mid;
        }
        return false;
}

static void top_finalize(Volume *v) {
        sqlite3_stmt **stmts = (sqlite3_stmt **) &v->top;

        for (size_t i = 0; i < sizeof v->top / sizeof(sqlite3_stmt *); i++) {
                sqlite3_finalize(stmts[i]);
                stmts[i] = NULL;
        }
        v->top_prepared = false;
}

/* Each read returns whether its row passed its check as the column after
 * the row's values (ROW_INTACT_COLUMN_* below); layers without row checks
 * give 1. */
#define LAYER_QUERIES(inode_ok, dentry_ok, extent_ok, xattr_ok)                                                  \
        {                                                                                                        \
                { offsetof(VolumeLayer, get_inode),                                                              \
                  "SELECT mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns, ctime_ns, parent, lower_limit, data, " \
                  "data_zstd, data_check, " inode_ok " FROM inodes WHERE ino = ?1" },                             \
                { offsetof(VolumeLayer, get_dentry),                                                             \
                  "SELECT ino, type, " dentry_ok " FROM dentries WHERE parent = ?1 AND name = ?2" },              \
                { offsetof(VolumeLayer, list_dentries),                                                          \
                  "SELECT name, ino, type, " dentry_ok " FROM dentries WHERE parent = ?1" },                      \
                { offsetof(VolumeLayer, get_extent),                                                             \
                  "SELECT digest, len, " extent_ok " FROM extents WHERE ino = ?1 AND idx = ?2" },                 \
                { offsetof(VolumeLayer, list_extents),                                                           \
                  "SELECT idx, digest, len, " extent_ok " FROM extents WHERE ino = ?1 AND idx >= ?2 ORDER BY idx" },            \
                { offsetof(VolumeLayer, get_xattr),                                                              \
                  "SELECT value, " xattr_ok " FROM xattrs WHERE ino = ?1 AND name = ?2" },                        \
                { offsetof(VolumeLayer, list_xattrs),                                                            \
                  "SELECT name, " xattr_ok " FROM xattrs WHERE ino = ?1 ORDER BY name" },                         \
                { offsetof(VolumeLayer, copy_xattrs),                                                            \
                  "SELECT name, value, " xattr_ok " FROM xattrs WHERE ino = ?1" },                                \
        }

static int layer_prepare(VolumeLayer *l) {
        static const PreparedQuery checked[] = LAYER_QUERIES("row_check IS " INODE_CHECK, "row_check IS " DENTRY_CHECK,
                                                              "row_check IS " EXTENT_CHECK, "row_check IS " XATTR_CHECK);
        static const PreparedQuery unchecked[] = LAYER_QUERIES("1", "1", "1", "1");

        if (layer_has_row_checks(l->db, "main"))
                return sqlite_prepare_all(l->db, checked, ELEMENTSOF(checked), l);
        return sqlite_prepare_all(l->db, unchecked, ELEMENTSOF(unchecked), l);
}

int volume_row_intact(Volume *v, sqlite3_stmt *st, int column) {
        if (sqlite3_column_int(st, column))
                return 0;
        block_count_corruption(v->store);
        return -EIO;
}

static int top_prepare(Volume *v) {
        static const PreparedQuery queries[] = {
                { offsetof(TopStatements, put_inode),
                  "INSERT OR REPLACE INTO inodes(ino, mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns, ctime_ns, "
                  "parent, lower_limit, data, data_zstd, data_check, row_check) "
                  "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, "
                  "cowbox_check('inode', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?14, ?15))" },
                /* The content and its check stay as they are. */
                { offsetof(TopStatements, put_inode_attrs),
                  "UPDATE inodes SET mode = ?2, nlink = ?3, uid = ?4, gid = ?5, rdev = ?6, size = ?7, atime_ns = ?8, "
                  "mtime_ns = ?9, ctime_ns = ?10, parent = ?11, lower_limit = ?12, "
                  "row_check = cowbox_check('inode', ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, data_zstd, "
                  "data_check) WHERE ino = ?1" },
                { offsetof(TopStatements, delete_inode), "DELETE FROM inodes WHERE ino = ?1" },
                { offsetof(TopStatements, put_dentry),
                  "INSERT OR REPLACE INTO dentries(parent, name, ino, type, row_check) "
                  "VALUES (?1, ?2, ?3, ?4, cowbox_check('dentry', ?1, ?2, ?3, ?4))" },
                { offsetof(TopStatements, delete_dentry), "DELETE FROM dentries WHERE parent = ?1 AND name = ?2" },
                /* Whiteouts stay: they hide entries of the layers below, which would come
                 * back (naming inodes dropped since) when this layer is folded into them. */
                { offsetof(TopStatements, delete_dentries_of), "DELETE FROM dentries WHERE parent = ?1 AND ino != 0" },
                { offsetof(TopStatements, put_extent),
                  "INSERT OR REPLACE INTO extents(ino, idx, digest, len, row_check) "
                  "VALUES (?1, ?2, ?3, ?4, cowbox_check('extent', ?1, ?2, ?3, ?4))" },
                { offsetof(TopStatements, list_extents_from),
                  "SELECT digest FROM extents WHERE ino = ?1 AND idx >= ?2 AND digest IS NOT NULL" },
                { offsetof(TopStatements, delete_extents_from), "DELETE FROM extents WHERE ino = ?1 AND idx >= ?2" },
                { offsetof(TopStatements, put_xattr),
                  "INSERT OR REPLACE INTO xattrs(ino, name, value, row_check) "
                  "VALUES (?1, ?2, ?3, cowbox_check('xattr', ?1, ?2, ?3))" },
                { offsetof(TopStatements, delete_xattr), "DELETE FROM xattrs WHERE ino = ?1 AND name = ?2" },
                { offsetof(TopStatements, delete_xattrs_of), "DELETE FROM xattrs WHERE ino = ?1" },
                { offsetof(TopStatements, get_blockref),
                  "SELECT refs, row_check IS " BLOCKREF_CHECK " FROM blockrefs WHERE digest = ?1" },
                { offsetof(TopStatements, put_blockref),
                  "INSERT OR REPLACE INTO blockrefs(digest, refs, stored_len, row_check) "
                  "VALUES (?1, ?2, ?3, cowbox_check('blockref', ?1, ?2, ?3))" },
                { offsetof(TopStatements, delete_blockref), "DELETE FROM blockrefs WHERE digest = ?1" },
                { offsetof(TopStatements, list_orphans), "SELECT ino FROM inodes WHERE nlink = 0" },
                { offsetof(TopStatements, savepoint), "SAVEPOINT change" },
                { offsetof(TopStatements, release_savepoint), "RELEASE change" },
                { offsetof(TopStatements, rollback_to_savepoint), "ROLLBACK TO change" },
        };
        int r;

        r = sqlite_prepare_all(v->layers[0].db, queries, ELEMENTSOF(queries), &v->top);
        if (r < 0)
                return r;
        v->top_prepared = true;
        return 0;
}

/* Stops using the top layer: what the kernel was told no longer matches
 * it, or cannot be taken back. As after a crash, the layer holds what was
 * committed last; everything fails with EIO until the volume is opened
 * again. */
static void volume_fail(Volume *v, const char *why) {
        if (v->n_layers > 0 && v->layers[0].db)
                sqlite_rollback(v->layers[0].db);
        v->in_transaction = false;
        if (!v->failed)
                store_log("subvolume '%s' failed: %s. It answers EIO until it is opened again, and holds what "
                          "was committed last.", v->name, why);
        v->failed = true;
}

static void layers_unload(Volume *v) {
        top_finalize(v);
        for (size_t i = 0; i < v->n_layers; i++)
                layer_finalize(&v->layers[i]);
        free(v->layers);
        v->layers = NULL;
        v->n_layers = 0;
}

/* Whether the subvolume's stack in the catalog is still the one loaded. */
static int layers_current(Volume *v) {
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0;
        int r;

        r = catalog_subvolume_stack(v->store, v->subvolume_id, &ids, &n);
        if (r < 0)
                return r;
        if (n != v->n_layers)
                return 0;
        for (size_t i = 0; i < n; i++)
                if (ids[i] != v->layers[i].id)
                        return 0;
        return 1;
}

/* Between commits, reads of the top layer go on in a transaction too, the
 * one the next change will write in: in autocommit, every query would lock
 * the database file, look at it again and unlock it, three system calls
 * that cost more than the query. */
static int top_begin(Volume *v) {
        int r;

        r = sqlite_begin_deferred(v->layers[0].db);
        if (r < 0)
                return r;
        v->in_transaction = true;
        v->changes_at_begin = sqlite3_total_changes64(v->layers[0].db);
        return 0;
}

static void top_read_begin(Volume *v) {
        if (!v->writable || !v->layers[0].db || v->in_transaction || v->failed)
                return;
        (void) top_begin(v);
}

/* After some I/O errors SQLite rolls back the whole transaction. If it had
 * written nothing, nothing is lost and the next change begins another. */
static int top_transaction_check(Volume *v) {
        sqlite3 *db = v->layers[0].db;

        if (!v->in_transaction || !db || !sqlite3_get_autocommit(db))
                return 0;
        v->in_transaction = false;
        if (sqlite3_total_changes64(db) == v->changes_at_begin)
                return 0;
        volume_fail(v, "SQLite rolled back the changes not yet committed (after an I/O error or on a full disk)");
        return -EIO;
}

static int layers_load_once(Volume *v, bool *ret_missing);

/* Opens every layer of the subvolume's stack as the catalog has it now. A
 * layer without a database is empty, unless the reaper has just folded it
 * away: then the catalog names a new stack, which is loaded instead. */
static int layers_load(Volume *v) {
        for (unsigned attempt = 0;; attempt++) {
                bool missing = false;
                int r, k;

                /* Also when it failed: with every written layer folded
                 * away, no counters were left to read. */
                r = layers_load_once(v, &missing);
                if (!missing || attempt >= 8)
                        return r;
                k = layers_current(v);
                if (k != 0)
                        return k < 0 ? k : r;
                layers_unload(v);
        }
}

/* An inode number is never handed out twice, whatever the counters say:
 * a fold of two never-written layers once left an empty subvolume's
 * counters on top (fsck --repair mends the store for good). One lookup of
 * the highest number in each layer. */
static int next_ino_untaken(Volume *v) {
        for (size_t i = 0; i < v->n_layers; i++) {
                uint64_t highest;
                int r;

                if (!v->layers[i].db)
                        continue;
                r = layer_highest_ino(v->layers[i].db, &highest);
                if (r < 0)
                        return r;
                v->counters.next_ino = MAX(v->counters.next_ino, highest + 1);
        }
        return 0;
}

static int layers_load_once(Volume *v, bool *ret_missing) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0;
        int r;

        r = catalog_find_subvolume_by_id(v->store, v->subvolume_id, &rec);
        if (r < 0)
                return r;
        v->quota_bytes = rec.quota_bytes;
        r = catalog_layer_stack(v->store, rec.top_layer, &ids, &n);
        /* An image's top may have been folded into a new one since its
         * row was read: nobody writes it, so the reaper takes no lock. */
        if (r == -EUCLEAN)
                *ret_missing = true;
        if (r < 0)
                return r;

        v->layers = calloc(n, sizeof *v->layers);
        if (!v->layers)
                return -ENOMEM;
        v->n_layers = n;

        for (size_t i = 0; i < n; i++) {
                VolumeLayer *l = &v->layers[i];
                LayerOpenMode mode = LAYER_READ_FROZEN;

                l->id = ids[i];
                /* A writable subvolume mounted read-only: nobody writes its
                 * top meanwhile (its lock is shared), so it is read without
                 * locks too, unless a server that died left a WAL. */
                if (i == 0 && !rec.readonly && v->writable)
                        mode = LAYER_WRITE;
                r = layer_open(v->store, l->id, mode, &l->db);
                if (r == -ENOENT) {
                        *ret_missing = true;
                        continue;
                }
                if (r < 0)
                        return r;
                r = layer_prepare(l);
                if (r >= 0 && i > 0)
                        r = layer_load_keys(v->store, l);
                if (r < 0)
                        return r;
        }

        /* The counters are the topmost database's. A layer created lazily
         * starts with the counters below it, but stores nothing yet. */
        r = -EUCLEAN; /* every stack has a bottom layer with a root */
        for (size_t i = 0; i < n && r == -EUCLEAN; i++)
                if (v->layers[i].db)
                        r = layer_read_counters(v->layers[i].db, &v->counters);
        if (r < 0)
                return r;
        if (!v->layers[0].db)
                v->counters.stored_bytes = 0;
        if (v->writable) {
                r = next_ino_untaken(v);
                if (r < 0)
                        return r;
        }
        if (v->writable && v->layers[0].db) {
                r = top_prepare(v);
                if (r < 0)
                        return r;
                top_read_begin(v);
        }
        return 0;
}

/* Creates the top layer's database on the first change and opens the
 * transaction that collects changes until the next commit. */
int volume_ensure_top(Volume *v) {
        VolumeLayer *top = &v->layers[0];
        int r;

        if (!v->writable)
                return -EROFS;
        if (v->failed)
                return -EIO;
        r = top_transaction_check(v);
        if (r < 0)
                return r;
        if (!top->db) {
                r = layer_create(v->store, top->id, &v->counters, false, &top->db);
                if (r < 0)
                        return r;
                r = layer_prepare(top);
                if (r < 0)
                        return r;
        }
        if (!v->top_prepared) {
                r = top_prepare(v);
                if (r < 0)
                        return r;
        }
        if (!v->in_transaction)
                return top_begin(v);
        return 0;
}

int top_change_begin(Volume *v, TopChange *ret) {
        int r;

        *ret = (TopChange) {};
        r = volume_ensure_top(v);
        if (r < 0)
                return r;
        r = sqlite_step_done(v->top.savepoint);
        if (r < 0)
                return top_transaction_check(v) ?: r;
        *ret = (TopChange) {
                .counters = v->counters,
                .orphan_bytes = v->orphan_bytes,
                .memory_changes = v->memory_changes,
                .changed = v->changed,
                .begun = true,
        };
        return 0;
}

int top_change_end(Volume *v, const TopChange *c, int r) {
        sqlite3 *db;

        if (!c->begun)
                return r;
        db = v->layers[0].db;
        if (sqlite3_get_autocommit(db)) {
                /* The whole transaction went, this change with it. The
                 * volume fails if the transaction held anything more. */
                (void) top_transaction_check(v);
                if (r >= 0)
                        r = -EIO;
        } else if (r >= 0) {
                int k = sqlite_step_done(v->top.release_savepoint);

                if (k >= 0)
                        return r;
                r = k;
        }
        if (!sqlite3_get_autocommit(db) &&
            (sqlite_step_done(v->top.rollback_to_savepoint) < 0 || sqlite_step_done(v->top.release_savepoint) < 0))
                volume_fail(v, "a change that failed could not be undone");
        /* Blocks in memory are not rolled back with the layer. */
        if (v->memory_changes != c->memory_changes)
                volume_fail(v, "a change that failed had changed data in memory");
        v->counters = c->counters;
        v->orphan_bytes = c->orphan_bytes;
        v->changed = c->changed;
        return r;
}

void volume_mark_changed(Volume *v) {
        v->changed = true;
}

/* While space is low, removals commit every so many changes: the rows they
 * add (whiteouts over the layers below) reach the disk, where the next
 * check of the space sees them, instead of piling up in memory for a
 * commit that no longer fits. */
#define SHORT_COMMIT_CHANGES 256

void volume_commit_if_short(Volume *v) {
        if (!v->in_transaction || !v->changed || !space_low(v->store) ||
            sqlite3_total_changes64(v->layers[0].db) - v->changes_at_begin < SHORT_COMMIT_CHANGES)
                return;
        (void) volume_commit_locked(v, 0);
}

/* Commits what changed. Data that does not fit on the disk stays in memory
 * and is tried again at the next commit; the metadata commits regardless.
 * Returns the data error for must_ino's blocks (every block if 0). */
int volume_commit_locked(Volume *v, uint64_t must_ino) {
        int r, failed = 0;

        if (!v->writable || !v->changed)
                return 0;
        if (v->failed)
                return -EIO;

        /* Another program may have filled the disk since the space was
         * checked: what was accepted goes in with the reserve's space. A
         * commit that fails half way is rolled back, and the volume with
         * it. */
        space_update(v->store);

        /* The GC lock is taken where a block reference is made (the flush
         * of dirty blocks, a clone) and held until here: a commit without
         * new references does not wait for a reaper's mark and sweep. */
        r = data_flush_all(v, must_ino, &failed);
        if (r >= 0)
                r = block_commit(v->store);
        if (r < 0) {
                /* Blocks the open transaction references may be lost: it
                 * must never commit. */
                if (block_writer_failed(v->store))
                        volume_fail(v, "a sync of the pack its data went to failed, and data not yet committed "
                                       "may be lost");
                return r;
        }
        r = volume_ensure_top(v);
        if (r < 0)
                return r;
        r = layer_write_counters(v->layers[0].db, &v->counters);
        if (r < 0)
                return r;
        /* A commit that fails and leaves the transaction open is tried
         * again at the next. */
        r = sqlite_exec(v->layers[0].db, "COMMIT");
        if (r < 0) {
                if (sqlite3_get_autocommit(v->layers[0].db))
                        volume_fail(v, "its commit failed, and SQLite rolled back the changes");
                return r;
        }
        v->in_transaction = false;
        top_read_begin(v);
        v->changed = v->n_dirty > 0; /* what stays in memory is committed later */
        v->flush_ahead_at = v->n_dirty + FLUSH_AHEAD_BLOCKS;
        if (!v->flushing_ahead)
                gc_unlock(&v->gc_fd);
        return failed;
}

int volume_sync(Volume *v) {
        MUTEX_LOCKED(&v->lock);
        return volume_commit_locked(v, 0);
}

int volume_fsync(Volume *v, uint64_t ino) {
        MUTEX_LOCKED(&v->lock);
        return volume_commit_locked(v, ino);
}

/* The limit may change while the subvolume is mounted (set-quota). */
static void quota_refresh(Volume *v) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};

        if (catalog_find_subvolume_by_id(v->store, v->subvolume_id, &rec) >= 0)
                v->quota_bytes = rec.quota_bytes;
}

void volume_quota_refresh(Volume *v) {
        MUTEX_LOCKED(&v->lock);
        quota_refresh(v);
}

bool quota_passed(const Volume *v, uint64_t orphans, uint64_t growth) {
        return v->quota_bytes > 0 &&
               (unsigned __int128) v->counters.logical_bytes + orphans + growth > v->quota_bytes;
}

int volume_check_quota(Volume *v, uint64_t bytes) {
        return bytes > 0 && quota_passed(v, v->orphan_bytes, bytes) ? -EDQUOT : 0;
}

/* Commits every COMMIT_INTERVAL_MS; in between, stores whole dirty blocks
 * when writers have made enough of them, and again when those it had to
 * leave because they had just changed have been left alone long enough. */
static void *committer_main(void *userdata) {
        Volume *v = userdata;
        uint64_t next_commit = monotonic_usec() + COMMIT_INTERVAL_MS * 1000ull;

        pthread_mutex_lock(&v->lock);
        while (!v->stopping) {
                uint64_t now = monotonic_usec(), until = next_commit;

                if (now >= next_commit) {
                        (void) volume_commit_locked(v, 0);
                        quota_refresh(v);
                        v->flush_ahead_retry_usec = 0;
                        next_commit = monotonic_usec() + COMMIT_INTERVAL_MS * 1000ull;
                        continue;
                }
                if (v->flush_ahead_retry_usec != 0 && now >= v->flush_ahead_retry_usec) {
                        v->flush_ahead_retry_usec = 0;
                        v->flush_ahead_wanted = true;
                }
                if (v->flush_ahead_wanted) {
                        /* Writes may have gone on meanwhile: more, until a
                         * look finds nothing to store. */
                        v->flush_ahead_wanted = data_flush_ahead(v) > 0 && v->n_dirty >= FLUSH_AHEAD_BLOCKS;
                        /* The GC lock covers references not committed yet.
                         * A flush that referenced nothing (a commit took
                         * its blocks meanwhile, or none were ready) leaves
                         * none: else an idle mount kept reapers waiting. */
                        if (!v->changed)
                                gc_unlock(&v->gc_fd);
                        continue;
                }
                if (v->flush_ahead_retry_usec != 0)
                        until = MIN(until, v->flush_ahead_retry_usec);

                /* v->wake waits on CLOCK_MONOTONIC, the clock of until. */
                struct timespec deadline = timespec_from_usec(until);
                (void) pthread_cond_timedwait(&v->wake, &v->lock, &deadline);
        }
        pthread_mutex_unlock(&v->lock);
        return NULL;
}

/* Drops inodes left with no name and no user: unlinked while open when
 * the previous server stopped or died. */
static int purge_orphans(Volume *v) {
        _cleanup_free_ uint64_t *inos = NULL;
        size_t n = 0;
        int r;

        if (!v->layers[0].db)
                return 0;
        if (!v->top_prepared) {
                r = top_prepare(v);
                if (r < 0)
                        return r;
        }
        r = sqlite_collect_ids(v->top.list_orphans, &inos, &n);
        if (r < 0)
                return r;

        for (size_t i = 0; i < n; i++) {
                _cleanup_(inode_row_clear) InodeRow row = {};

                r = inode_get(v, inos[i], &row);
                if (r < 0)
                        return r;
                if (row.layer == 0 && row.nlink == 0) {
                        r = inode_drop(v, &row);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

int volume_open(Store *s, const char *name, bool writable, Volume **ret, pid_t *ret_holder) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        Volume *v;
        int r;

        if (!s || !ret)
                return -EINVAL;
        if (!store_name_is_valid(name))
                return -EINVAL;
        r = catalog_find_subvolume(s, name, &rec);
        if (r < 0)
                return r;
        if (rec.readonly && writable)
                return -EROFS;

        v = calloc(1, sizeof *v);
        if (!v)
                return -ENOMEM;
        v->store = s;
        v->subvolume_id = rec.id;
        v->writable = writable;
        v->lock_fd = v->gc_fd = -EBADF;
        v->flush_ahead_at = FLUSH_AHEAD_BLOCKS;
        pthread_mutex_init(&v->lock, NULL);
        {
                pthread_condattr_t attr;

                pthread_condattr_init(&attr);
                pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
                pthread_cond_init(&v->wake, &attr);
                pthread_cond_init(&v->orphans_gone, &attr);
                pthread_condattr_destroy(&attr);
        }
        v->name = strdup(name);
        v->cctx = ZSTD_createCCtx();
        v->dctx = ZSTD_createDCtx();
        if (!v->name || !v->cctx || !v->dctx) {
                r = -ENOMEM;
                goto fail;
        }

        /* Read-only servers share the lock, so that nobody mounts the
         * subvolume writable, or deletes it, under them. */
        r = subvolume_lock_full(s, rec.id, writable, writable ? SUBVOLUME_LOCK_PATIENT : 0, ret_holder);
        if (r < 0)
                goto fail;
        v->lock_fd = r;

        r = layers_load(v);
        if (r < 0)
                goto fail;

        if (writable) {
                r = purge_orphans(v);
                if (r >= 0)
                        r = volume_commit_locked(v, 0);
                if (r < 0)
                        goto fail;
                r = control_server_start(v, s, rec.id, &v->control);
                if (r < 0)
                        goto fail;
                r = -pthread_create(&v->committer, NULL, committer_main, v);
                if (r < 0)
                        goto fail;
                v->committer_running = true;
        }

        *ret = v;
        return 0;
fail:
        volume_close(v);
        return r;
}

Volume *volume_close(Volume *v) {
        if (!v)
                return NULL;

        v->control = control_server_stop(v->control);

        if (v->committer_running) {
                pthread_mutex_lock(&v->lock);
                v->stopping = true;
                pthread_cond_signal(&v->wake);
                pthread_mutex_unlock(&v->lock);
                pthread_join(v->committer, NULL);
        }

        if (v->writable && v->n_layers > 0) {
                MUTEX_LOCKED(&v->lock);
                (void) purge_orphans(v);
                (void) volume_commit_locked(v, 0);
        }
        if (v->in_transaction && v->layers[0].db)
                sqlite_rollback(v->layers[0].db);

        data_forget_dirty(v, 0, 0, 0);
        layers_unload(v);
        gc_unlock(&v->gc_fd);
        safe_close(v->lock_fd);
        ZSTD_freeCCtx(v->cctx);
        ZSTD_freeDCtx(v->dctx);
        pthread_cond_destroy(&v->wake);
        pthread_cond_destroy(&v->orphans_gone);
        pthread_mutex_destroy(&v->lock);
        free(v->name);
        free(v);
        return NULL;
}

void volume_closing(Volume *v) {
        if (v && v->lock_fd >= 0)
                (void) write_pid_file(v->lock_fd, " brief");
}

bool volume_is_writable(const Volume *v) {
        return v->writable;
}

bool volume_is_sole_writer(const Volume *v) {
        return true;
}

const char *volume_name(const Volume *v) {
        return v->name;
}

void volume_set_write_back(Volume *v, int (*write_back)(void *userdata), void *userdata) {
        MUTEX_LOCKED(&v->lock);
        v->write_back = write_back;
        v->write_back_userdata = userdata;
}

void volume_set_before_wait(Volume *v, void (*before_wait)(void)) {
        MUTEX_LOCKED(&v->lock);
        v->before_wait = before_wait;
}

/* Called by the control server: freezes the top layer at a point where
 * everything written so far is committed, and moves onto a new one. What
 * the kernel still holds is written back first, without our lock: it
 * comes to us as writes. */
int volume_take_snapshot(Volume *v, const char *name, bool readonly, const char *uuid) {
        _cleanup_(subvolume_record_clear) SubvolumeRecord rec = {};
        int (*write_back)(void *userdata);
        void *userdata;
        int r;

        {
                MUTEX_LOCKED(&v->lock);
                write_back = v->write_back;
                userdata = v->write_back_userdata;
        }
        if (write_back) {
                r = write_back(userdata);
                if (r < 0)
                        return r;
        }

        MUTEX_LOCKED(&v->lock);

        /* What the kernel was told is gone: a snapshot would not hold it. */
        if (v->failed)
                return -EIO;
        if (v->changed) {
                r = volume_commit_locked(v, 0);
                if (r < 0)
                        return r;
        }
        if (v->in_transaction) {
                r = sqlite_commit(v->layers[0].db); /* opened, but nothing changed */
                v->in_transaction = false;
                if (r < 0)
                        return r;
        }
        r = catalog_find_subvolume_by_id(v->store, v->subvolume_id, &rec);
        if (r < 0)
                return r;

        /* Seal through a fresh connection once ours is closed: no statement
         * or transaction of ours may hold the database open meanwhile. */
        layers_unload(v);
        r = layer_seal(v->store, rec.top_layer);
        if (r >= 0)
                r = catalog_snapshot(v->store, &rec, name, readonly, uuid);

        /* Whatever happened, serve the stack the catalog has now; if it
         * cannot be loaded, nothing is served. */
        {
                int k = layers_load(v);
                if (k < 0) {
                        volume_fail(v, "its layers could not be loaded again after a snapshot");
                        if (r >= 0)
                                r = k;
                }
        }
        return r;
}

/* ---- rows through the stack ---- */

/* Small files' contents are stored compressed when that saves an eighth. */
static int inline_decode(Volume *v, const void *stored, size_t stored_len, bool compressed, uint64_t check,
                         InodeRow *row) {
        size_t n;

        if (inline_check(stored, stored_len) != check) {
                block_count_corruption(v->store);
                return -EIO;
        }

        row->has_data = true;
        row->data = malloc(compressed ? INLINE_MAX : MAX(stored_len, 1u));
        if (!row->data)
                return -ENOMEM;
        if (!compressed) {
                if (stored_len > 0)
                        memcpy(row->data, stored, stored_len);
                row->data_len = stored_len;
                return 0;
        }
        if (zstd_decompress(v->store, v->dctx, row->data, INLINE_MAX, stored, stored_len, &n) < 0)
                return -EIO;
        row->data_len = n;
        inline_keep_stored(row, stored, stored_len, check);
        return 0;
}

/* with_content false: a regular file's inline content is neither read nor
 * decoded, only its length is set (its size), for what stat needs. */
static int inode_from_stmt(Volume *v, sqlite3_stmt *st, uint64_t ino, size_t layer, bool with_content,
                           InodeRow *ret) {
        int r;

        *ret = (InodeRow) {};
        r = volume_row_intact(v, st, 14);
        if (r < 0)
                return r;
        *ret = (InodeRow) {
                .ino = ino,
                .mode = (mode_t) sqlite3_column_int(st, 0),
                .nlink = (uint32_t) sqlite3_column_int(st, 1),
                .uid = (uid_t) sqlite3_column_int64(st, 2),
                .gid = (gid_t) sqlite3_column_int64(st, 3),
                .rdev = (uint64_t) sqlite3_column_int64(st, 4),
                .size = (uint64_t) sqlite3_column_int64(st, 5),
                .atime_ns = sqlite3_column_int64(st, 6),
                .mtime_ns = sqlite3_column_int64(st, 7),
                .ctime_ns = sqlite3_column_int64(st, 8),
                .parent = (uint64_t) sqlite3_column_int64(st, 9),
                .lower_limit = (uint64_t) sqlite3_column_int64(st, 10),
                .layer = layer,
        };
        if (sqlite3_column_type(st, 11) == SQLITE_NULL)
                return 0;
        if (!with_content && S_ISREG(ret->mode)) {
                ret->has_data = ret->content_unread = true;
                ret->data_len = (size_t) ret->size;
                return 0;
        }
        return inline_decode(v, sqlite3_column_blob(st, 11), (size_t) sqlite3_column_bytes(st, 11),
                             sqlite3_column_int(st, 12) != 0, (uint64_t) sqlite3_column_int64(st, 13), ret);
}

static int inode_find(Volume *v, uint64_t ino, bool with_content, InodeRow *ret) {
        int r;

        if (v->failed)
                return -EIO;

        for (size_t i = 0; i < v->n_layers; i++) {
                sqlite3_stmt *st = v->layers[i].get_inode;

                if (!layer_may_have(&v->layers[i], ino))
                        continue;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
                r = sqlite_step_row(st);
                if (r > 0) {
                        r = inode_from_stmt(v, st, ino, i, with_content, ret);
                        sqlite3_reset(st);
                        if (r < 0)
                                inode_row_clear(ret);
                        return r;
                }
                sqlite3_reset(st);
                if (r < 0)
                        return r;
        }
        return -ENOENT;
}

int inode_get(Volume *v, uint64_t ino, InodeRow *ret) {
        return inode_find(v, ino, true, ret);
}

int inode_get_attr(Volume *v, uint64_t ino, InodeRow *ret) {
        return inode_find(v, ino, false, ret);
}

int inode_put(Volume *v, const InodeRow *row) {
        sqlite3_stmt *st;
        int r;

        r = volume_ensure_top(v);
        if (r < 0)
                return r;
        if (row->content_unread) {
                /* Only a row of the top layer can keep its content there. */
                if (row->layer != 0)
                        return -EINVAL;
                st = v->top.put_inode_attrs;
        } else
                st = v->top.put_inode;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) row->ino);
        sqlite3_bind_int(st, 2, (int) row->mode);
        sqlite3_bind_int64(st, 3, row->nlink);
        sqlite3_bind_int64(st, 4, row->uid);
        sqlite3_bind_int64(st, 5, row->gid);
        sqlite3_bind_int64(st, 6, (sqlite3_int64) row->rdev);
        sqlite3_bind_int64(st, 7, (sqlite3_int64) row->size);
        sqlite3_bind_int64(st, 8, row->atime_ns);
        sqlite3_bind_int64(st, 9, row->mtime_ns);
        sqlite3_bind_int64(st, 10, row->ctime_ns);
        sqlite3_bind_int64(st, 11, (sqlite3_int64) row->parent);
        sqlite3_bind_int64(st, 12, (sqlite3_int64) row->lower_limit);
        if (row->content_unread)
                goto put;
        if (row->has_data) {
                size_t n = 0;

                if (row->stored && XXH3_64bits(row->data, row->data_len) == row->decoded_check) {
                        /* Unchanged (an attribute changed): as it was. */
                        sqlite3_bind_blob(st, 13, row->stored, (int) row->stored_len, SQLITE_STATIC);
                        sqlite3_bind_int(st, 14, row->stored_zstd);
                        sqlite3_bind_int64(st, 15, (sqlite3_int64) row->stored_check);
                        goto put;
                }
                if (S_ISREG(row->mode) && row->data_len >= 64) {
                        dictionary_offer_sample(v->store, row->data, row->data_len);
                        n = zstd_compress_small(v->store, v->cctx, v->inline_scratch, ZSTD_COMPRESSBOUND(INLINE_MAX),
                                                row->data, row->data_len, INLINE_ZSTD_LEVEL);
                        if (ZSTD_isError(n) || n > row->data_len - row->data_len / 8)
                                n = 0;
                }
                if (n > 0) {
                        sqlite3_bind_blob(st, 13, v->inline_scratch, (int) n, SQLITE_STATIC);
                        sqlite3_bind_int64(st, 15, (sqlite3_int64) inline_check(v->inline_scratch, n));
                } else {
                        sqlite3_bind_blob(st, 13, row->data_len > 0 ? (const void *) row->data : "",
                                          (int) row->data_len, SQLITE_STATIC);
                        sqlite3_bind_int64(st, 15, (sqlite3_int64) inline_check(row->data, row->data_len));
                }
                sqlite3_bind_int(st, 14, n > 0);
        } else {
                sqlite3_bind_null(st, 13);
                sqlite3_bind_int(st, 14, 0);
                sqlite3_bind_int64(st, 15, 0);
        }
put:
        r = sqlite_step_done(st);
        sqlite3_clear_bindings(st);
        if (r < 0)
                return r;
        if (row->content_unread && sqlite3_changes(v->layers[0].db) != 1)
                return -EIO; /* the row it was read from is gone */
        volume_mark_changed(v);
        return 0;
}

static int xattrs_copy_up(Volume *v, uint64_t ino, size_t from_layer) {
        sqlite3_stmt *st = v->layers[from_layer].copy_xattrs;
        int r;

        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        while ((r = sqlite_step_row(st)) > 0) {
                sqlite3_stmt *put = v->top.put_xattr;

                r = volume_row_intact(v, st, 2);
                if (r < 0)
                        break;
                sqlite3_bind_int64(put, 1, (sqlite3_int64) ino);
                sqlite3_bind_blob(put, 2, sqlite3_column_blob(st, 0), sqlite3_column_bytes(st, 0), SQLITE_TRANSIENT);
                sqlite3_bind_blob(put, 3, sqlite3_column_blob(st, 1) ?: "", sqlite3_column_bytes(st, 1),
                                  SQLITE_TRANSIENT);
                r = sqlite_step_done(put);
                if (r < 0)
                        break;
        }
        sqlite3_reset(st);
        return r;
}

/* The row, copied up into the top layer first if it is below: whole, with
 * its content, even where only the attributes were asked for. */
static int inode_find_for_write(Volume *v, uint64_t ino, bool with_content, InodeRow *ret) {
        TopChange change;
        int r;

        r = volume_ensure_top(v);
        if (r < 0)
                return r;
        r = inode_find(v, ino, with_content, ret);
        if (r < 0 || ret->layer == 0)
                return r;
        if (ret->content_unread) {
                inode_row_clear(ret);
                r = inode_find(v, ino, true, ret);
                if (r < 0)
                        return r;
        }

        /* Copy-up: the top layer gets the whole row and the xattrs; the file
         * contents stay below, visible up to lower_limit. */
        ret->lower_limit = LOWER_LIMIT_NONE;
        r = top_change_begin(v, &change);
        if (r >= 0)
                r = xattrs_copy_up(v, ino, ret->layer);
        if (r >= 0)
                r = inode_put(v, ret);
        r = top_change_end(v, &change, r);
        if (r < 0) {
                inode_row_clear(ret);
                return r;
        }
        ret->layer = 0;
        return 0;
}

int inode_get_for_write(Volume *v, uint64_t ino, InodeRow *ret) {
        return inode_find_for_write(v, ino, true, ret);
}

int inode_get_attr_for_write(Volume *v, uint64_t ino, InodeRow *ret) {
        return inode_find_for_write(v, ino, false, ret);
}

static int inode_drop_rows(Volume *v, const InodeRow *row) {
        int r;

        r = extents_delete_from(v, row->ino, 0);
        if (r < 0)
                return r;
        sqlite3_bind_int64(v->top.delete_xattrs_of, 1, (sqlite3_int64) row->ino);
        r = sqlite_step_done(v->top.delete_xattrs_of);
        if (r < 0)
                return r;
        sqlite3_bind_int64(v->top.delete_inode, 1, (sqlite3_int64) row->ino);
        r = sqlite_step_done(v->top.delete_inode);
        if (r < 0)
                return r;
        if (S_ISDIR(row->mode)) {
                sqlite3_bind_int64(v->top.delete_dentries_of, 1, (sqlite3_int64) row->ino);
                r = sqlite_step_done(v->top.delete_dentries_of);
                if (r < 0)
                        return r;
        }
        volume_mark_changed(v);
        return 0;
}

/* Drops an inode without names (already out of the counters) from the top
 * layer, with its data. */
int inode_drop(Volume *v, const InodeRow *row) {
        TopChange change;
        int r;

        r = top_change_begin(v, &change);
        r = top_change_end(v, &change, r ?: inode_drop_rows(v, row));
        if (r < 0)
                return r;
        data_forget_dirty(v, row->ino, 0, row->size);
        inode_forgotten(v, row);
        return 0;
}

/* An inode without names that the kernel forgot: its bytes stop counting
 * against the quota. */
void inode_forgotten(Volume *v, const InodeRow *row) {
        if (S_ISREG(row->mode) && row->size > 0) {
                v->orphan_bytes -= MIN(v->orphan_bytes, row->size);
                pthread_cond_broadcast(&v->orphans_gone);
        }
}

/* An inode that lost its last name leaves the counters at once, not when
 * the kernel forgets it: a snapshot taken meanwhile can never open it, nor
 * can the next mount. */
void inode_unlinked(Volume *v, const InodeRow *row) {
        if (v->counters.inodes > 0)
                v->counters.inodes--;
        if (S_ISREG(row->mode)) {
                v->counters.logical_bytes -= MIN(v->counters.logical_bytes, row->size);
                bytes_add(&v->orphan_bytes, row->size);
        }
}

void inode_to_stat(Volume *v, const InodeRow *row, struct stat *ret) {
        *ret = (struct stat) {
                .st_ino = row->ino,
                .st_mode = row->mode,
                .st_nlink = row->nlink,
                .st_uid = row->uid,
                .st_gid = row->gid,
                .st_rdev = (dev_t) row->rdev,
                .st_size = (off_t) row->size,
                .st_blksize = 4096,
                .st_atim = timestamp_to_timespec(row->atime_ns),
                .st_mtim = timestamp_to_timespec(row->mtime_ns),
                .st_ctim = timestamp_to_timespec(row->ctime_ns),
        };
        if (S_ISREG(row->mode))
                ret->st_blocks = (blkcnt_t) DIV_ROUND_UP(data_allocated_bytes(v, row), 512);
        else if (S_ISDIR(row->mode))
                ret->st_size = 4096, ret->st_blocks = 8;
        else if (S_ISLNK(row->mode))
                ret->st_size = (off_t) row->data_len;
}

int dentry_get(Volume *v, uint64_t parent, const char *name, uint64_t *ret_ino, mode_t *ret_type) {
        int r;

        if (v->failed)
                return -EIO; /* its layers may be half loaded */
        for (size_t i = 0; i < v->n_layers; i++) {
                sqlite3_stmt *st = v->layers[i].get_dentry;

                if (!layer_may_have(&v->layers[i], parent))
                        continue;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) parent);
                sqlite3_bind_blob(st, 2, name, (int) strlen(name), SQLITE_STATIC);
                r = sqlite_step_row(st);
                if (r > 0) {
                        uint64_t ino = (uint64_t) sqlite3_column_int64(st, 0);
                        mode_t type = (mode_t) sqlite3_column_int(st, 1);

                        r = volume_row_intact(v, st, 2);
                        sqlite3_reset(st);
                        if (r < 0)
                                return r;
                        if (ino == 0)
                                return -ENOENT; /* whiteout */
                        if (ret_ino)
                                *ret_ino = ino;
                        if (ret_type)
                                *ret_type = type;
                        return 0;
                }
                sqlite3_reset(st);
                if (r < 0)
                        return r;
        }
        return -ENOENT;
}

int dentry_put(Volume *v, uint64_t parent, const char *name, uint64_t ino, mode_t type) {
        sqlite3_stmt *st;
        int r;

        r = volume_ensure_top(v);
        if (r < 0)
                return r;
        st = v->top.put_dentry;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) parent);
        sqlite3_bind_blob(st, 2, name, (int) strlen(name), SQLITE_STATIC);
        sqlite3_bind_int64(st, 3, (sqlite3_int64) ino);
        sqlite3_bind_int(st, 4, (int) (type & S_IFMT));
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        volume_mark_changed(v);
        return 0;
}

/* Removes a name: deletes the top layer's entry, and leaves a whiteout if a
 * lower layer still has the name. */
int dentry_remove(Volume *v, uint64_t parent, const char *name) {
        bool lower_has_it = false;
        int r;

        for (size_t i = 1; i < v->n_layers && !lower_has_it; i++) {
                sqlite3_stmt *st = v->layers[i].get_dentry;

                if (!layer_may_have(&v->layers[i], parent))
                        continue;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) parent);
                sqlite3_bind_blob(st, 2, name, (int) strlen(name), SQLITE_STATIC);
                r = sqlite_step_row(st);
                if (r > 0 && sqlite3_column_int64(st, 0) != 0)
                        lower_has_it = true;
                if (r > 0)
                        r = volume_row_intact(v, st, 2);
                sqlite3_reset(st);
                if (r < 0)
                        return r;
                if (r > 0)
                        break;
        }

        if (lower_has_it)
                return dentry_put(v, parent, name, 0, 0);

        r = volume_ensure_top(v);
        if (r < 0)
                return r;
        sqlite3_bind_int64(v->top.delete_dentry, 1, (sqlite3_int64) parent);
        sqlite3_bind_blob(v->top.delete_dentry, 2, name, (int) strlen(name), SQLITE_STATIC);
        r = sqlite_step_done(v->top.delete_dentry);
        if (r < 0)
                return r;
        volume_mark_changed(v);
        return 0;
}

typedef struct LayeredName {
        char *name;
        uint64_t ino;
        mode_t type;
        size_t layer;
} LayeredName;

static int layered_name_compare(const void *a, const void *b) {
        const LayeredName *x = a, *y = b;
        int c = strcmp(x->name, y->name);

        if (c != 0)
                return c;
        return x->layer < y->layer ? -1 : x->layer > y->layer;
}

static void layered_names_free(LayeredName *names, size_t n) {
        for (size_t i = 0; i < n; i++)
                free(names[i].name);
        free(names);
}

static int layered_names_collect(Volume *v, uint64_t parent, LayeredName **ret, size_t *ret_n) {
        LayeredName *names = NULL;
        size_t n = 0, allocated = 0;
        int r = 0;

        for (size_t i = 0; i < v->n_layers; i++) {
                sqlite3_stmt *st = v->layers[i].list_dentries;

                if (!layer_may_have(&v->layers[i], parent))
                        continue;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) parent);
                while ((r = sqlite_step_row(st)) > 0) {
                        int len = sqlite3_column_bytes(st, 0);

                        /* A damaged entry fails the listing even where a
                         * layer above hides it: the name itself may be what
                         * is damaged. */
                        r = volume_row_intact(v, st, 3);
                        if (r < 0)
                                break;
                        if (!GREEDY_REALLOC(names, allocated, n + 1)) {
                                r = -ENOMEM;
                                break;
                        }
                        names[n].name = strndup(sqlite3_column_blob(st, 0) ?: "", (size_t) len);
                        if (!names[n].name) {
                                r = -ENOMEM;
                                break;
                        }
                        names[n].ino = (uint64_t) sqlite3_column_int64(st, 1);
                        names[n].type = (mode_t) sqlite3_column_int(st, 2);
                        names[n].layer = i;
                        n++;
                }
                sqlite3_reset(st);
                if (r < 0) {
                        layered_names_free(names, n);
                        return r;
                }
        }
        *ret = names;
        *ret_n = n;
        return 0;
}

/* The merged listing: for each name the topmost layer's entry, without
 * whiteouts. */
int dentries_list(Volume *v, uint64_t parent, VolumeDirent **ret, size_t *ret_n, bool stop_at_first) {
        LayeredName *names = NULL;
        VolumeDirent *entries = NULL;
        size_t n = 0, k = 0;
        int r;

        if (v->failed)
                return -EIO;
        r = layered_names_collect(v, parent, &names, &n);
        if (r < 0)
                return r;
        if (n > 0)
                qsort(names, n, sizeof *names, layered_name_compare);

        if (ret) {
                entries = calloc(MAX(n, 1u), sizeof *entries);
                if (!entries) {
                        layered_names_free(names, n);
                        return -ENOMEM;
                }
        }
        for (size_t i = 0; i < n; i++) {
                if (i > 0 && streq(names[i].name, names[i - 1].name))
                        continue; /* hidden by a layer above */
                if (names[i].ino == 0)
                        continue; /* whiteout */
                if (entries) {
                        entries[k] = (VolumeDirent) {
                                .ino = names[i].ino,
                                .type = names[i].type,
                                .name = strdup(names[i].name),
                        };
                        if (!entries[k].name) {
                                for (size_t j = 0; j < k; j++)
                                        free(entries[j].name);
                                free(entries);
                                layered_names_free(names, n);
                                return -ENOMEM;
                        }
                }
                k++;
                if (stop_at_first)
                        break;
        }
        layered_names_free(names, n);
        if (ret)
                *ret = entries;
        *ret_n = k;
        return 0;
}

/* The block at idx as the stack has it: the topmost layer's extent, unless
 * an inode row above cut the file below that block (lower_limit). */
int extent_get(Volume *v, const InodeRow *row, uint64_t idx, Digest *ret_digest, uint32_t *ret_len, bool *ret_hole) {
        uint64_t limit = LOWER_LIMIT_NONE;
        int r;

        *ret_hole = true;
        *ret_len = 0;
        if (v->failed)
                return -EIO;
        for (size_t i = 0; i < v->n_layers; i++) {
                VolumeLayer *l = &v->layers[i];

                if (idx * STORE_BLOCK_SIZE >= limit)
                        return 0;
                if (!layer_may_have(l, row->ino))
                        continue;

                sqlite3_bind_int64(l->get_extent, 1, (sqlite3_int64) row->ino);
                sqlite3_bind_int64(l->get_extent, 2, (sqlite3_int64) idx);
                r = sqlite_step_row(l->get_extent);
                if (r > 0) {
                        r = volume_row_intact(v, l->get_extent, 2);
                        if (r < 0) {
                                sqlite3_reset(l->get_extent);
                                return r;
                        }
                        if (sqlite3_column_type(l->get_extent, 0) != SQLITE_NULL &&
                            sqlite3_column_bytes(l->get_extent, 0) == sizeof ret_digest->bytes) {
                                memcpy(ret_digest->bytes, sqlite3_column_blob(l->get_extent, 0),
                                       sizeof ret_digest->bytes);
                                *ret_len = (uint32_t) sqlite3_column_int(l->get_extent, 1);
                                *ret_hole = false;
                                /* Bytes past a cut made above this layer read as zeros. */
                                if (limit != LOWER_LIMIT_NONE && idx * STORE_BLOCK_SIZE + *ret_len > limit)
                                        *ret_len = (uint32_t) (limit - idx * STORE_BLOCK_SIZE);
                        }
                        sqlite3_reset(l->get_extent);
                        return 0;
                }
                sqlite3_reset(l->get_extent);
                if (r < 0)
                        return r;

                /* This layer's row of the inode cuts off the layers below. */
                sqlite3_bind_int64(l->get_inode, 1, (sqlite3_int64) row->ino);
                r = sqlite_step_row(l->get_inode);
                if (r > 0) {
                        uint64_t lower = (uint64_t) sqlite3_column_int64(l->get_inode, 10);
                        bool is_inline = sqlite3_column_type(l->get_inode, 11) != SQLITE_NULL;

                        limit = MIN(limit, is_inline ? 0 : lower);
                        r = volume_row_intact(v, l->get_inode, 14);
                }
                sqlite3_reset(l->get_inode);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int blockref_change(Volume *v, const Digest *d, int delta, uint32_t stored_len) {
        sqlite3_stmt *st = v->top.get_blockref;
        int64_t refs = 0;
        int r;

        sqlite3_bind_blob(st, 1, d->bytes, sizeof d->bytes, SQLITE_STATIC);
        r = sqlite_step_row(st);
        if (r > 0) {
                refs = sqlite3_column_int64(st, 0);
                /* A damaged count could free a block still in use. */
                if (volume_row_intact(v, st, 1) < 0)
                        r = -EIO;
        }
        sqlite3_reset(st);
        if (r < 0)
                return r;

        refs += delta;
        if (refs <= 0) {
                if (r == 0)
                        return 0;
                sqlite3_bind_blob(v->top.delete_blockref, 1, d->bytes, sizeof d->bytes, SQLITE_STATIC);
                r = sqlite_step_done(v->top.delete_blockref);
                if (r < 0)
                        return r;
                /* stored_len of the row being removed: look it up in the index. */
                {
                        BlockLocation loc;
                        if (block_lookup(v->store, d, &loc) >= 0)
                                v->counters.stored_bytes -= MIN(v->counters.stored_bytes,
                                                                sizeof(PackRecordHeader) + loc.stored_len);
                }
                return 0;
        }

        if (r == 0)
                v->counters.stored_bytes += sizeof(PackRecordHeader) + stored_len;
        st = v->top.put_blockref;
        sqlite3_bind_blob(st, 1, d->bytes, sizeof d->bytes, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, refs);
        sqlite3_bind_int64(st, 3, stored_len);
        return sqlite_step_done(st);
}

/* The top layer's extent at idx, if it has one with data. */
static int top_extent_digest(Volume *v, uint64_t ino, uint64_t idx, Digest *ret) {
        sqlite3_stmt *st = v->layers[0].get_extent;
        int r;

        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) idx);
        r = sqlite_step_row(st);
        if (r > 0)
                r = volume_row_intact(v, st, 2) ?: 1;
        if (r > 0) {
                if (sqlite3_column_bytes(st, 0) == sizeof ret->bytes)
                        memcpy(ret->bytes, sqlite3_column_blob(st, 0), sizeof ret->bytes);
                else
                        r = 0;
        }
        sqlite3_reset(st);
        return r;
}

static int extent_replace(Volume *v, uint64_t ino, uint64_t idx, const Digest *digest, uint32_t len,
                          uint32_t stored_len) {
        sqlite3_stmt *st;
        Digest old;
        int r;

        r = top_extent_digest(v, ino, idx, &old);
        if (r < 0)
                return r;
        if (r > 0) {
                if (digest && memcmp(old.bytes, digest->bytes, sizeof old.bytes) == 0)
                        return 0;
                r = blockref_change(v, &old, -1, 0);
                if (r < 0)
                        return r;
        }

        st = v->top.put_extent;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) idx);
        if (digest)
                sqlite3_bind_blob(st, 3, digest->bytes, sizeof digest->bytes, SQLITE_STATIC);
        else
                sqlite3_bind_null(st, 3);
        sqlite3_bind_int64(st, 4, len);
        r = sqlite_step_done(st);
        if (r < 0)
                return r;
        if (digest) {
                r = blockref_change(v, digest, +1, stored_len);
                if (r < 0)
                        return r;
        }
        volume_mark_changed(v);
        return 0;
}

/* An extent and the block references that go with it change together. */
int extent_put(Volume *v, uint64_t ino, uint64_t idx, const Digest *digest, uint32_t len, uint32_t stored_len) {
        TopChange change;
        int r;

        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: extent_replace(v, ino, idx, digest, len, stored_len));
}

static int extents_delete_rows(Volume *v, uint64_t ino, uint64_t first_idx) {
        sqlite3_stmt *st = v->top.list_extents_from;
        Digest *digests = NULL;
        size_t n = 0, allocated = 0;
        int r;

        sqlite3_bind_int64(st, 1, (sqlite3_int64) ino);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) first_idx);
        while ((r = sqlite_step_row(st)) > 0) {
                if (sqlite3_column_bytes(st, 0) != sizeof(Digest))
                        continue;
                if (!GREEDY_REALLOC(digests, allocated, n + 1)) {
                        r = -ENOMEM;
                        break;
                }
                memcpy(digests[n++].bytes, sqlite3_column_blob(st, 0), sizeof(Digest));
        }
        sqlite3_reset(st);

        for (size_t i = 0; r >= 0 && i < n; i++)
                r = blockref_change(v, &digests[i], -1, 0);
        free(digests);
        if (r < 0)
                return r;

        sqlite3_bind_int64(v->top.delete_extents_from, 1, (sqlite3_int64) ino);
        sqlite3_bind_int64(v->top.delete_extents_from, 2, (sqlite3_int64) first_idx);
        r = sqlite_step_done(v->top.delete_extents_from);
        if (r < 0)
                return r;
        volume_mark_changed(v);
        return 0;
}

int extents_delete_from(Volume *v, uint64_t ino, uint64_t first_idx) {
        TopChange change;
        int r;

        r = top_change_begin(v, &change);
        return top_change_end(v, &change, r ?: extents_delete_rows(v, ino, first_idx));
}
