/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A transaction ends where it fails. SQLite can be stopped at any step of
 * BEGIN or COMMIT (an I/O error, an interrupt): interrupted at each step in
 * turn, on a real database file in WAL mode as the catalog is, a BEGIN or
 * COMMIT that fails must leave the connection outside any transaction, with
 * nothing of a failed commit kept, and the next transaction must work.
 * Before, a BEGIN IMMEDIATE interrupted once it had opened its transaction
 * left it open: every later BEGIN failed, and every later statement ran in
 * a transaction never to be committed.
 */

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "sqlite-util.h"

static const char *test_name = "test-sqlite-util";

/* More than the steps of BEGIN IMMEDIATE or COMMIT. */
#define MAX_STEP 64

static char dir[] = "/var/tmp/test-sqlite-util-XXXXXX";
static char path[sizeof dir + 16];

typedef struct Interrupt {
        sqlite3 *db;
        unsigned left;
        bool in_transaction_only;
} Interrupt;

/* Interrupts the left-th step; for a COMMIT, only while its transaction is
 * open: once the commit is done, an I/O error cannot fail it any more. */
static int interrupt_at(void *userdata) {
        Interrupt *i = userdata;

        if (i->in_transaction_only && sqlite3_get_autocommit(i->db))
                return 0;
        return i->left > 0 && --i->left == 0;
}

static int64_t rows(sqlite3 *db) {
        int64_t n = -1;

        CHECK_OK(sqlite_query_int(db, "SELECT count(*) FROM t", &n));
        return n;
}

/* Interrupts begin at each step in turn; returns how many steps failed it. */
static unsigned check_begin(sqlite3 *db, int (*begin)(sqlite3 *db)) {
        unsigned failed = 0;

        for (unsigned step = 1; step <= MAX_STEP; step++) {
                Interrupt at = { .db = db, .left = step };
                int r;

                sqlite3_progress_handler(db, 1, interrupt_at, &at);
                r = begin(db);
                sqlite3_progress_handler(db, 0, NULL, NULL);
                if (r < 0) {
                        failed++;
                        CHECK(sqlite3_get_autocommit(db));
                        continue;
                }
                CHECK(!sqlite3_get_autocommit(db));
                CHECK_OK(sqlite_commit(db));
        }
        /* And then a transaction works. */
        CHECK_OK(begin(db));
        CHECK_OK(sqlite_exec(db, "INSERT INTO t VALUES (0)"));
        CHECK_OK(sqlite_commit(db));
        return failed;
}

/* Interrupts the commit of one row at each step in turn: the row is there
 * if and only if the commit succeeded. */
static unsigned check_commit(sqlite3 *db) {
        unsigned failed = 0;

        for (unsigned step = 1; step <= MAX_STEP; step++) {
                Interrupt at = { .db = db, .left = step, .in_transaction_only = true };
                int64_t before = rows(db);
                int r;

                CHECK_OK(sqlite_begin(db));
                CHECK_OK(sqlite_exec(db, "INSERT INTO t VALUES (1)"));
                sqlite3_progress_handler(db, 1, interrupt_at, &at);
                r = sqlite_commit(db);
                sqlite3_progress_handler(db, 0, NULL, NULL);
                CHECK(sqlite3_get_autocommit(db));
                CHECK(rows(db) == before + (r >= 0));
                failed += r < 0;
        }
        return failed;
}

static void cleanup(void) {
        static const char *const suffixes[] = { "", "-wal", "-shm" };

        for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
                char p[sizeof path + 8];

                snprintf(p, sizeof p, "%s%s", path, suffixes[i]);
                (void) unlink(p);
        }
        (void) rmdir(dir);
}

int main(void) {
        sqlite3 *db = NULL;
        unsigned begin_failed, deferred_failed, commit_failed;

        CHECK(mkdtemp(dir));
        snprintf(path, sizeof path, "%s/t.db", dir);
        atexit(cleanup);

        CHECK_OK(sqlite_open(path, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, true, &db));
        CHECK_OK(sqlite_exec(db, "CREATE TABLE t(x)"));

        begin_failed = check_begin(db, sqlite_begin);
        deferred_failed = check_begin(db, sqlite_begin_deferred);
        commit_failed = check_commit(db);
        /* Each was interrupted at least once: the checks above ran. */
        CHECK(begin_failed > 0 && deferred_failed > 0 && commit_failed > 0);

        sqlite3_close_v2(db);
        printf("%s: BEGIN IMMEDIATE failed at %u steps, BEGIN at %u, COMMIT at %u; "
               "each left no transaction open\n", test_name, begin_failed, deferred_failed, commit_failed);
        return EXIT_SUCCESS;
}
