/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* cowbox-store receive and send: images from and to send streams in the
 * format of `btrfs send` (the work is in images/images.h). */

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "images.h"
#include "output-file.h"
#include "store-tool.h"
#include "string-util.h"

static void show_progress(const ImageProgress *p, void *userdata) {
        char what[STORE_NAME_MAX + 32];

        snprintf(what, sizeof what, "%s%s%s", p->phase, p->image ? " " : "", p->image ? p->image : "");
        progress_show(what, p->bytes, p->total);
}

static void end_progress(bool shown) {
        if (shown)
                progress_clear();
}

static int report_image_error(const char *what, int r, const ImageError *error) {
        if (error->message[0] && error->has_offset)
                return report_failure("%s failed at byte %" PRIu64 " of the stream: %s", what, error->offset,
                                      error->message);
        if (error->message[0])
                return report_failure("%s failed: %s", what, error->message);
        return report_failure("%s failed: %s", what, error_text(r));
}

static int verb_receive(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        _cleanup_close_ int fd = -EBADF;
        ImageReceiveOptions opts = {};
        ImageError error = {};
        const char *file = NULL;
        char **names = NULL;
        bool progress;
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0)
                if (c == 'f')
                        file = optarg;
        if (c < 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 0, 1);
        if (r != 0)
                return r;
        if (optind < argc) {
                opts.name = argv[optind];
                r = command_check_name(cmd, opts.name);
                if (r != 0)
                        return r;
        }

        if (file && !streq(file, "-")) {
                fd = open(file, O_RDONLY | O_CLOEXEC);
                if (fd < 0)
                        return report_failure("cannot open %s: %m", file);
        } else if (isatty(STDIN_FILENO))
                return report_usage_error(cmd, "standard input is a terminal; give the stream with -f FILE "
                                          "or through a pipe");

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        progress = progress_wanted();
        if (progress)
                opts.progress = show_progress;
        r = image_receive(store, fd >= 0 ? fd : STDIN_FILENO, &opts, &names, &error);
        end_progress(progress);
        if (r < 0)
                return report_image_error("receive", r, &error);

        if (tool->json) {
                _cleanup_json_ json_t *list = json_array();

                for (char **n = names; n && *n; n++)
                        json_array_append_new(list, json_string(*n));
                json_dumpf(list, stdout, JSON_INDENT(2));
                putchar('\n');
        } else
                for (char **n = names; n && *n; n++)
                        printf("Received image '%s'.\n", *n);
        image_names_free(names);
        return EXIT_SUCCESS;
}

static int verb_send(Tool *tool, const Command *cmd, int argc, char *argv[]) {
        _cleanup_store_ Store *store = NULL;
        _cleanup_(output_file_abort) OutputFile out = { .fd = -EBADF };
        ImageSendOptions opts = {};
        ImageError error = {};
        const char *file = NULL;
        bool progress;
        int c, r;

        while ((c = command_getopt(tool, cmd, argc, argv)) > 0)
                switch (c) {
                case 'f':
                        file = optarg;
                        break;
                case 'p':
                        opts.parent = optarg;
                        break;
                case ARG_PROTO:
                        if (!streq(optarg, "1") && !streq(optarg, "2"))
                                return report_usage_error(cmd, "--proto takes 1 or 2, not '%s'", optarg);
                        opts.version = (unsigned) (optarg[0] - '0');
                        break;
                case ARG_COMPRESSED_DATA:
                        opts.compressed_data = true;
                        break;
                case ARG_ZSTD:
                        opts.zstd = true;
                        break;
                }
        if (c < 0)
                return options_exit_status(c);
        r = command_check_arguments(cmd, argc, argv, 1, 1);
        if (r != 0)
                return r;
        r = command_check_name(cmd, argv[optind]);
        if (r == 0 && opts.parent)
                r = command_check_name(cmd, opts.parent);
        if (r != 0)
                return r;
        if (opts.compressed_data && opts.version == 0)
                opts.version = 2;
        if (opts.compressed_data && opts.version < 2)
                return report_usage_error(cmd, "--compressed-data needs --proto 2");

        if (file && !streq(file, "-")) {
                r = output_file_open(file, &out);
                if (r < 0)
                        return report_failure("cannot create %s: %s", file, strerror(-r));
        } else if (isatty(STDOUT_FILENO))
                return report_usage_error(cmd, "standard output is a terminal; write the stream to a file "
                                          "with -f FILE, or into a pipe");

        r = tool_open_store(tool, &store);
        if (r != 0)
                return r;

        progress = progress_wanted();
        if (progress)
                opts.progress = show_progress;
        r = image_send(store, argv[optind], out.fd >= 0 ? out.fd : STDOUT_FILENO, &opts, &error);
        end_progress(progress);
        if (r < 0)
                return report_image_error("send", r, &error);
        r = output_file_commit(&out);
        if (r < 0)
                return report_failure("cannot write %s: %s", file, strerror(-r));
        return EXIT_SUCCESS;
}

const Command command_receive = {
        .name = "receive",
        .synopsis = "[-f FILE] [NAME]",
        .summary = "Make images of the send streams in a file or on standard input.",
        .description =
                "Reads send streams in the format of 'btrfs send' (versions 1 and 2, several\n"
                "subvolumes back to back), as they are or wrapped in zstd, and makes a read-only\n"
                "image of each. An image takes the stream's subvolume name unless NAME is given\n"
                "(for a stream of one subvolume). An incremental stream (btrfs send -p) is\n"
                "applied to a snapshot of its parent image, which must be in the store already:\n"
                "it is found by the UUID the stream names.\n"
                "\n"
                "A stream is untrusted input: paths with '..' or that lead through a symbolic\n"
                "link are refused, and a damaged, truncated or malformed stream fails with the\n"
                "byte offset and the reason. A zstd-wrapped stream made by '" PROGRAM_NAME " send\n"
                "--zstd' carries a digest that a file is checked against before anything is\n"
                "applied. Either all images of the input are made, or none.\n",
        .options = (const CommandOption[]) {
                { 'f', "file", "FILE", "read the streams from FILE instead of standard input" },
                {}
        },
        .examples = (const char *const[]) {
                "btrfs send /mnt/btrfs/base | " PROGRAM_NAME " receive",
                PROGRAM_NAME " receive -f base-v2.stream.zst base-v2",
                PROGRAM_NAME " --json receive -f images.stream",
                NULL,
        },
        .flags = COMMAND_JSON,
        .run = verb_receive,
};

const Command command_send = {
        .name = "send",
        .synopsis = "[-p PARENT] [-f FILE] [--proto 1|2] [--compressed-data] [--zstd] IMAGE",
        .summary = "Write a send stream of a read-only image to a file or to standard output.",
        .description =
                "Writes IMAGE in the format of 'btrfs send', for 'btrfs receive' or for another\n"
                "cowbox store. With -p, the stream is incremental: it carries only what differs\n"
                "from the image PARENT, which the receiver must have, and it clones blocks the\n"
                "receiver has instead of sending them again. Version 1 is the default; version\n"
                "2 with --compressed-data sends blocks that the store keeps compressed as they\n"
                "are. --zstd wraps the stream in zstd, followed by its XXH3 digest, for transport\n"
                "('zstd -d' unwraps it for 'btrfs receive').\n",
        .options = (const CommandOption[]) {
                { 'p', "parent", "PARENT", "send only the difference from the image PARENT" },
                { 'f', "file", "FILE", "write the stream to FILE instead of standard output" },
                { ARG_PROTO, "proto", "VERSION", "the stream's version: 1 (the default) or 2" },
                { ARG_COMPRESSED_DATA, "compressed-data", NULL, "send zstd-compressed blocks as they are\n"
                  "(implies --proto 2)" },
                { ARG_ZSTD, "zstd", NULL, "wrap the stream in zstd with a digest" },
                {}
        },
        .examples = (const char *const[]) {
                PROGRAM_NAME " send base-v1 | btrfs receive /mnt/btrfs",
                PROGRAM_NAME " send -p base-v1 -f upgrade.stream base-v2",
                PROGRAM_NAME " send --zstd -f base.stream.zst base-v1",
                NULL,
        },
        .run = verb_send,
};
