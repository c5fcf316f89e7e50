/* SPDX-License-Identifier: LGPL-2.1-or-later */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cleanup.h"

const sd_bus_error_map api_error_map[] = {
        SD_BUS_ERROR_MAP(API_ERROR_NO_SUCH_IMAGE, ENOENT),
        SD_BUS_ERROR_MAP(API_ERROR_NO_SUCH_SUBVOLUME, ENOENT),
        SD_BUS_ERROR_MAP(API_ERROR_NO_SUCH_JOB, ESRCH),
        SD_BUS_ERROR_MAP(API_ERROR_NAME_TAKEN, EEXIST),
        SD_BUS_ERROR_MAP(API_ERROR_BUSY, EBUSY),
        SD_BUS_ERROR_MAP(API_ERROR_NOT_READ_ONLY, EROFS),
        SD_BUS_ERROR_MAP(API_ERROR_INVALID_JSON, EINVAL),
        SD_BUS_ERROR_MAP(API_ERROR_INVALID_NAME, EINVAL),
        SD_BUS_ERROR_MAP(API_ERROR_BAD_STREAM, EBADMSG),
        SD_BUS_ERROR_MAP(API_ERROR_NO_SPACE, ENOSPC),
        SD_BUS_ERROR_MAP(API_ERROR_TOO_MANY_JOBS, EAGAIN),
        SD_BUS_ERROR_MAP(API_ERROR_ACCESS_DENIED, EPERM),
        SD_BUS_ERROR_MAP(API_ERROR_JOB_FAILED, EIO),
        SD_BUS_ERROR_MAP(API_ERROR_NO_SUCH_WORKSPACE, ENOENT),
        SD_BUS_ERROR_MAP(API_ERROR_NO_SUCH_CHECKPOINT, ENOKEY),
        SD_BUS_ERROR_MAP(API_ERROR_NO_SUCH_SANDBOX, ENOENT),
        SD_BUS_ERROR_MAP(API_ERROR_STORE_FAILED, EIO),
        SD_BUS_ERROR_MAP(API_ERROR_UNSAFE_MOUNT_POINT, ELOOP),
        SD_BUS_ERROR_MAP_END
};

int api_subvolume_path(const char *name, char **ret) {
        return sd_bus_path_encode(API_SUBVOLUME_PREFIX, name, ret);
}

int api_subvolume_name_from_path(const char *path, char **ret) {
        return sd_bus_path_decode(path, API_SUBVOLUME_PREFIX, ret);
}

int api_job_path(uint32_t id, char **ret) {
        return asprintf(ret, API_JOB_PREFIX "/%" PRIu32, id) < 0 ? -ENOMEM : 0;
}

int api_utf8_char(const unsigned char *p, size_t n) {
        unsigned char lo = 0x80, hi = 0xBF;
        int len;

        if (p[0] < 0x80)
                return 1;
        if (p[0] >= 0xC2 && p[0] <= 0xDF)
                len = 2;
        else if (p[0] >= 0xE0 && p[0] <= 0xEF) {
                len = 3;
                if (p[0] == 0xE0)
                        lo = 0xA0;      /* overlong */
                else if (p[0] == 0xED)
                        hi = 0x9F;      /* surrogates */
        } else if (p[0] >= 0xF0 && p[0] <= 0xF4) {
                len = 4;
                if (p[0] == 0xF0)
                        lo = 0x90;      /* overlong */
                else if (p[0] == 0xF4)
                        hi = 0x8F;      /* past U+10FFFF */
        } else
                return -1;
        for (int i = 1; i < len; i++) {
                if ((size_t) i >= n || p[i] < (i == 1 ? lo : 0x80) || p[i] > (i == 1 ? hi : 0xBF))
                        return -i;
        }
        return len;
}

/* Writes the n bytes at s to out (room for 3 * n bytes), each invalid
 * sequence replaced by U+FFFD; returns the length written. */
static size_t utf8_lossy(const char *s, size_t n, char *out) {
        size_t k = 0;

        for (size_t i = 0; i < n;) {
                int len = api_utf8_char((const unsigned char *) s + i, n - i);

                if (len > 0) {
                        memcpy(out + k, s + i, (size_t) len);
                        k += (size_t) len;
                        i += (size_t) len;
                } else {
                        memcpy(out + k, "\xEF\xBF\xBD", 3);
                        k += 3;
                        i += (size_t) -len;
                }
        }
        return k;
}

json_t *api_json_stringn_lossy(const char *s, size_t n) {
        _cleanup_free_ char *text = NULL;

        if (n > (SIZE_MAX - 1) / 3)
                return NULL;
        text = malloc(n * 3 + 1);
        if (!text)
                return NULL;
        return json_stringn(text, utf8_lossy(s, n, text));
}

json_t *api_json_string_lossy(const char *s) {
        return api_json_stringn_lossy(s, strlen(s));
}

char *api_utf8_lossy(const char *s) {
        size_t n = strlen(s);
        char *text;

        if (n > (SIZE_MAX - 1) / 3)
                return NULL;
        text = malloc(n * 3 + 1);
        if (text)
                text[utf8_lossy(s, n, text)] = 0;
        return text;
}

static json_t *json_u64(uint64_t v) {
        return json_integer((json_int_t) MIN(v, (uint64_t) INT64_MAX));
}

json_t *api_subvolume_to_json(const StoreSubvolumeInfo *info) {
        /* Names may hold any byte but '/' and control characters: one
         * that is not UTF-8 must not fail the whole listing. */
        return json_pack("{s:o, s:o, s:s, s:s, s:s, s:b, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:o, s:o, s:i, s:b}",
                         "id", json_u64(info->id),
                         "name", api_json_string_lossy(info->name),
                         "uuid", info->uuid,
                         "parent_uuid", info->parent_uuid,
                         "received_uuid", info->received_uuid,
                         "readonly", info->readonly,
                         "created_usec", json_u64(info->created_usec),
                         "logical_bytes", json_u64(info->logical_bytes),
                         "referenced_bytes", json_u64(info->referenced_bytes),
                         "exclusive_bytes", json_u64(info->exclusive_bytes),
                         "inodes", json_u64(info->inodes),
                         "quota_bytes", json_u64(info->quota_bytes),
                         "mounted_by", (int) info->mounted_by,
                         "ctransid", json_u64(info->ctransid),
                         "stransid", json_u64(info->stransid),
                         "layers", (int) info->depth,
                         "damaged", info->damaged);
}

json_t *api_usage_to_json(const StoreUsage *u) {
        return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}",
                         "logical_bytes", json_u64(u->logical_bytes),
                         "stored_bytes", json_u64(u->stored_bytes),
                         "data_bytes", json_u64(u->data_bytes),
                         "metadata_bytes", json_u64(u->metadata_bytes),
                         "blocks", json_u64(u->blocks),
                         "pack_file_bytes", json_u64(u->pack_file_bytes),
                         "reclaimable_bytes", json_u64(u->space.reclaimable_bytes),
                         "subvolumes", json_u64(u->subvolumes),
                         "damaged_subvolumes", json_u64(u->damaged_subvolumes),
                         "deleted_subvolumes", json_u64(u->deleted_subvolumes),
                         "layers", json_u64(u->layers),
                         "corruption_events", json_u64(u->corruption_events),
                         "fs_free_bytes", json_u64(u->space.fs_free_bytes),
                         "fs_total_bytes", json_u64(u->space.fs_total_bytes),
                         "fs_reserved_bytes", json_u64(u->space.fs_reserved_bytes),
                         "reserve_bytes", json_u64(u->space.reserve_bytes));
}

static const char *json_type_name(char type) {
        switch (type) {
        case 's': return "a string";
        case 'b': return "true or false";
        case 'i': return "a user or group ID, from 0 to 4294967294";
        default:  return "a non-negative integer";
        }
}

static bool json_type_ok(json_t *v, char type) {
        switch (type) {
        case 's': return json_is_string(v);
        case 'b': return json_is_boolean(v);
        case 'i': return json_is_integer(v) && json_integer_value(v) >= 0 &&
                         json_integer_value(v) < (json_int_t) UINT32_MAX;
        default:  return json_is_integer(v) && json_integer_value(v) >= 0;
        }
}

int api_parse_options(const char *text, const ApiOption *allowed, json_t **ret, sd_bus_error *error) {
        json_t *doc;
        json_error_t jerr;
        const char *key;
        json_t *value;

        if (!text || !*text) {
                *ret = json_object();
                return *ret ? 0 : -ENOMEM;
        }
        if (strlen(text) > 64 * 1024)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "The options are %zu bytes long; at most "
                                         "65536 are accepted.", strlen(text));
        doc = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
        if (!doc)
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "The options are not valid JSON (%s, at "
                                         "character %d); pass an object such as {\"readonly\": true}.",
                                         jerr.text, jerr.position);
        if (!json_is_object(doc)) {
                json_decref(doc);
                return sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "The options must be a JSON object, "
                                         "such as {\"readonly\": true}.");
        }
        json_object_foreach(doc, key, value) {
                const ApiOption *o = allowed;

                while (o && o->key && strcmp(o->key, key) != 0)
                        o++;
                if (!o || !o->key) {
                        sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Unknown option \"%s\".", key);
                        json_decref(doc);
                        return -EINVAL;
                }
                if (!json_type_ok(value, o->type)) {
                        sd_bus_error_setf(error, API_ERROR_INVALID_JSON, "Option \"%s\" must be %s.", key,
                                          json_type_name(o->type));
                        json_decref(doc);
                        return -EINVAL;
                }
        }
        *ret = doc;
        return 0;
}

const char *api_option_string(json_t *options, const char *key, const char *def) {
        json_t *v = json_object_get(options, key);

        return json_is_string(v) ? json_string_value(v) : def;
}

bool api_option_bool(json_t *options, const char *key, bool def) {
        json_t *v = json_object_get(options, key);

        return json_is_boolean(v) ? json_is_true(v) : def;
}

uint64_t api_option_uint(json_t *options, const char *key, uint64_t def) {
        json_t *v = json_object_get(options, key);

        return json_is_integer(v) && json_integer_value(v) >= 0 ? (uint64_t) json_integer_value(v) : def;
}

char *api_json_text(json_t *json) {
        return json ? json_dumps(json, JSON_COMPACT) : NULL;
}

int api_reply_json(sd_bus_message *message, json_t *json) {
        _cleanup_free_ char *text = api_json_text(json);

        if (!text)
                return -ENOMEM;
        return sd_bus_reply_method_return(message, "s", text);
}
