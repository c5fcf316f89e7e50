/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Receive: applies send streams to new images. Each subvolume of the input
 * is built under a temporary name (IMAGE_RECEIVING_PREFIX, the receive's
 * own UUID and a counter), frozen at its END command, and given its real
 * name only when the whole input has been read and its digest (if it has
 * one) checked out. A failure deletes them all. The receive holds a claim
 * of the store named after its UUID while it runs: the subvolumes of one
 * whose process died, which nobody claims any more, are cleaned up by the
 * next (image_remove_stale_receives()).
 *
 * Paths come from an untrusted stream: each is walked from the root one
 * component at a time, and a component that is empty, ".", "..", or not a
 * directory (a symbolic link above all) stops it. Nothing is ever resolved
 * through a symbolic link.
 */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <lzo/lzo1x.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include "images-internal.h"
#include "process-util.h"
#include "string-util.h"
#include "time-util.h"

#define CLONE_SOURCES_MAX 16
#define RECEIVE_CLAIM_PREFIX "receive-"
#define PROGRESS_INTERVAL_USEC (200 * 1000)

typedef struct CloneSource {
        uint8_t uuid[16];
        Volume *volume;
} CloneSource;

/* An image of the input, complete, that takes its name and its received
 * UUID once the whole input has checked out: until then no other receive
 * finds it, for its input may still be refused. */
typedef struct PendingImage {
        char temp[64];
        uint8_t uuid[16];
        uint64_t ctransid;
        bool named;
} PendingImage;

typedef struct Receiver {
        Store *store;
        const ImageReceiveOptions *opts;
        ImageError *error;
        StreamReader reader;
        const char *phase;

        /* Its claim ("receive-UUID"), and the UUID in its temporary names. */
        char claim[64];
        char receive_uuid[37];

        /* The subvolume being received. */
        Volume *volume;
        char temp_name[64];
        char *name;
        uint8_t uuid[16];
        uint64_t ctransid;

        CloneSource sources[CLONE_SOURCES_MAX];
        size_t n_sources;

        /* Subvolumes received, under their temporary names until the end. */
        PendingImage *pending;
        char **names;           /* NULL-terminated */
        size_t n_names;
        unsigned n_subvolumes;

        uint8_t *decoded;       /* ENCODED_LEN_MAX */
        uint64_t progress_usec;
} Receiver;

static void report_progress(Receiver *rc, bool force) {
        if (!rc->opts->progress || !ratelimit_due(&rc->progress_usec, PROGRESS_INTERVAL_USEC, force))
                return;
        rc->opts->progress(&(ImageProgress) {
                .phase = rc->phase,
                .bytes = stream_input_raw_bytes(rc->reader.in),
                .total = stream_input_raw_total(rc->reader.in),
                .image = rc->name,
        }, rc->opts->userdata);
}

char **image_names_free(char **names) {
        if (names)
                for (char **n = names; *n; n++)
                        free(*n);
        free(names);
        return NULL;
}

/* ---- paths ---- */

static int fail_path(Receiver *rc, const StreamCommand *c, const char *path, int r, const char *why) {
        return image_error_at(rc->error, r, c->offset, "%s '%s': %s", stream_command_name(c->cmd), path,
                              why ? why : strerror(-r));
}

/* Checks a path's form before anything is looked up: relative, and made
 * of proper names only. */
static int check_path(Receiver *rc, const StreamCommand *c, const char *path) {
        if (*path == '/')
                return fail_path(rc, c, path, -EPERM, "absolute paths are refused");
        for (const char *p = path; *path;) {
                const char *slash = strchr(p, '/');
                size_t len = slash ? (size_t) (slash - p) : strlen(p);

                if (len == 0)
                        return fail_path(rc, c, path, -EPERM, "empty path components are refused");
                if ((len == 1 && p[0] == '.') || (len == 2 && p[0] == '.' && p[1] == '.'))
                        return fail_path(rc, c, path, -EPERM, "'.' and '..' components are refused");
                if (len > NAME_MAX)
                        return fail_path(rc, c, path, -ENAMETOOLONG, NULL);
                if (!slash)
                        break;
                p = slash + 1;
        }
        return 0;
}

/* Walks path from the root to the directory that holds its last
 * component: *ret_name points into path at that component, NULL for the
 * root itself (the empty path). */
static int resolve_parent(Receiver *rc, Volume *v, const StreamCommand *c, const char *path,
                          uint64_t *ret_parent, const char **ret_name) {
        uint64_t dir = VOLUME_ROOT_INO;
        const char *p = path;
        int r;

        if (*path == 0) {
                *ret_parent = VOLUME_ROOT_INO;
                *ret_name = NULL;
                return 0;
        }
        r = check_path(rc, c, path);
        if (r < 0)
                return r;

        for (;;) {
                const char *slash = strchr(p, '/');
                size_t len = slash ? (size_t) (slash - p) : strlen(p);
                char component[NAME_MAX + 1];
                struct stat st;

                memcpy(component, p, len);
                component[len] = 0;
                if (!slash) {
                        *ret_parent = dir;
                        *ret_name = p;
                        return 0;
                }

                r = volume_lookup(v, dir, component, &st);
                if (r < 0)
                        return fail_path(rc, c, path, r, NULL);
                if (S_ISLNK(st.st_mode))
                        return fail_path(rc, c, path, -ELOOP, "it goes through a symbolic link");
                if (!S_ISDIR(st.st_mode))
                        return fail_path(rc, c, path, -ENOTDIR, NULL);
                dir = st.st_ino;
                p = slash + 1;
        }
}

/* The inode path names itself (never what a symbolic link points to). */
static int resolve(Receiver *rc, Volume *v, const StreamCommand *c, const char *path, struct stat *ret) {
        const char *name;
        uint64_t parent;
        int r;

        r = resolve_parent(rc, v, c, path, &parent, &name);
        if (r < 0)
                return r;
        if (!name)
                r = volume_getattr(v, VOLUME_ROOT_INO, ret);
        else
                r = volume_lookup(v, parent, name, ret);
        return r < 0 ? fail_path(rc, c, path, r, NULL) : 0;
}

static int resolve_regular(Receiver *rc, const StreamCommand *c, struct stat *ret) {
        int r;

        r = resolve(rc, rc->volume, c, c->path, ret);
        if (r < 0)
                return r;
        if (!S_ISREG(ret->st_mode))
                return fail_path(rc, c, c->path, -EINVAL, "not a regular file");
        return 0;
}

/* ---- subvolumes ---- */

static int check_image_name(Receiver *rc, const StreamCommand *c, const char *name) {
        StoreSubvolumeInfo info = {};
        int r;

        if (!store_name_is_valid(name) || startswith(name, IMAGE_RECEIVING_PREFIX))
                return image_error_at(rc->error, -EINVAL, c->offset, "'%s' is not a valid image name%s",
                                      name, rc->opts->name ? "" : "; give the image a name of its own");
        for (const char *const *p = rc->opts->reserved_prefixes; p && *p; p++)
                if (startswith(name, *p))
                        return image_error_at(rc->error, -EINVAL, c->offset, "'%s' is not a name for an image: "
                                              "names starting with '%s' are kept for others; give the image "
                                              "a name of its own", name, *p);
        r = store_subvolume_show(rc->store, name, &info);
        store_subvolume_info_clear(&info);
        if (r >= 0)
                return image_error_at(rc->error, -EEXIST, c->offset, "an image or subvolume named '%s' exists "
                                      "already; delete it, or receive under another name", name);
        if (r != -ENOENT)
                return image_error(rc->error, r, "cannot look up '%s' in the store: %s", name, strerror(-r));
        for (size_t i = 0; i < rc->n_names; i++)
                if (streq(rc->names[i], name))
                        return image_error_at(rc->error, -EEXIST, c->offset, "the input holds two subvolumes "
                                              "named '%s'", name);
        return 0;
}

/* The temporary name of an image this input made, if it has that UUID. */
static const char *pending_image(const Receiver *rc, const uint8_t uuid[16]) {
        for (size_t i = 0; i < rc->n_names; i++)
                if (!rc->pending[i].named && memcmp(rc->pending[i].uuid, uuid, 16) == 0)
                        return rc->pending[i].temp;
        return NULL;
}

/* The image with that UUID (the one it was received with, or else its
 * own). One still being received, by another receive or by one that died,
 * is not there yet: its input may still be refused. */
static int find_image(Receiver *rc, const uint8_t uuid[16], StoreSubvolumeInfo *ret) {
        char text[37];
        int r;

        uuid_format(uuid, text);
        r = store_subvolume_find_uuid(rc->store, text, ret);
        if (r >= 0 && startswith(ret->name, IMAGE_RECEIVING_PREFIX)) {
                store_subvolume_info_clear(ret);
                return -ENOENT;
        }
        return r;
}

/* An increment, or a clone, names the image it builds on by a UUID and
 * the transaction it was at when sent: the one it was received with,
 * where the UUID is the one it was received with, or else its own. An
 * image found that is not read-only, or has changed since (made writable
 * and frozen again), is another tree: applied to it, the stream would make
 * an image that is neither. */
static int check_base_image(Receiver *rc, const StreamCommand *c, const StoreSubvolumeInfo *info, const char *what) {
        char uuid[37];
        uint64_t transid;

        uuid_format(c->clone_uuid, uuid);
        if (!info->readonly)
                return image_error_at(rc->error, -EPERM, c->offset, "%s: the image it builds on, '%s' (UUID %s), is "
                                      "not read-only", what, info->name, uuid);
        transid = streq(info->received_uuid, uuid) ? info->stransid : info->ctransid;
        if (transid != c->clone_ctransid)
                return image_error_at(rc->error, -ESTALE, c->offset, "%s: the image it builds on, '%s' (UUID %s), "
                                      "is at transaction %" PRIu64 " here, not at %" PRIu64 " as when the stream "
                                      "was made: it changed since; send a full stream", what, info->name, uuid,
                                      transid, (uint64_t) c->clone_ctransid);
        return 0;
}

static int begin_subvolume(Receiver *rc, const StreamCommand *c) {
        static unsigned counter;
        const char *name = rc->opts->name ? rc->opts->name : c->path;
        char uuid[37];
        int r;

        if (rc->volume)
                return image_error_at(rc->error, -EBADMSG, c->offset, "a %s command inside a subvolume "
                                      "(before its END)", stream_command_name(c->cmd));
        if (rc->opts->name && rc->n_subvolumes > 0)
                return image_error_at(rc->error, -EINVAL, c->offset, "the input holds more than one "
                                      "subvolume, and a name was given for one only");
        r = check_image_name(rc, c, name);
        if (r < 0)
                return r;

        free(rc->name);
        rc->name = strdup(name);
        if (!rc->name)
                return -ENOMEM;
        memcpy(rc->uuid, c->uuid, sizeof rc->uuid);
        rc->ctransid = c->ctransid;
        snprintf(rc->temp_name, sizeof rc->temp_name, IMAGE_RECEIVING_PREFIX "%s-%u", rc->receive_uuid,
                 counter++);

        if (c->cmd == CMD_SNAPSHOT && pending_image(rc, c->clone_uuid))
                r = store_subvolume_snapshot(rc->store, pending_image(rc, c->clone_uuid), rc->temp_name, false);
        else if (c->cmd == CMD_SNAPSHOT) {
                StoreSubvolumeInfo parent = {};

                uuid_format(c->clone_uuid, uuid);
                r = find_image(rc, c->clone_uuid, &parent);
                if (r == -ENOENT)
                        return image_error_at(rc->error, r, c->offset, "the stream is an increment on an image "
                                              "with UUID %s, which is not in this store: receive that image "
                                              "first", uuid);
                if (r < 0)
                        return image_error(rc->error, r, "cannot look up the parent image: %s", strerror(-r));
                r = check_base_image(rc, c, &parent, "the increment");
                if (r < 0) {
                        store_subvolume_info_clear(&parent);
                        rc->temp_name[0] = 0;
                        return r;
                }
                r = store_subvolume_snapshot(rc->store, parent.name, rc->temp_name, false);
                store_subvolume_info_clear(&parent);
        } else
                r = store_subvolume_create(rc->store, rc->temp_name);
        if (r < 0) {
                rc->temp_name[0] = 0;
                return image_error(rc->error, r, "cannot create the image: %s", strerror(-r));
        }
        r = volume_open(rc->store, rc->temp_name, true, &rc->volume, NULL);
        if (r < 0)
                return image_error(rc->error, r, "cannot open the new image: %s", strerror(-r));
        rc->n_subvolumes++;
        report_progress(rc, true);
        return 0;
}

static void close_sources(Receiver *rc) {
        for (size_t i = 0; i < rc->n_sources; i++)
                volume_close(rc->sources[i].volume);
        rc->n_sources = 0;
}

/* Drops the subvolume being received, if any. */
static void abandon_subvolume(Receiver *rc) {
        close_sources(rc);
        if (rc->volume)
                rc->volume = volume_close(rc->volume);
        if (rc->temp_name[0]) {
                if (store_subvolume_delete(rc->store, rc->temp_name, NULL) >= 0 &&
                    !rc->opts->no_background_reap)
                        (void) store_reap_in_background(rc->store);
                rc->temp_name[0] = 0;
        }
}

static int finish_subvolume(Receiver *rc, const StreamCommand *c) {
        PendingImage *pending;
        char **names;
        int r;

        if (!rc->volume)
                return image_error_at(rc->error, -EBADMSG, c->offset, "an END command outside a subvolume");
        close_sources(rc);
        r = volume_sync(rc->volume);
        rc->volume = volume_close(rc->volume);
        if (r < 0)
                return image_error(rc->error, r, "cannot store the image: %s", strerror(-r));

        r = store_subvolume_set_readonly(rc->store, rc->temp_name, true);
        if (r < 0)
                return image_error(rc->error, r, "cannot complete the image: %s", strerror(-r));

        names = realloc(rc->names, (rc->n_names + 2) * sizeof *names);
        if (!names)
                return -ENOMEM;
        rc->names = names;
        pending = realloc(rc->pending, (rc->n_names + 1) * sizeof *pending);
        if (!pending)
                return -ENOMEM;
        rc->pending = pending;
        pending = &rc->pending[rc->n_names];
        *pending = (PendingImage) { .ctransid = rc->ctransid };
        memcpy(pending->temp, rc->temp_name, sizeof pending->temp);
        memcpy(pending->uuid, rc->uuid, sizeof pending->uuid);
        rc->names[rc->n_names++] = TAKE_PTR(rc->name);
        rc->names[rc->n_names] = NULL;
        rc->temp_name[0] = 0;
        return 0;
}

/* The whole input checked out: the images take their names, all in one
 * change of the store, so that not even a crash leaves some named and the
 * others not (those are deleted with the rest by the next receive). The
 * received UUIDs come first: under their temporary names, nobody builds
 * on them yet. */
static int name_images(Receiver *rc) {
        _cleanup_free_ StoreRename *renames = NULL;
        size_t failed = 0;
        int r;

        if (rc->n_names == 0)
                return 0;
        renames = calloc(rc->n_names, sizeof *renames);
        if (!renames)
                return -ENOMEM;
        for (size_t i = 0; i < rc->n_names; i++) {
                char uuid[37];

                uuid_format(rc->pending[i].uuid, uuid);
                r = store_subvolume_set_received(rc->store, rc->pending[i].temp, uuid, rc->pending[i].ctransid);
                if (r < 0)
                        return image_error(rc->error, r, "cannot complete the image '%s': %s", rc->names[i],
                                           strerror(-r));
                renames[i] = (StoreRename) { rc->pending[i].temp, rc->names[i] };
        }
        r = store_subvolumes_rename(rc->store, renames, rc->n_names, &failed);
        if (r == -EEXIST && failed < rc->n_names)
                return image_error(rc->error, r, "an image named '%s' appeared while this one was "
                                   "received", rc->names[failed]);
        if (r < 0 && failed < rc->n_names)
                return image_error(rc->error, r, "cannot name the image '%s': %s", rc->names[failed],
                                   strerror(-r));
        if (r < 0)
                return image_error(rc->error, r, "cannot name the images: %s", strerror(-r));
        for (size_t i = 0; i < rc->n_names; i++)
                rc->pending[i].named = true;
        return 0;
}

static void abandon_pending(Receiver *rc) {
        bool deleted = false;

        for (size_t i = 0; i < rc->n_names; i++)
                if (!rc->pending[i].named && store_subvolume_delete(rc->store, rc->pending[i].temp, NULL) >= 0)
                        deleted = true;
        if (deleted && !rc->opts->no_background_reap)
                (void) store_reap_in_background(rc->store);
}

/* ---- commands ---- */

static int make_node(Receiver *rc, const StreamCommand *c) {
        const char *name;
        uint64_t parent;
        struct stat st;
        mode_t mode;
        dev_t rdev = 0;
        int r;

        r = resolve_parent(rc, rc->volume, c, c->path, &parent, &name);
        if (r < 0)
                return r;
        if (!name)
                return fail_path(rc, c, c->path, -EEXIST, "the root exists already");

        switch (c->cmd) {
        case CMD_MKFILE:
                r = volume_mknod(rc->volume, parent, name, S_IFREG | 0600, 0, 0, 0, &st);
                break;
        case CMD_MKDIR:
                r = volume_mkdir(rc->volume, parent, name, 0700, 0, 0, &st);
                break;
        case CMD_SYMLINK:
                r = volume_symlink(rc->volume, parent, name, c->path_link, 0, 0, &st);
                break;
        default:
                mode = c->cmd == CMD_MKFIFO ? S_IFIFO : c->cmd == CMD_MKSOCK ? S_IFSOCK : (mode_t) c->mode & S_IFMT;
                if (mode != S_IFCHR && mode != S_IFBLK && mode != S_IFIFO && mode != S_IFSOCK)
                        return fail_path(rc, c, c->path, -EINVAL, "not a device, FIFO or socket mode");
                if (mode == S_IFCHR || mode == S_IFBLK)
                        rdev = makedev((unsigned) ((c->rdev & 0xfff00) >> 8),
                                       (unsigned) ((c->rdev & 0xff) | ((c->rdev >> 12) & 0xfff00)));
                r = volume_mknod(rc->volume, parent, name, mode | 0600, rdev, 0, 0, &st);
                break;
        }
        return r < 0 ? fail_path(rc, c, c->path, r, NULL) : 0;
}

static int remove_entry(Receiver *rc, const StreamCommand *c) {
        const char *name;
        uint64_t parent;
        struct stat st;
        int r;

        r = resolve_parent(rc, rc->volume, c, c->path, &parent, &name);
        if (r < 0)
                return r;
        if (!name)
                return fail_path(rc, c, c->path, -EBUSY, "the root cannot be removed");
        r = volume_lookup(rc->volume, parent, name, &st);
        if (r >= 0)
                r = c->cmd == CMD_RMDIR ? volume_rmdir(rc->volume, parent, name)
                                        : volume_unlink(rc->volume, parent, name);
        if (r < 0)
                return fail_path(rc, c, c->path, r, NULL);
        volume_forget(rc->volume, st.st_ino);
        return 0;
}

static int rename_entry(Receiver *rc, const StreamCommand *c) {
        const char *name, *new_name;
        uint64_t parent, new_parent;
        struct stat replaced;
        bool replaces;
        int r;

        r = resolve_parent(rc, rc->volume, c, c->path, &parent, &name);
        if (r < 0)
                return r;
        r = resolve_parent(rc, rc->volume, c, c->path_to, &new_parent, &new_name);
        if (r < 0)
                return r;
        if (!name || !new_name)
                return fail_path(rc, c, c->path, -EBUSY, "the root cannot be renamed");
        replaces = volume_lookup(rc->volume, new_parent, new_name, &replaced) >= 0;
        r = volume_rename(rc->volume, parent, name, new_parent, new_name, 0);
        if (r == -EINVAL)
                return fail_path(rc, c, c->path, r, "a directory cannot be moved into itself");
        if (r < 0)
                return fail_path(rc, c, c->path, r, NULL);
        if (replaces)
                volume_forget(rc->volume, replaced.st_ino);
        return 0;
}

static int link_entry(Receiver *rc, const StreamCommand *c) {
        const char *name;
        uint64_t parent;
        struct stat target, st;
        int r;

        r = resolve(rc, rc->volume, c, c->path_link, &target);
        if (r < 0)
                return r;
        if (S_ISDIR(target.st_mode))
                return fail_path(rc, c, c->path_link, -EPERM, "directories cannot be hard linked");
        r = resolve_parent(rc, rc->volume, c, c->path, &parent, &name);
        if (r < 0)
                return r;
        if (!name)
                return fail_path(rc, c, c->path, -EEXIST, NULL);
        r = volume_link(rc->volume, target.st_ino, parent, name, &st);
        return r < 0 ? fail_path(rc, c, c->path, r, NULL) : 0;
}

static int set_attributes(Receiver *rc, const StreamCommand *c) {
        struct stat st, attr = {};
        unsigned valid;
        int r;

        r = resolve(rc, rc->volume, c, c->path, &st);
        if (r < 0)
                return r;
        switch (c->cmd) {
        case CMD_TRUNCATE:
                if (!S_ISREG(st.st_mode))
                        return fail_path(rc, c, c->path, -EINVAL, "not a regular file");
                if (c->size > (uint64_t) INT64_MAX)
                        return fail_path(rc, c, c->path, -EFBIG, NULL);
                attr.st_size = (off_t) c->size;
                valid = VOLUME_SET_SIZE;
                break;
        case CMD_CHMOD:
                if (S_ISLNK(st.st_mode))
                        return 0;
                attr.st_mode = (mode_t) (c->mode & 07777);
                valid = VOLUME_SET_MODE;
                break;
        case CMD_CHOWN:
                if (c->uid > UINT32_MAX - 1 || c->gid > UINT32_MAX - 1)
                        return fail_path(rc, c, c->path, -EINVAL, "owner out of range");
                attr.st_uid = (uid_t) c->uid;
                attr.st_gid = (gid_t) c->gid;
                valid = VOLUME_SET_UID | VOLUME_SET_GID;
                break;
        default: /* CMD_UTIMES: ctime and otime cannot be set, as on any file system */
                attr.st_atim = c->atime;
                attr.st_mtim = c->mtime;
                valid = VOLUME_SET_ATIME | VOLUME_SET_MTIME;
                break;
        }
        r = volume_setattr(rc->volume, st.st_ino, &attr, valid, &st);
        return r < 0 ? fail_path(rc, c, c->path, r, NULL) : 0;
}

static int change_xattr(Receiver *rc, const StreamCommand *c) {
        struct stat st;
        int r;

        r = resolve(rc, rc->volume, c, c->path, &st);
        if (r < 0)
                return r;
        if (c->xattr_name[0] == 0)
                return fail_path(rc, c, c->path, -EINVAL, "an empty extended attribute name");
        if (c->cmd == CMD_REMOVE_XATTR)
                r = volume_removexattr(rc->volume, st.st_ino, c->xattr_name);
        else if (c->xattr_data_len > XATTR_VALUE_MAX)
                r = -E2BIG;
        else
                r = volume_setxattr(rc->volume, st.st_ino, c->xattr_name, c->xattr_data, c->xattr_data_len, 0);
        return r < 0 ? fail_path(rc, c, c->path, r, NULL) : 0;
}

static int write_range(Receiver *rc, const StreamCommand *c, uint64_t ino, const uint8_t *data,
                       size_t len, uint64_t offset) {
        ssize_t k;

        if (offset + len < offset || offset + len > (uint64_t) INT64_MAX)
                return fail_path(rc, c, c->path, -EFBIG, NULL);
        k = volume_write(rc->volume, ino, data, len, offset);
        if (k < 0)
                return fail_path(rc, c, c->path, (int) k, NULL);
        return 0;
}

static int write_data(Receiver *rc, const StreamCommand *c) {
        struct stat st;
        int r;

        r = resolve_regular(rc, c, &st);
        if (r < 0)
                return r;
        return write_range(rc, c, st.st_ino, c->data, c->data_len, c->file_offset);
}

static Volume *clone_source(Receiver *rc, const StreamCommand *c, int *ret_error) {
        StoreSubvolumeInfo info = {};
        Volume *v = NULL;
        char uuid[37];
        int r;

        if (memcmp(c->clone_uuid, rc->uuid, sizeof rc->uuid) == 0)
                return rc->volume;
        for (size_t i = 0; i < rc->n_sources; i++)
                if (memcmp(rc->sources[i].uuid, c->clone_uuid, 16) == 0)
                        return rc->sources[i].volume;

        uuid_format(c->clone_uuid, uuid);
        if (pending_image(rc, c->clone_uuid)) {
                r = 0;
                info.readonly = true;
                info.name = strdup(pending_image(rc, c->clone_uuid));
                if (!info.name)
                        r = -ENOMEM;
        } else {
                r = find_image(rc, c->clone_uuid, &info);
                if (r >= 0) {
                        char what[PATH_MAX + 16];

                        snprintf(what, sizeof what, "clone '%s'", c->path);
                        r = check_base_image(rc, c, &info, what);
                }
        }
        if (r == -ENOENT)
                r = image_error_at(rc->error, r, c->offset, "clone '%s': its source, the subvolume with UUID %s, "
                                   "is not in this store", c->path, uuid);
        else if (r >= 0 && rc->n_sources == CLONE_SOURCES_MAX)
                r = image_error_at(rc->error, -E2BIG, c->offset, "clone '%s': clones from more than %d images",
                                   c->path, CLONE_SOURCES_MAX);
        else if (r >= 0) {
                r = volume_open(rc->store, info.name, false, &v, NULL);
                if (r < 0)
                        r = image_error(rc->error, r, "cannot open image '%s': %s", info.name, strerror(-r));
        }
        store_subvolume_info_clear(&info);
        if (r < 0) {
                *ret_error = r;
                return NULL;
        }
        memcpy(rc->sources[rc->n_sources].uuid, c->clone_uuid, 16);
        rc->sources[rc->n_sources++].volume = v;
        return v;
}

static int clone_data(Receiver *rc, const StreamCommand *c) {
        struct stat dst, src;
        Volume *source;
        int r = 0;

        r = resolve_regular(rc, c, &dst);
        if (r < 0)
                return r;
        source = clone_source(rc, c, &r);
        if (!source)
                return r;
        r = resolve(rc, source, c, c->clone_path, &src);
        if (r < 0)
                return r;
        if (!S_ISREG(src.st_mode))
                return fail_path(rc, c, c->clone_path, -EINVAL, "the clone source is not a regular file");
        r = volume_clone_range(rc->volume, dst.st_ino, c->file_offset, source, src.st_ino, c->clone_offset,
                               c->clone_len);
        return r < 0 ? fail_path(rc, c, c->path, r, NULL) : 0;
}

static int fallocate_range(Receiver *rc, const StreamCommand *c) {
        struct stat st;
        int r;

        r = resolve_regular(rc, c, &st);
        if (r < 0)
                return r;
        if (c->fallocate_mode & ~(uint32_t) (FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE))
                return fail_path(rc, c, c->path, -EOPNOTSUPP, "unknown fallocate mode");
        if (c->size == 0)
                return 0;
        r = volume_fallocate(rc->volume, st.st_ino, (int) c->fallocate_mode, c->file_offset, c->size);
        return r < 0 ? fail_path(rc, c, c->path, r, NULL) : 0;
}

/* btrfs's LZO framing: a u32 total length, then segments of a u32 length
 * and LZO1X data; a segment header never straddles a sector. */
static int decode_lzo(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len, size_t sector) {
        size_t total, pos = 4, done = 0;

        if (in_len < 4)
                return -EBADMSG;
        total = (size_t) in[0] | (size_t) in[1] << 8 | (size_t) in[2] << 16 | (size_t) in[3] << 24;
        if (total > in_len || total < 4)
                return -EBADMSG;
        while (pos < total && done < out_len) {
                lzo_uint got = out_len - done;
                size_t seg;

                if (sector - pos % sector < 4)
                        pos += sector - pos % sector;
                /* The padding may end past the data: what follows is not its. */
                if (pos > total || total - pos < 4)
                        break;
                seg = (size_t) in[pos] | (size_t) in[pos + 1] << 8 | (size_t) in[pos + 2] << 16 |
                      (size_t) in[pos + 3] << 24;
                pos += 4;
                if (seg > total - pos)
                        return -EBADMSG;
                if (lzo1x_decompress_safe(in + pos, seg, out + done, &got, NULL) != LZO_E_OK)
                        return -EBADMSG;
                done += got;
                pos += seg;
        }
        return (int) done;
}

static int decode_zlib(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len) {
        z_stream z = {
                .next_in = (Bytef *) in,
                .avail_in = (uInt) in_len,
                .next_out = out,
                .avail_out = (uInt) out_len,
        };
        int zr;

        if (inflateInit(&z) != Z_OK)
                return -ENOMEM;
        zr = inflate(&z, Z_FINISH);
        inflateEnd(&z);
        if (zr != Z_STREAM_END && !(zr == Z_BUF_ERROR && z.avail_out == 0))
                return -EBADMSG;
        return (int) (out_len - z.avail_out);
}

static int decode_zstd(const uint8_t *in, size_t in_len, uint8_t *out, size_t out_len) {
        size_t frame = ZSTD_findFrameCompressedSize(in, in_len), n;

        if (ZSTD_isError(frame))
                return -EBADMSG;
        n = ZSTD_decompress(out, out_len, in, frame);
        return ZSTD_isError(n) ? -EBADMSG : (int) n;
}

static int encoded_write(Receiver *rc, const StreamCommand *c) {
        const uint8_t *plain;
        struct stat st;
        int r;

        r = resolve_regular(rc, c, &st);
        if (r < 0)
                return r;
        if (c->encryption != 0)
                return fail_path(rc, c, c->path, -EOPNOTSUPP, "encrypted data is not supported");
        if (c->unencoded_len > ENCODED_LEN_MAX || c->unencoded_offset > c->unencoded_len ||
            c->unencoded_file_len > c->unencoded_len - c->unencoded_offset)
                return fail_path(rc, c, c->path, -EBADMSG, "the encoded extent's lengths do not fit together");

        switch (c->compression) {
        case ENCODED_NONE:
                if (c->data_len < c->unencoded_len)
                        return fail_path(rc, c, c->path, -EBADMSG, "less data than its length says");
                plain = c->data;
                r = 0;
                break;
        case ENCODED_ZLIB:
                r = decode_zlib(c->data, c->data_len, rc->decoded, c->unencoded_len);
                plain = rc->decoded;
                break;
        case ENCODED_ZSTD:
                r = decode_zstd(c->data, c->data_len, rc->decoded, c->unencoded_len);
                plain = rc->decoded;
                break;
        default:
                if (c->compression < ENCODED_LZO_4K || c->compression > ENCODED_LZO_64K)
                        return fail_path(rc, c, c->path, -EOPNOTSUPP, "unknown compression");
                r = decode_lzo(c->data, c->data_len, rc->decoded, c->unencoded_len,
                               (size_t) 4096 << (c->compression - ENCODED_LZO_4K));
                plain = rc->decoded;
                break;
        }
        if (r < 0)
                return fail_path(rc, c, c->path, r, "the compressed data is damaged");
        /* A short extent reads as zeros after its end. */
        if (plain == rc->decoded && (uint64_t) r < c->unencoded_len)
                memset(rc->decoded + r, 0, c->unencoded_len - (uint64_t) r);
        return write_range(rc, c, st.st_ino, plain + c->unencoded_offset, c->unencoded_file_len, c->file_offset);
}

static int apply_command(Receiver *rc, const StreamCommand *c) {
        int r;

        r = stream_command_check(c, rc->error);
        if (r < 0)
                return r;
        if (c->cmd == CMD_SUBVOL || c->cmd == CMD_SNAPSHOT)
                return begin_subvolume(rc, c);
        if (!rc->volume)
                return image_error_at(rc->error, -EBADMSG, c->offset, "a %s command before the stream's "
                                      "subvolume command", stream_command_name(c->cmd));

        switch (c->cmd) {
        case CMD_END:
                return finish_subvolume(rc, c);
        case CMD_MKFILE: case CMD_MKDIR: case CMD_MKNOD: case CMD_MKFIFO: case CMD_MKSOCK: case CMD_SYMLINK:
                return make_node(rc, c);
        case CMD_RENAME:
                return rename_entry(rc, c);
        case CMD_LINK:
                return link_entry(rc, c);
        case CMD_UNLINK: case CMD_RMDIR:
                return remove_entry(rc, c);
        case CMD_SET_XATTR: case CMD_REMOVE_XATTR:
                return change_xattr(rc, c);
        case CMD_WRITE:
                return write_data(rc, c);
        case CMD_CLONE:
                return clone_data(rc, c);
        case CMD_TRUNCATE: case CMD_CHMOD: case CMD_CHOWN: case CMD_UTIMES:
                return set_attributes(rc, c);
        case CMD_FALLOCATE:
                return fallocate_range(rc, c);
        case CMD_ENCODED_WRITE:
                return encoded_write(rc, c);
        case CMD_UPDATE_EXTENT:
        case CMD_FILEATTR:
                /* No data (a stream of metadata only); inode flags, which
                 * the store does not keep (btrfs receive ignores them too). */
                return 0;
        default:
                return image_error_at(rc->error, -EBADMSG, c->offset, "unknown command %u", c->cmd);
        }
}

/* Reads every stream of the input; with apply false, only reads through
 * it (to check its digest before anything is applied). */
static int receive_all(Receiver *rc, bool apply) {
        _cleanup_free_ StreamCommand *c = malloc(sizeof *c);
        int r;

        if (!c)
                return -ENOMEM;
        for (unsigned streams = 0;; streams++) {
                r = stream_read_header(&rc->reader, rc->error);
                if (r < 0)
                        return r;
                /* As a plain input that is empty: a compressed one may
                 * hold no bytes at all. */
                if (r == 0 && streams == 0)
                        return image_error(rc->error, -ENODATA, "the input is empty: no send stream in it");
                if (r == 0)
                        break;
                for (;;) {
                        r = stream_read_command(&rc->reader, c, rc->error);
                        if (r < 0)
                                return r;
                        if (apply) {
                                r = apply_command(rc, c);
                                if (r < 0)
                                        return r;
                        }
                        report_progress(rc, false);
                        if (c->cmd == CMD_END)
                                break;
                }
        }
        return stream_input_verify(rc->reader.in, rc->error);
}

int image_receive(Store *s, int fd, const ImageReceiveOptions *opts, char ***ret_names, ImageError *ret_error) {
        _cleanup_(stream_input_freep) StreamInput *in = NULL;
        static const ImageReceiveOptions no_options = {};
        ImageError dummy;
        Receiver rc = {
                .store = s,
                .opts = opts ? opts : &no_options,
                .error = ret_error ? ret_error : &dummy,
        };
        int r;

        *rc.error = (ImageError) {};
        if (image_remove_stale_receives(s) > 0 && !rc.opts->no_background_reap)
                (void) store_reap_in_background(s);

        /* Claimed before its first subvolume is made: none is ever seen
         * unclaimed while the receive lives. */
        r = store_uuid_new(rc.receive_uuid);
        if (r < 0)
                return image_error(rc.error, r, "cannot make the receive's UUID: %s", strerror(-r));
        snprintf(rc.claim, sizeof rc.claim, RECEIVE_CLAIM_PREFIX "%s", rc.receive_uuid);
        r = store_claim(s, rc.claim);
        if (r < 0)
                return image_error(rc.error, r, "cannot claim the receive in the store: %s", strerror(-r));

        r = stream_input_new(fd, &in, rc.error);
        if (r < 0)
                goto finish;
        rc.reader.in = in;
        rc.reader.buf = malloc(COMMAND_HEADER_LEN + COMMAND_PAYLOAD_MAX);
        rc.decoded = malloc(ENCODED_LEN_MAX);
        if (!rc.reader.buf || !rc.decoded) {
                r = -ENOMEM;
                goto finish;
        }

        /* A file with a digest is checked whole before anything is applied;
         * from a pipe, the images wait under their temporary names until
         * the digest at the end has checked out. */
        if (stream_input_rewindable(in)) {
                rc.phase = "verifying";
                r = receive_all(&rc, false);
                if (r < 0)
                        goto finish;
                r = stream_input_rewind(in, rc.error);
                if (r < 0)
                        goto finish;
        }
        rc.phase = "receiving";
        r = receive_all(&rc, true);
        if (r >= 0 && rc.volume)
                r = image_error(rc.error, -EBADMSG, "the input ends inside a subvolume");
        if (r >= 0)
                r = name_images(&rc);
        if (r >= 0)
                report_progress(&rc, true);
finish:
        abandon_subvolume(&rc);
        if (r < 0)
                abandon_pending(&rc);
        (void) store_claim_release(s, rc.claim);
        free(rc.pending);
        free(rc.reader.buf);
        free(rc.decoded);
        free(rc.name);
        if (r < 0 && r != -ENOMEM && !rc.error->message[0])
                image_error(rc.error, r, "%s", strerror(-r));
        if (r < 0 || !ret_names)
                image_names_free(rc.names);
        else
                *ret_names = rc.names ? rc.names : calloc(1, sizeof(char *));
        if (r >= 0 && ret_names && !*ret_names)
                return -ENOMEM;
        return r;
}

/* Whether a temporary name is one a receive made whose process is gone:
 * UUID-N, the UUID of a receive that nobody claims any more; or PID-N,
 * made by receives before claims, of a process that is gone. Any other
 * name is kept. */
static bool receive_is_gone(Store *s, const char *name) {
        const char *id = name + strlen(IMAGE_RECEIVING_PREFIX), *counter;
        size_t id_len;
        char *end;

        if (!startswith(name, IMAGE_RECEIVING_PREFIX))
                return false;
        counter = strrchr(id, '-');
        if (!counter || !isdigit((unsigned char) counter[1]))
                return false;
        errno = 0;
        if (strtoul(counter + 1, &end, 10) > UINT_MAX || errno != 0 || *end != 0)
                return false;
        id_len = (size_t) (counter - id);

        if (id_len == 36 && strspn(id, "0123456789abcdef-") >= 36) {
                char claim[64];

                snprintf(claim, sizeof claim, RECEIVE_CLAIM_PREFIX "%.36s", id);
                return store_claim_is_held(s, claim) == 0;
        }
        if (id_len > 0 && id_len <= 10 && strspn(id, "0123456789") == id_len) {
                long pid = strtol(id, NULL, 10);

                return pid > 0 && pid <= INT_MAX && process_is_exiting((pid_t) pid);
        }
        return false;
}

int image_remove_stale_receives(Store *s) {
        _cleanup_strv_free_ char **names = NULL;
        int r, removed = 0;

        /* Names only: the daemon asks every few seconds after it starts,
         * and a store may hold thousands of subvolumes. */
        r = store_subvolume_names(s, &names);
        if (r < 0)
                return r;
        for (char **name = names; *name; name++) {
                if (!receive_is_gone(s, *name))
                        continue;
                /* One still mounted stays: its lock is taken, the delete fails. */
                if (store_subvolume_delete(s, *name, NULL) >= 0)
                        removed++;
        }
        /* Then the claims of receives that died, their subvolumes gone. */
        (void) store_claims_clear(s, RECEIVE_CLAIM_PREFIX);
        return removed;
}
