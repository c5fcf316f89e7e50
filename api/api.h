/* SPDX-License-Identifier: LGPL-2.1-or-later */
#pragma once

/*
 * api.h: the contract between cowboxd and its clients on the bus: names of
 * the service, its objects, interfaces and errors, and the JSON documents
 * its methods take and return (built and checked here, with jansson).
 *
 * The daemon and the cowbox client both use this header; a client in any
 * other language needs only the names below and the README's examples.
 */

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <systemd/sd-bus.h>

#include "store.h"

#define API_SERVICE             "org.cowbox1"
#define API_MANAGER_PATH        "/org/cowbox1"
#define API_MANAGER_INTERFACE   "org.cowbox1.Manager"
#define API_SUBVOLUME_PREFIX    "/org/cowbox1/subvolume"
#define API_SUBVOLUME_INTERFACE "org.cowbox1.Subvolume"
#define API_JOB_PREFIX          "/org/cowbox1/job"
#define API_SANDBOX_PREFIX      "/org/cowbox1/sandbox"
#define API_SANDBOX_INTERFACE   "org.cowbox1.Sandbox"
#define API_JOB_INTERFACE       "org.cowbox1.Job"

/* The group whose members may change things, besides root. */
#define API_GROUP               "cowbox"

/* Error names. Each is mapped to an errno (api_error_map), so that a
 * handler that returns -errno gives the caller the right name; a handler
 * that knows more says it with a sentence. */
#define API_ERROR_NO_SUCH_IMAGE      "org.cowbox1.Error.NoSuchImage"
#define API_ERROR_NO_SUCH_SUBVOLUME  "org.cowbox1.Error.NoSuchSubvolume"
#define API_ERROR_NO_SUCH_JOB        "org.cowbox1.Error.NoSuchJob"
#define API_ERROR_NAME_TAKEN         "org.cowbox1.Error.NameTaken"
#define API_ERROR_BUSY               "org.cowbox1.Error.Busy"
#define API_ERROR_NOT_READ_ONLY      "org.cowbox1.Error.NotReadOnly"
#define API_ERROR_INVALID_JSON       "org.cowbox1.Error.InvalidJSON"
#define API_ERROR_INVALID_NAME       "org.cowbox1.Error.InvalidName"
#define API_ERROR_BAD_STREAM         "org.cowbox1.Error.BadStream"
#define API_ERROR_NO_SPACE           "org.cowbox1.Error.NoSpace"
#define API_ERROR_TOO_MANY_JOBS      "org.cowbox1.Error.TooManyJobs"
#define API_ERROR_ACCESS_DENIED      "org.cowbox1.Error.AccessDenied"
#define API_ERROR_JOB_FAILED         "org.cowbox1.Error.JobFailed"
#define API_ERROR_NO_SUCH_WORKSPACE  "org.cowbox1.Error.NoSuchWorkspace"
#define API_ERROR_NO_SUCH_CHECKPOINT "org.cowbox1.Error.NoSuchCheckpoint"
#define API_ERROR_NO_SUCH_SANDBOX    "org.cowbox1.Error.NoSuchSandbox"
#define API_ERROR_STORE_FAILED       "org.cowbox1.Error.StoreFailed"
#define API_ERROR_UNSAFE_MOUNT_POINT "org.cowbox1.Error.UnsafeMountPoint"

extern const sd_bus_error_map api_error_map[];

/* Object paths of subvolumes (the name, escaped) and jobs (the id). */
int api_subvolume_path(const char *name, char **ret);
int api_subvolume_name_from_path(const char *path, char **ret);
int api_job_path(uint32_t id, char **ret);

/* UTF-8, which D-Bus strings and JSON hold only. The length of the valid
 * character at p (of n bytes), or minus the length of its invalid part (at
 * least 1): the lead byte and the continuation bytes that fit it, as
 * Unicode's best practice counts them. */
int api_utf8_char(const unsigned char *p, size_t n);
/* A JSON string of the n bytes at s (or of s), each invalid sequence of
 * bytes replaced by U+FFFD; NULL only without memory. */
json_t *api_json_stringn_lossy(const char *s, size_t n);
json_t *api_json_string_lossy(const char *s);
/* The same as a new C string (the caller frees it). */
char *api_utf8_lossy(const char *s);

/* JSON of a subvolume, as GetSubvolume and ListSubvolumes return it (a
 * name that is not UTF-8 as api_json_string_lossy makes it):
 *   {"name": "base", "uuid": "…", "parent_uuid": "", "received_uuid": "…",
 *    "readonly": true, "created_usec": …, "logical_bytes": …,
 *    "referenced_bytes": …, "exclusive_bytes": …, "inodes": …,
 *    "quota_bytes": 0, "mounted_by": 0, "ctransid": 3, "stransid": 7,
 *    "layers": 1, "damaged": false}
 * A damaged one (only in listings, see StoreSubvolumeInfo) has its name
 * and what its record could tell, the rest 0 or "". */
json_t *api_subvolume_to_json(const StoreSubvolumeInfo *info);

/* JSON of the store's state, as GetStatus returns it. */
json_t *api_usage_to_json(const StoreUsage *usage);

/* Parses a method's JSON options: an object whose keys must all be among
 * the allowed ones, each of the JSON type given ('s' string, 'b' boolean,
 * 'u' unsigned integer, 'i' a user or group ID: below 2^32 - 1). "" or
 * "{}" is an empty object. On a mistake, sets error
 * (API_ERROR_INVALID_JSON) with a sentence and returns -EINVAL. */
typedef struct ApiOption {
        const char *key;
        char type;
} ApiOption;

int api_parse_options(const char *text, const ApiOption *allowed, json_t **ret, sd_bus_error *error);

/* Returns the value of key, or the default when the key is absent. */
const char *api_option_string(json_t *options, const char *key, const char *def);
bool api_option_bool(json_t *options, const char *key, bool def);
uint64_t api_option_uint(json_t *options, const char *key, uint64_t def);

/* Compact JSON text (the caller frees it), or NULL. */
char *api_json_text(json_t *json);

/* Replies a method call with one JSON document as its "s" result. */
int api_reply_json(sd_bus_message *message, json_t *json);
