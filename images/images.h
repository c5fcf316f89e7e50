/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * images.h: images from send streams in the format of `btrfs send`, and
 * send streams from images.
 *
 * An image is a read-only subvolume of the store. Receiving applies a
 * stream (version 1 or 2; several subvolumes back to back) to a new image,
 * or to a writable snapshot of the parent image an incremental stream names,
 * and records the stream's UUID and transaction id so that later increments
 * find it. Sending writes a full stream of an image, or an incremental one
 * against a parent image that carries only the difference.
 *
 * On the wire a stream may be wrapped in zstd, followed by a skippable zstd
 * frame that holds an XXH3-128 digest of the stream (the README describes
 * the framing): a damaged or truncated download is caught before anything
 * is applied.
 *
 * A stream is untrusted input: paths that leave the image, go through a
 * symbolic link or hold "." or ".." components are refused; sizes and
 * counts are bounded. A stream that fails leaves no image behind.
 *
 * Functions return 0 or a negative errno, never print, and describe a
 * failure in an ImageError where they take one.
 */

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include "store.h"

/* What went wrong, and where: offset is the byte offset in the (decoded)
 * stream of the command that failed, or of the bad bytes. */
typedef struct ImageError {
        bool has_offset;
        uint64_t offset;
        char message[PATH_MAX + 512];  /* a path, and why */
} ImageError;

typedef struct ImageProgress {
        const char *phase;      /* "verifying", "receiving", "sending" */
        uint64_t bytes;         /* read (receive) or written (send) so far */
        uint64_t total;         /* of the input, if known; 0 otherwise */
        const char *image;      /* the image at work, if any */
} ImageProgress;

/* Called at most a few times a second. */
typedef void (*image_progress_cb)(const ImageProgress *p, void *userdata);

typedef struct ImageReceiveOptions {
        /* The image's name instead of the stream's subvolume name; only for
         * a stream of one subvolume. */
        const char *name;
        /* Prefixes of names the caller keeps for subvolumes of its own
         * (NULL-terminated, or NULL): a stream that names its subvolume so
         * is refused. */
        const char *const *reserved_prefixes;
        image_progress_cb progress;
        void *userdata;
        /* What a failed receive leaves is deleted, and a reaper started in
         * the background to free it, unless the caller runs its own. */
        bool no_background_reap;
} ImageReceiveOptions;

/* Reads streams from fd until its end and makes an image of each. The names
 * of the images made are returned in *ret_names (NULL-terminated; free with
 * image_names_free()). All or nothing: on failure no image of the input is
 * left behind. */
int image_receive(Store *s, int fd, const ImageReceiveOptions *opts, char ***ret_names, ImageError *ret_error);

char **image_names_free(char **names);

typedef struct ImageSendOptions {
        const char *parent;     /* an incremental stream against this image, or NULL */
        unsigned version;       /* 1 (0 means 1) or 2 */
        bool compressed_data;   /* version 2: send blocks stored with zstd as they are */
        bool zstd;              /* wrap the stream in zstd with a digest */
        image_progress_cb progress;
        void *userdata;
} ImageSendOptions;

/* Writes a stream of a read-only subvolume to fd. */
int image_send(Store *s, const char *image, int fd, const ImageSendOptions *opts, ImageError *ret_error);

/* Deletes subvolumes left behind by receives whose process died (the
 * reaper frees them). Returns how many. */
int image_remove_stale_receives(Store *s);

/* The prefix of the name of a subvolume being received. */
#define IMAGE_RECEIVING_PREFIX ".receiving-"
