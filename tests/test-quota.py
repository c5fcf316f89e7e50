#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A subvolume's quota: writes that would pass the limit fail with EDQUOT
(at write or at fsync, as the page cache decides), everything written and
fsync'd before stays intact, removing files makes room, a raised limit
applies to the mounted subvolume within seconds, and snapshots keep the
limit of their source."""

import errno
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402


def write_synced(path, data):
    """Writes and fsyncs; returns None or the errno that stopped it."""
    try:
        t.write_file(path, data, fsync=True)
    except OSError as e:
        return e.errno
    return None


def run():
    t.require_fuse()
    with t.Store('quota') as store:
        store.create('ws')
        store.run('subvolume', 'set-quota', 'ws', '2M')
        t.check_equal(store.show('ws')['quota_bytes'], 2 * MiB, 'quota_bytes after set-quota 2M')

        first = t.random_bytes(1536 * KiB, 1)
        with store.mount('ws') as m:
            t.check_equal(write_synced(m.p('first'), first), None, 'writing 1.5 MiB under a 2 MiB quota')
            err = write_synced(m.p('second'), t.random_bytes(1 * MiB, 2))
            t.check_equal(err, errno.EDQUOT, 'writing 1 MiB more: the error')
            t.check_bytes(t.read_file(m.p('first')), first, 'the file written before the quota was reached')
            # Small files still fit, up to the limit.
            t.check_equal(write_synced(m.p('small'), b'x' * 1000), None, 'a small file under the limit')

            # Room comes back when files go.
            os.unlink(m.p('second'))
            os.unlink(m.p('first'))
            t.check_equal(write_synced(m.p('third'), t.random_bytes(1 * MiB, 3)), None,
                          'writing 1 MiB after removing files')

            # A raised limit reaches the mounted subvolume.
            store.run('subvolume', 'set-quota', 'ws', '8M')
            deadline = time.monotonic() + 10
            while True:
                err = write_synced(m.p('big'), t.random_bytes(4 * MiB, 4))
                if err is None or time.monotonic() > deadline:
                    break
                time.sleep(0.25)
            t.check_equal(err, None, 'writing 4 MiB within 10 s of raising the quota to 8 MiB')
        with store.mount('ws') as m:
            t.check_bytes(t.read_file(m.p('big')), t.random_bytes(4 * MiB, 4), 'the file written after the raise')

        store.snapshot('ws', 'ws-snap')
        t.check_equal(store.show('ws-snap')['quota_bytes'], 8 * MiB, 'quota of a snapshot')
        store.run('subvolume', 'set-quota', 'ws', 'none')
        t.check_equal(store.show('ws')['quota_bytes'], 0, 'quota_bytes after set-quota none')
        with store.mount('ws') as m:
            t.check_equal(write_synced(m.p('huge'), t.random_bytes(12 * MiB, 5)), None, 'writing with no quota')
        r = store.run('subvolume', 'set-quota', 'missing', '1M', expect=1)
        t.check('missing' in r.err, f'set-quota of a missing subvolume names it:\n{r.describe()}')
        store.run('subvolume', 'set-quota', 'ws', 'lots', expect=2)


t.main(run)
