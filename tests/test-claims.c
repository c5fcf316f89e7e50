/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Claims under races. A receive claims its temporary names, and the next
 * receive clears the claims nobody holds: a clearing that meets a claim
 * being taken must neither remove a claim that is held nor leave its
 * holder locking a file that is gone, which would claim nothing. One
 * process takes and lets go of a claim over and over, others clear
 * claims without pause, and every time the claim is taken this process
 * checks, from a store of its own, that the claim is seen held.
 */

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "cleanup.h"
#include "store.h"

#define ROUNDS 5000
#define CLEARERS 3

static const char *test_name = "";

static char store_dir[] = "/var/tmp/cowbox-test-claims-XXXXXX";
static pid_t test_pid;
static pid_t children[CLEARERS + 1];

/* Before the store is removed, also when a check failed: a child left
 * running would make files in it again. */
static void kill_children(void) {
        for (size_t i = 0; i < ELEMENTSOF(children); i++)
                if (children[i] > 0) {
                        (void) kill(children[i], SIGKILL);
                        (void) waitpid(children[i], NULL, 0);
                        children[i] = 0;
                }
}

static void cleanup_store(void) {
        char cmd[512];

        snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", store_dir);
        (void) !system(cmd);
}

static bool claim_file_exists(const char *claim) {
        char path[512];
        struct stat st;

        snprintf(path, sizeof path, "%s/locks/claim-%s.lock", store_dir, claim);
        return stat(path, &st) == 0;
}

static void test_basics(Store *s) {
        Store *other = NULL;

        test_name = "basics";
        CHECK_OK(store_open(store_dir, &other));

        CHECK(store_claim(s, "Bad/Name") == -EINVAL);
        CHECK(store_claim_is_held(other, "receive-a") == 0);
        CHECK_OK(store_claim(s, "receive-a"));
        CHECK(store_claim_is_held(other, "receive-a") == 1);
        /* Exclusive: another store of this process is refused. */
        CHECK(store_claim(other, "receive-a") == -EEXIST);
        /* A clearing passes a held claim by, and removes one nobody holds. */
        CHECK_OK(store_claim(other, "receive-b"));
        store_close(other);
        CHECK_OK(store_open(store_dir, &other));
        CHECK(claim_file_exists("receive-b"));
        CHECK(store_claims_clear(other, "receive-") == 1);
        CHECK(!claim_file_exists("receive-b"));
        CHECK(store_claim_is_held(other, "receive-a") == 1);
        CHECK(store_claims_clear(other, "other-") == 0);

        CHECK_OK(store_claim_release(s, "receive-a"));
        CHECK(store_claim_release(s, "receive-a") == -ENOENT);
        CHECK(!claim_file_exists("receive-a"));
        CHECK(store_claim_is_held(other, "receive-a") == 0);
        store_close(other);
}

_noreturn_
static void clear_forever(void) {
        Store *s = NULL;

        /* Not beyond a test that failed. */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != test_pid)
                _exit(EXIT_FAILURE);
        if (store_open(store_dir, &s) < 0)
                _exit(EXIT_FAILURE);
        for (;;)
                if (store_claims_clear(s, "receive-") < 0)
                        _exit(EXIT_FAILURE);
}

/* Takes the claim ROUNDS times; each time, says so on ready_fd and lets
 * go once told on go_fd. */
_noreturn_
static void claim_over_and_over(int ready_fd, int go_fd) {
        Store *s = NULL;
        char c;

        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != test_pid)
                _exit(EXIT_FAILURE);
        if (store_open(store_dir, &s) < 0)
                _exit(EXIT_FAILURE);
        for (unsigned i = 0; i < ROUNDS; i++) {
                if (store_claim(s, "receive-raced") < 0)
                        _exit(3);
                if (write(ready_fd, "1", 1) != 1 || read(go_fd, &c, 1) != 1)
                        _exit(EXIT_FAILURE);
                if (store_claim_release(s, "receive-raced") < 0)
                        _exit(4);
        }
        _exit(EXIT_SUCCESS);
}

static void test_races(void) {
        pid_t *clearers = children, claimer;
        int ready[2], go[2], status;
        Store *s = NULL;
        unsigned rounds = 0;
        char c;

        test_name = "races";
        test_pid = getpid();
        atexit(kill_children);
        CHECK_OK(store_open(store_dir, &s));
        for (size_t i = 0; i < CLEARERS; i++) {
                clearers[i] = fork();
                CHECK(clearers[i] >= 0);
                if (clearers[i] == 0)
                        clear_forever();
        }
        /* After the clearers: only the claimer may keep ready open. */
        CHECK(pipe(ready) == 0 && pipe(go) == 0);
        claimer = children[CLEARERS] = fork();
        CHECK(claimer >= 0);
        if (claimer == 0)
                claim_over_and_over(ready[1], go[0]);
        close(ready[1]);
        close(go[0]);

        while (read(ready[0], &c, 1) == 1) {
                /* Held: seen held, its file there, not taken twice. */
                if (store_claim_is_held(s, "receive-raced") != 1) {
                        fprintf(stderr, "races: round %u: a claim taken is not seen held\n", rounds);
                        CHECK(false);
                }
                CHECK(claim_file_exists("receive-raced"));
                CHECK(write(go[1], "1", 1) == 1);
                rounds++;
        }
        CHECK(waitpid(claimer, &status, 0) == claimer);
        children[CLEARERS] = 0;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                fprintf(stderr, "races: the claimer failed (status %d) after %u rounds\n", status, rounds);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        CHECK(rounds == ROUNDS);
        for (size_t i = 0; i < CLEARERS; i++) {
                CHECK(kill(clearers[i], SIGKILL) == 0);
                CHECK(waitpid(clearers[i], &status, 0) == clearers[i]);
                clearers[i] = 0;
                CHECK(WIFSIGNALED(status));     /* not one that failed */
        }
        /* Let go of, it is nobody's. */
        CHECK(store_claim_is_held(s, "receive-raced") == 0);
        store_close(s);
}

int main(void) {
        Store *s = NULL;

        if (!mkdtemp(store_dir)) {
                perror("mkdtemp");
                return EXIT_FAILURE;
        }
        atexit(cleanup_store);
        CHECK(rmdir(store_dir) == 0);
        CHECK_OK(store_init(store_dir));
        CHECK_OK(store_open(store_dir, &s));

        test_basics(s);
        test_races();

        store_close(s);
        printf("test-claims: all checks passed\n");
        return EXIT_SUCCESS;
}
