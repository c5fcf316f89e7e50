#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A crash loop: writers create, fsync and remove files while snapshots are
taken and deleted, and the FUSE server, and now and then a reaper at work,
are killed with SIGKILL at random moments, again and again. After every
kill the store opens; at the end every file whose fsync returned reads back
exactly, every file whose removal was fsync'd is gone, fsck finds the store
consistent, scrub finds no damage, and a reap gives back the space of the
half-done work.

  COWBOX_CRASHLOOP_KILLS=N    server kills (default 200)

Packs are made small (1 MiB), so that servers move on to new packs all the
time while reapers reclaim what dead writers left.
  COWBOX_SEED=N               replay a run (the seed is printed)
"""

import errno
import os
import random
import signal
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB  # noqa: E402

DEAD_MOUNT = (errno.ENOTCONN, errno.ECONNABORTED, errno.EIO, errno.ENOENT)
SIZES = [0, 300, 3000, 5000, 64 * KiB, 100 * KiB + 7, 300 * KiB]


class Ledger:
    """What the store must hold: files whose fsync returned (durable), and
    files whose fate the crash decides (maybe: their possible contents, None
    for absent)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.durable = {}
        self.maybe = {}

    def attempt(self, name, data):
        with self.lock:
            self.maybe[name] = [data]

    def synced(self, name, data):
        with self.lock:
            self.maybe.pop(name, None)
            self.durable[name] = data

    def pick_and_remove(self, rnd):
        """A durable file to remove, taken out of durable at once so that
        two writers never pick the same."""
        with self.lock:
            if not self.durable:
                return None
            name = rnd.choice(sorted(self.durable))
            self.maybe[name] = [self.durable.pop(name), None]
            return name

    def removed(self, name):
        with self.lock:
            self.maybe.pop(name, None)


def write_synced(root_fd, name, data):
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644, dir_fd=root_fd)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def writer(root_fd, ledger, cycle, index, seed, stop):
    """Works through a descriptor of the mount's root, opened while it was
    mounted, never by path: once the dead mount is cleaned up, a path would
    lead to the directory below it, and writes there would succeed."""
    rnd = random.Random(seed)
    n = 0
    try:
        while not stop.is_set():
            victim = ledger.pick_and_remove(rnd) if rnd.random() < 0.25 else None
            if victim:
                os.unlink(victim, dir_fd=root_fd)
                os.fsync(root_fd)
                ledger.removed(victim)
                continue
            name = f'c{cycle}-w{index}-{n}'
            n += 1
            data = t.random_bytes(rnd.choice(SIZES), rnd.getrandbits(32))
            ledger.attempt(name, data)
            write_synced(root_fd, name, data)
            ledger.synced(name, data)
    except OSError as e:
        if e.errno not in DEAD_MOUNT:
            raise


def kill_a_reaper(store, rnd):
    """Starts a reaper with work to do and kills it at a random moment."""
    p = subprocess.Popen([t.tool(), '--store', store.path, 'reap', '--wait'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(rnd.uniform(0, 0.05))
    p.send_signal(signal.SIGKILL)
    p.wait()


def describe_holder(store):
    """Who holds the subvolume: for a failure message."""
    try:
        pid = store.show('loop')['mounted_by']
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            cmd = f.read().replace(b'\0', b' ').decode(errors='replace')
        with open(f'/proc/{pid}/status') as f:
            state = next((line.strip() for line in f if line.startswith('State:')), '?')
        return f'pid {pid}: {cmd} ({state})'
    except (OSError, KeyError, t.Failure) as e:
        return f'unknown ({e})'


def one_cycle(store, m, ledger, cycle, rnd):
    try:
        m.mount()
    except t.Failure:
        print(f'cycle {cycle}: the subvolume is held by {describe_holder(store)}', flush=True)
        raise
    stop = threading.Event()
    root_fd = os.open(m.path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    threads = [threading.Thread(target=writer, args=(root_fd, ledger, cycle, i, rnd.getrandbits(32), stop))
               for i in range(2)]
    failures = []

    def guarded(th):
        try:
            th.run()
        except BaseException as e:  # reported below, not lost in the thread
            failures.append(e)

    runners = [threading.Thread(target=guarded, args=(th,)) for th in threads]
    for th in runners:
        th.start()

    time.sleep(rnd.uniform(0.01, 0.12))
    if cycle % 7 == 3:
        # A snapshot through the server, deleted at once: work for a reaper.
        store.run('subvolume', 'snapshot', 'loop', f'snap-{cycle}', expect=None)
        store.run('subvolume', 'delete', '--no-reap', f'snap-{cycle}', expect=None)
    if cycle % 10 == 5:
        kill_a_reaper(store, rnd)
    time.sleep(rnd.uniform(0, 0.12))

    m.kill()
    stop.set()
    for th in runners:
        th.join(timeout=60)
        t.check(not th.is_alive(), 'a writer hangs on a dead mount')
    try:
        os.close(root_fd)
    except OSError:
        pass  # its mount is gone
    if failures:
        raise failures[0]


def verify(m, ledger):
    for name, data in sorted(ledger.durable.items()):
        try:
            got = t.read_file(m.p(name))
        except OSError as e:
            t.fail(f"{name}: fsync'd before a crash, now {e}")
        t.check_bytes(got, data, f"{name} (fsync'd before a crash)")
    for name, options in sorted(ledger.maybe.items()):
        if not os.path.exists(m.p(name)):
            continue  # never synced, or its removal was under way: either is right
        got = t.read_file(m.p(name))
        contents = [o for o in options if o is not None]
        t.check(contents, f'{name} exists, but its removal was fsync\'d')
        t.check(len(got) <= max(len(o) for o in contents), f'{name}: longer than ever written')
        for off in range(0, len(got), 4096):
            page = got[off:off + 4096]
            t.check(page == bytes(len(page)) or any(o[off:off + len(page)] == page for o in contents),
                    f'{name}: the page at {off} is neither written data nor zeros')
    expected = set(ledger.durable) | set(ledger.maybe)
    extra = sorted(set(os.listdir(m.path)) - expected)
    t.check(not extra, f'files that were never written: {extra[:10]}')


def run():
    t.require_fuse()
    kills = t.env_int('COWBOX_CRASHLOOP_KILLS', 200)
    seed = t.env_int('COWBOX_SEED', random.SystemRandom().getrandbits(32))
    print(f'seed {seed}, {kills} kills (replay: COWBOX_SEED={seed})', flush=True)
    rnd = random.Random(seed)
    ledger = Ledger()
    os.environ['COWBOX_PACK_MAX_BYTES'] = str(1024 * 1024)
    with t.Store('crashloop') as store:
        store.create('loop')
        m = store.mount('loop')
        try:
            for cycle in range(kills):
                one_cycle(store, m, ledger, cycle, rnd)
                if cycle % 50 == 49:
                    m.mount()
                    try:
                        verify(m, ledger)
                    finally:
                        m.unmount()
                    print(f'{cycle + 1} kills: {len(ledger.durable)} fsync\'d files verified', flush=True)
        except BaseException:
            print(f'failed with seed {seed} (replay: COWBOX_SEED={seed})', flush=True)
            raise

        store.fsck()
        m.mount()
        try:
            verify(m, ledger)
        finally:
            m.unmount()
        store.reap()
        store.fsck()
        store.run('scrub')

        # What is left after the reap is what the files use.
        usage = store.usage()
        logical = sum(len(d) for d in ledger.durable.values())
        t.check(usage['pack_file_bytes'] <= 2 * logical + 16 * 1024 * 1024,
                f"pack files take {usage['pack_file_bytes']} bytes for {logical} bytes of files: "
                'the space of half-done work was not reclaimed')
        print(f"{kills} kills; {len(ledger.durable)} fsync'd files intact; pack files "
              f"{usage['pack_file_bytes']} bytes for {logical} logical", flush=True)


t.main(run)
