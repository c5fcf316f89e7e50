/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "alloc-util.h"
#include "env-util.h"
#include "sqlite-util.h"
#include "store.h"

int sqlite_errno(int rc) {
        /* A trigger refused to change a damaged record. */
        if (rc == SQLITE_CONSTRAINT_TRIGGER)
                return -EUCLEAN;
        switch (rc & 0xff) {
        case SQLITE_OK:
        case SQLITE_ROW:
        case SQLITE_DONE:
                return 0;
        case SQLITE_BUSY:
        case SQLITE_LOCKED:
                return -EBUSY;
        case SQLITE_NOMEM:
                return -ENOMEM;
        case SQLITE_READONLY:
                return -EROFS;
        case SQLITE_FULL:
                return -ENOSPC;
        case SQLITE_CANTOPEN:
                return -ENOENT;
        case SQLITE_CONSTRAINT:
                return -EEXIST;
        case SQLITE_PERM:
        case SQLITE_AUTH:
                return -EACCES;
        case SQLITE_CORRUPT:
        case SQLITE_NOTADB:
                return -EUCLEAN;
        case SQLITE_TOOBIG:
                return -EFBIG;
        default:
                return -EIO;
        }
}

/* A write that failed for want of space is ENOSPC, not EIO: SQLite reports
 * it as an I/O error (of its journal, or of the WAL index that even a
 * reader must extend), and keeps the system's errno. */
static int sqlite_db_errno(sqlite3 *db, int rc) {
        if ((rc & 0xff) == SQLITE_IOERR && db) {
                int e = sqlite3_system_errno(db);

                if (e == ENOSPC || e == EDQUOT)
                        return -ENOSPC;
        }
        return sqlite_errno(rc);
}

/* Fault injection for tests (COWBOX_FAULT_SQL_STEP=N): the Nth step of
 * SQLite's programs in this process, on any connection, is interrupted,
 * as an I/O error or a full disk would stop it: a write then makes SQLite
 * roll back its whole transaction, a read fails alone. Not the last steps
 * of a COMMIT that is done: an I/O error cannot fail it any more, an
 * interrupt would. With COWBOX_FAULT_SQL_KILL=1, the process is killed
 * there instead (SIGKILL), as kill -9 would at that instant. */
static uint64_t fault_steps_left;
static uint64_t fault_kills;

static bool committed_already(sqlite3 *db) {
        if (!sqlite3_get_autocommit(db))
                return false;
        for (sqlite3_stmt *st = sqlite3_next_stmt(db, NULL); st; st = sqlite3_next_stmt(db, st)) {
                const char *sql = sqlite3_sql(st);

                if (sqlite3_stmt_busy(st) && sql && strncmp(sql, "COMMIT", 6) == 0)
                        return true;
        }
        return false;
}

static int fault_step(void *userdata) {
        uint64_t left = __atomic_load_n(&fault_steps_left, __ATOMIC_RELAXED);

        if (left == 1 && committed_already(userdata))
                return 0;
        while (left > 0)
                if (__atomic_compare_exchange_n(&fault_steps_left, &left, left - 1, false, __ATOMIC_RELAXED,
                                                __ATOMIC_RELAXED)) {
                        if (left == 1 && fault_kills)
                                (void) raise(SIGKILL);
                        return left == 1;
                }
        return 0;
}

void sqlite_fault_arm(uint64_t steps) {
        __atomic_store_n(&fault_steps_left, steps, __ATOMIC_RELAXED);
}

uint64_t sqlite_fault_left(void) {
        return __atomic_load_n(&fault_steps_left, __ATOMIC_RELAXED);
}

static void fault_injection_configure(void) {
        (void) secure_getenv_uint64("COWBOX_FAULT_SQL_STEP", &fault_steps_left);
        (void) secure_getenv_uint64("COWBOX_FAULT_SQL_KILL", &fault_kills);
}

/* SQLite's own account of an I/O error: which file, which system call
 * and errno, none of which the EIO a caller gets can carry. Other errors
 * are left out: busy, constraint, full disk and damage are expected and
 * answered, and recovery notices follow every crash. */
static void sqlite_log_error(void *userdata, int code, const char *message) {
        switch (code & 0xff) {
        case SQLITE_IOERR:
        case SQLITE_INTERNAL:
        case SQLITE_MISUSE:
        case SQLITE_PROTOCOL:
                store_log("SQLite error %d: %s", code, message);
                break;
        default:
                break;
        }
}

static void sqlite_configure(void) {
        fault_injection_configure();

        /* Before SQLite initialises, like the setting below. */
        (void) sqlite3_config(SQLITE_CONFIG_LOG, sqlite_log_error, NULL);

        /* No bulk allocation of 20 cache pages when a connection reads its
         * first page: filling it in touches every page of it, a fault each,
         * which short commands paid for pages they never used. Fails
         * harmlessly when SQLite was initialised before. */
        (void) sqlite3_config(SQLITE_CONFIG_PAGECACHE, NULL, 0, 0);
}

int sqlite_open(const char *path, int flags, bool wal, sqlite3 **ret) {
        static pthread_once_t configured = PTHREAD_ONCE_INIT;
        _cleanup_sqlite_ sqlite3 *db = NULL;
        int rc, r;

        (void) pthread_once(&configured, sqlite_configure);

        /* A connection of one thread needs no mutex of SQLite's; one shared by
         * threads asks for SQLITE_OPEN_FULLMUTEX. */
        if (!(flags & SQLITE_OPEN_FULLMUTEX))
                flags |= SQLITE_OPEN_NOMUTEX;
        rc = sqlite3_open_v2(path, &db, flags | SQLITE_OPEN_EXRESCODE, NULL);
        if (rc != SQLITE_OK)
                return sqlite_db_errno(db, rc);

        (void) sqlite3_busy_timeout(db, 30000);
        if (__atomic_load_n(&fault_steps_left, __ATOMIC_RELAXED) > 0)
                sqlite3_progress_handler(db, 1, fault_step, db);

        /* Statement journals and sorts in memory, not in temporary files:
         * those go to the temporary directory, often on the store's disk,
         * where a change of a mount, rolled back as a whole if it fails,
         * must not need new space to free space. */
        r = sqlite_exec(db, "PRAGMA temp_store=MEMORY");
        if (r < 0)
                return r;

        if (wal && !(flags & SQLITE_OPEN_READONLY)) {
                /* Short WALs: checkpointed every MiB, cut back to 4 MiB after
                 * a checkpoint, so that the space kept for journals on a
                 * nearly full disk suffices. */
                r = sqlite_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; "
                                    "PRAGMA wal_autocheckpoint=256; PRAGMA journal_size_limit=4194304;");
                if (r < 0)
                        return r;
        }

        *ret = TAKE_PTR(db);
        return 0;
}

int sqlite_exec(sqlite3 *db, const char *sql) {
        return sqlite_db_errno(db, sqlite3_exec(db, sql, NULL, NULL, NULL));
}

int sqlite_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **ret) {
        return sqlite_db_errno(db, sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, ret, NULL));
}

int sqlite_step_done(sqlite3_stmt *st) {
        int rc = sqlite3_step(st);
        (void) sqlite3_reset(st);
        if (rc == SQLITE_DONE || rc == SQLITE_ROW)
                return 0;
        return sqlite_db_errno(sqlite3_db_handle(st), rc);
}

int sqlite_step_row(sqlite3_stmt *st) {
        int rc = sqlite3_step(st);
        if (rc == SQLITE_ROW)
                return 1;
        if (rc == SQLITE_DONE)
                return 0;
        return sqlite_db_errno(sqlite3_db_handle(st), rc);
}

int sqlite_query_int(sqlite3 *db, const char *sql, int64_t *ret_value) {
        _cleanup_stmt_ sqlite3_stmt *st = NULL;
        int r;

        r = sqlite_db_errno(db, sqlite3_prepare_v2(db, sql, -1, &st, NULL));
        if (r < 0)
                return r;
        r = sqlite_step_row(st);
        if (r <= 0)
                return r;
        *ret_value = sqlite3_column_int64(st, 0);
        return 0;
}

int sqlite_prepare_all(sqlite3 *db, const PreparedQuery *queries, size_t n, void *base) {
        for (size_t i = 0; i < n; i++) {
                int r = sqlite_prepare(db, queries[i].sql, (sqlite3_stmt **) ((uint8_t *) base + queries[i].offset));
                if (r < 0)
                        return r;
        }
        return 0;
}

int sqlite_collect_ids(sqlite3_stmt *st, uint64_t **ret_ids, size_t *ret_n) {
        _cleanup_free_ uint64_t *ids = NULL;
        size_t n = 0, allocated = 0;
        int r;

        while ((r = sqlite_step_row(st)) > 0) {
                if (!GREEDY_REALLOC(ids, allocated, n + 1)) {
                        (void) sqlite3_reset(st);
                        return -ENOMEM;
                }
                ids[n++] = (uint64_t) sqlite3_column_int64(st, 0);
        }
        (void) sqlite3_reset(st);
        if (r < 0)
                return r;
        *ret_ids = TAKE_PTR(ids);
        *ret_n = n;
        return 0;
}

void sqlite_rollback(sqlite3 *db) {
        if (!sqlite3_get_autocommit(db))
                (void) sqlite3_exec(db, "ROLLBACK", NULL, NULL, NULL);
}

/* A BEGIN that fails may have begun all the same (one interrupted once it
 * had opened the transaction): nothing stays open. */
static int begin(sqlite3 *db, const char *sql) {
        int r;

        r = sqlite_exec(db, sql);
        if (r < 0)
                sqlite_rollback(db);
        return r;
}

int sqlite_begin(sqlite3 *db) {
        return begin(db, "BEGIN IMMEDIATE");
}

int sqlite_begin_deferred(sqlite3 *db) {
        return begin(db, "BEGIN");
}

int sqlite_commit(sqlite3 *db) {
        int r;

        r = sqlite_exec(db, "COMMIT");
        if (r < 0)
                sqlite_rollback(db);
        return r;
}
