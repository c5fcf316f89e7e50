/* SPDX-License-Identifier: LGPL-2.1-or-later */

/* Job objects: /org/cowbox1/job/ID, while the job runs. */

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "cleanup.h"
#include "manager.h"

static Job *job_from_path(Manager *m, const char *path) {
        const char *id = path + strlen(API_JOB_PREFIX);
        char *end = NULL;
        unsigned long v;

        if (strncmp(path, API_JOB_PREFIX "/", strlen(API_JOB_PREFIX) + 1) != 0)
                return NULL;
        v = strtoul(id + 1, &end, 10);
        if (!end || *end || v == 0 || v > UINT32_MAX)
                return NULL;
        return manager_find_job(m, (uint32_t) v);
}

int job_object_find(sd_bus *bus, const char *path, const char *interface, void *userdata,
                    void **found, sd_bus_error *error) {
        Job *j = job_from_path(userdata, path);

        if (!j)
                return 0;
        *found = j;
        return 1;
}

int job_node_enumerator(sd_bus *bus, const char *path, void *userdata, char ***nodes, sd_bus_error *error) {
        Manager *m = userdata;
        char **list;
        size_t k = 0;

        list = calloc(m->n_jobs + 1, sizeof *list);
        if (!list)
                return -ENOMEM;
        for (Job *j = m->jobs; j; j = j->next)
                if (api_job_path(j->id, &list[k]) >= 0)
                        k++;
        *nodes = list;
        return 0;
}

static int property_get(sd_bus *bus, const char *path, const char *interface, const char *property,
                        sd_bus_message *reply, void *userdata, sd_bus_error *error) {
        Job *j = userdata;

        if (strcmp(property, "Id") == 0)
                return sd_bus_message_append(reply, "u", j->id);
        if (strcmp(property, "Type") == 0)
                return sd_bus_message_append(reply, "s", job_type_to_string(j->type));
        if (strcmp(property, "Target") == 0)
                return sd_bus_message_append(reply, "s", j->target);
        if (strcmp(property, "State") == 0)
                return sd_bus_message_append(reply, "s", job_state_to_string(j->state));
        if (strcmp(property, "BytesDone") == 0)
                return sd_bus_message_append(reply, "t", j->bytes_done);
        if (strcmp(property, "BytesTotal") == 0)
                return sd_bus_message_append(reply, "t", j->bytes_total);
        /* Progress: 0..1, or -1 while the total is unknown. */
        return sd_bus_message_append(reply, "d", j->bytes_total > 0 ?
                                     (double) MIN(j->bytes_done, j->bytes_total) / (double) j->bytes_total : -1.0);
}

static int method_cancel(sd_bus_message *message, void *userdata, sd_bus_error *error) {
        Job *j = userdata;
        int r;

        r = manager_check_caller(message, error);
        if (r < 0)
                return r;
        r = job_cancel(j);
        if (r < 0)
                return sd_bus_error_setf(error, API_ERROR_NO_SUCH_JOB, "Job %" PRIu32 " is not running.", j->id);
        return sd_bus_reply_method_return(message, NULL);
}

int job_send_changed(Job *j) {
        _cleanup_free_ char *path = NULL;
        int r;

        r = api_job_path(j->id, &path);
        if (r < 0)
                return r;
        return sd_bus_emit_properties_changed(j->manager->bus, path, API_JOB_INTERFACE, "BytesDone", "BytesTotal",
                                              "Progress", NULL);
}

int job_send_new(Job *j) {
        _cleanup_free_ char *path = NULL;
        int r;

        r = api_job_path(j->id, &path);
        if (r < 0)
                return r;
        r = sd_bus_emit_signal(j->manager->bus, API_MANAGER_PATH, API_MANAGER_INTERFACE, "JobNew", "uo", j->id,
                               path);
        if (r < 0)
                return r;
        /* The object manager's clients learn of objects only from these. */
        return sd_bus_emit_interfaces_added(j->manager->bus, path, API_JOB_INTERFACE, NULL);
}

int job_send_removed(Job *j) {
        _cleanup_free_ char *path = NULL, *json = NULL;
        json_t *doc;
        int r;

        r = api_job_path(j->id, &path);
        if (r < 0)
                return r;
        if (j->state == JOB_DONE)
                json = strdup(j->result ? j->result : "{}");
        else {
                doc = json_pack("{s:i, s:s}", "errno", -j->error, "error",
                                j->error_text ? j->error_text : "the job failed");
                json = api_json_text(doc);
                json_decref(doc);
        }
        if (!json)
                return -ENOMEM;
        r = sd_bus_emit_signal(j->manager->bus, API_MANAGER_PATH, API_MANAGER_INTERFACE, "JobRemoved", "uoss",
                               j->id, path, job_state_to_string(j->state), json);
        if (r < 0)
                return r;
        return sd_bus_emit_interfaces_removed(j->manager->bus, path, API_JOB_INTERFACE, NULL);
}

const sd_bus_vtable job_vtable[] = {
        SD_BUS_VTABLE_START(0),
        SD_BUS_PROPERTY("Id", "u", property_get, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Type", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("Target", "s", property_get, 0, SD_BUS_VTABLE_PROPERTY_CONST),
        SD_BUS_PROPERTY("State", "s", property_get, 0, 0),
        SD_BUS_PROPERTY("BytesDone", "t", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("BytesTotal", "t", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_PROPERTY("Progress", "d", property_get, 0, SD_BUS_VTABLE_PROPERTY_EMITS_CHANGE),
        SD_BUS_METHOD_WITH_ARGS("Cancel", SD_BUS_NO_ARGS, SD_BUS_NO_RESULT, method_cancel,
                                SD_BUS_VTABLE_UNPRIVILEGED),
        SD_BUS_VTABLE_END
};
