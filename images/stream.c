/* SPDX-License-Identifier: LGPL-2.1-or-later */

/*
 * The send stream codec: the stream header, commands as TLV attributes with
 * a CRC-32C each, read with every length and value checked (the input is
 * untrusted), and written the way `btrfs receive` expects them.
 */

#include <errno.h>
#include <pthread.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "images-internal.h"

static const char *const command_names[_CMD_MAX] = {
        [CMD_SUBVOL] = "subvol",           [CMD_SNAPSHOT] = "snapshot",
        [CMD_MKFILE] = "mkfile",           [CMD_MKDIR] = "mkdir",
        [CMD_MKNOD] = "mknod",             [CMD_MKFIFO] = "mkfifo",
        [CMD_MKSOCK] = "mksock",           [CMD_SYMLINK] = "symlink",
        [CMD_RENAME] = "rename",           [CMD_LINK] = "link",
        [CMD_UNLINK] = "unlink",           [CMD_RMDIR] = "rmdir",
        [CMD_SET_XATTR] = "set_xattr",     [CMD_REMOVE_XATTR] = "remove_xattr",
        [CMD_WRITE] = "write",             [CMD_CLONE] = "clone",
        [CMD_TRUNCATE] = "truncate",       [CMD_CHMOD] = "chmod",
        [CMD_CHOWN] = "chown",             [CMD_UTIMES] = "utimes",
        [CMD_END] = "end",                 [CMD_UPDATE_EXTENT] = "update_extent",
        [CMD_FALLOCATE] = "fallocate",     [CMD_FILEATTR] = "fileattr",
        [CMD_ENCODED_WRITE] = "encoded_write",
};

static const char *const attribute_names[_ATTR_MAX] = {
        [ATTR_UUID] = "uuid",                   [ATTR_CTRANSID] = "ctransid",
        [ATTR_INO] = "ino",                     [ATTR_SIZE] = "size",
        [ATTR_MODE] = "mode",                   [ATTR_UID] = "uid",
        [ATTR_GID] = "gid",                     [ATTR_RDEV] = "rdev",
        [ATTR_CTIME] = "ctime",                 [ATTR_MTIME] = "mtime",
        [ATTR_ATIME] = "atime",                 [ATTR_OTIME] = "otime",
        [ATTR_XATTR_NAME] = "xattr_name",       [ATTR_XATTR_DATA] = "xattr_data",
        [ATTR_PATH] = "path",                   [ATTR_PATH_TO] = "path_to",
        [ATTR_PATH_LINK] = "path_link",         [ATTR_FILE_OFFSET] = "file_offset",
        [ATTR_DATA] = "data",                   [ATTR_CLONE_UUID] = "clone_uuid",
        [ATTR_CLONE_CTRANSID] = "clone_ctransid", [ATTR_CLONE_PATH] = "clone_path",
        [ATTR_CLONE_OFFSET] = "clone_offset",   [ATTR_CLONE_LEN] = "clone_len",
        [ATTR_FALLOCATE_MODE] = "fallocate_mode", [ATTR_FILEATTR] = "fileattr",
        [ATTR_UNENCODED_FILE_LEN] = "unencoded_file_len", [ATTR_UNENCODED_LEN] = "unencoded_len",
        [ATTR_UNENCODED_OFFSET] = "unencoded_offset", [ATTR_COMPRESSION] = "compression",
        [ATTR_ENCRYPTION] = "encryption",
};

const char *stream_command_name(unsigned cmd) {
        return cmd < _CMD_MAX && command_names[cmd] ? command_names[cmd] : "unknown";
}

const char *stream_attribute_name(unsigned attr) {
        return attr < _ATTR_MAX && attribute_names[attr] ? attribute_names[attr] : "unknown";
}

/* The attributes each command needs. */
static const uint64_t required_attributes[_CMD_MAX] = {
        [CMD_SUBVOL] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_UUID) | ATTR_BIT(ATTR_CTRANSID),
        [CMD_SNAPSHOT] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_UUID) | ATTR_BIT(ATTR_CTRANSID) |
                         ATTR_BIT(ATTR_CLONE_UUID) | ATTR_BIT(ATTR_CLONE_CTRANSID),
        [CMD_MKFILE] = ATTR_BIT(ATTR_PATH),
        [CMD_MKDIR] = ATTR_BIT(ATTR_PATH),
        [CMD_MKNOD] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_MODE) | ATTR_BIT(ATTR_RDEV),
        [CMD_MKFIFO] = ATTR_BIT(ATTR_PATH),
        [CMD_MKSOCK] = ATTR_BIT(ATTR_PATH),
        [CMD_SYMLINK] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_PATH_LINK),
        [CMD_RENAME] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_PATH_TO),
        [CMD_LINK] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_PATH_LINK),
        [CMD_UNLINK] = ATTR_BIT(ATTR_PATH),
        [CMD_RMDIR] = ATTR_BIT(ATTR_PATH),
        [CMD_SET_XATTR] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_XATTR_NAME) | ATTR_BIT(ATTR_XATTR_DATA),
        [CMD_REMOVE_XATTR] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_XATTR_NAME),
        [CMD_WRITE] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_FILE_OFFSET) | ATTR_BIT(ATTR_DATA),
        [CMD_CLONE] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_FILE_OFFSET) | ATTR_BIT(ATTR_CLONE_LEN) |
                      ATTR_BIT(ATTR_CLONE_UUID) | ATTR_BIT(ATTR_CLONE_CTRANSID) |
                      ATTR_BIT(ATTR_CLONE_PATH) | ATTR_BIT(ATTR_CLONE_OFFSET),
        [CMD_TRUNCATE] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_SIZE),
        [CMD_CHMOD] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_MODE),
        [CMD_CHOWN] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_UID) | ATTR_BIT(ATTR_GID),
        [CMD_UTIMES] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_ATIME) | ATTR_BIT(ATTR_MTIME) |
                       ATTR_BIT(ATTR_CTIME),
        [CMD_UPDATE_EXTENT] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_FILE_OFFSET) | ATTR_BIT(ATTR_SIZE),
        [CMD_FALLOCATE] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_FALLOCATE_MODE) |
                          ATTR_BIT(ATTR_FILE_OFFSET) | ATTR_BIT(ATTR_SIZE),
        [CMD_FILEATTR] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_FILEATTR),
        [CMD_ENCODED_WRITE] = ATTR_BIT(ATTR_PATH) | ATTR_BIT(ATTR_FILE_OFFSET) |
                              ATTR_BIT(ATTR_UNENCODED_FILE_LEN) | ATTR_BIT(ATTR_UNENCODED_LEN) |
                              ATTR_BIT(ATTR_UNENCODED_OFFSET) | ATTR_BIT(ATTR_DATA),
};

/* ---- CRC-32C (Castagnoli), reflected, as the stream uses it ---- */

static uint32_t crc_table[256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_table_init(void) {
        for (uint32_t i = 0; i < 256; i++) {
                uint32_t c = i;

                for (unsigned k = 0; k < 8; k++)
                        c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
                crc_table[i] = c;
        }
}

uint32_t stream_crc32c(uint32_t crc, const void *data, size_t len) {
        const uint8_t *p = data;

        pthread_once(&crc_once, crc_table_init);
        while (len--)
                crc = crc_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
        return crc;
}

/* ---- errors and UUIDs ---- */

int image_error(ImageError *error, int r, const char *format, ...) {
        va_list ap;

        if (error) {
                error->has_offset = false;
                va_start(ap, format);
                vsnprintf(error->message, sizeof error->message, format, ap);
                va_end(ap);
        }
        return r;
}

int image_error_at(ImageError *error, int r, uint64_t offset, const char *format, ...) {
        va_list ap;

        if (error) {
                error->has_offset = true;
                error->offset = offset;
                va_start(ap, format);
                vsnprintf(error->message, sizeof error->message, format, ap);
                va_end(ap);
        }
        return r;
}

void uuid_format(const uint8_t u[16], char ret[static 37]) {
        snprintf(ret, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7],
                 u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

static int hex_value(char c) {
        if (c >= '0' && c <= '9')
                return c - '0';
        if (c >= 'a' && c <= 'f')
                return c - 'a' + 10;
        if (c >= 'A' && c <= 'F')
                return c - 'A' + 10;
        return -1;
}

int uuid_parse(const char *text, uint8_t ret[16]) {
        size_t n = 0;

        for (const char *p = text; *p; p++) {
                int hi, lo;

                if (*p == '-')
                        continue;
                hi = hex_value(p[0]);
                lo = p[1] ? hex_value(p[1]) : -1;
                if (hi < 0 || lo < 0 || n == 16)
                        return -EINVAL;
                ret[n++] = (uint8_t) (hi << 4 | lo);
                p++;
        }
        return n == 16 ? 0 : -EINVAL;
}

/* ---- reading ---- */

static uint16_t get_le16(const uint8_t *p) {
        return (uint16_t) (p[0] | p[1] << 8);
}

static uint32_t get_le32(const uint8_t *p) {
        return (uint32_t) get_le16(p) | (uint32_t) get_le16(p + 2) << 16;
}

static uint64_t get_le64(const uint8_t *p) {
        return (uint64_t) get_le32(p) | (uint64_t) get_le32(p + 4) << 32;
}

int stream_read_header(StreamReader *r, ImageError *error) {
        uint8_t h[STREAM_HEADER_LEN];
        uint64_t offset = stream_input_offset(r->in);
        ssize_t k;
        uint32_t version;

        k = stream_input_read(r->in, h, sizeof h, error);
        if (k <= 0)
                return (int) k;
        if ((size_t) k < sizeof h || memcmp(h, STREAM_MAGIC, STREAM_MAGIC_LEN) != 0)
                return image_error_at(error, -EBADMSG, offset,
                                      (size_t) k < sizeof h ? "the input is truncated in a stream header"
                                                            : "no stream header (\"btrfs-stream\") where a stream "
                                                              "should start");
        version = get_le32(h + STREAM_MAGIC_LEN);
        if (version == 0 || version > STREAM_VERSION_MAX)
                return image_error_at(error, -EPROTONOSUPPORT, offset,
                                      "the stream has version %" PRIu32 "; versions 1 and 2 are supported",
                                      version);
        r->version = version;
        return 1;
}

static int copy_string(char *dst, size_t max, const uint8_t *v, uint16_t len, unsigned attr,
                       uint64_t offset, ImageError *error) {
        if (len > max)
                return image_error_at(error, -ENAMETOOLONG, offset, "attribute %s is %u bytes long, "
                                      "more than the %zu allowed", stream_attribute_name(attr), len, max);
        if (memchr(v, 0, len))
                return image_error_at(error, -EBADMSG, offset, "attribute %s holds a NUL byte",
                                      stream_attribute_name(attr));
        memcpy(dst, v, len);
        dst[len] = 0;
        return 0;
}

static int parse_attribute(StreamCommand *c, unsigned attr, const uint8_t *v, size_t len,
                           uint64_t offset, ImageError *error) {
        size_t want = 0;

        switch (attr) {
        case ATTR_UUID:
        case ATTR_CLONE_UUID:
                want = 16;
                break;
        case ATTR_CTIME: case ATTR_MTIME: case ATTR_ATIME: case ATTR_OTIME:
                want = 12;
                break;
        case ATTR_FALLOCATE_MODE: case ATTR_COMPRESSION: case ATTR_ENCRYPTION:
                want = 4;
                break;
        case ATTR_CTRANSID: case ATTR_INO: case ATTR_SIZE: case ATTR_MODE: case ATTR_UID:
        case ATTR_GID: case ATTR_RDEV: case ATTR_FILE_OFFSET: case ATTR_CLONE_CTRANSID:
        case ATTR_CLONE_OFFSET: case ATTR_CLONE_LEN: case ATTR_FILEATTR:
        case ATTR_UNENCODED_FILE_LEN: case ATTR_UNENCODED_LEN: case ATTR_UNENCODED_OFFSET:
                want = 8;
                break;
        }
        if (want && len != want)
                return image_error_at(error, -EBADMSG, offset, "attribute %s is %zu bytes long instead of %zu",
                                      stream_attribute_name(attr), len, want);

        switch (attr) {
        case ATTR_UUID:         memcpy(c->uuid, v, 16); break;
        case ATTR_CLONE_UUID:   memcpy(c->clone_uuid, v, 16); break;
        case ATTR_CTRANSID:     c->ctransid = get_le64(v); break;
        case ATTR_CLONE_CTRANSID: c->clone_ctransid = get_le64(v); break;
        case ATTR_INO:          c->ino = get_le64(v); break;
        case ATTR_SIZE:         c->size = get_le64(v); break;
        case ATTR_MODE:         c->mode = get_le64(v); break;
        case ATTR_UID:          c->uid = get_le64(v); break;
        case ATTR_GID:          c->gid = get_le64(v); break;
        case ATTR_RDEV:         c->rdev = get_le64(v); break;
        case ATTR_FILE_OFFSET:  c->file_offset = get_le64(v); break;
        case ATTR_CLONE_OFFSET: c->clone_offset = get_le64(v); break;
        case ATTR_CLONE_LEN:    c->clone_len = get_le64(v); break;
        case ATTR_FILEATTR:     c->fileattr = get_le64(v); break;
        case ATTR_UNENCODED_FILE_LEN: c->unencoded_file_len = get_le64(v); break;
        case ATTR_UNENCODED_LEN: c->unencoded_len = get_le64(v); break;
        case ATTR_UNENCODED_OFFSET: c->unencoded_offset = get_le64(v); break;
        case ATTR_FALLOCATE_MODE: c->fallocate_mode = get_le32(v); break;
        case ATTR_COMPRESSION:  c->compression = get_le32(v); break;
        case ATTR_ENCRYPTION:   c->encryption = get_le32(v); break;
        case ATTR_CTIME: case ATTR_MTIME: case ATTR_ATIME: case ATTR_OTIME: {
                struct timespec *ts = attr == ATTR_CTIME ? &c->ctime : attr == ATTR_MTIME ? &c->mtime :
                                      attr == ATTR_ATIME ? &c->atime : &c->otime;
                /* Seconds as btrfs keeps them: signed, before 1970 negative. */
                int64_t sec = (int64_t) get_le64(v);
                uint32_t nsec = get_le32(v + 8);

                if (nsec >= 1000000000u)
                        return image_error_at(error, -EBADMSG, offset, "attribute %s is not a valid time",
                                              stream_attribute_name(attr));
                *ts = (struct timespec) { .tv_sec = (time_t) sec, .tv_nsec = (long) nsec };
                break;
        }
        case ATTR_PATH:
                return copy_string(c->path, STREAM_PATH_MAX, v, (uint16_t) len, attr, offset, error);
        case ATTR_PATH_TO:
                return copy_string(c->path_to, STREAM_PATH_MAX, v, (uint16_t) len, attr, offset, error);
        case ATTR_PATH_LINK:
                return copy_string(c->path_link, STREAM_PATH_MAX, v, (uint16_t) len, attr, offset, error);
        case ATTR_CLONE_PATH:
                return copy_string(c->clone_path, STREAM_PATH_MAX, v, (uint16_t) len, attr, offset, error);
        case ATTR_XATTR_NAME:
                return copy_string(c->xattr_name, XATTR_NAME_LEN_MAX, v, (uint16_t) len, attr, offset, error);
        case ATTR_XATTR_DATA:
                c->xattr_data = v;
                c->xattr_data_len = len;
                break;
        case ATTR_DATA:
                c->data = v;
                c->data_len = len;
                break;
        default:
                return image_error_at(error, -EBADMSG, offset, "unknown attribute type %u", attr);
        }
        return 0;
}

int stream_read_command(StreamReader *r, StreamCommand *c, ImageError *error) {
        uint64_t offset = stream_input_offset(r->in);
        uint8_t *h = r->buf, *payload = r->buf + COMMAND_HEADER_LEN;
        uint32_t len, crc, actual;
        ssize_t k;
        size_t pos = 0;

        k = stream_input_read(r->in, h, COMMAND_HEADER_LEN, error);
        if (k < 0)
                return (int) k;
        if (k < COMMAND_HEADER_LEN)
                return image_error_at(error, -EBADMSG, offset, "the stream is truncated: it ends %s",
                                      k == 0 ? "before its END command" : "inside a command header");
        len = get_le32(h);
        if (len > COMMAND_PAYLOAD_MAX)
                return image_error_at(error, -EMSGSIZE, offset, "a command of %" PRIu32 " bytes: more than the "
                                      "%u allowed", len, COMMAND_PAYLOAD_MAX);
        k = stream_input_read(r->in, payload, len, error);
        if (k < 0)
                return (int) k;
        if ((size_t) k < len)
                return image_error_at(error, -EBADMSG, offset, "the stream is truncated inside a %s command",
                                      stream_command_name(get_le16(h + 4)));

        crc = get_le32(h + 6);
        memset(h + 6, 0, 4);
        actual = stream_crc32c(0, h, COMMAND_HEADER_LEN);
        actual = stream_crc32c(actual, payload, len);
        if (crc != actual)
                return image_error_at(error, -EBADMSG, offset, "checksum mismatch in a %s command: the stream "
                                      "is damaged", stream_command_name(get_le16(h + 4)));

        *c = (StreamCommand) { .cmd = get_le16(h + 4), .offset = offset };
        if (c->cmd == CMD_UNSPEC || c->cmd >= _CMD_MAX)
                return image_error_at(error, -EBADMSG, offset, "unknown command %u", c->cmd);

        while (pos < len) {
                unsigned attr;
                size_t alen;
                int q;

                if (len - pos < 2)
                        return image_error_at(error, -EBADMSG, offset, "a %s command ends inside an attribute",
                                              stream_command_name(c->cmd));
                attr = get_le16(payload + pos);
                pos += 2;
                if (attr == ATTR_DATA && r->version >= 2)
                        alen = len - pos;       /* runs to the end of the command */
                else {
                        if (len - pos < 2)
                                return image_error_at(error, -EBADMSG, offset,
                                                      "a %s command ends inside an attribute",
                                                      stream_command_name(c->cmd));
                        alen = get_le16(payload + pos);
                        pos += 2;
                        if (alen > len - pos)
                                return image_error_at(error, -EBADMSG, offset, "attribute %s runs past the end "
                                                      "of its %s command", stream_attribute_name(attr),
                                                      stream_command_name(c->cmd));
                }
                if (attr == ATTR_UNSPEC || attr >= _ATTR_MAX)
                        return image_error_at(error, -EBADMSG, offset, "unknown attribute type %u in a %s "
                                              "command", attr, stream_command_name(c->cmd));
                q = parse_attribute(c, attr, payload + pos, alen, offset, error);
                if (q < 0)
                        return q;
                c->present |= ATTR_BIT(attr);
                pos += alen;
        }
        return 0;
}

int stream_command_check(const StreamCommand *c, ImageError *error) {
        uint64_t missing = required_attributes[c->cmd] & ~c->present;

        for (unsigned a = 1; a < _ATTR_MAX; a++)
                if (missing & ATTR_BIT(a))
                        return image_error_at(error, -EBADMSG, c->offset, "a %s command without its %s attribute",
                                              stream_command_name(c->cmd), stream_attribute_name(a));
        return 0;
}

/* ---- writing ---- */

/* Commands the kernel writes are at most 64 KiB in version 1 and 16 KiB
 * more than the largest compressed extent in version 2: what receivers
 * size their buffers for. */
#define COMMAND_MAX_V1 (64 * 1024)
#define COMMAND_MAX_V2 (16 * 1024 + 128 * 1024)

int stream_writer_init(StreamWriter *w, StreamOutput *out, unsigned version) {
        *w = (StreamWriter) {
                .out = out,
                .version = version,
                .max = version >= 2 ? COMMAND_MAX_V2 : COMMAND_MAX_V1,
        };
        w->buf = malloc(w->max);
        return w->buf ? 0 : -ENOMEM;
}

void stream_writer_done(StreamWriter *w) {
        free(w->buf);
        w->buf = NULL;
}

int stream_write_header(StreamWriter *w) {
        uint8_t h[STREAM_HEADER_LEN];

        memcpy(h, STREAM_MAGIC, STREAM_MAGIC_LEN);
        for (unsigned i = 0; i < 4; i++)
                h[STREAM_MAGIC_LEN + i] = (uint8_t) (w->version >> (8 * i));
        return stream_output_write(w->out, h, sizeof h);
}

void stream_begin(StreamWriter *w, unsigned cmd) {
        w->len = COMMAND_HEADER_LEN;
        w->buf[4] = (uint8_t) cmd;
        w->buf[5] = (uint8_t) (cmd >> 8);
}

static void put_raw(StreamWriter *w, const void *p, size_t n) {
        if (w->error < 0)
                return;
        if (n > w->max - w->len) {
                w->error = -EMSGSIZE;
                return;
        }
        memcpy(w->buf + w->len, p, n);
        w->len += n;
}

static void put_le(StreamWriter *w, uint64_t v, unsigned bytes) {
        uint8_t b[8];

        for (unsigned i = 0; i < bytes; i++)
                b[i] = (uint8_t) (v >> (8 * i));
        put_raw(w, b, bytes);
}

void stream_put_bytes(StreamWriter *w, unsigned attr, const void *p, size_t n) {
        if (n > UINT16_MAX) {
                w->error = -EMSGSIZE;
                return;
        }
        put_le(w, attr, 2);
        put_le(w, n, 2);
        put_raw(w, p, n);
}

void stream_put_u64(StreamWriter *w, unsigned attr, uint64_t v) {
        put_le(w, attr, 2);
        put_le(w, 8, 2);
        put_le(w, v, 8);
}

void stream_put_u32(StreamWriter *w, unsigned attr, uint32_t v) {
        put_le(w, attr, 2);
        put_le(w, 4, 2);
        put_le(w, v, 4);
}

void stream_put_string(StreamWriter *w, unsigned attr, const char *s) {
        stream_put_bytes(w, attr, s, strlen(s));
}

void stream_put_time(StreamWriter *w, unsigned attr, const struct timespec *ts) {
        put_le(w, attr, 2);
        put_le(w, 12, 2);
        put_le(w, (uint64_t) ts->tv_sec, 8);
        put_le(w, (uint64_t) ts->tv_nsec, 4);
}

void stream_put_data(StreamWriter *w, const void *p, size_t n) {
        if (w->version >= 2) {
                put_le(w, ATTR_DATA, 2);
                put_raw(w, p, n);
        } else
                stream_put_bytes(w, ATTR_DATA, p, n);
}

size_t stream_data_room(const StreamWriter *w) {
        size_t used = w->len + (w->version >= 2 ? 2 : 4);

        if (used >= w->max)
                return 0;
        return w->version >= 2 ? w->max - used : MIN(w->max - used, (size_t) UINT16_MAX);
}

int stream_end(StreamWriter *w) {
        uint32_t len = (uint32_t) (w->len - COMMAND_HEADER_LEN), crc;
        int r;

        if (w->error < 0) {
                r = w->error;
                w->error = 0;
                return r;
        }
        for (unsigned i = 0; i < 4; i++) {
                w->buf[i] = (uint8_t) (len >> (8 * i));
                w->buf[6 + i] = 0;
        }
        crc = stream_crc32c(0, w->buf, w->len);
        for (unsigned i = 0; i < 4; i++)
                w->buf[6 + i] = (uint8_t) (crc >> (8 * i));
        return stream_output_write(w->out, w->buf, w->len);
}
