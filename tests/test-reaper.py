#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The reaper can be paused, and runs at a bounded rate: while paused no
reaper frees anything (the space stays reclaimable, and a reap says it is
paused); after resuming, a reaper limited to 2 MiB/s takes at least as long
as the rate says to free what was deleted, and frees all of it."""

import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import MiB  # noqa: E402

DATA = 8 * MiB
RATE = 2 * MiB


def fill(store, name, seed):
    store.create(name)
    with store.mount(name) as m:
        for i in range(4):
            t.write_file(m.p(f'f{i}'), t.random_bytes(DATA // 4, seed * 10 + i), fsync=True)


def run():
    t.require_fuse()
    with t.Store('reaper') as store:
        fill(store, 'a', 1)
        fill(store, 'b', 2)
        store.run('reap', '--pause')
        store.delete('a', reap=False)
        store.run('subvolume', 'delete', 'b')   # starts a background reaper, which must wait
        r = store.run('reap', expect=1)
        t.check('paused' in r.err, f'reap while paused:\n{r.describe()}')
        time.sleep(1)
        usage = store.usage()
        t.check(usage['reclaimable_bytes'] >= 2 * DATA,
                f"reclaimable bytes while paused: {usage['reclaimable_bytes']}, expected at least {2 * DATA}")

        settings = store.json('reap', '--resume', '--rate', '2M')
        t.check_equal(settings, {'paused': False, 'rate_bytes_per_sec': RATE}, 'reaper settings')
        start = time.monotonic()
        store.run('reap', '--wait', timeout=120)
        seconds = time.monotonic() - start
        freed = usage['data_bytes'] - store.usage()['data_bytes']
        print(f'freed {freed} bytes in {seconds:.2f} s at a limit of {RATE} bytes/s', flush=True)
        t.check(freed >= 2 * DATA, f'the reaper freed {freed} bytes of {2 * DATA}')
        t.check(seconds >= 0.8 * freed / RATE,
                f'{freed} bytes freed in {seconds:.2f} s: faster than the limit of {RATE} bytes/s')
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'reclaimable bytes after the reap')
        store.run('reap', '--rate', 'none')
        store.fsck()


t.main(run)
