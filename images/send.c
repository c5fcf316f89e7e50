/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * Send: writes an image as a send stream. A full stream creates every
 * inode at its final path (directories first), gives a second name of an
 * inode as LINK, and sends a block that the stream has sent before as a
 * CLONE of it.
 *
 * An incremental stream against a parent image walks both trees by path.
 * The store keeps inode numbers across snapshots, so a path that holds the
 * same inode (same number, type and, for links and devices, target) in
 * both is changed in place: only the blocks whose digests differ, the
 * xattrs, owner, mode and times that differ. Everything else of the parent
 * is removed first, then everything new is created; its blocks go as CLONEs
 * of the parent's (or of what the stream sent before) wherever the same
 * block is there, so data the receiver has is never sent again.
 */

#include <errno.h>
#include <inttypes.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysmacros.h>
#include <time.h>

#include "images-internal.h"
#include "keymap.h"
#include "string-util.h"
#include "time-util.h"

#define PROGRESS_INTERVAL_USEC (200 * 1000)
#define XATTR_LIST_MAX_BYTES (64 * 1024)
#define CAPABILITY_XATTR "security.capability"

typedef struct Sender {
        Store *store;
        const ImageSendOptions *opts;
        ImageError *error;
        StreamWriter w;
        unsigned version;

        Volume *image;
        Volume *parent;                 /* NULL for a full stream */
        char image_name[STORE_NAME_MAX + 1];
        uint8_t image_uuid[16];
        uint8_t parent_uuid[16];
        uint64_t image_ctransid, parent_ctransid;
        uint64_t logical_bytes;

        KeyMap created;                 /* inode -> the path it was created at */
        KeyMap updated;                 /* inodes changed in place already */
        KeyMap survivors;               /* inode -> 1 if the parent's inode is the image's, 2 if not */
        KeyMap parent_inodes;           /* inodes reachable by name in the parent */
        KeyMap image_inodes;            /* ... and in the image */
        KeyMap location;                /* inode -> its name and parent directory on the receiver */
        KeyMap orphans;                 /* inode -> its temporary name in the root; size 1: placed */
        KeyMap touched;                 /* directories whose entries change on the receiver */
        KeyMap sent_blocks;             /* digest -> where the receiving subvolume has it */
        KeyMap parent_blocks;           /* digest -> where the parent has it */
        KeyMap parent_files;            /* inode -> a path of the parent's regular file */
        bool parent_blocks_ready;

        uint8_t *block;                 /* VOLUME_BLOCK_SIZE */
        uint8_t *other;                 /* VOLUME_BLOCK_SIZE */
        uint64_t progress_usec;
} Sender;

static void report_progress(Sender *sd, bool force) {
        if (!sd->opts->progress || !ratelimit_due(&sd->progress_usec, PROGRESS_INTERVAL_USEC, force))
                return;
        sd->opts->progress(&(ImageProgress) {
                .phase = "sending",
                .bytes = stream_output_bytes(sd->w.out),
                .total = sd->parent ? 0 : sd->logical_bytes,
                .image = sd->image_name,
        }, sd->opts->userdata);
}

static int fail(Sender *sd, int r, const char *path, const char *what) {
        if (r == -EPIPE)
                return image_error(sd->error, r, "the receiving end of the output closed");
        if (r == -EMSGSIZE)
                return image_error(sd->error, r, "'%s': %s does not fit in a version %u command", path, what,
                                   sd->version);
        if (!*path)     /* the image as a whole, not one of its files */
                return image_error(sd->error, r, "cannot %s: %s", what, strerror(-r));
        return image_error(sd->error, r, "'%s': cannot %s: %s", path, what, strerror(-r));
}

/* ---- tree helpers ---- */

static int dirent_compare(const void *a, const void *b) {
        return strcmp(((const VolumeDirent *) a)->name, ((const VolumeDirent *) b)->name);
}

static int open_dir_sorted(Volume *v, uint64_t ino, VolumeDir **ret) {
        int r = volume_opendir(v, ino, ret);

        if (r >= 0 && (*ret)->n > 1)
                qsort((*ret)->entries, (*ret)->n, sizeof *(*ret)->entries, dirent_compare);
        return r;
}

DEFINE_TRIVIAL_CLEANUP_FUNC(VolumeDir *, volume_dir_free);

static int join_path(const char *dir, const char *name, char **ret) {
        char *p;

        if (asprintf(&p, "%s%s%s", dir, *dir ? "/" : "", name) < 0)
                return -ENOMEM;
        if (strlen(p) > STREAM_PATH_MAX) {
                free(p);
                return -ENAMETOOLONG;
        }
        *ret = p;
        return 0;
}

static uint8_t *ino_key(uint64_t ino, uint8_t key[16]) {
        keymap_ino_key(ino, key);
        return key;
}

/* ---- commands ---- */

static int emit_path(Sender *sd, unsigned cmd, const char *path) {
        stream_begin(&sd->w, cmd);
        stream_put_string(&sd->w, ATTR_PATH, path);
        return stream_end(&sd->w);
}

static int emit_owner(Sender *sd, const char *path, const struct stat *st) {
        stream_begin(&sd->w, CMD_CHOWN);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_u64(&sd->w, ATTR_UID, st->st_uid);
        stream_put_u64(&sd->w, ATTR_GID, st->st_gid);
        return stream_end(&sd->w);
}

static int emit_mode(Sender *sd, const char *path, const struct stat *st) {
        stream_begin(&sd->w, CMD_CHMOD);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_u64(&sd->w, ATTR_MODE, st->st_mode & 07777);
        return stream_end(&sd->w);
}

static int emit_times(Sender *sd, const char *path, const struct stat *st) {
        stream_begin(&sd->w, CMD_UTIMES);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_time(&sd->w, ATTR_ATIME, &st->st_atim);
        stream_put_time(&sd->w, ATTR_MTIME, &st->st_mtim);
        stream_put_time(&sd->w, ATTR_CTIME, &st->st_ctim);
        return stream_end(&sd->w);
}

static int emit_truncate(Sender *sd, const char *path, uint64_t size) {
        stream_begin(&sd->w, CMD_TRUNCATE);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_u64(&sd->w, ATTR_SIZE, size);
        return stream_end(&sd->w);
}

static int emit_write(Sender *sd, const char *path, const uint8_t *data, size_t len, uint64_t offset) {
        while (len > 0) {
                size_t n;
                int r;

                stream_begin(&sd->w, CMD_WRITE);
                stream_put_string(&sd->w, ATTR_PATH, path);
                stream_put_u64(&sd->w, ATTR_FILE_OFFSET, offset);
                /* Version 1 receivers expect at most 48 KiB a write. */
                n = MIN(len, sd->version >= 2 ? stream_data_room(&sd->w) : MIN(stream_data_room(&sd->w),
                                                                            (size_t) 48 * 1024));
                stream_put_data(&sd->w, data, n);
                r = stream_end(&sd->w);
                if (r < 0)
                        return r;
                data += n;
                len -= n;
                offset += n;
        }
        return 0;
}

static int emit_clone(Sender *sd, const char *path, uint64_t offset, uint64_t len, const uint8_t uuid[16],
                      uint64_t ctransid, const char *source, uint64_t source_offset) {
        stream_begin(&sd->w, CMD_CLONE);
        stream_put_u64(&sd->w, ATTR_FILE_OFFSET, offset);
        stream_put_u64(&sd->w, ATTR_CLONE_LEN, len);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_bytes(&sd->w, ATTR_CLONE_UUID, uuid, 16);
        stream_put_u64(&sd->w, ATTR_CLONE_CTRANSID, ctransid);
        stream_put_string(&sd->w, ATTR_CLONE_PATH, source);
        stream_put_u64(&sd->w, ATTR_CLONE_OFFSET, source_offset);
        return stream_end(&sd->w);
}

static int emit_xattr(Sender *sd, const char *path, const char *name, const void *value, size_t len) {
        stream_begin(&sd->w, CMD_SET_XATTR);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_string(&sd->w, ATTR_XATTR_NAME, name);
        stream_put_bytes(&sd->w, ATTR_XATTR_DATA, value, len);
        return stream_end(&sd->w);
}

/* ---- xattrs ---- */

static int list_xattrs(Volume *v, uint64_t ino, char **ret, size_t *ret_len) {
        _cleanup_free_ char *names = NULL;
        ssize_t n;

        n = volume_listxattr(v, ino, NULL, 0);
        if (n < 0)
                return (int) n;
        if (n > XATTR_LIST_MAX_BYTES)
                return -E2BIG;
        names = malloc((size_t) n + 1);
        if (!names)
                return -ENOMEM;
        n = volume_listxattr(v, ino, names, (size_t) n);
        if (n < 0)
                return (int) n;
        names[n] = 0;
        *ret = TAKE_PTR(names);
        *ret_len = (size_t) n;
        return 0;
}

/* Reads an xattr's value into buf (VOLUME_BLOCK_SIZE bytes): its length,
 * or -ENODATA. */
static ssize_t read_xattr(Volume *v, uint64_t ino, const char *name, uint8_t *buf) {
        return volume_getxattr(v, ino, name, buf, VOLUME_BLOCK_SIZE);
}

/* Sends the xattrs of ino that the receiver lacks (all of them, without a
 * parent inode) and removes those it has that ino lacks. */
static int send_xattrs(Sender *sd, const char *path, uint64_t ino, uint64_t parent_ino, bool *ret_changed) {
        _cleanup_free_ char *names = NULL, *old_names = NULL;
        size_t len, old_len = 0;
        int r;

        r = list_xattrs(sd->image, ino, &names, &len);
        if (r < 0)
                return fail(sd, r, path, "list extended attributes");
        if (parent_ino) {
                r = list_xattrs(sd->parent, parent_ino, &old_names, &old_len);
                if (r < 0)
                        return fail(sd, r, path, "list extended attributes");
                for (char *n = old_names; n < old_names + old_len; n += strlen(n) + 1) {
                        if (read_xattr(sd->image, ino, n, sd->block) != -ENODATA)
                                continue;
                        stream_begin(&sd->w, CMD_REMOVE_XATTR);
                        stream_put_string(&sd->w, ATTR_PATH, path);
                        stream_put_string(&sd->w, ATTR_XATTR_NAME, n);
                        r = stream_end(&sd->w);
                        if (r < 0)
                                return fail(sd, r, path, "remove an extended attribute");
                        *ret_changed = true;
                }
        }
        for (char *n = names; n < names + len; n += strlen(n) + 1) {
                ssize_t k = read_xattr(sd->image, ino, n, sd->block);

                if (k < 0)
                        return fail(sd, (int) k, path, "read an extended attribute");
                if (parent_ino) {
                        ssize_t old = read_xattr(sd->parent, parent_ino, n, sd->other);

                        if (old == k && memcmp(sd->block, sd->other, (size_t) k) == 0)
                                continue;
                }
                r = emit_xattr(sd, path, n, sd->block, (size_t) k);
                if (r < 0)
                        return fail(sd, r, path, "send an extended attribute");
                *ret_changed = true;
        }
        return 0;
}

/* chown clears security.capability on the receiver: send it again. */
static int send_capability_again(Sender *sd, const char *path, uint64_t ino) {
        ssize_t k = read_xattr(sd->image, ino, CAPABILITY_XATTR, sd->block);
        int r;

        if (k == -ENODATA)
                return 0;
        if (k < 0)
                return fail(sd, (int) k, path, "read an extended attribute");
        r = emit_xattr(sd, path, CAPABILITY_XATTR, sd->block, (size_t) k);
        return r < 0 ? fail(sd, r, path, "send an extended attribute") : 0;
}

/* ---- data ---- */

static int collect_parent_blocks(Sender *sd, const char *path, uint64_t ino);

/* Walks the parent once, the first time a block is looked for there. */
static int parent_blocks_prepare(Sender *sd) {
        int r;

        if (sd->parent_blocks_ready || !sd->parent)
                return 0;
        sd->parent_blocks_ready = true;
        r = collect_parent_blocks(sd, "", VOLUME_ROOT_INO);
        return r < 0 ? image_error(sd->error, r, "cannot list the blocks of the parent image: %s",
                                   strerror(-r)) : 0;
}

static int collect_parent_blocks(Sender *sd, const char *path, uint64_t ino) {
        _cleanup_(volume_dir_freep) VolumeDir *dir = NULL;
        int r;

        r = volume_opendir(sd->parent, ino, &dir);
        if (r < 0)
                return r;
        for (size_t i = 0; i < dir->n; i++) {
                _cleanup_free_ VolumeExtent *extents = NULL;
                _cleanup_free_ char *child = NULL;
                const VolumeDirent *e = &dir->entries[i];
                struct stat st;
                size_t n;

                r = join_path(path, e->name, &child);
                if (r == -ENAMETOOLONG)
                        continue;
                if (r < 0)
                        return r;
                if (e->type == S_IFDIR) {
                        r = collect_parent_blocks(sd, child, e->ino);
                        if (r < 0)
                                return r;
                        continue;
                }
                if (e->type != S_IFREG)
                        continue;
                r = volume_getattr(sd->parent, e->ino, &st);
                if (r < 0)
                        return r;
                r = keymap_add(&sd->parent_files, ino_key(e->ino, (uint8_t[16]) {}), child, 0,
                               (uint64_t) st.st_size);
                if (r < 0)
                        return r;
                r = volume_file_extents(sd->parent, e->ino, &extents, &n);
                if (r == -ENODATA)
                        continue;
                if (r < 0)
                        return r;
                for (size_t k = 0; k < n; k++) {
                        if (extents[k].unsettled)
                                continue;
                        r = keymap_add(&sd->parent_blocks, extents[k].digest, child, extents[k].offset,
                                       (uint64_t) st.st_size);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

/* Whether a block of length len at offset of a file that ends at size can
 * be cloned from source: both at block boundaries, and a short block only
 * from the end of one file to the end of the other. */
static bool can_clone(const KeyMapEntry *source, uint64_t offset, uint32_t len, uint64_t size) {
        uint64_t source_len;

        if (!source || source->offset % VOLUME_BLOCK_SIZE != 0 || offset % VOLUME_BLOCK_SIZE != 0)
                return false;
        source_len = MIN((uint64_t) VOLUME_BLOCK_SIZE, source->size - source->offset);
        if (source_len != len)
                return false;
        return len == VOLUME_BLOCK_SIZE || (offset + len == size && source->offset + len == source->size);
}

static int send_block_data(Sender *sd, const char *path, uint64_t ino, const VolumeExtent *e) {
        ssize_t k;
        int r;

        if (sd->version >= 2 && sd->opts->compressed_data && !e->unsettled && e->length == VOLUME_BLOCK_SIZE) {
                size_t zlen;

                r = volume_read_block_zstd(sd->image, e->digest, sd->other, &zlen);
                if (r >= 0) {
                        stream_begin(&sd->w, CMD_ENCODED_WRITE);
                        stream_put_string(&sd->w, ATTR_PATH, path);
                        stream_put_u64(&sd->w, ATTR_FILE_OFFSET, e->offset);
                        stream_put_u64(&sd->w, ATTR_UNENCODED_FILE_LEN, e->length);
                        stream_put_u64(&sd->w, ATTR_UNENCODED_LEN, e->length);
                        stream_put_u64(&sd->w, ATTR_UNENCODED_OFFSET, 0);
                        stream_put_u32(&sd->w, ATTR_COMPRESSION, ENCODED_ZSTD);
                        stream_put_data(&sd->w, sd->other, zlen);
                        r = stream_end(&sd->w);
                        return r < 0 ? fail(sd, r, path, "send data") : 0;
                }
                if (r != -ENODATA)
                        return fail(sd, r, path, "read a block");
        }

        k = volume_read(sd->image, ino, sd->block, e->length, e->offset);
        if (k < 0)
                return fail(sd, (int) k, path, "read data");
        if ((size_t) k != e->length)
                return fail(sd, -EIO, path, "read data");
        r = emit_write(sd, path, sd->block, (size_t) k, e->offset);
        return r < 0 ? fail(sd, r, path, "send data") : 0;
}

#define PAGE_BYTES 4096

/* Sends only the pages of a block that differ from what the receiver's
 * file holds there (the parent inode's bytes, changed in place). 0 if it
 * cannot tell, and the whole block must go. */
static int send_block_changes(Sender *sd, const char *path, uint64_t ino, const VolumeExtent *e,
                              uint64_t parent_ino, uint64_t parent_size) {
        size_t old_len, run_start = 0;
        bool in_run = false;
        ssize_t k;
        int r;

        if (e->offset >= parent_size)
                return 0;
        old_len = (size_t) MIN((uint64_t) e->length, parent_size - e->offset);
        k = volume_read(sd->parent, parent_ino, sd->other, old_len, e->offset);
        if (k < 0 || (size_t) k != old_len)
                return 0;
        if (old_len < e->length)
                memset(sd->other + old_len, 0, e->length - old_len);
        k = volume_read(sd->image, ino, sd->block, e->length, e->offset);
        if (k < 0)
                return fail(sd, (int) k, path, "read data");
        if ((size_t) k != e->length)
                return fail(sd, -EIO, path, "read data");

        for (size_t pos = 0; pos < e->length; pos += PAGE_BYTES) {
                size_t n = MIN((size_t) PAGE_BYTES, e->length - pos);
                bool differs = memcmp(sd->block + pos, sd->other + pos, n) != 0;

                if (differs && !in_run) {
                        run_start = pos;
                        in_run = true;
                } else if (!differs && in_run) {
                        r = emit_write(sd, path, sd->block + run_start, pos - run_start, e->offset + run_start);
                        if (r < 0)
                                return fail(sd, r, path, "send data");
                        in_run = false;
                }
        }
        if (in_run) {
                r = emit_write(sd, path, sd->block + run_start, e->length - run_start, e->offset + run_start);
                if (r < 0)
                        return fail(sd, r, path, "send data");
        }
        return 1;
}

/* Sends one block of a file that ends at size: as a clone of a block the
 * receiver has, as the pages that differ from the parent inode's, or as
 * data. */
static int send_block(Sender *sd, const char *path, uint64_t ino, const VolumeExtent *e, uint64_t size,
                      uint64_t parent_ino, uint64_t parent_size) {
        KeyMapEntry *source;
        int r;

        if (!e->unsettled) {
                source = keymap_get(&sd->sent_blocks, e->digest);
                if (can_clone(source, e->offset, e->length, size) && !(streq(source->path, path) &&
                                                                        source->offset == e->offset)) {
                        r = emit_clone(sd, path, e->offset, e->length, sd->image_uuid, sd->image_ctransid,
                                       source->path, source->offset);
                        return r < 0 ? fail(sd, r, path, "send a clone") : 0;
                }
                if (sd->parent) {
                        r = parent_blocks_prepare(sd);
                        if (r < 0)
                                return r;
                        source = keymap_get(&sd->parent_blocks, e->digest);
                        if (can_clone(source, e->offset, e->length, size)) {
                                r = emit_clone(sd, path, e->offset, e->length, sd->parent_uuid,
                                               sd->parent_ctransid, source->path, source->offset);
                                if (r < 0)
                                        return fail(sd, r, path, "send a clone");
                                goto sent;
                        }
                }
        }
        r = 0;
        if (parent_ino)
                r = send_block_changes(sd, path, ino, e, parent_ino, parent_size);
        if (r == 0)
                r = send_block_data(sd, path, ino, e);
        if (r < 0)
                return r;
sent:
        if (!e->unsettled) {
                r = keymap_add(&sd->sent_blocks, e->digest, path, e->offset, size);
                if (r < 0)
                        return r;
        }
        report_progress(sd, false);
        return 0;
}

static bool extent_equal(const VolumeExtent *a, const VolumeExtent *b) {
        if (a->unsettled || b->unsettled)
                return false;
        return a->length == b->length && memcmp(a->digest, b->digest, sizeof a->digest) == 0;
}

static int send_hole(Sender *sd, const char *path, uint64_t offset, uint64_t len) {
        int r;

        if (sd->version >= 2) {
                stream_begin(&sd->w, CMD_FALLOCATE);
                stream_put_string(&sd->w, ATTR_PATH, path);
                stream_put_u32(&sd->w, ATTR_FALLOCATE_MODE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE);
                stream_put_u64(&sd->w, ATTR_FILE_OFFSET, offset);
                stream_put_u64(&sd->w, ATTR_SIZE, len);
                r = stream_end(&sd->w);
        } else {
                memset(sd->block, 0, VOLUME_BLOCK_SIZE);
                r = emit_write(sd, path, sd->block, (size_t) len, offset);
        }
        return r < 0 ? fail(sd, r, path, "send a hole") : 0;
}

/* Reads a whole small file (inline in the store). */
static int read_small(Volume *v, uint64_t ino, uint64_t size, uint8_t *buf) {
        ssize_t k;

        if (size > VOLUME_BLOCK_SIZE)
                return -EFBIG;
        k = volume_read(v, ino, buf, (size_t) size, 0);
        if (k < 0)
                return (int) k;
        return (uint64_t) k == size ? 0 : -EIO;
}

/* Sends a regular file's content. With a parent inode (changed in place),
 * only what differs from it; its size is set first. */
static int send_data(Sender *sd, const char *path, uint64_t ino, const struct stat *st,
                     uint64_t parent_ino, const struct stat *parent_st, bool *ret_changed) {
        _cleanup_free_ VolumeExtent *extents = NULL, *old = NULL;
        uint64_t size = (uint64_t) st->st_size;
        size_t n = 0, n_old = 0;
        bool small, old_small = true;
        int r;

        r = volume_file_extents(sd->image, ino, &extents, &n);
        if (r < 0 && r != -ENODATA)
                return fail(sd, r, path, "list the blocks");
        small = r == -ENODATA;

        if (parent_ino) {
                r = volume_file_extents(sd->parent, parent_ino, &old, &n_old);
                if (r < 0 && r != -ENODATA)
                        return fail(sd, r, path, "list the blocks");
                old_small = r == -ENODATA;
                if (small && old_small && parent_st->st_size == st->st_size) {
                        r = read_small(sd->image, ino, size, sd->block);
                        if (r >= 0)
                                r = read_small(sd->parent, parent_ino, size, sd->other);
                        if (r < 0)
                                return fail(sd, r, path, "read data");
                        if (memcmp(sd->block, sd->other, size) == 0)
                                return 0;
                }
                *ret_changed = true;
                if (parent_st->st_size != st->st_size) {
                        r = emit_truncate(sd, path, size);
                        if (r < 0)
                                return fail(sd, r, path, "send the size");
                }
        }

        if (small) {
                r = read_small(sd->image, ino, size, sd->block);
                if (r < 0)
                        return fail(sd, r, path, "read data");
                if (size > 0 || parent_ino) {
                        r = emit_write(sd, path, sd->block, (size_t) size, 0);
                        if (r < 0)
                                return fail(sd, r, path, "send data");
                }
                return 0;
        }

        /* Both lists hold blocks with data only, in order: a block of the
         * parent's that the file no longer has is a hole now (bytes past
         * the old size read as zeros already, those past the new one are
         * cut off). A small parent's bytes lie in the first block. */
        if (parent_ino && old_small && parent_st->st_size > 0 && (n == 0 || extents[0].offset > 0)) {
                r = send_hole(sd, path, 0, MIN((uint64_t) parent_st->st_size, MIN(size, VOLUME_BLOCK_SIZE)));
                if (r < 0)
                        return r;
                *ret_changed = true;
        }
        for (size_t i = 0, j = 0; i <= n; i++) {
                const VolumeExtent *e = i < n ? &extents[i] : NULL;
                const VolumeExtent *o = NULL;

                for (; parent_ino && !old_small && j < n_old && (!e || old[j].offset < e->offset); j++) {
                        if (old[j].offset >= size)
                                continue;
                        r = send_hole(sd, path, old[j].offset, MIN((uint64_t) old[j].length, size - old[j].offset));
                        if (r < 0)
                                return r;
                        *ret_changed = true;
                }
                if (!e)
                        break;
                if (parent_ino && !old_small && j < n_old && old[j].offset == e->offset)
                        o = &old[j++];
                if (o && extent_equal(e, o))
                        continue;
                r = send_block(sd, path, ino, e, size, parent_ino,
                               parent_ino && !old_small ? (uint64_t) parent_st->st_size : 0);
                if (r < 0)
                        return r;
                *ret_changed = true;
        }

        /* Trailing holes: the size says them. */
        if (!parent_ino && (n == 0 || extents[n - 1].offset + extents[n - 1].length < size)) {
                r = emit_truncate(sd, path, size);
                if (r < 0)
                        return fail(sd, r, path, "send the size");
        }
        return 0;
}

/* ---- creating ---- */

/* A new name for a file that the parent has elsewhere (moved, or its
 * directory moved): the parent's file is cloned whole, then changed. */
static int send_new_data(Sender *sd, const char *path, uint64_t ino, const struct stat *st, bool *ret_changed) {
        KeyMapEntry *moved = NULL;
        uint8_t key[16];
        struct stat old;
        int r;

        if (sd->parent) {
                r = parent_blocks_prepare(sd);
                if (r < 0)
                        return r;
                moved = keymap_get(&sd->parent_files, ino_key(ino, key));
        }
        if (!moved || moved->size == 0 || volume_getattr(sd->parent, ino, &old) < 0 || !S_ISREG(old.st_mode))
                return send_data(sd, path, ino, st, 0, NULL, ret_changed);

        r = emit_clone(sd, path, 0, moved->size, sd->parent_uuid, sd->parent_ctransid, moved->path, 0);
        if (r < 0)
                return fail(sd, r, path, "send a clone");
        return send_data(sd, path, ino, st, ino, &old, ret_changed);
}

static int send_new_entry(Sender *sd, const char *path, const VolumeDirent *e);
static int diff_place(Sender *sd, uint64_t dir, const char *path);

static int send_new_children(Sender *sd, const char *path, uint64_t ino) {
        _cleanup_(volume_dir_freep) VolumeDir *dir = NULL;
        int r;

        r = open_dir_sorted(sd->image, ino, &dir);
        if (r < 0)
                return fail(sd, r, path, "read the directory");
        for (size_t i = 0; i < dir->n; i++) {
                _cleanup_free_ char *child = NULL;

                r = join_path(path, dir->entries[i].name, &child);
                if (r < 0)
                        return fail(sd, r, path, "name an entry");
                r = send_new_entry(sd, child, &dir->entries[i]);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int send_make(Sender *sd, const char *path, uint64_t ino, const struct stat *st) {
        unsigned cmd;
        int r;

        switch (st->st_mode & S_IFMT) {
        case S_IFREG:   cmd = CMD_MKFILE; break;
        case S_IFDIR:   cmd = CMD_MKDIR; break;
        case S_IFLNK:   cmd = CMD_SYMLINK; break;
        case S_IFIFO:   cmd = CMD_MKFIFO; break;
        case S_IFSOCK:  cmd = CMD_MKSOCK; break;
        default:        cmd = CMD_MKNOD; break;
        }
        stream_begin(&sd->w, cmd);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_u64(&sd->w, ATTR_INO, ino);
        if (cmd == CMD_SYMLINK) {
                char target[STREAM_PATH_MAX + 1];

                r = volume_readlink(sd->image, ino, target, sizeof target);
                if (r < 0)
                        return fail(sd, r, path, "read the symbolic link");
                if ((size_t) r > STREAM_PATH_MAX)
                        return fail(sd, -ENAMETOOLONG, path, "send the symbolic link");
                target[r] = 0;
                stream_put_string(&sd->w, ATTR_PATH_LINK, target);
        } else if (cmd == CMD_MKNOD || cmd == CMD_MKFIFO || cmd == CMD_MKSOCK) {
                uint64_t maj = major(st->st_rdev), min = minor(st->st_rdev);

                stream_put_u64(&sd->w, ATTR_RDEV, (min & 0xff) | (maj << 8) | ((min & ~(uint64_t) 0xff) << 12));
                stream_put_u64(&sd->w, ATTR_MODE, st->st_mode);
        }
        r = stream_end(&sd->w);
        return r < 0 ? fail(sd, r, path, "send the new entry") : 0;
}

/* Owner, mode and the capability, as btrfs sends them, and what the
 * receiver's own calls clear: chown clears the capability and the setuid
 * and setgid bits, and a write or a truncation the capability (wrote: the
 * data was sent). */
static int send_owner_mode(Sender *sd, const char *path, uint64_t ino, const struct stat *st,
                           const struct stat *old, bool wrote, bool *ret_changed) {
        bool owner = !old || old->st_uid != st->st_uid || old->st_gid != st->st_gid;
        int r;

        if (owner) {
                r = emit_owner(sd, path, st);
                if (r < 0)
                        return fail(sd, r, path, "send the owner");
                *ret_changed = true;
        }
        if (!S_ISLNK(st->st_mode) && (!old || (old->st_mode & 07777) != (st->st_mode & 07777) ||
                                      (owner && (st->st_mode & (S_ISUID | S_ISGID))))) {
                r = emit_mode(sd, path, st);
                if (r < 0)
                        return fail(sd, r, path, "send the mode");
                *ret_changed = true;
        }
        return owner || wrote ? send_capability_again(sd, path, ino) : 0;
}

static int send_link(Sender *sd, const char *path, const char *existing) {
        int r;

        stream_begin(&sd->w, CMD_LINK);
        stream_put_string(&sd->w, ATTR_PATH, path);
        stream_put_string(&sd->w, ATTR_PATH_LINK, existing);
        r = stream_end(&sd->w);
        return r < 0 ? fail(sd, r, path, "send a hard link") : 0;
}

static int send_new_entry(Sender *sd, const char *path, const VolumeDirent *e) {
        struct stat st;
        uint8_t key[16];
        KeyMapEntry *other;
        bool changed = false;
        int r;

        r = volume_getattr(sd->image, e->ino, &st);
        if (r < 0)
                return fail(sd, r, path, "read the attributes");

        if (!S_ISDIR(st.st_mode)) {
                other = keymap_get(&sd->created, ino_key(e->ino, key));
                if (other)
                        return send_link(sd, path, other->path);
                if (st.st_nlink > 1) {
                        r = keymap_add(&sd->created, key, path, 0, 0);
                        if (r < 0)
                                return r;
                }
        }

        r = send_make(sd, path, e->ino, &st);
        if (r >= 0)
                r = send_xattrs(sd, path, e->ino, 0, &changed);
        if (r >= 0 && S_ISREG(st.st_mode))
                r = send_new_data(sd, path, e->ino, &st, &changed);
        if (r >= 0)
                r = send_owner_mode(sd, path, e->ino, &st, NULL, false, &changed);
        if (r >= 0 && S_ISDIR(st.st_mode))
                r = sd->parent ? diff_place(sd, e->ino, path) : send_new_children(sd, path, e->ino);
        if (r >= 0) {
                r = emit_times(sd, path, &st);
                if (r < 0)
                        return fail(sd, r, path, "send the times");
        }
        return r;
}

/* ---- the difference against the parent ----
 *
 * The receiver starts from the parent. Inodes the parent and the image
 * share (same number and type, and for links and devices the same target)
 * are kept and changed in place; a name of theirs that moved is renamed.
 * First pass, over the parent: names the image does not have go, except
 * that a kept inode losing its name is moved to a temporary name in the
 * root (an orphan) with all it holds. Second pass, over the image: new
 * names of kept inodes take them back from the orphans (or link to them),
 * new inodes are created, and kept ones are changed in place.
 */

/* The inodes a tree reaches by name: a layer's inode rows may outlive
 * their last name below a layer that removed it, so that asking for an
 * inode by number is no proof that the tree has it. */
static int collect_inodes(Volume *v, uint64_t dir, KeyMap *set, unsigned depth) {
        _cleanup_(volume_dir_freep) VolumeDir *d = NULL;
        uint8_t key[16];
        int r;

        if (depth > STREAM_PATH_MAX / 2)
                return -ELOOP;
        r = volume_opendir(v, dir, &d);
        if (r < 0)
                return r;
        for (size_t i = 0; i < d->n; i++) {
                r = keymap_add(set, ino_key(d->entries[i].ino, key), "", 0, 0);
                if (r > 0 && d->entries[i].type == S_IFDIR)
                        r = collect_inodes(v, d->entries[i].ino, set, depth + 1);
                if (r < 0)
                        return r;
        }
        return 0;
}

static int inode_survives(Sender *sd, uint64_t ino, bool *ret) {
        uint8_t key[16];
        KeyMapEntry *cached = keymap_get(&sd->survivors, ino_key(ino, key));
        struct stat a, b;
        bool same = false;
        int r = 0;

        if (cached) {
                *ret = cached->offset == 1;
                return 0;
        }
        if (ino == VOLUME_ROOT_INO ||
            (keymap_get(&sd->parent_inodes, key) && keymap_get(&sd->image_inodes, key))) {
                r = volume_getattr(sd->parent, ino, &a);
                if (r >= 0)
                        r = volume_getattr(sd->image, ino, &b);
        } else
                r = -ENOENT;
        if (r < 0 && r != -ENOENT)
                return r;
        if (r >= 0 && (a.st_mode & S_IFMT) == (b.st_mode & S_IFMT)) {
                same = true;
                if (S_ISCHR(a.st_mode) || S_ISBLK(a.st_mode))
                        same = a.st_rdev == b.st_rdev;
                else if (S_ISLNK(a.st_mode)) {
                        char ta[STREAM_PATH_MAX + 1], tb[STREAM_PATH_MAX + 1];
                        int la = volume_readlink(sd->parent, ino, ta, sizeof ta);
                        int lb = volume_readlink(sd->image, ino, tb, sizeof tb);

                        if (la < 0 || lb < 0)
                                return la < 0 ? la : lb;
                        same = la == lb && memcmp(ta, tb, (size_t) la) == 0;
                }
        }
        r = keymap_add(&sd->survivors, key, "", same ? 1 : 2, 0);
        if (r < 0)
                return r;
        *ret = same;
        return 0;
}

/* Whether name in directory dir names the kept inode ino in the volume
 * other (the image when walking the parent, and the other way round). */
static bool name_kept(Volume *other, uint64_t dir, const char *name, uint64_t ino) {
        struct stat st;

        return volume_lookup(other, dir, name, &st) >= 0 && (uint64_t) st.st_ino == ino;
}

static int set_location(Sender *sd, uint64_t ino, uint64_t dir, const char *name) {
        uint8_t key[16];

        return keymap_set(&sd->location, ino_key(ino, key), name, dir, 0);
}

static int touch(Sender *sd, uint64_t dir) {
        uint8_t key[16];

        return keymap_set(&sd->touched, ino_key(dir, key), "", 0, 0);
}

static bool touched(Sender *sd, uint64_t dir) {
        uint8_t key[16];

        return keymap_get(&sd->touched, ino_key(dir, key)) != NULL;
}

/* Where an inode is on the receiver now, from its location and those of
 * the directories above it. */
static int receiver_path(Sender *sd, uint64_t ino, char **ret) {
        _cleanup_free_ char *path = strdup("");
        uint8_t key[16];

        if (!path)
                return -ENOMEM;
        for (unsigned depth = 0; ino != VOLUME_ROOT_INO; depth++) {
                KeyMapEntry *e = keymap_get(&sd->location, ino_key(ino, key));
                char *longer;

                if (!e || depth > STREAM_PATH_MAX)
                        return -EUCLEAN;
                if (asprintf(&longer, "%s%s%s", e->path, *path ? "/" : "", path) < 0)
                        return -ENOMEM;
                free(path);
                path = longer;
                ino = e->offset;
        }
        if (strlen(path) > STREAM_PATH_MAX)
                return -ENAMETOOLONG;
        *ret = TAKE_PTR(path);
        return 0;
}

/* A name in the root that neither image has. */
static int orphan_name(Sender *sd, uint64_t ino, char ret[static 64]) {
        struct stat st;

        for (unsigned n = 0;; n++) {
                snprintf(ret, 64, "o%" PRIu64 "-cowbox-%u", ino, n);
                if (volume_lookup(sd->parent, VOLUME_ROOT_INO, ret, &st) == -ENOENT &&
                    volume_lookup(sd->image, VOLUME_ROOT_INO, ret, &st) == -ENOENT)
                        return 0;
                if (n > 1000)
                        return -EEXIST;
        }
}

static int emit_rename(Sender *sd, const char *from, const char *to) {
        int r;

        stream_begin(&sd->w, CMD_RENAME);
        stream_put_string(&sd->w, ATTR_PATH, from);
        stream_put_string(&sd->w, ATTR_PATH_TO, to);
        r = stream_end(&sd->w);
        return r < 0 ? fail(sd, r, from, "send a rename") : 0;
}

/* First pass, over the parent's directory dir, which is at path on the
 * receiver. */
static int diff_detach(Sender *sd, uint64_t dir, const char *path) {
        _cleanup_(volume_dir_freep) VolumeDir *old = NULL;
        bool dir_kept;
        uint8_t key[16];
        int r;

        r = inode_survives(sd, dir, &dir_kept);
        if (r >= 0)
                r = open_dir_sorted(sd->parent, dir, &old);
        if (r < 0)
                return fail(sd, r, path, "read the parent's directory");

        for (size_t i = 0; i < old->n; i++) {
                const VolumeDirent *o = &old->entries[i];
                _cleanup_free_ char *child = NULL;
                bool survives;

                r = join_path(path, o->name, &child);
                if (r >= 0)
                        r = inode_survives(sd, o->ino, &survives);
                if (r < 0)
                        return fail(sd, r, path, "compare an entry");

                if (survives && dir_kept && name_kept(sd->image, dir, o->name, o->ino)) {
                        r = set_location(sd, o->ino, dir, o->name);
                        if (r >= 0 && o->type == S_IFDIR)
                                r = diff_detach(sd, o->ino, child);
                        if (r < 0)
                                return r;
                        continue;
                }

                r = touch(sd, dir);
                if (r < 0)
                        return r;
                if (survives && !keymap_get(&sd->orphans, ino_key(o->ino, key))) {
                        char orphan[64];

                        r = orphan_name(sd, o->ino, orphan);
                        if (r < 0)
                                return fail(sd, r, child, "find a temporary name");
                        r = emit_rename(sd, child, orphan);
                        if (r < 0)
                                return r;
                        r = keymap_add(&sd->orphans, key, orphan, 0, 0);
                        if (r >= 0 && (o->type == S_IFDIR || !keymap_get(&sd->location, key)))
                                r = set_location(sd, o->ino, VOLUME_ROOT_INO, orphan);
                        if (r >= 0 && o->type == S_IFDIR)
                                r = diff_detach(sd, o->ino, orphan);
                } else if (!survives && o->type == S_IFDIR) {
                        r = diff_detach(sd, o->ino, child);
                        if (r >= 0)
                                r = emit_path(sd, CMD_RMDIR, child);
                } else
                        r = emit_path(sd, CMD_UNLINK, child);
                if (r < 0)
                        return fail(sd, r, child, "send a removal");
        }
        return 0;
}

static int update_inode(Sender *sd, const char *path, uint64_t ino, bool touched);

/* Changes a kept inode once, whatever number of names it has. */
static int update_once(Sender *sd, const char *path, const VolumeDirent *e) {
        uint8_t key[16];
        int r;

        if (e->type == S_IFDIR)
                return update_inode(sd, path, e->ino, touched(sd, e->ino));
        r = keymap_add(&sd->updated, ino_key(e->ino, key), path, 0, 0);
        if (r <= 0)
                return r;
        return update_inode(sd, path, e->ino, false);
}

/* Second pass, over the image's directory dir, at path on the receiver. */
static int diff_place(Sender *sd, uint64_t dir, const char *path) {
        _cleanup_(volume_dir_freep) VolumeDir *now = NULL;
        bool dir_kept;
        uint8_t key[16];
        int r;

        r = inode_survives(sd, dir, &dir_kept);
        if (r >= 0)
                r = open_dir_sorted(sd->image, dir, &now);
        if (r < 0)
                return fail(sd, r, path, "read the directory");

        for (size_t i = 0; i < now->n; i++) {
                const VolumeDirent *e = &now->entries[i];
                _cleanup_free_ char *child = NULL;
                KeyMapEntry *orphan;
                bool survives;

                r = join_path(path, e->name, &child);
                if (r >= 0)
                        r = inode_survives(sd, e->ino, &survives);
                if (r < 0)
                        return fail(sd, r, path, "compare an entry");

                if (!(survives && dir_kept && name_kept(sd->parent, dir, e->name, e->ino))) {
                        r = touch(sd, dir);
                        if (r < 0)
                                return r;
                        if (!survives) {
                                r = set_location(sd, e->ino, dir, e->name);
                                if (r >= 0)
                                        r = send_new_entry(sd, child, e);
                                if (r < 0)
                                        return r;
                                continue;
                        }
                        orphan = keymap_get(&sd->orphans, ino_key(e->ino, key));
                        if (orphan && orphan->size == 0) {
                                r = emit_rename(sd, orphan->path, child);
                                orphan->size = 1;
                                if (r >= 0)
                                        r = set_location(sd, e->ino, dir, e->name);
                        } else {
                                _cleanup_free_ char *existing = NULL;

                                r = receiver_path(sd, e->ino, &existing);
                                if (r < 0)
                                        return fail(sd, r, child, "find the other name of the file");
                                r = send_link(sd, child, existing);
                        }
                        if (r < 0)
                                return r;
                }
                if (e->type == S_IFDIR) {
                        r = diff_place(sd, e->ino, child);
                        if (r < 0)
                                return r;
                }
                r = update_once(sd, child, e);
                if (r < 0)
                        return r;
        }
        return 0;
}

/* Orphans of files whose every new name is a link to another: they go. */
static int remove_unplaced_orphans(Sender *sd) {
        for (size_t i = 0; i < sd->orphans.n_slots; i++) {
                KeyMapEntry *o = &sd->orphans.slots[i];
                int r;

                if (!o->path || o->size != 0)
                        continue;
                r = emit_path(sd, CMD_UNLINK, o->path);
                if (r < 0)
                        return fail(sd, r, o->path, "send a removal");
        }
        return 0;
}

/* Changes an inode that stays in place: xattrs, data, owner, mode, times. */
static int update_inode(Sender *sd, const char *path, uint64_t ino, bool touched) {
        struct stat st, old;
        bool changed = touched, wrote = false;
        int r;

        r = volume_getattr(sd->image, ino, &st);
        if (r >= 0)
                r = volume_getattr(sd->parent, ino, &old);
        if (r < 0)
                return fail(sd, r, path, "read the attributes");

        r = send_xattrs(sd, path, ino, ino, &changed);
        if (r >= 0 && S_ISREG(st.st_mode))
                r = send_data(sd, path, ino, &st, ino, &old, &wrote);
        if (r >= 0)
                r = send_owner_mode(sd, path, ino, &st, &old, wrote, &changed);
        if (r < 0)
                return r;
        changed |= wrote;
        if (changed || st.st_mtim.tv_sec != old.st_mtim.tv_sec || st.st_mtim.tv_nsec != old.st_mtim.tv_nsec ||
            st.st_atim.tv_sec != old.st_atim.tv_sec || st.st_atim.tv_nsec != old.st_atim.tv_nsec) {
                r = emit_times(sd, path, &st);
                if (r < 0)
                        return fail(sd, r, path, "send the times");
        }
        return 0;
}

/* ---- streams ---- */

static int open_image(Sender *sd, const char *name, Volume **ret, uint8_t uuid[16], uint64_t *ret_ctransid,
                      uint64_t *ret_logical) {
        StoreSubvolumeInfo info = {};
        int r;

        r = store_subvolume_show(sd->store, name, &info);
        if (r == -ENOENT || r == -EINVAL)
                return image_error(sd->error, -ENOENT, "no image named '%s' in this store", name);
        if (r < 0)
                return image_error(sd->error, r, "cannot look up '%s': %s", name, strerror(-r));
        if (!info.readonly) {
                store_subvolume_info_clear(&info);
                return image_error(sd->error, -EINVAL, "'%s' is writable: only read-only images can be sent "
                                   "(take a read-only snapshot of it and send that)", name);
        }
        /* What the receiver will know it by: the UUID and transaction id
         * it was received with, if it was. */
        r = uuid_parse(info.received_uuid[0] ? info.received_uuid : info.uuid, uuid);
        *ret_ctransid = info.received_uuid[0] ? info.stransid : info.ctransid;
        if (ret_logical)
                *ret_logical = info.logical_bytes;
        store_subvolume_info_clear(&info);
        if (r < 0)
                return image_error(sd->error, -EUCLEAN, "image '%s' has a malformed UUID", name);
        r = volume_open(sd->store, name, false, ret, NULL);
        return r < 0 ? image_error(sd->error, r, "cannot open image '%s': %s", name, strerror(-r)) : 0;
}

static int send_stream(Sender *sd) {
        struct stat root;
        bool changed = false;
        int r;

        r = stream_write_header(&sd->w);
        if (r < 0)
                return fail(sd, r, "", "write the stream header");

        stream_begin(&sd->w, sd->parent ? CMD_SNAPSHOT : CMD_SUBVOL);
        stream_put_string(&sd->w, ATTR_PATH, sd->image_name);
        stream_put_bytes(&sd->w, ATTR_UUID, sd->image_uuid, 16);
        stream_put_u64(&sd->w, ATTR_CTRANSID, sd->image_ctransid);
        if (sd->parent) {
                stream_put_bytes(&sd->w, ATTR_CLONE_UUID, sd->parent_uuid, 16);
                stream_put_u64(&sd->w, ATTR_CLONE_CTRANSID, sd->parent_ctransid);
        }
        r = stream_end(&sd->w);
        if (r < 0)
                return fail(sd, r, "", "send the subvolume");

        if (sd->parent) {
                r = collect_inodes(sd->parent, VOLUME_ROOT_INO, &sd->parent_inodes, 0);
                if (r >= 0)
                        r = collect_inodes(sd->image, VOLUME_ROOT_INO, &sd->image_inodes, 0);
                if (r < 0)
                        return image_error(sd->error, r, "cannot read the trees: %s", strerror(-r));
                r = diff_detach(sd, VOLUME_ROOT_INO, "");
                if (r >= 0)
                        r = diff_place(sd, VOLUME_ROOT_INO, "");
                if (r >= 0)
                        r = remove_unplaced_orphans(sd);
                if (r >= 0)
                        r = update_inode(sd, "", VOLUME_ROOT_INO, touched(sd, VOLUME_ROOT_INO));
                if (r < 0)
                        return r;
        } else {
                r = volume_getattr(sd->image, VOLUME_ROOT_INO, &root);
                if (r < 0)
                        return fail(sd, r, "", "read the attributes");
                r = send_xattrs(sd, "", VOLUME_ROOT_INO, 0, &changed);
                if (r >= 0)
                        r = send_owner_mode(sd, "", VOLUME_ROOT_INO, &root, NULL, false, &changed);
                if (r >= 0)
                        r = send_new_children(sd, "", VOLUME_ROOT_INO);
                if (r < 0)
                        return r;
                r = emit_times(sd, "", &root);
                if (r < 0)
                        return fail(sd, r, "", "send the times");
        }

        stream_begin(&sd->w, CMD_END);
        r = stream_end(&sd->w);
        if (r >= 0)
                r = stream_output_finish(sd->w.out);
        return r < 0 ? fail(sd, r, "", "finish the stream") : 0;
}

int image_send(Store *s, const char *image, int fd, const ImageSendOptions *opts, ImageError *ret_error) {
        static const ImageSendOptions no_options = {};
        _cleanup_(stream_output_freep) StreamOutput *out = NULL;
        ImageError dummy;
        Sender sd = {
                .store = s,
                .opts = opts ? opts : &no_options,
                .error = ret_error ? ret_error : &dummy,
        };
        int r;

        *sd.error = (ImageError) {};
        sd.version = sd.opts->version ? sd.opts->version : 1;
        if (sd.version > STREAM_VERSION_MAX)
                return image_error(sd.error, -EINVAL, "stream version %u is not supported (1 or 2)", sd.version);
        if (sd.opts->compressed_data && sd.version < 2)
                return image_error(sd.error, -EINVAL, "compressed data needs a version 2 stream");
        if (!image || strlen(image) > STORE_NAME_MAX)
                return image_error(sd.error, -EINVAL, "not a valid image name");
        snprintf(sd.image_name, sizeof sd.image_name, "%s", image);

        sd.block = malloc(VOLUME_BLOCK_SIZE);
        sd.other = malloc(VOLUME_BLOCK_SIZE);
        r = !sd.block || !sd.other ? -ENOMEM : stream_output_new(fd, sd.opts->zstd, &out);
        if (r >= 0)
                r = stream_writer_init(&sd.w, out, sd.version);
        if (r >= 0)
                r = open_image(&sd, image, &sd.image, sd.image_uuid, &sd.image_ctransid, &sd.logical_bytes);
        if (r >= 0 && sd.opts->parent)
                r = open_image(&sd, sd.opts->parent, &sd.parent, sd.parent_uuid, &sd.parent_ctransid, NULL);
        if (r >= 0)
                r = send_stream(&sd);
        if (r >= 0)
                report_progress(&sd, true);

        if (r < 0 && !sd.error->message[0])
                image_error(sd.error, r, "%s", strerror(-r));
        volume_close(sd.parent);
        volume_close(sd.image);
        stream_writer_done(&sd.w);
        keymap_done(&sd.created);
        keymap_done(&sd.updated);
        keymap_done(&sd.survivors);
        keymap_done(&sd.parent_inodes);
        keymap_done(&sd.image_inodes);
        keymap_done(&sd.location);
        keymap_done(&sd.orphans);
        keymap_done(&sd.touched);
        keymap_done(&sd.sent_blocks);
        keymap_done(&sd.parent_blocks);
        keymap_done(&sd.parent_files);
        free(sd.block);
        free(sd.other);
        return r;
}
