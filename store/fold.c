/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Layer folding keeps stacks shallow and gives back the space of data that
 * only hidden rows still reference. A layer L with a single child C, that is
 * nobody's top, is merged with C into a new layer M = L + C (C's rows win)
 * that takes C's place; L and C then become unreachable and are dropped.
 * Nobody writes L or C meanwhile: a frozen C never changes, and a writable
 * top C is folded only while its subvolume's lock is ours. Servers that
 * still have the old stack open keep reading the old files, which stay
 * valid while open.
 *
 * Inode rows with nlink 0 (unlinked while open) that a snapshot froze
 * below a top are reached by no name: only the server that had the file
 * open then may still read them, by inode number. M leaves them out, with
 * their data, once no writable subvolume above C is being served: a
 * server started later never has them open. Else nothing would ever free
 * them: a server forgets only rows of its own top.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/sendfile.h>
#include <sys/stat.h>

#include "alloc-util.h"
#include "sqlite-util.h"
#include "store-internal.h"

typedef struct FoldCandidate {
        uint64_t lower;
        uint64_t upper;
        uint64_t parent;        /* the lower's parent, 0 for none */
        uint64_t writer;        /* the subvolume whose writable top the upper is, 0 for none */
} FoldCandidate;

/* Layers with a single child that are nobody's top, with that child. */
static int find_candidates(Store *s, FoldCandidate **ret, size_t *ret_n) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        _cleanup_free_ FoldCandidate *list = NULL;
        size_t n = 0, allocated = 0;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog,
                           "SELECT l.id, c.id, coalesce(l.parent, 0),"
                           "  coalesce((SELECT id FROM subvolumes WHERE top_layer = c.id AND readonly = 0), 0) "
                           "FROM layers l JOIN layers c ON c.parent = l.id "
                           "WHERE (SELECT count(*) FROM layers x WHERE x.parent = l.id) = 1"
                           "  AND l.id NOT IN (SELECT top_layer FROM subvolumes)"
                           "  AND c.id IN (SELECT top_layer FROM subvolumes UNION SELECT parent FROM layers) "
                           "ORDER BY l.id",
                           &st);
        if (r < 0)
                return r;
        while ((r = sqlite_step_row(st)) > 0) {
                if (!GREEDY_REALLOC(list, allocated, n + 1))
                        return -ENOMEM;
                list[n++] = (FoldCandidate) {
                        .lower = (uint64_t) sqlite3_column_int64(st, 0),
                        .upper = (uint64_t) sqlite3_column_int64(st, 1),
                        .parent = (uint64_t) sqlite3_column_int64(st, 2),
                        .writer = (uint64_t) sqlite3_column_int64(st, 3),
                };
        }
        if (r < 0)
                return r;
        *ret = TAKE_PTR(list);
        *ret_n = n;
        return 0;
}

static int copy_file(const char *from, const char *to) {
        _cleanup_close_ int in = -EBADF, out = -EBADF;
        struct stat st;
        off_t offset = 0;

        in = open(from, O_RDONLY | O_CLOEXEC);
        if (in < 0)
                return -errno;
        if (fstat(in, &st) < 0)
                return -errno;
        out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (out < 0)
                return -errno;
        while (offset < st.st_size) {
                ssize_t n = copy_file_range(in, &offset, out, NULL, (size_t) (st.st_size - offset), 0);
                if (n < 0)
                        return -errno;
                if (n == 0)
                        return -EIO;
        }
        return fsync(out) < 0 ? -errno : 0;
}

/* The merged layer's rows get checks computed anew: both layers' rows are
 * verified first, so that a damaged row is never given a valid check. */
static int verify_rows(sqlite3 *db, bool with_upper) {
        int64_t damaged = 0;
        int r;

        FOREACH_STRING(schema, "main", "upper") {
                int64_t n = 0;

                if (!with_upper && streq(schema, "upper"))
                        continue;
                r = layer_count_damaged_rows(db, schema, &n);
                if (r < 0)
                        return r;
                damaged += n;
        }
        return damaged > 0 ? -EIO : 0;
}

/* Rows of the upper layer (if upper_path is not NULL) replace the lower's;
 * what the upper cut off (lower_limit, inline contents) goes; whiteouts and
 * holes go too where no layer lies below; and with drop_orphans, the data
 * of inodes without names, and where no layer lies below their rows. */
static int apply_upper(sqlite3 *db, const char *upper_path, bool bottom, bool drop_orphans) {
        _cleanup_free_ char *sql = NULL;
        LayerCounters c = {};
        int64_t stored = 0;
        int r;

        if (upper_path) {
                if (asprintf(&sql, "ATTACH 'file:%s?immutable=1' AS upper", upper_path) < 0)
                        return -ENOMEM;
                r = sqlite_exec(db, sql);
                if (r < 0)
                        return r;
        }

        r = sqlite_begin(db);
        if (r >= 0)
                r = verify_rows(db, upper_path);
        if (r >= 0 && !upper_path)
                r = sqlite_exec(db, "CREATE TEMP TABLE lens AS SELECT digest, stored_len FROM main.blockrefs;");
        if (r >= 0 && upper_path)
                r = sqlite_exec(db,
                "CREATE TEMP TABLE lens AS SELECT digest, stored_len FROM main.blockrefs "
                "  UNION SELECT digest, stored_len FROM upper.blockrefs;"
                "DELETE FROM main.extents WHERE EXISTS (SELECT 1 FROM upper.inodes u WHERE u.ino = extents.ino"
                "  AND (u.data IS NOT NULL OR extents.idx * " STRINGIFY(STORE_BLOCK_SIZE) " >= u.lower_limit));"
                "INSERT OR REPLACE INTO main.inodes(ino, mode, nlink, uid, gid, rdev, size, atime_ns, mtime_ns,"
                "  ctime_ns, parent, lower_limit, data, data_zstd, data_check, row_check)"
                "  SELECT *, " INODE_CHECK " FROM (SELECT u.ino, u.mode, u.nlink, u.uid, u.gid, u.rdev, u.size,"
                "    u.atime_ns, u.mtime_ns, u.ctime_ns, u.parent,"
                "    min(u.lower_limit, coalesce((SELECT m.lower_limit FROM main.inodes m WHERE m.ino = u.ino),"
                "                                9223372036854775807)) AS lower_limit,"
                "    u.data, u.data_zstd, u.data_check FROM upper.inodes u);"
                "DELETE FROM main.xattrs WHERE ino IN (SELECT ino FROM upper.inodes);"
                "INSERT OR REPLACE INTO main.xattrs(ino, name, value, row_check)"
                "  SELECT ino, name, value, " XATTR_CHECK " FROM upper.xattrs;"
                "INSERT OR REPLACE INTO main.dentries(parent, name, ino, type, row_check)"
                "  SELECT parent, name, ino, type, " DENTRY_CHECK " FROM upper.dentries;"
                "INSERT OR REPLACE INTO main.extents(ino, idx, digest, len, row_check)"
                "  SELECT ino, idx, digest, len, " EXTENT_CHECK " FROM upper.extents;"
                "DELETE FROM main.info;"
                "INSERT INTO main.info(key, value, row_check) SELECT key, value, " INFO_CHECK " FROM upper.info;");
        if (r < 0)
                goto fail;
        if (bottom && upper_path) {
                r = sqlite_exec(db, "DELETE FROM main.dentries WHERE ino = 0;"
                                    "DELETE FROM main.extents WHERE digest IS NULL;"
                                    "UPDATE main.inodes SET lower_limit = 0, row_check = " INODE_CHECK_WITH("0") ";");
                if (r < 0)
                        goto fail;
        }
        if (drop_orphans) {
                r = sqlite_exec(db,
                        "DELETE FROM main.extents WHERE ino IN (SELECT ino FROM main.inodes WHERE nlink = 0);");
                /* Above a layer below, the row stays, cutting off that
                 * layer's data and rows of the inode (a file unlinked
                 * above where it was made). */
                if (r >= 0 && bottom)
                        r = sqlite_exec(db,
                                "DELETE FROM main.xattrs WHERE ino IN (SELECT ino FROM main.inodes WHERE nlink = 0);"
                                "DELETE FROM main.dentries WHERE parent IN (SELECT ino FROM main.inodes WHERE nlink = 0);"
                                "DELETE FROM main.inodes WHERE nlink = 0;");
                else if (r >= 0)
                        r = sqlite_exec(db, "UPDATE main.inodes SET lower_limit = 0, row_check = "
                                            INODE_CHECK_WITH("0") " WHERE nlink = 0;");
                if (r < 0)
                        goto fail;
        }
        r = sqlite_exec(db,
                BLOCKREFS_FROM_EXTENTS("main.", ", row_check", ", " BLOCKREF_CHECK));
        if (r < 0)
                goto fail;

        r = sqlite_query_int(db, "SELECT coalesce(sum(stored_len + 48), 0) FROM main.blockrefs", &stored);
        if (r >= 0)
                r = layer_read_counters(db, &c);
        if (r < 0)
                goto fail;
        c.stored_bytes = (uint64_t) stored;
        r = layer_write_counters(db, &c);
        if (r >= 0)
                r = sqlite_commit(db);
        if (r < 0)
                goto fail;
        return upper_path ? sqlite_exec(db, "DETACH upper") : 0;
fail:
        sqlite_rollback(db);
        return r;
}

/* Builds M's database: a copy of the lower layer with the upper applied,
 * or the upper alone. Where neither was ever written, M is not either: a
 * layer without a database holds nothing and reads the counters of the
 * layers below it, which a database made here would hide behind those of
 * an empty store (next_ino 2: the next file made would take the inode
 * number of one below). */
static int build_merged(Store *s, const FoldCandidate *fc, uint64_t merged, bool drop_orphans) {
        _cleanup_free_ char *lower_path = NULL, *upper_path = NULL, *path = NULL, *tmp = NULL;
        _cleanup_sqlite_ sqlite3 *db = NULL;
        int lower_exists, upper_exists, r;

        lower_exists = layer_exists(s, fc->lower);
        if (lower_exists < 0)
                return lower_exists;
        /* A layer rewritten alone is its own upper. */
        upper_exists = fc->upper == fc->lower ? 0 : layer_exists(s, fc->upper);
        if (upper_exists < 0)
                return upper_exists;
        /* A layer made and gone is lost, not empty: folding it would make
         * the loss look whole. */
        if ((!lower_exists && catalog_layer_was_made(s, fc->lower) != 0) ||
            (!upper_exists && fc->upper != fc->lower && catalog_layer_was_made(s, fc->upper) != 0))
                return -EUCLEAN;
        if (!lower_exists && !upper_exists)
                return 0;

        r = layer_path(s, fc->lower, &lower_path);
        if (r >= 0)
                r = layer_path(s, fc->upper, &upper_path);
        if (r >= 0)
                r = layer_path(s, merged, &path);
        if (r < 0)
                return r;
        if (asprintf(&tmp, "%s.new", path) < 0)
                return -ENOMEM;

        if (lower_exists) {
                r = copy_file(lower_path, tmp);
                if (r < 0)
                        return r;
                /* Named for good before the catalog names it (swap_in()),
                 * and from then on a loss if it goes. */
                if (rename(tmp, path) < 0 || fsync(s->layers_fd) < 0)
                        return -errno;
                r = catalog_layer_set_made(s, merged);
                if (r >= 0)
                        r = layer_open(s, merged, LAYER_WRITE, &db);
        } else {
                /* The upper's counters replace these: it has a database. */
                LayerCounters c = { .next_ino = 2 };

                r = layer_create(s, merged, &c, false, &db);
        }
        if (r < 0)
                return r;

        if (upper_exists || drop_orphans) {
                r = apply_upper(db, upper_exists ? upper_path : NULL, fc->parent == 0, drop_orphans);
                if (r < 0)
                        return r;
        }
        /* M is unreachable, not unseen: its row makes it a dead layer, whose
         * bytes the space estimate (usage, the daemon's watch) reads now
         * and then, and the mode change waits for such a reader to go. */
        return layer_journal_delete(db);
}

/* In a transaction: -ESTALE unless the pair is still one to fold, as
 * find_candidates() found it before the fold took the writer's lock. A
 * snapshot of a top never written meanwhile makes the lower a read-only
 * snapshot's top, or the parent of a writable one's. */
static int check_pair(Store *s, const FoldCandidate *fc) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        if (fc->lower == fc->upper)
                return 0;
        r = sqlite_prepare(s->catalog,
                           "SELECT (SELECT count(*) FROM layers WHERE parent = ?1) = 1"
                           "  AND EXISTS (SELECT 1 FROM layers WHERE id = ?2 AND parent = ?1)"
                           "  AND NOT EXISTS (SELECT 1 FROM subvolumes WHERE top_layer = ?1)", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) fc->lower);
        sqlite3_bind_int64(st, 2, (sqlite3_int64) fc->upper);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r < 0 ? r : -EIO;
        return sqlite3_column_int(st, 0) ? 0 : -ESTALE;
}

/* In the transaction of swap_in(), which it ends: M's row goes, since M
 * is not used, or it would stand beside the lower as a child of the
 * lower's parent until the next reap. -ESTALE, or a negative errno. */
static int drop_merged(Store *s, uint64_t merged) {
        char sql[96];
        int r;

        snprintf(sql, sizeof sql, "DELETE FROM layers WHERE id = %" PRIu64, merged);
        r = sqlite_exec(s->catalog, sql);
        if (r >= 0)
                r = catalog_fold_done(s);
        if (r >= 0)
                r = sqlite_commit(s->catalog);
        if (r < 0) {
                sqlite_rollback(s->catalog);
                return r;
        }
        return -ESTALE;
}

static int swap_in(Store *s, const FoldCandidate *fc, uint64_t merged) {
        _cleanup_stmt_ sqlite3_stmt *a = NULL, *b = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_begin(s->catalog);
        if (r < 0)
                return r;
        r = check_pair(s, fc);
        if (r == -ESTALE)
                return drop_merged(s, merged);
        if (r >= 0)
                r = sqlite_prepare(s->catalog, "UPDATE layers SET parent = ?1 WHERE parent = ?2", &a);
        if (r >= 0)
                r = sqlite_prepare(s->catalog, "UPDATE subvolumes SET top_layer = ?1 WHERE top_layer = ?2", &b);
        if (r >= 0) {
                sqlite3_bind_int64(a, 1, (sqlite3_int64) merged);
                sqlite3_bind_int64(a, 2, (sqlite3_int64) fc->upper);
                r = sqlite_step_done(a);
        }
        if (r >= 0) {
                sqlite3_bind_int64(b, 1, (sqlite3_int64) merged);
                sqlite3_bind_int64(b, 2, (sqlite3_int64) fc->upper);
                r = sqlite_step_done(b);
        }
        /* Nothing reaches the lower and the upper any more: their rows go
         * now, so that the next fold sees M as its parent's only child. */
        if (r >= 0) {
                char sql[128];

                snprintf(sql, sizeof sql, "DELETE FROM layers WHERE id IN (%" PRIu64 ", %" PRIu64 ")",
                         fc->lower, fc->upper);
                r = sqlite_exec(s->catalog, sql);
        }
        if (r >= 0)
                r = catalog_fold_done(s);
        if (r >= 0)
                r = sqlite_commit(s->catalog);
        if (r < 0)
                sqlite_rollback(s->catalog);
        return r;
}

/* Whether rows of inodes without names in the pair are of no use to
 * anyone: 1 unless a writable subvolume whose top is the upper or above it
 * is served (other than fc->writer, whose lock is ours), or a negative
 * errno. Such a server may have had the file open since before the layer
 * froze, and read it by inode number. */
static int orphans_unused(Store *s, const FoldCandidate *fc) {
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0, allocated = 0;
        int r;

        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;

                CATALOG_LOCKED(s);
                r = sqlite_prepare(s->catalog,
                                   "WITH RECURSIVE above(id) AS (SELECT ?1"
                                   "  UNION SELECT l.id FROM layers l JOIN above ON l.parent = above.id) "
                                   "SELECT id FROM subvolumes WHERE readonly = 0 AND top_layer IN above",
                                   &st);
                if (r < 0)
                        return r;
                sqlite3_bind_int64(st, 1, (sqlite3_int64) fc->upper);
                while ((r = sqlite_step_row(st)) > 0) {
                        if (!GREEDY_REALLOC(ids, allocated, n + 1))
                                return -ENOMEM;
                        ids[n++] = (uint64_t) sqlite3_column_int64(st, 0);
                }
                if (r < 0)
                        return r;
        }
        for (size_t i = 0; i < n; i++) {
                pid_t holder;

                if (ids[i] == fc->writer)
                        continue;
                r = subvolume_lock_holder(s, ids[i], &holder);
                if (r != 0)
                        return r < 0 ? r : 0;
        }
        return 1;
}

/* Folds one pair. A writable top is folded only while nobody serves its
 * subvolume: its lock is held until the catalog names the merged layer.
 * A pair of one layer (lower and upper the same) is that layer rewritten
 * without its rows of inodes without names, if nobody may use them. */
static int fold_one(Store *s, const FoldCandidate *fc, Pace *pace, StoreReapStats *stats) {
        _cleanup_close_ int lock = -EBADF;
        bool rewrite = fc->lower == fc->upper;
        uint64_t merged, before;
        int unused, r;

        if (fc->writer != 0) {
                lock = subvolume_lock_full(s, fc->writer, true, SUBVOLUME_LOCK_BRIEF, NULL);
                if (lock == -EBUSY)
                        return 0;
                if (lock < 0)
                        return lock;
        }
        /* The upper is read immutable below: no WAL may hold part of it (a
         * server that died leaves its last changes there). */
        r = layer_seal(s, fc->upper);
        if (r == -EBUSY)
                return 0;
        if (r < 0)
                return r;

        unused = orphans_unused(s, fc);
        if (unused < 0)
                return unused;
        if (rewrite && unused == 0)
                return 0;
        /* M's row exists, unreachable, before its file: a crash leaves a
         * dead layer that the next reap drops. */
        r = catalog_new_folding_layer(s, fc->parent, &merged);
        if (r < 0)
                return r;
        r = build_merged(s, fc, merged, unused > 0);
        if (r >= 0) {
                pace_wrote(pace, layer_file_bytes(s, merged));
                r = swap_in(s, fc, merged);
        }
        if (r < 0) {
                (void) layer_unlink(s, merged);
                /* Changed since it was found: a later reap looks again. */
                if (r == -ESTALE)
                        return 0;
                if (r != -EIO)
                        return r;
                /* A damaged row: the pair stays as it is, for scrub to
                 * name and reads to refuse, and the reaper goes on. */
                block_count_corruption(s);
                return 0;
        }
        if (rewrite) {
                before = layer_file_bytes(s, fc->lower);
                stats->bytes_freed += before - MIN(before, layer_file_bytes(s, merged));
                (void) layer_unlink(s, fc->lower);
                return 1;
        }
        stats->bytes_freed += layer_file_bytes(s, fc->lower) + layer_file_bytes(s, fc->upper);
        (void) layer_unlink(s, fc->lower);
        (void) layer_unlink(s, fc->upper);
        stats->layers_folded++;
        return 1;
}

/* Layers nobody writes (below a top, or a read-only subvolume's top) that
 * hold rows of inodes without names, as pairs of one layer: a snapshot
 * froze them with files unlinked while open. Folds drop those of the
 * layers they merge; these are the rest. */
static int find_frozen_orphans(Store *s, FoldCandidate **ret, size_t *ret_n) {
        _cleanup_free_ FoldCandidate *list = NULL;
        size_t n = 0, k = 0, allocated = 0;
        int r;

        {
                _cleanup_stmt_ sqlite3_stmt *st = NULL;

                CATALOG_LOCKED(s);
                r = sqlite_prepare(s->catalog,
                                   "WITH RECURSIVE live(layer) AS ("
                                   "  SELECT top_layer FROM subvolumes WHERE deleted = 0"
                                   "  UNION SELECT layers.parent FROM live JOIN layers ON layers.id = live.layer"
                                   "  WHERE layers.parent IS NOT NULL) "
                                   "SELECT l.id, coalesce(l.parent, 0) FROM layers l "
                                   "WHERE l.id IN (SELECT layer FROM live)"
                                   "  AND l.id NOT IN (SELECT top_layer FROM subvolumes WHERE readonly = 0) "
                                   "ORDER BY l.id",
                                   &st);
                if (r < 0)
                        return r;
                while ((r = sqlite_step_row(st)) > 0) {
                        if (!GREEDY_REALLOC(list, allocated, n + 1))
                                return -ENOMEM;
                        list[n].lower = list[n].upper = (uint64_t) sqlite3_column_int64(st, 0);
                        list[n].parent = (uint64_t) sqlite3_column_int64(st, 1);
                        list[n].writer = 0;
                        n++;
                }
                if (r < 0)
                        return r;
        }

        /* Each layer is opened, as the mark of the blocks opens it; the
         * orphans index answers at once. */
        for (size_t i = 0; i < n; i++) {
                _cleanup_sqlite_ sqlite3 *db = NULL;
                int64_t found = 0;

                r = layer_open(s, list[i].lower, LAYER_READ_FROZEN, &db);
                /* Never written, or lost (which fsck names). */
                if (r == -ENOENT || r == -EUCLEAN)
                        continue;
                /* Above a layer below, a row rewritten stays, without data
                 * and cutting off the layers below: it is not looked at
                 * again. */
                if (r >= 0)
                        r = sqlite_query_int(db, list[i].parent == 0
                                ? "SELECT EXISTS (SELECT 1 FROM inodes WHERE nlink = 0)"
                                : "SELECT EXISTS (SELECT 1 FROM inodes i WHERE nlink = 0 AND (lower_limit != 0"
                                  "  OR EXISTS (SELECT 1 FROM extents e WHERE e.ino = i.ino)))",
                                &found);
                if (r < 0)
                        return r;
                if (found)
                        list[k++] = list[i];
        }
        *ret = TAKE_PTR(list);
        *ret_n = k;
        return 0;
}

/* The parent the catalog gives the layer now (0 for none); -ENOENT if
 * the layer is gone. */
static int layer_parent(Store *s, uint64_t layer, uint64_t *ret) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        CATALOG_LOCKED(s);
        r = sqlite_prepare(s->catalog, "SELECT coalesce(parent, 0) FROM layers WHERE id = ?1", &st);
        if (r < 0)
                return r;
        sqlite3_bind_int64(st, 1, (sqlite3_int64) layer);
        r = sqlite_step_row(st);
        if (r <= 0)
                return r < 0 ? r : -ENOENT;
        *ret = (uint64_t) sqlite3_column_int64(st, 0);
        return 0;
}

int fold_layers(Store *s, Pace *pace, StoreReapStats *stats) {
        bool folded;

        /* Each fold changes the tree: look again until a pass folds nothing. */
        do {
                _cleanup_free_ FoldCandidate *list = NULL;
                size_t n = 0;
                int r;

                r = find_candidates(s, &list, &n);
                if (r < 0)
                        return r;
                folded = false;
                for (size_t i = 0; i < n && !folded; i++) {
                        r = pace_step(pace, 0);
                        if (r < 0)
                                return r;
                        r = fold_one(s, &list[i], pace, stats);
                        /* A merged layer is a copy: on a full disk it waits
                         * for the space the rest of the reap gives back. */
                        if (r == -ENOSPC)
                                return 0;
                        if (r < 0)
                                return r;
                        folded = r > 0;
                }
        } while (folded);

        {
                _cleanup_free_ FoldCandidate *list = NULL;
                size_t n = 0;
                int r;

                r = find_frozen_orphans(s, &list, &n);
                if (r < 0)
                        return r;
                for (size_t i = 0; i < n; i++) {
                        r = pace_step(pace, 0);
                        if (r < 0)
                                return r;
                        /* A layer rewritten before this one may have been
                         * its parent: the rewrite stands on what replaced
                         * it, or its stack would end there. */
                        r = layer_parent(s, list[i].lower, &list[i].parent);
                        if (r == -ENOENT)
                                continue;
                        if (r < 0)
                                return r;
                        r = fold_one(s, &list[i], pace, stats);
                        if (r == -ENOSPC)
                                return 0;
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}
