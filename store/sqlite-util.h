/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Small helpers around SQLite: errors as negative errno, cleanup attributes. */

#include <sqlite3.h>
#include <stdbool.h>
#include <stdint.h>

#include "cleanup.h"

DEFINE_TRIVIAL_CLEANUP_FUNC(sqlite3_stmt *, sqlite3_finalize);
#define _cleanup_stmt_ _cleanup_(sqlite3_finalizep)

static inline void sqlite3_closep(sqlite3 **db) {
        if (*db)
                (void) sqlite3_close_v2(*db);
}
#define _cleanup_sqlite_ _cleanup_(sqlite3_closep)

/* Maps an SQLite result code to a negative errno. */
int sqlite_errno(int rc);

/* Opens a database. flags as sqlite3_open_v2(); the connection gets a busy
 * timeout, foreign keys, and (if wal) WAL journaling with full sync. */
int sqlite_open(const char *path, int flags, bool wal, sqlite3 **ret);

/* Runs one or more statements that return no rows. */
int sqlite_exec(sqlite3 *db, const char *sql);

int sqlite_prepare(sqlite3 *db, const char *sql, sqlite3_stmt **ret);

/* Steps a statement that returns no row, then resets it. */
int sqlite_step_done(sqlite3_stmt *st);

/* Steps a statement: 1 if a row is ready, 0 when done, negative on error. */
int sqlite_step_row(sqlite3_stmt *st);

/* Runs a query that returns one integer; ret_value untouched if no row. */
int sqlite_query_int(sqlite3 *db, const char *sql, int64_t *ret_value);

/* A statement to prepare into the struct at base + offset. */
typedef struct PreparedQuery {
        size_t offset;
        const char *sql;
} PreparedQuery;

int sqlite_prepare_all(sqlite3 *db, const PreparedQuery *queries, size_t n, void *base);

/* Steps a statement and collects its first column's integers. */
int sqlite_collect_ids(sqlite3_stmt *st, uint64_t **ret_ids, size_t *ret_n);

/* BEGIN IMMEDIATE (a writer), and BEGIN (a reader until it writes). */
int sqlite_begin(sqlite3 *db);
int sqlite_begin_deferred(sqlite3 *db);

/* Fault injection (COWBOX_FAULT_SQL_STEP, for tests): interrupts the steps-th
 * step of SQLite's programs on connections opened from now on (0: none),
 * or kills the process there with COWBOX_FAULT_SQL_KILL=1; and how many
 * steps are left before it. */
void sqlite_fault_arm(uint64_t steps);
uint64_t sqlite_fault_left(void);
/* A commit that fails is rolled back: an interrupted or failed COMMIT can
 * leave the transaction open, and every later statement of the connection
 * in it, never to be committed. */
int sqlite_commit(sqlite3 *db);
void sqlite_rollback(sqlite3 *db);
