/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The store's volume layer without FUSE: layering, copy-up, truncation
 * across layers, whiteouts, snapshots, deletion and reaping, folding, and
 * corruption detection, on a real store in a temporary directory.
 */

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "check.h"
#include "cleanup.h"
#include "sqlite-util.h"
#include "store.h"
#include "string-util.h"
#include "time-util.h"

static const char *test_name = "";

static char store_dir[] = "/tmp/cowbox-test-volume-XXXXXX";

static void remove_tree(const char *path) {
        char cmd[512];

        snprintf(cmd, sizeof cmd, "rm -rf -- '%s'", path);
        (void) !system(cmd);
}

static void cleanup_store(void) {
        remove_tree(store_dir);
}

static uint64_t make_file(Volume *v, uint64_t parent, const char *name) {
        struct stat st;

        CHECK_OK(volume_mknod(v, parent, name, S_IFREG | 0644, 0, 0, 0, &st));
        return st.st_ino;
}

static uint64_t lookup(Volume *v, uint64_t parent, const char *name) {
        struct stat st;

        CHECK_OK(volume_lookup(v, parent, name, &st));
        return st.st_ino;
}

static void fill_pattern(uint8_t *buf, size_t n, unsigned seed) {
        uint32_t x = seed * 2654435761u + 1;

        for (size_t i = 0; i < n; i++) {
                x ^= x << 13, x ^= x >> 17, x ^= x << 5;
                buf[i] = (uint8_t) x;
        }
}

static void check_content(Volume *v, uint64_t ino, const uint8_t *expect, size_t n) {
        _cleanup_free_ uint8_t *buf = malloc(n + 100);
        struct stat st;

        CHECK(buf);
        CHECK_OK(volume_getattr(v, ino, &st));
        CHECK((size_t) st.st_size == n);
        CHECK(volume_read(v, ino, buf, n + 100, 0) == (ssize_t) n);
        CHECK(memcmp(buf, expect, n) == 0);
}

static Volume *open_volume(Store *s, const char *name, bool writable) {
        Volume *v = NULL;

        CHECK_OK(volume_open(s, name, writable, &v, NULL));
        return v;
}

static void test_basic_and_snapshot(Store *s) {
        _cleanup_free_ uint8_t *big = malloc(300000), *changed = NULL;
        char target[64];
        Volume *v;
        uint64_t dir, small, large, link_ino;
        struct stat st;
        pid_t holder = 0;

        test_name = "basic-and-snapshot";
        CHECK(big);
        fill_pattern(big, 300000, 1);
        CHECK_OK(store_subvolume_create(s, "a"));
        CHECK(store_subvolume_create(s, "a") == -EEXIST);
        CHECK(store_subvolume_create(s, "x/y") == -EINVAL);

        v = open_volume(s, "a", true);
        CHECK(volume_open(s, "a", true, &(Volume *) { NULL }, &holder) == -EBUSY);
        CHECK(holder == getpid());

        CHECK_OK(volume_mkdir(v, 1, "dir", 0755, 0, 0, &st));
        dir = st.st_ino;
        small = make_file(v, dir, "small");
        CHECK(volume_write(v, small, "hello", 5, 0) == 5);
        large = make_file(v, dir, "large");
        CHECK(volume_write(v, large, big, 300000, 0) == 300000);
        CHECK_OK(volume_symlink(v, 1, "link", "dir/small", 0, 0, &st));
        link_ino = st.st_ino;
        CHECK_OK(volume_setxattr(v, large, "user.k", "v1", 2, 0));
        CHECK(volume_setxattr(v, large, "user.k", "v2", 2, XATTR_CREATE) == -EEXIST);
        CHECK_OK(volume_link(v, small, 1, "small-link", &st));
        CHECK(st.st_nlink == 2);
        check_content(v, large, big, 300000);
        CHECK_OK(volume_sync(v));
        check_content(v, large, big, 300000);
        volume_close(v);

        CHECK_OK(store_subvolume_snapshot(s, "a", "b", false));
        CHECK_OK(store_subvolume_snapshot(s, "a", "ro", true));
        CHECK(store_subvolume_snapshot(s, "a", "b", false) == -EEXIST);
        CHECK(store_subvolume_snapshot(s, "missing", "z", false) == -ENOENT);

        /* Change a after the snapshot: overwrite a part, truncate, unlink. */
        v = open_volume(s, "a", true);
        changed = malloc(300000);
        CHECK(changed);
        memcpy(changed, big, 300000);
        memset(changed + 70000, 'x', 1000);
        CHECK(volume_write(v, large, changed + 70000, 1000, 70000) == 1000);
        check_content(v, large, changed, 300000);
        CHECK_OK(volume_unlink(v, dir, "small"));
        CHECK(volume_lookup(v, dir, "small", &st) == -ENOENT);
        {
                /* A file without names, open until the kernel forgets it,
                 * gets none back (the reaper drops such files from frozen
                 * layers). */
                uint64_t gone = make_file(v, 1, "gone");

                CHECK_OK(volume_unlink(v, 1, "gone"));
                CHECK(volume_link(v, gone, 1, "back", NULL) == -ENOENT);
                CHECK(volume_lookup(v, 1, "back", &st) == -ENOENT);
                volume_forget(v, gone);
        }
        CHECK_OK(volume_setxattr(v, large, "user.k", "v3", 2, XATTR_REPLACE));
        volume_close(v);

        /* The snapshots still see the old state. */
        v = open_volume(s, "b", true);
        check_content(v, lookup(v, dir, "large"), big, 300000);
        check_content(v, lookup(v, dir, "small"), (const uint8_t *) "hello", 5);
        CHECK(volume_readlink(v, link_ino, target, sizeof target) == 9);
        CHECK(memcmp(target, "dir/small", 9) == 0);
        {
                char value[8];
                CHECK(volume_getxattr(v, large, "user.k", value, sizeof value) == 2);
                CHECK(memcmp(value, "v1", 2) == 0);
        }
        volume_close(v);

        CHECK(volume_open(s, "ro", true, &(Volume *) { NULL }, NULL) == -EROFS);
        v = open_volume(s, "ro", false);
        check_content(v, lookup(v, dir, "large"), big, 300000);
        CHECK(volume_write(v, large, "x", 1, 0) == -EROFS);
        volume_close(v);

        v = open_volume(s, "a", false);
        check_content(v, lookup(v, dir, "large"), changed, 300000);
        {
                char value[8];
                CHECK(volume_getxattr(v, large, "user.k", value, sizeof value) == 2);
                CHECK(memcmp(value, "v3", 2) == 0);
        }
        volume_close(v);
}

/* A file truncated in an upper layer and grown again must not show the
 * lower layer's bytes. */
static void test_truncate_across_layers(Store *s) {
        _cleanup_free_ uint8_t *data = malloc(200000), *expect = calloc(1, 200000);
        Volume *v;
        uint64_t f;
        struct stat st = {};

        test_name = "truncate-across-layers";
        CHECK(data && expect);
        fill_pattern(data, 200000, 2);
        CHECK_OK(store_subvolume_create(s, "t"));
        v = open_volume(s, "t", true);
        f = make_file(v, 1, "f");
        CHECK(volume_write(v, f, data, 200000, 0) == 200000);
        volume_close(v);
        CHECK_OK(store_subvolume_snapshot(s, "t", "t-snap", true));

        v = open_volume(s, "t", true);
        st.st_size = 100;
        CHECK_OK(volume_setattr(v, f, &st, VOLUME_SET_SIZE, NULL));
        st.st_size = 200000;
        CHECK_OK(volume_setattr(v, f, &st, VOLUME_SET_SIZE, NULL));
        memcpy(expect, data, 100);
        check_content(v, f, expect, 200000);
        CHECK_OK(volume_sync(v));
        check_content(v, f, expect, 200000);

        /* Punch a hole in the middle of a block of the lower layer. */
        volume_close(v);
        v = open_volume(s, "t-snap", false);
        check_content(v, f, data, 200000);
        volume_close(v);
}

static void test_rename(Store *s) {
        Volume *v;
        uint64_t a, b, d1, d2;
        struct stat st;

        test_name = "rename";
        CHECK_OK(store_subvolume_create(s, "r"));
        v = open_volume(s, "r", true);
        a = make_file(v, 1, "a");
        b = make_file(v, 1, "b");
        CHECK(volume_rename(v, 1, "a", 1, "b", RENAME_NOREPLACE) == -EEXIST);
        CHECK_OK(volume_rename(v, 1, "a", 1, "b", RENAME_EXCHANGE));
        CHECK(lookup(v, 1, "a") == b);
        CHECK(lookup(v, 1, "b") == a);
        CHECK_OK(volume_rename(v, 1, "a", 1, "b", 0));
        CHECK(lookup(v, 1, "b") == b);
        CHECK(volume_lookup(v, 1, "a", &st) == -ENOENT);

        CHECK_OK(volume_mkdir(v, 1, "d1", 0755, 0, 0, &st));
        d1 = st.st_ino;
        CHECK_OK(volume_mkdir(v, 1, "d2", 0755, 0, 0, &st));
        d2 = st.st_ino;
        CHECK_OK(volume_mkdir(v, d1, "sub", 0755, 0, 0, &st));
        CHECK_OK(volume_getattr(v, d1, &st));
        CHECK(st.st_nlink == 3);
        CHECK_OK(volume_rename(v, d1, "sub", d2, "sub", 0));
        CHECK_OK(volume_getattr(v, d1, &st));
        CHECK(st.st_nlink == 2);
        CHECK_OK(volume_getattr(v, d2, &st));
        CHECK(st.st_nlink == 3);
        CHECK(volume_rmdir(v, 1, "d2") == -ENOTEMPTY);
        CHECK(volume_rename(v, 1, "b", 1, "d1", 0) == -EISDIR);
        CHECK(volume_rename(v, 1, "d1", 1, "d2", 0) == -ENOTEMPTY);
        CHECK_OK(volume_rmdir(v, d2, "sub"));
        CHECK_OK(volume_rmdir(v, 1, "d2"));
        volume_close(v);
}

static size_t listing_size(Store *s, const char *name) {
        Volume *v = open_volume(s, name, false);
        VolumeDir *d = NULL;
        size_t n;

        CHECK_OK(volume_opendir(v, 1, &d));
        n = d->n;
        volume_dir_free(d);
        volume_close(v);
        return n;
}

static void test_whiteouts_and_fold(Store *s) {
        Volume *v;
        StoreReapStats stats;
        StoreSubvolumeInfo info;
        char name[16];

        test_name = "whiteouts-and-fold";
        CHECK_OK(store_subvolume_create(s, "w"));
        v = open_volume(s, "w", true);
        for (int i = 0; i < 10; i++) {
                snprintf(name, sizeof name, "f%d", i);
                make_file(v, 1, name);
        }
        volume_close(v);

        /* A chain of snapshots, each removing a file. */
        for (int i = 0; i < 5; i++) {
                snprintf(name, sizeof name, "w-%d", i);
                CHECK_OK(store_subvolume_snapshot(s, "w", name, true));
                CHECK_OK(store_subvolume_delete(s, name, NULL));
                v = open_volume(s, "w", true);
                snprintf(name, sizeof name, "f%d", i);
                CHECK_OK(volume_unlink(v, 1, name));
                volume_close(v);
        }
        CHECK(listing_size(s, "w") == 5);
        CHECK_OK(store_subvolume_show(s, "w", &info));
        CHECK(info.depth >= 5);
        store_subvolume_info_clear(&info);

        CHECK_OK(store_reap(s, true, NULL, NULL, &stats, NULL));
        CHECK(stats.subvolumes_forgotten == 5);
        CHECK(stats.layers_folded > 0);
        CHECK_OK(store_subvolume_show(s, "w", &info));
        CHECK(info.depth <= 2);
        store_subvolume_info_clear(&info);
        CHECK(listing_size(s, "w") == 5);
}

static int find_largest_pack(char *ret, size_t size) {
        char path[512];
        DIR *d;
        struct dirent *de;
        off_t best = 0;

        snprintf(path, sizeof path, "%s/packs", store_dir);
        d = opendir(path);
        if (!d)
                return -errno;
        while ((de = readdir(d))) {
                struct stat st;
                char p[1024];

                if (de->d_name[0] == '.')
                        continue;
                snprintf(p, sizeof p, "%s/%s", path, de->d_name);
                if (stat(p, &st) >= 0 && st.st_size > best) {
                        best = st.st_size;
                        snprintf(ret, size, "%s", p);
                }
        }
        closedir(d);
        return best > 0 ? 0 : -ENOENT;
}

static void check_uuid(Store *s, const char *name, const char *uuid) {
        _cleanup_(store_subvolume_info_clear) StoreSubvolumeInfo info = {};

        CHECK_OK(store_subvolume_show(s, name, &info));
        CHECK(streq(info.uuid, uuid));
}

/* A snapshot under a UUID its caller chose before: taken directly, and
 * through the control socket of a process that has the source open
 * writable; a UUID names one subvolume, deleted ones too. */
/* Layers never written below a writable top, as a subvolume made
 * read-only and writable again without a change between leaves them (and
 * snapshots of an empty top did, in stores made before): folded, the
 * subvolume keeps its files, its counts, and the inode numbers it handed
 * out. A fold of two such layers once put an empty subvolume's counters
 * on top. */
static void test_fold_unwritten_layers(Store *s) {
        StoreSubvolumeInfo info;
        StoreReapStats stats;
        struct stat st;
        uint64_t a, b, c;
        Volume *v;

        test_name = "fold-unwritten-layers";
        CHECK_OK(store_subvolume_create(s, "uw"));
        v = open_volume(s, "uw", true);
        a = make_file(v, 1, "a");
        b = make_file(v, 1, "b");
        volume_close(v);
        for (int i = 0; i < 3; i++) {
                CHECK_OK(store_subvolume_set_readonly(s, "uw", true));
                CHECK_OK(store_subvolume_set_readonly(s, "uw", false));
        }
        CHECK_OK(store_subvolume_show(s, "uw", &info));
        CHECK(info.depth >= 4);
        store_subvolume_info_clear(&info);

        CHECK_OK(store_reap(s, true, NULL, NULL, &stats, NULL));
        CHECK(stats.layers_folded > 0);
        CHECK_OK(store_subvolume_show(s, "uw", &info));
        CHECK(info.depth <= 2);
        CHECK(info.inodes == 3);
        store_subvolume_info_clear(&info);
        v = open_volume(s, "uw", true);
        CHECK(lookup(v, 1, "a") == a);
        CHECK(lookup(v, 1, "b") == b);
        c = make_file(v, 1, "c");
        CHECK(c != a && c != b && c != 1);
        CHECK_OK(volume_getattr(v, a, &st));
        CHECK(st.st_nlink == 1);
        volume_close(v);
        CHECK_OK(store_subvolume_delete(s, "uw", NULL));
}

static void test_snapshot_with_uuid(Store *s) {
        char uuid[37], live_uuid[37];
        Volume *v;

        test_name = "snapshot-with-uuid";
        CHECK_OK(store_subvolume_create(s, "uuid-src"));
        CHECK_OK(store_uuid_new(uuid));
        CHECK_OK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-a", true, uuid));
        check_uuid(s, "uuid-a", uuid);
        CHECK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-b", true, uuid) == -EEXIST);
        CHECK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-b", true, "not-a-uuid") == -EINVAL);
        CHECK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-b", true, "0123456789abcdef0123456789abcdef0123") ==
              -EINVAL);
        CHECK_OK(store_subvolume_delete(s, "uuid-a", NULL));
        CHECK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-b", true, uuid) == -EEXIST);

        v = open_volume(s, "uuid-src", true);
        CHECK_OK(store_uuid_new(live_uuid));
        CHECK_OK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-live", false, live_uuid));
        check_uuid(s, "uuid-live", live_uuid);
        CHECK(store_subvolume_snapshot_as(s, "uuid-src", "uuid-live-2", false, live_uuid) == -EEXIST);
        volume_close(v);
        CHECK(store_subvolume_show(s, "uuid-b", &(StoreSubvolumeInfo) {}) == -ENOENT);
        FOREACH_STRING(name, "uuid-live", "uuid-src")
                CHECK_OK(store_subvolume_delete(s, name, NULL));
}

static void test_delete_reap_and_corruption(Store *s) {
        _cleanup_free_ uint8_t *data = malloc(1 << 20), *buf = malloc(1 << 20);
        StoreUsage before, after;
        StoreReapStats stats;
        Volume *v;
        uint64_t f;
        char pack[1024];
        int fd;

        test_name = "delete-reap-corruption";
        CHECK(data && buf);
        fill_pattern(data, 1 << 20, 3);
        CHECK_OK(store_subvolume_create(s, "big"));
        v = open_volume(s, "big", true);
        f = make_file(v, 1, "f");
        CHECK(volume_write(v, f, data, 1 << 20, 0) == 1 << 20);
        volume_close(v);

        CHECK_OK(store_usage(s, &before));
        CHECK(before.data_bytes >= (1 << 20));
        CHECK_OK(store_subvolume_delete(s, "big", NULL));
        CHECK(store_subvolume_delete(s, "big", NULL) == -ENOENT);
        CHECK_OK(store_reap(s, false, NULL, NULL, &stats, NULL));
        CHECK(stats.bytes_freed >= (1 << 20));
        CHECK_OK(store_usage(s, &after));
        CHECK(after.data_bytes + (1 << 20) <= before.data_bytes);

        /* Damage a block: reads fail with EIO, never return other bytes. */
        CHECK_OK(store_subvolume_create(s, "c"));
        v = open_volume(s, "c", true);
        f = make_file(v, 1, "f");
        CHECK(volume_write(v, f, data, 1 << 20, 0) == 1 << 20);
        volume_close(v);
        CHECK_OK(find_largest_pack(pack, sizeof pack));
        fd = open(pack, O_RDWR | O_CLOEXEC);
        CHECK(fd >= 0);
        {
                struct stat st;
                uint8_t byte;
                off_t at;

                CHECK(fstat(fd, &st) == 0);
                at = st.st_size - 300000; /* inside the blocks just written */
                CHECK(pread(fd, &byte, 1, at) == 1);
                byte ^= 0x40;
                CHECK(pwrite(fd, &byte, 1, at) == 1);
        }
        close(fd);

        v = open_volume(s, "c", false);
        CHECK(volume_read(v, f, buf, 1 << 20, 0) == -EIO);
        volume_close(v);
        CHECK_OK(store_usage(s, &after));
        CHECK(after.corruption_events > 0);
        {
                StoreScrubStats scrub;
                CHECK_OK(store_scrub(s, NULL, NULL, NULL, &scrub));
                CHECK(scrub.blocks_damaged == 1);
        }
}

/* Clones share whole aligned blocks (the store does not grow) and copy
 * the rest; across subvolumes too, and the image and its writer agree on
 * the result. Also renaming, freezing and finding subvolumes by UUID. */
static void test_clone_and_image_state(Store *s) {
        const size_t size = 5 * VOLUME_BLOCK_SIZE + 1234;
        _cleanup_free_ uint8_t *data = malloc(size), *back = malloc(size);
        _cleanup_free_ VolumeExtent *a = NULL, *b = NULL;
        StoreSubvolumeInfo info = {};
        StoreUsage before, after;
        size_t na, nb;
        uint64_t src, dst, other;
        Volume *v, *w;

        test_name = "clone";
        CHECK(data && back);
        fill_pattern(data, size, 7);
        CHECK_OK(store_subvolume_create(s, "clone-src"));
        v = open_volume(s, "clone-src", true);
        src = make_file(v, VOLUME_ROOT_INO, "src");
        CHECK(volume_write(v, src, data, size, 0) == (ssize_t) size);
        CHECK_OK(volume_sync(v));
        CHECK_OK(store_usage(s, &before));

        /* Aligned, whole file: every block shared, the tail too. */
        dst = make_file(v, VOLUME_ROOT_INO, "dst");
        CHECK_OK(volume_clone_range(v, dst, 0, v, src, 0, size));
        CHECK_OK(volume_sync(v));
        CHECK_OK(store_usage(s, &after));
        CHECK(after.data_bytes == before.data_bytes);
        check_content(v, dst, data, size);
        CHECK_OK(volume_file_extents(v, src, &a, &na));
        CHECK_OK(volume_file_extents(v, dst, &b, &nb));
        CHECK(na == 6 && nb == 6);
        CHECK(memcmp(a, b, na * sizeof *a) == 0);

        /* Unaligned: copied, and the bytes are right. */
        other = make_file(v, VOLUME_ROOT_INO, "other");
        CHECK_OK(volume_clone_range(v, other, 100, v, src, 4096, 3 * VOLUME_BLOCK_SIZE));
        memset(back, 0xaa, size);
        CHECK(volume_read(v, other, back, size, 0) == 100 + 3 * VOLUME_BLOCK_SIZE);
        for (size_t i = 0; i < 100; i++)
                CHECK(back[i] == 0);
        CHECK(memcmp(back + 100, data + 4096, 3 * VOLUME_BLOCK_SIZE) == 0);

        /* Overlapping ranges of one file and ranges past the end fail. */
        CHECK(volume_clone_range(v, src, 10, v, src, 0, 100) == -EINVAL);
        CHECK(volume_clone_range(v, dst, 0, v, src, size - 10, 11) == -EINVAL);
        volume_close(v);

        /* Freeze it, find it by UUID, clone from the image into another
         * subvolume. */
        CHECK_OK(store_subvolume_set_readonly(s, "clone-src", true));
        CHECK_OK(store_subvolume_rename(s, "clone-src", "clone-image"));
        CHECK(store_subvolume_rename(s, "clone-image", "clone-image") == 0);
        CHECK_OK(store_subvolume_set_received(s, "clone-image", "01234567-89ab-cdef-0123-456789abcdef", 42));
        CHECK_OK(store_subvolume_find_uuid(s, "01234567-89ab-cdef-0123-456789abcdef", &info));
        CHECK(streq(info.name, "clone-image") && info.readonly && info.stransid == 42 && info.ctransid > 0);
        store_subvolume_info_clear(&info);

        CHECK_OK(store_subvolume_create(s, "clone-dst"));
        CHECK(store_subvolume_rename(s, "clone-dst", "clone-image") == -EEXIST);
        v = open_volume(s, "clone-image", false);
        w = open_volume(s, "clone-dst", true);
        dst = make_file(w, VOLUME_ROOT_INO, "copy");
        CHECK_OK(volume_clone_range(w, dst, 0, v, lookup(v, VOLUME_ROOT_INO, "src"), 0, size));
        check_content(w, dst, data, size);
        CHECK(volume_clone_range(v, 2, 0, w, dst, 0, 10) == -EROFS);
        volume_close(w);
        volume_close(v);

        /* Writable again: a new layer above the frozen one. */
        CHECK_OK(store_subvolume_set_readonly(s, "clone-image", false));
        v = open_volume(s, "clone-image", true);
        check_content(v, lookup(v, VOLUME_ROOT_INO, "dst"), data, size);
        volume_close(v);
}

/* Reads fetch blocks without the volume's lock, so the threads of a server
 * meet in the store's catalog as they look blocks up. Each round opens the
 * store anew, so that no block location is remembered and every read of
 * every thread asks the catalog. */
#define PARALLEL_FILES 3000
#define PARALLEL_FILE_SIZE 5000         /* past the inline limit: one short block each */
#define PARALLEL_THREADS 4
#define PARALLEL_ROUNDS 12

typedef struct ParallelReader {
        Volume *volume;
        const uint64_t *inos;
        unsigned first;
        bool ok;
} ParallelReader;

static void *parallel_reader(void *userdata) {
        ParallelReader *pr = userdata;
        uint8_t expect[PARALLEL_FILE_SIZE], buf[PARALLEL_FILE_SIZE];

        pr->ok = true;
        for (unsigned i = pr->first; i < PARALLEL_FILES; i += PARALLEL_THREADS) {
                fill_pattern(expect, sizeof expect, 1000 + i);
                if (volume_read(pr->volume, pr->inos[i], buf, sizeof buf, 0) != (ssize_t) sizeof buf ||
                    memcmp(buf, expect, sizeof buf) != 0) {
                        fprintf(stderr, "%s: file %u read back wrong\n", test_name, i);
                        pr->ok = false;
                }
        }
        return NULL;
}

static void test_parallel_reads(Store *s) {
        _cleanup_free_ uint64_t *inos = calloc(PARALLEL_FILES, sizeof *inos);
        uint8_t data[PARALLEL_FILE_SIZE];
        Volume *v;

        test_name = "parallel-reads";
        CHECK(inos);
        CHECK_OK(store_subvolume_create(s, "parallel"));
        v = open_volume(s, "parallel", true);
        for (unsigned i = 0; i < PARALLEL_FILES; i++) {
                char name[32];

                snprintf(name, sizeof name, "f%u", i);
                inos[i] = make_file(v, 1, name);
                fill_pattern(data, sizeof data, 1000 + i);
                CHECK(volume_write(v, inos[i], data, sizeof data, 0) == (ssize_t) sizeof data);
        }
        CHECK_OK(volume_sync(v));
        volume_close(v);

        for (unsigned round = 0; round < PARALLEL_ROUNDS; round++) {
                ParallelReader readers[PARALLEL_THREADS];
                pthread_t threads[PARALLEL_THREADS];
                Store *fresh = NULL;

                CHECK_OK(store_open(store_dir, &fresh));
                v = open_volume(fresh, "parallel", false);
                for (unsigned k = 0; k < PARALLEL_THREADS; k++) {
                        readers[k] = (ParallelReader) { .volume = v, .inos = inos, .first = k };
                        CHECK(pthread_create(&threads[k], NULL, parallel_reader, &readers[k]) == 0);
                }
                for (unsigned k = 0; k < PARALLEL_THREADS; k++) {
                        CHECK(pthread_join(threads[k], NULL) == 0);
                        CHECK(readers[k].ok);
                }
                volume_close(v);
                store_close(fresh);
        }
}

#define FOLD_RACE_ROUNDS 150

/* Opens the subvolume the main thread names, read-only, over and over,
 * through a store of its own, until told to stop. */
typedef struct FoldReader {
        pthread_mutex_t lock;
        char name[32];
        bool stop;
        unsigned opens;
        int error;              /* the first failure, negative errno */
} FoldReader;

static void *fold_reader(void *userdata) {
        FoldReader *fr = userdata;
        Store *s = NULL;

        CHECK_OK(store_open(store_dir, &s));
        for (;;) {
                char name[32];
                Volume *v = NULL;
                int r;

                pthread_mutex_lock(&fr->lock);
                if (fr->stop || fr->error < 0) {
                        pthread_mutex_unlock(&fr->lock);
                        break;
                }
                memcpy(name, fr->name, sizeof name);
                pthread_mutex_unlock(&fr->lock);
                if (!*name)
                        continue;
                r = volume_open(s, name, false, &v, NULL);
                if (r >= 0) {
                        struct stat st;

                        r = volume_lookup(v, 1, "b", &st);
                        volume_close(v);
                }
                /* Its figures are those of the whole stack: the root, a
                 * and b, not those of a layer below. */
                if (r >= 0) {
                        StoreSubvolumeInfo info = {};

                        r = store_subvolume_show(s, name, &info);
                        if (r >= 0 && info.inodes != 3) {
                                fprintf(stderr, "open-during-folds: %s shows %" PRIu64 " inodes\n", name,
                                        info.inodes);
                                r = -EBADMSG;
                        }
                        store_subvolume_info_clear(&info);
                }
                pthread_mutex_lock(&fr->lock);
                fr->opens++;
                /* Gone. Its lock held for a moment by the fold of its top
                 * or by its delete is waited for, not busy. */
                if (r < 0 && r != -ENOENT && fr->error == 0)
                        fr->error = r;
                pthread_mutex_unlock(&fr->lock);
        }
        store_close(s);
        return NULL;
}

/* A subvolume opened while the reaper folds the layers of its stack: a
 * writable one whose top was never written, the layers below it folded;
 * an image, its top folded with the layer below into a new top. The
 * stack it read from the catalog names layers that are gone by the time
 * it opens them, and it must load the new one rather than call the store
 * damaged, or show the figures of what is left. */
static void test_open_during_folds(Store *s) {
        FoldReader fr = { .lock = PTHREAD_MUTEX_INITIALIZER };
        pthread_t reader;
        uint64_t folded = 0;

        test_name = "open-during-folds";
        CHECK(pthread_create(&reader, NULL, fold_reader, &fr) == 0);
        for (unsigned i = 0; i < FOLD_RACE_ROUNDS && fr.error == 0; i++) {
                char src[32], keep[32], name[32];
                StoreReapStats stats;
                Volume *v;

                snprintf(src, sizeof src, "race-src-%u", i);
                snprintf(keep, sizeof keep, "race-keep-%u", i);
                snprintf(name, sizeof name, "race-%u", i);
                /* name's stack: its empty top, then src's second and first
                 * written layers, each shared until src and keep go. */
                CHECK_OK(store_subvolume_create(s, src));
                v = open_volume(s, src, true);
                make_file(v, 1, "a");
                volume_close(v);
                CHECK_OK(store_subvolume_snapshot(s, src, keep, true));
                v = open_volume(s, src, true);
                make_file(v, 1, "b");
                volume_close(v);
                CHECK_OK(store_subvolume_snapshot(s, src, name, i % 2));
                pthread_mutex_lock(&fr.lock);
                memcpy(fr.name, name, sizeof name);
                pthread_mutex_unlock(&fr.lock);
                CHECK_OK(store_subvolume_delete(s, src, NULL));
                CHECK_OK(store_subvolume_delete(s, keep, NULL));
                CHECK_OK(store_reap(s, true, NULL, NULL, &stats, NULL));
                folded += stats.layers_folded;
                pthread_mutex_lock(&fr.lock);
                fr.name[0] = 0;
                pthread_mutex_unlock(&fr.lock);
                for (unsigned tries = 0; store_subvolume_delete(s, name, NULL) == -EBUSY; tries++) {
                        CHECK(tries < 1000);    /* the reader's last open lets go */
                        (void) usleep(1000);
                }
        }
        pthread_mutex_lock(&fr.lock);
        fr.stop = true;
        pthread_mutex_unlock(&fr.lock);
        CHECK(pthread_join(reader, NULL) == 0);
        printf("open-during-folds: %u opens, %" PRIu64 " layers folded\n", fr.opens, folded);
        if (fr.error < 0)
                fprintf(stderr, "open-during-folds: a read-only open failed: %s\n", strerror(-fr.error));
        CHECK(fr.error == 0);
        CHECK(folded > 0);
}

typedef struct LockTaker {
        int fd;
        uint64_t brief_after_usec;
} LockTaker;

/* Says, an instant after it took the lock, that it holds it for a moment,
 * and lets go a moment later: what a fold or a delete does. */
static void *lock_taker(void *userdata) {
        LockTaker *lt = userdata;
        char text[32];
        int n;

        (void) usleep((useconds_t) lt->brief_after_usec);
        n = snprintf(text, sizeof text, "%d brief\n", (int) getpid());
        CHECK(pwrite(lt->fd, text, (size_t) n, 0) == n);
        (void) usleep(30000);
        CHECK(flock(lt->fd, LOCK_UN) == 0);
        return NULL;
}

/* A read-only open that comes just after a brief holder took the lock, when
 * the lock file still names the previous holder, alive, waits for the brief
 * one; a holder that lives and keeps the lock still makes it fail at once. */
static void test_lock_taken_an_instant_ago(Store *s) {
        _cleanup_free_ char *path = NULL;
        StoreSubvolumeInfo info = {};
        LockTaker lt = { .brief_after_usec = 20000 };
        pthread_t taker;
        uint64_t start;
        Volume *v = NULL;
        char text[32];
        int n;

        test_name = "lock-taken-an-instant-ago";
        CHECK_OK(store_subvolume_create(s, "instant"));
        CHECK_OK(store_subvolume_show(s, "instant", &info));
        CHECK(asprintf(&path, "%s/locks/subvolume-%" PRIu64 ".lock", store_path(s), info.id) > 0);
        store_subvolume_info_clear(&info);
        lt.fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        CHECK(lt.fd >= 0);
        /* The previous holder, alive: this process. */
        n = snprintf(text, sizeof text, "%d\n", (int) getpid());
        CHECK(pwrite(lt.fd, text, (size_t) n, 0) == n && ftruncate(lt.fd, n) == 0);

        CHECK(flock(lt.fd, LOCK_EX) == 0);
        CHECK(pthread_create(&taker, NULL, lock_taker, &lt) == 0);
        CHECK_OK(volume_open(s, "instant", false, &v, NULL));
        volume_close(v);
        CHECK(pthread_join(taker, NULL) == 0);

        CHECK(flock(lt.fd, LOCK_EX) == 0);
        CHECK(pwrite(lt.fd, text, (size_t) n, 0) == n && ftruncate(lt.fd, n) == 0);
        start = monotonic_usec();
        CHECK(volume_open(s, "instant", false, &v, NULL) == -EBUSY);
        CHECK(monotonic_usec() - start < 1000000);
        CHECK(close(lt.fd) == 0);
        CHECK_OK(store_subvolume_delete(s, "instant", NULL));
}

/* Counts the damage scrub reports in the subvolumes of this test. */
static void count_damage_of(const StoreDamage *d, void *userdata) {
        if (d->subvolume && startswith(d->subvolume, "attrs"))
                ++*(unsigned *) userdata;
}

/* Changes of attributes, names and xattrs of a small file rewrite its row
 * without reading its inline content: the content, and the row's check,
 * must come out right, in the layer that has the row and after a copy-up
 * from a frozen one. */
static void test_attributes_keep_content(Store *s) {
        uint8_t text[3000];
        struct stat attr = { .st_mode = 0600, .st_uid = 1000 };
        StoreScrubStats scrub;
        unsigned damaged = 0;
        uint64_t ino;
        Volume *v;

        test_name = "attributes-keep-content";
        for (size_t i = 0; i < sizeof text; i++)
                text[i] = (uint8_t) "int main(void) { return 0; }\n"[i % 30];
        CHECK_OK(store_subvolume_create(s, "attrs"));
        v = open_volume(s, "attrs", true);
        ino = make_file(v, 1, "small.c");
        CHECK(volume_write(v, ino, text, sizeof text, 0) == (ssize_t) sizeof text);
        CHECK_OK(volume_sync(v));

        for (int round = 0; round < 2; round++) {
                struct stat st;

                CHECK_OK(volume_setattr(v, ino, &attr, VOLUME_SET_MODE | VOLUME_SET_UID | VOLUME_SET_MTIME_NOW, &st));
                CHECK((st.st_mode & 07777) == attr.st_mode && st.st_uid == 1000 && st.st_size == (off_t) sizeof text);
                CHECK_OK(volume_link(v, ino, 1, "hard.c", &st));
                CHECK(st.st_nlink == 2);
                CHECK_OK(volume_rename(v, 1, "hard.c", 1, "moved.c", 0));
                CHECK_OK(volume_setxattr(v, ino, "user.kind", "c", 1, 0));
                CHECK_OK(volume_removexattr(v, ino, "user.kind"));
                CHECK_OK(volume_unlink(v, 1, "moved.c"));
                CHECK_OK(volume_getattr(v, ino, &st));
                CHECK(st.st_nlink == 1 && st.st_blocks == (blkcnt_t) DIV_ROUND_UP(sizeof text, 512));
                check_content(v, ino, text, sizeof text);
                CHECK_OK(volume_sync(v));
                volume_close(v);

                /* The second round changes a row a snapshot froze. */
                if (round == 0)
                        CHECK_OK(store_subvolume_snapshot(s, "attrs", "attrs-frozen", true));
                v = open_volume(s, "attrs", true);
                check_content(v, ino, text, sizeof text);
                attr.st_mode = 0640;
        }
        volume_close(v);
        CHECK_OK(store_scrub(s, count_damage_of, NULL, &damaged, &scrub));
        CHECK(damaged == 0);
}

/* Whole dirty blocks are stored ahead of the commit by the volume's
 * committer, compressed without the volume's lock: they must be stored
 * before the first commit, and a block rewritten while its old copy was
 * being compressed must keep what was written last. */
#define AHEAD_BYTES (16u << 20)
#define AHEAD_REWRITE_USEC 400000
#define AHEAD_WRITTEN_USEC 500000
#define AHEAD_FIRST_COMMIT_USEC 900000  /* the commit interval is 1 s */

static size_t settled_blocks(Volume *v, uint64_t ino) {
        _cleanup_free_ VolumeExtent *extents = NULL;
        size_t n = 0, settled = 0;

        CHECK_OK(volume_file_extents(v, ino, &extents, &n));
        for (size_t i = 0; i < n; i++)
                settled += !extents[i].unsettled;
        return settled;
}

static void test_flush_ahead(Store *s) {
        _cleanup_free_ uint8_t *expect = malloc(AHEAD_BYTES), *piece = malloc(2 * VOLUME_BLOCK_SIZE);
        uint64_t opened, ino;
        unsigned seed = 1;
        size_t settled = 0;
        Volume *v;

        test_name = "flush-ahead";
        CHECK(expect && piece);
        CHECK_OK(store_subvolume_create(s, "ahead"));
        v = open_volume(s, "ahead", true);
        opened = monotonic_usec();
        ino = make_file(v, 1, "large");
        fill_pattern(expect, AHEAD_BYTES, 500);
        /* As the kernel writes a file back: 1 MiB at a time. */
        for (size_t off = 0; off < AHEAD_BYTES; off += 1u << 20)
                CHECK(volume_write(v, ino, expect + off, 1u << 20, off) == 1 << 20);

        if (monotonic_usec() - opened > AHEAD_WRITTEN_USEC)
                fprintf(stderr, "%s: writing took too long to tell a flush ahead from the first commit; "
                        "not checked\n", test_name);
        else {
                do {
                        settled = settled_blocks(v, ino);
                        if (settled >= AHEAD_BYTES / VOLUME_BLOCK_SIZE / 2)
                                break;
                        (void) usleep(5000);
                } while (monotonic_usec() - opened < AHEAD_FIRST_COMMIT_USEC);
                CHECK(settled >= AHEAD_BYTES / VOLUME_BLOCK_SIZE / 2);
        }

        /* Rewrites, whole blocks and pieces, while blocks are stored ahead. */
        for (uint64_t until = monotonic_usec() + AHEAD_REWRITE_USEC; monotonic_usec() < until;) {
                size_t len = 1 + (size_t) rand() % (2 * VOLUME_BLOCK_SIZE);
                size_t off = (size_t) rand() % (AHEAD_BYTES - len);

                if (seed % 2)
                        off -= off % VOLUME_BLOCK_SIZE, len = VOLUME_BLOCK_SIZE;
                fill_pattern(piece, len, 600 + seed++);
                CHECK(volume_write(v, ino, piece, len, off) == (ssize_t) len);
                memcpy(expect + off, piece, len);
        }
        check_content(v, ino, expect, AHEAD_BYTES);
        CHECK_OK(volume_sync(v));
        volume_close(v);

        v = open_volume(s, "ahead", false);
        check_content(v, ino, expect, AHEAD_BYTES);
        CHECK(settled_blocks(v, ino) == AHEAD_BYTES / VOLUME_BLOCK_SIZE);
        volume_close(v);
}

/* A write of a whole block over a stored one, with a fault at each step of
 * opening the volume and writing, in turn: a write that fails leaves the
 * block as it was (not zeros: the block is not read before it is
 * overwritten), one that succeeds leaves the new data, before and after a
 * reopen; and then the write that meets no fault. */
static void test_write_faults(Store *s) {
        _cleanup_free_ uint8_t *old = malloc(3 * VOLUME_BLOCK_SIZE), *block = malloc(VOLUME_BLOCK_SIZE),
                               *now = malloc(3 * VOLUME_BLOCK_SIZE);
        unsigned faulted = 0;
        Volume *v;
        uint64_t ino;

        test_name = "write-faults";
        CHECK(old && block && now);
        fill_pattern(old, 3 * VOLUME_BLOCK_SIZE, 700);
        fill_pattern(block, VOLUME_BLOCK_SIZE, 701);
        memcpy(now, old, 3 * VOLUME_BLOCK_SIZE);
        memcpy(now + VOLUME_BLOCK_SIZE, block, VOLUME_BLOCK_SIZE);
        CHECK_OK(store_subvolume_create(s, "write-faults"));
        v = open_volume(s, "write-faults", true);
        ino = make_file(v, 1, "f");
        CHECK(volume_write(v, ino, old, 3 * VOLUME_BLOCK_SIZE, 0) == 3 * VOLUME_BLOCK_SIZE);
        CHECK_OK(volume_sync(v));
        volume_close(v);

        for (uint64_t step = 1;; step++) {
                ssize_t n = -EIO;
                bool met = true;

                sqlite_fault_arm(step);
                if (volume_open(s, "write-faults", true, &v, NULL) >= 0) {
                        uint8_t got[64];

                        n = volume_write(v, ino, block, VOLUME_BLOCK_SIZE, VOLUME_BLOCK_SIZE);
                        met = sqlite_fault_left() == 0;
                        sqlite_fault_arm(0);
                        CHECK(n == VOLUME_BLOCK_SIZE || n < 0);
                        /* A failed write is served as before, or the volume
                         * failed as a whole. */
                        if (n < 0 && volume_read(v, ino, got, sizeof got, VOLUME_BLOCK_SIZE) >= 0)
                                CHECK(memcmp(got, old + VOLUME_BLOCK_SIZE, sizeof got) == 0);
                        volume_close(v);
                }
                sqlite_fault_arm(0);
                faulted += met;

                v = open_volume(s, "write-faults", true);
                check_content(v, ino, n < 0 ? old : now, 3 * VOLUME_BLOCK_SIZE);
                if (n >= 0) {
                        CHECK(volume_write(v, ino, old + VOLUME_BLOCK_SIZE, VOLUME_BLOCK_SIZE, VOLUME_BLOCK_SIZE) ==
                              VOLUME_BLOCK_SIZE);
                        CHECK_OK(volume_sync(v));
                }
                volume_close(v);
                if (!met)
                        break;
                CHECK(step < 100000);
        }
        CHECK(faulted > 10);
}

static void print_problem(const char *what, void *userdata) {
        fprintf(stderr, "fsck: %s\n", what);
}

/* Changes of a mount with a fault at each step of opening the volume and
 * making the change, in turn, until one meets none. Each runs on a fresh
 * writable snapshot of a frozen tree, so that it copies rows up from the
 * layer below: a change that fails leaves everything as it was, one that
 * succeeds is wholly there, in memory and after a reopen, and fsck finds
 * the store consistent every time. */
#define OPS_FILE_SIZE (3 * VOLUME_BLOCK_SIZE + 500)
#define OPS_SMALL_SIZE 700
/* Every seventh step: a change takes a thousand or more. */
#define OPS_FAULT_STRIDE 7

typedef struct OpsTree {
        uint8_t file[OPS_FILE_SIZE];    /* "a" */
        uint8_t small[OPS_SMALL_SIZE];  /* "b", with xattr user.k = "old" */
        uint64_t a, b;
} OpsTree;

static bool ops_named(Volume *v, const char *name, uint64_t *ret) {
        struct stat st;
        int r = volume_lookup(v, 1, name, &st);

        CHECK(r >= 0 || r == -ENOENT);
        if (r >= 0 && ret)
                *ret = st.st_ino;
        return r >= 0;
}

static int op_truncate(Volume *v, const OpsTree *t) {
        struct stat attr = { .st_size = VOLUME_BLOCK_SIZE + 100 };

        return volume_setattr(v, t->a, &attr, VOLUME_SET_SIZE, NULL);
}

static void check_truncate(Volume *v, const OpsTree *t, bool done) {
        check_content(v, t->a, t->file, done ? VOLUME_BLOCK_SIZE + 100 : OPS_FILE_SIZE);
}

static int op_punch(Volume *v, const OpsTree *t) {
        return volume_fallocate(v, t->a, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1000, VOLUME_BLOCK_SIZE + 3000);
}

static void check_punch(Volume *v, const OpsTree *t, bool done) {
        uint8_t expect[OPS_FILE_SIZE];

        memcpy(expect, t->file, sizeof expect);
        if (done)
                memset(expect + 1000, 0, VOLUME_BLOCK_SIZE + 3000);
        check_content(v, t->a, expect, sizeof expect);
}

static int op_rename(Volume *v, const OpsTree *t) {
        return volume_rename(v, 1, "b", 1, "a", 0);
}

static void check_rename(Volume *v, const OpsTree *t, bool done) {
        uint64_t ino = 0;

        CHECK(ops_named(v, "a", &ino));
        CHECK(ops_named(v, "b", NULL) == !done);
        CHECK(ino == (done ? t->b : t->a));
        check_content(v, ino, done ? t->small : t->file, done ? OPS_SMALL_SIZE : OPS_FILE_SIZE);
}

static int op_link_unlink(Volume *v, const OpsTree *t) {
        return volume_link(v, t->a, 1, "c", NULL) ?: volume_unlink(v, 1, "a");
}

static void check_link_unlink(Volume *v, const OpsTree *t, bool done) {
        struct stat st;

        /* Two changes: the link may be there alone. */
        CHECK_OK(volume_getattr(v, t->a, &st));
        CHECK(ops_named(v, "a", NULL) || ops_named(v, "c", NULL));
        CHECK(st.st_nlink == (nlink_t) (ops_named(v, "a", NULL) + ops_named(v, "c", NULL)));
        CHECK(!done || (!ops_named(v, "a", NULL) && ops_named(v, "c", NULL)));
        check_content(v, t->a, t->file, OPS_FILE_SIZE);
}

static int op_setxattr(Volume *v, const OpsTree *t) {
        return volume_setxattr(v, t->b, "user.k", "new value", 9, 0);
}

static void check_setxattr(Volume *v, const OpsTree *t, bool done) {
        char value[16];

        CHECK(volume_getxattr(v, t->b, "user.k", value, sizeof value) == (done ? 9 : 3));
        CHECK(memcmp(value, done ? "new value" : "old", done ? 9 : 3) == 0);
        check_content(v, t->b, t->small, OPS_SMALL_SIZE);
}

static int op_create(Volume *v, const OpsTree *t) {
        return volume_mknod(v, 1, "new", S_IFREG | 0600, 0, 0, 0, NULL);
}

static void check_create(Volume *v, const OpsTree *t, bool done) {
        uint64_t ino = 0;

        CHECK(ops_named(v, "new", &ino) == done);
        if (done)
                check_content(v, ino, (const uint8_t *) "", 0);
}

static int op_clone(Volume *v, const OpsTree *t) {
        return volume_clone_range(v, t->b, 0, v, t->a, 0, VOLUME_BLOCK_SIZE);
}

static void check_clone(Volume *v, const OpsTree *t, bool done) {
        if (done)
                check_content(v, t->b, t->file, VOLUME_BLOCK_SIZE);
        else
                check_content(v, t->b, t->small, OPS_SMALL_SIZE);
        check_content(v, t->a, t->file, OPS_FILE_SIZE);
}

static void check_op_faults(Store *s, const OpsTree *t, const char *name, int (*op)(Volume *v, const OpsTree *t),
                            void (*check)(Volume *v, const OpsTree *t, bool done)) {
        unsigned faulted = 0, n_snaps = 0;
        uint64_t open_steps, first;
        Volume *v;

        /* The steps of opening the volume are not the change's: the first
         * faults go a few steps before its end. */
        test_name = name;
        CHECK_OK(store_subvolume_snapshot(s, "ops-base", "ops-measure", false));
        sqlite_fault_arm(UINT64_MAX);
        v = open_volume(s, "ops-measure", true);
        open_steps = UINT64_MAX - sqlite_fault_left();
        sqlite_fault_arm(0);
        volume_close(v);
        CHECK_OK(store_subvolume_delete(s, "ops-measure", NULL));

        first = open_steps > 10 ? open_steps - 10 : 1;
        for (uint64_t step = first;; step += OPS_FAULT_STRIDE) {
                char snap[64];
                bool met = true, done = false;

                snprintf(snap, sizeof snap, "%s-%" PRIu64, name, step);
                CHECK_OK(store_subvolume_snapshot(s, "ops-base", snap, false));
                sqlite_fault_arm(step);
                if (volume_open(s, snap, true, &v, NULL) >= 0) {
                        struct stat st;

                        done = op(v, t) >= 0;
                        met = sqlite_fault_left() == 0;
                        sqlite_fault_arm(0);
                        /* As it is now, unless the volume failed as a whole. */
                        if (volume_getattr(v, 1, &st) >= 0)
                                check(v, t, done);
                        volume_close(v);
                }
                sqlite_fault_arm(0);
                faulted += met;

                v = open_volume(s, snap, false);
                check(v, t, done);
                volume_close(v);
                n_snaps++;
                if (!met)
                        break;
                CHECK(step < 100000);
        }
        CHECK(faulted > 10);
        /* Every snapshot made, then the store without them. */
        CHECK(store_fsck(s, false, print_problem, NULL, NULL) == 0);
        for (uint64_t step = first; n_snaps > 0; step += OPS_FAULT_STRIDE, n_snaps--) {
                char snap[64];

                snprintf(snap, sizeof snap, "%s-%" PRIu64, name, step);
                CHECK_OK(store_subvolume_delete(s, snap, NULL));
        }
        CHECK_OK(store_reap(s, true, NULL, NULL, NULL, NULL));
        CHECK(store_fsck(s, false, print_problem, NULL, NULL) == 0);
}

static void test_change_faults(Store *s) {
        _cleanup_free_ OpsTree *t = calloc(1, sizeof *t);
        Volume *v;

        test_name = "change-faults";
        CHECK(t);
        fill_pattern(t->file, sizeof t->file, 800);
        fill_pattern(t->small, sizeof t->small, 801);
        CHECK_OK(store_subvolume_create(s, "ops-base"));
        v = open_volume(s, "ops-base", true);
        t->a = make_file(v, 1, "a");
        t->b = make_file(v, 1, "b");
        CHECK(volume_write(v, t->a, t->file, sizeof t->file, 0) == sizeof t->file);
        CHECK(volume_write(v, t->b, t->small, sizeof t->small, 0) == sizeof t->small);
        CHECK_OK(volume_setxattr(v, t->b, "user.k", "old", 3, 0));
        CHECK_OK(volume_sync(v));
        volume_close(v);
        CHECK_OK(store_subvolume_snapshot(s, "ops-base", "ops-frozen", true)); /* freezes its layer */

        check_op_faults(s, t, "truncate-faults", op_truncate, check_truncate);
        check_op_faults(s, t, "punch-faults", op_punch, check_punch);
        check_op_faults(s, t, "rename-faults", op_rename, check_rename);
        check_op_faults(s, t, "link-faults", op_link_unlink, check_link_unlink);
        check_op_faults(s, t, "setxattr-faults", op_setxattr, check_setxattr);
        check_op_faults(s, t, "create-faults", op_create, check_create);
        check_op_faults(s, t, "clone-faults", op_clone, check_clone);
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
        CHECK(store_init(store_dir) == -EEXIST);
        CHECK_OK(store_open(store_dir, &s));

        test_basic_and_snapshot(s);
        test_truncate_across_layers(s);
        test_rename(s);
        test_whiteouts_and_fold(s);
        test_fold_unwritten_layers(s);
        test_clone_and_image_state(s);
        test_snapshot_with_uuid(s);
        test_delete_reap_and_corruption(s);
        test_parallel_reads(s);
        test_open_during_folds(s);
        test_lock_taken_an_instant_ago(s);
        test_flush_ahead(s);
        test_attributes_keep_content(s);
        test_write_faults(s);
        test_change_faults(s);

        CHECK(store_fsck(s, false, print_problem, NULL, NULL) == 0);
        store_close(s);
        printf("test-volume: all checks passed\n");
        return EXIT_SUCCESS;
}
