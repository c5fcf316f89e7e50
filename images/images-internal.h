/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/* Internals of images/: the send stream codec (stream.c), the transport
 * framing (framing.c), receive (receive.c) and send (send.c). */

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "cleanup.h"
#include "images.h"

#define STREAM_MAGIC "btrfs-stream"
#define STREAM_MAGIC_LEN 13
#define STREAM_HEADER_LEN 17
#define STREAM_VERSION_MAX 2
#define COMMAND_HEADER_LEN 10

/* Bounds on untrusted input. The kernel's commands are at most 64 KiB (v1)
 * or 144 KiB (v2); other senders get some room. */
#define COMMAND_PAYLOAD_MAX (1024 * 1024)
#define STREAM_PATH_MAX 4096
#define XATTR_NAME_LEN_MAX 255
#define XATTR_VALUE_MAX (64 * 1024)
#define ENCODED_LEN_MAX (1024 * 1024)

enum {
        CMD_UNSPEC,
        CMD_SUBVOL,
        CMD_SNAPSHOT,
        CMD_MKFILE,
        CMD_MKDIR,
        CMD_MKNOD,
        CMD_MKFIFO,
        CMD_MKSOCK,
        CMD_SYMLINK,
        CMD_RENAME,
        CMD_LINK,
        CMD_UNLINK,
        CMD_RMDIR,
        CMD_SET_XATTR,
        CMD_REMOVE_XATTR,
        CMD_WRITE,
        CMD_CLONE,
        CMD_TRUNCATE,
        CMD_CHMOD,
        CMD_CHOWN,
        CMD_UTIMES,
        CMD_END,
        CMD_UPDATE_EXTENT,
        CMD_FALLOCATE,
        CMD_FILEATTR,
        CMD_ENCODED_WRITE,
        _CMD_MAX,
};

enum {
        ATTR_UNSPEC,
        ATTR_UUID,
        ATTR_CTRANSID,
        ATTR_INO,
        ATTR_SIZE,
        ATTR_MODE,
        ATTR_UID,
        ATTR_GID,
        ATTR_RDEV,
        ATTR_CTIME,
        ATTR_MTIME,
        ATTR_ATIME,
        ATTR_OTIME,
        ATTR_XATTR_NAME,
        ATTR_XATTR_DATA,
        ATTR_PATH,
        ATTR_PATH_TO,
        ATTR_PATH_LINK,
        ATTR_FILE_OFFSET,
        ATTR_DATA,
        ATTR_CLONE_UUID,
        ATTR_CLONE_CTRANSID,
        ATTR_CLONE_PATH,
        ATTR_CLONE_OFFSET,
        ATTR_CLONE_LEN,
        ATTR_FALLOCATE_MODE,
        ATTR_FILEATTR,
        ATTR_UNENCODED_FILE_LEN,
        ATTR_UNENCODED_LEN,
        ATTR_UNENCODED_OFFSET,
        ATTR_COMPRESSION,
        ATTR_ENCRYPTION,
        _ATTR_MAX,
};

enum {
        ENCODED_NONE = 0,
        ENCODED_ZLIB = 1,
        ENCODED_ZSTD = 2,
        ENCODED_LZO_4K = 3,
        ENCODED_LZO_64K = 7,
};

const char *stream_command_name(unsigned cmd);
const char *stream_attribute_name(unsigned attr);

/* CRC-32C as send streams use it: initial value 0, no final inversion. */
uint32_t stream_crc32c(uint32_t crc, const void *data, size_t len);

/* ---- framing.c: the input and output byte streams ---- */

/* Reads a stream from a file descriptor: plain, or wrapped in zstd with a
 * digest trailer. Counts the decoded bytes and hashes them. */
typedef struct StreamInput StreamInput;

int stream_input_new(int fd, StreamInput **ret, ImageError *error);
StreamInput *stream_input_free(StreamInput *in);
DEFINE_TRIVIAL_CLEANUP_FUNC(StreamInput *, stream_input_free);

/* Reads exactly n bytes: n, or fewer only at the end of the input (0 at a
 * clean end). < 0 on a read or decoding error (reported in error). */
ssize_t stream_input_read(StreamInput *in, void *buf, size_t n, ImageError *error);

/* The offset of the next decoded byte, and the bytes read from fd so far. */
uint64_t stream_input_offset(const StreamInput *in);
uint64_t stream_input_raw_bytes(const StreamInput *in);
uint64_t stream_input_raw_total(const StreamInput *in);

/* Whether the input carries a digest, and whether it can be read twice. */
bool stream_input_has_digest(const StreamInput *in);
bool stream_input_rewindable(const StreamInput *in);

/* After the last byte: checks the digest trailer against what was read.
 * -EBADMSG (reported) if it does not match or is missing from a framed
 * input that had one announced. */
int stream_input_verify(StreamInput *in, ImageError *error);

/* Starts reading again from the beginning (a regular file only). */
int stream_input_rewind(StreamInput *in, ImageError *error);

/* Writes a stream to a file descriptor, plain or framed. */
typedef struct StreamOutput StreamOutput;

int stream_output_new(int fd, bool zstd, StreamOutput **ret);
StreamOutput *stream_output_free(StreamOutput *out);
DEFINE_TRIVIAL_CLEANUP_FUNC(StreamOutput *, stream_output_free);
int stream_output_write(StreamOutput *out, const void *buf, size_t n);
/* Flushes, and writes the digest trailer of a framed output. */
int stream_output_finish(StreamOutput *out);
uint64_t stream_output_bytes(const StreamOutput *out);

/* ---- stream.c: commands ---- */

typedef struct StreamCommand {
        unsigned cmd;
        uint64_t offset;                /* of its header in the stream */
        uint64_t present;               /* bit per attribute */

        uint8_t uuid[16];
        uint8_t clone_uuid[16];
        uint64_t ctransid, clone_ctransid;
        uint64_t ino, size, mode, uid, gid, rdev;
        struct timespec atime, mtime, ctime, otime;
        uint64_t file_offset, clone_offset, clone_len;
        uint64_t fileattr;
        uint64_t unencoded_file_len, unencoded_len, unencoded_offset;
        uint32_t fallocate_mode, compression, encryption;

        /* NUL-terminated copies (checked to hold no NUL of their own). */
        char path[STREAM_PATH_MAX + 1];
        char path_to[STREAM_PATH_MAX + 1];
        char path_link[STREAM_PATH_MAX + 1];
        char clone_path[STREAM_PATH_MAX + 1];
        char xattr_name[XATTR_NAME_LEN_MAX + 1];

        /* Point into the command's buffer. */
        const uint8_t *xattr_data;
        size_t xattr_data_len;
        const uint8_t *data;
        size_t data_len;
} StreamCommand;

#define ATTR_BIT(a) (UINT64_C(1) << (a))

typedef struct StreamReader {
        StreamInput *in;
        unsigned version;
        uint8_t *buf;                   /* COMMAND_HEADER_LEN + COMMAND_PAYLOAD_MAX */
} StreamReader;

/* Reads the 17-byte header of the next stream: 1 and the version, 0 at a
 * clean end of input, < 0 (reported) for anything else. */
int stream_read_header(StreamReader *r, ImageError *error);

/* Reads and checks the next command into cmd. */
int stream_read_command(StreamReader *r, StreamCommand *cmd, ImageError *error);

/* Checks that cmd has the attributes its kind needs: 0, or -EBADMSG
 * (reported) naming the first one missing. */
int stream_command_check(const StreamCommand *cmd, ImageError *error);

/* Builds commands one at a time and writes them. */
typedef struct StreamWriter {
        StreamOutput *out;
        unsigned version;
        uint8_t *buf;
        size_t len;
        size_t max;                     /* of a whole command, header included */
        int error;
} StreamWriter;

int stream_writer_init(StreamWriter *w, StreamOutput *out, unsigned version);
void stream_writer_done(StreamWriter *w);
int stream_write_header(StreamWriter *w);
void stream_begin(StreamWriter *w, unsigned cmd);
void stream_put_u64(StreamWriter *w, unsigned attr, uint64_t v);
void stream_put_u32(StreamWriter *w, unsigned attr, uint32_t v);
void stream_put_bytes(StreamWriter *w, unsigned attr, const void *p, size_t n);
void stream_put_string(StreamWriter *w, unsigned attr, const char *s);
void stream_put_time(StreamWriter *w, unsigned attr, const struct timespec *ts);
/* The DATA attribute, last of a command (no length in version 2). */
void stream_put_data(StreamWriter *w, const void *p, size_t n);
/* Room left for DATA in the command being built. */
size_t stream_data_room(const StreamWriter *w);
int stream_end(StreamWriter *w);

/* ---- errors ---- */
_printf_(3, 4)
int image_error(ImageError *error, int r, const char *format, ...);
_printf_(4, 5)
int image_error_at(ImageError *error, int r, uint64_t offset, const char *format, ...);

/* UUIDs: 16 bytes in printed order, and their canonical text. */
void uuid_format(const uint8_t uuid[16], char ret[static 37]);
int uuid_parse(const char *text, uint8_t ret[16]);
