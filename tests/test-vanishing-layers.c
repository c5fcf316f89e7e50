/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * A layer the reaper removes while a listing opens it. A listing reads a
 * subvolume's stack from the catalog and then opens its layers; meanwhile
 * another process may delete the subvolume and reap, or fold the stack, and
 * remove the files. SQLite opens a layer's journal at its first read, next
 * to the database and by its name: with the database gone, it reported an
 * I/O error, and `usage` or `subvolume list` failed with EIO now and then
 * during reaps. The listing must take such a layer for gone and read the
 * catalog again.
 *
 * The moment is made exact: every database of this process is opened
 * through a VFS that passes everything on to SQLite's own, except that once
 * armed it runs a real `cowbox-store subvolume delete` and `reap` of the
 * store just before SQLite opens the journal of the armed layer.
 */

#include <errno.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "store.h"
#include "string-util.h"

static const char *test_name = "";

static char store_dir[] = "/var/tmp/cowbox-test-vanishing-XXXXXX";

static sqlite3_vfs *unix_vfs;
static sqlite3_vfs hooked_vfs;

/* The journal whose opening runs the action, once; and the subvolume the
 * action deletes. */
static char armed_journal[64];
static const char *doomed_subvolume;
static unsigned actions_run;

static void run_store_tool(const char *args) {
        const char *tool = getenv("COWBOX_STORE_TOOL");
        char cmd[1024];

        CHECK(tool);
        snprintf(cmd, sizeof cmd, "'%s' --store '%s' %s >/dev/null", tool, store_dir, args);
        if (system(cmd) != 0) {
                fprintf(stderr, "%s: failed: %s\n", test_name, cmd);
                exit(EXIT_FAILURE);
        }
}

static void delete_and_reap(void) {
        char args[256];

        snprintf(args, sizeof args, "subvolume delete %s", doomed_subvolume);
        run_store_tool(args);
        run_store_tool("reap --wait");
        actions_run++;
}

static int hooked_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *file, int flags, int *ret_flags) {
        (void) vfs;
        if (armed_journal[0] && name && endswith(name, armed_journal)) {
                armed_journal[0] = '\0';
                delete_and_reap();
        }
        return unix_vfs->xOpen(unix_vfs, name, file, flags, ret_flags);
}

static void install_hooked_vfs(void) {
        unix_vfs = sqlite3_vfs_find(NULL);
        CHECK(unix_vfs);
        hooked_vfs = *unix_vfs;
        hooked_vfs.zName = "cowbox-test-hooked";
        hooked_vfs.xOpen = hooked_open;
        CHECK(sqlite3_vfs_register(&hooked_vfs, 1) == SQLITE_OK);
}

static void arm(Store *s, const char *name) {
        StoreSubvolumeInfo info = {};
        char layer[64];
        struct stat st;

        CHECK_OK(store_subvolume_show(s, name, &info));
        snprintf(layer, sizeof layer, "%s/layers/%" PRIu64 ".db", store_dir, info.top_layer);
        CHECK(stat(layer, &st) == 0);   /* made: the listing opens it */
        snprintf(armed_journal, sizeof armed_journal, "/%" PRIu64 ".db-wal", info.top_layer);
        doomed_subvolume = name;
        store_subvolume_info_clear(&info);
}

static void write_file(Store *s, const char *subvolume, const char *name) {
        static const char data[] = "written, so that the top layer is made\n";
        struct stat st;
        Volume *v = NULL;

        CHECK_OK(volume_open(s, subvolume, true, &v, NULL));
        CHECK_OK(volume_mknod(v, 1, name, S_IFREG | 0644, 0, 0, 0, &st));
        CHECK(volume_write(v, st.st_ino, data, sizeof data, 0) == (ssize_t) sizeof data);
        volume_close(v);
}

static void make_written(Store *s, const char *name) {
        CHECK_OK(store_subvolume_create(s, name));
        write_file(s, name, "f");
}

/* Shown while it goes: not found, as if deleted a moment earlier. */
static void test_show(Store *s) {
        StoreSubvolumeInfo info = {};
        unsigned before = actions_run;

        test_name = "show";
        make_written(s, "shown");
        arm(s, "shown");
        CHECK(store_subvolume_show(s, "shown", &info) == -ENOENT);
        CHECK(actions_run == before + 1);
}

/* Listed while it goes: the others are listed all the same. */
static void test_list(Store *s) {
        StoreSubvolumeInfo *infos = NULL;
        unsigned before = actions_run;
        bool kept = false;
        size_t n = 0;

        test_name = "list";
        make_written(s, "kept");
        make_written(s, "listed");
        arm(s, "listed");
        CHECK_OK(store_subvolume_list(s, &infos, &n));
        CHECK(actions_run == before + 1);
        for (size_t i = 0; i < n; i++) {
                CHECK(!streq(infos[i].name, "listed"));
                if (streq(infos[i].name, "kept")) {
                        kept = true;
                        CHECK(infos[i].inodes == 2);    /* the root and f */
                }
        }
        CHECK(kept);
        store_subvolume_info_array_free(infos, n);
}

/* usage lists every subvolume to count what is shared. */
static void test_usage(Store *s) {
        unsigned before = actions_run;
        StoreUsage usage;

        test_name = "usage";
        make_written(s, "counted");
        arm(s, "counted");
        CHECK_OK(store_usage(s, &usage));
        CHECK(actions_run == before + 1);
}

/* Shown while the reaper folds its stack, the top included, into a new
 * layer: shown as it is now. */
static void test_fold(Store *s) {
        StoreSubvolumeInfo info = {};
        unsigned before = actions_run;
        uint64_t old_top;

        test_name = "fold";
        make_written(s, "folded");
        CHECK_OK(store_subvolume_snapshot(s, "folded", "folded-snapshot", true));
        write_file(s, "folded", "g");
        CHECK_OK(store_subvolume_show(s, "folded", &info));
        CHECK(info.depth == 2);
        old_top = info.top_layer;
        store_subvolume_info_clear(&info);

        arm(s, "folded");
        doomed_subvolume = "folded-snapshot";
        CHECK_OK(store_subvolume_show(s, "folded", &info));
        CHECK(actions_run == before + 1);
        CHECK(info.top_layer != old_top);
        CHECK(info.depth == 1);
        CHECK(info.inodes == 3);        /* the root, f and g */
        store_subvolume_info_clear(&info);
}

static void cleanup_store(void) {
        char cmd[512];

        snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", store_dir);
        (void) !system(cmd);
}

int main(void) {
        Store *s = NULL;

        if (!getenv("COWBOX_STORE_TOOL")) {
                printf("test-vanishing-layers: skipped: COWBOX_STORE_TOOL is not set\n");
                return 77;
        }
        if (!mkdtemp(store_dir)) {
                perror("mkdtemp");
                return EXIT_FAILURE;
        }
        atexit(cleanup_store);
        CHECK(rmdir(store_dir) == 0);
        install_hooked_vfs();
        CHECK_OK(store_init(store_dir));
        CHECK_OK(store_open(store_dir, &s));

        test_show(s);
        test_list(s);
        test_usage(s);
        test_fold(s);

        CHECK(store_fsck(s, false, NULL, NULL, NULL) == 0);
        store_close(s);
        printf("test-vanishing-layers: all checks passed\n");
        return EXIT_SUCCESS;
}
