#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A full disk: the store lives on a small ext4 file system on a loop file.
Several writers fill it through the mount until writes or fsyncs fail with
ENOSPC; a write() on the full disk fails itself, not a later close();
everything fsync'd before reads back intact, also after a remount;
unlinking and deleting work on the full disk; after a reap the space is back
and writing works again, with no repair; fsck finds the store consistent."""

import errno
import os
import subprocess
import sys
import threading

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402

FS_SIZE = 64 * MiB
WRITERS = 3
CHUNK = 256 * KiB


def make_small_fs(store):
    t.require_root('mounts an ext4 file system on a loop file')
    t.require_program('mkfs.ext4')
    image = os.path.join(store.tmp, 'fs.img')
    with open(image, 'wb') as f:
        f.truncate(FS_SIZE)
    t.run_command(['mkfs.ext4', '-q', '-F', image])
    fs = store.new_dir('fs')
    r = t.run_command(['mount', '-o', 'loop', image, fs], expect=None)
    if r.code != 0:
        t.skip(f'cannot mount a loop file here: {r.err.strip()}')
    return fs


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


class Writer(threading.Thread):
    """Writes files of random data, fsyncing each one, until the disk is
    full; remembers what was fsync'd."""

    def __init__(self, root, index):
        super().__init__(daemon=True)
        self.root, self.index = root, index
        self.synced = {}        # name -> seed and size of what fsync acknowledged
        self.error = None       # errno that stopped it
        self.unexpected = None

    def run(self):
        n = 0
        try:
            while True:
                path = os.path.join(self.root, f'w{self.index}-{n}')
                size = CHUNK * (1 + (n % 8))
                seed = self.index * 100000 + n
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                try:
                    _, error = write_all(fd, t.random_bytes(size, seed))
                    if error:
                        raise error
                    os.fsync(fd)
                finally:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self.synced[os.path.basename(path)] = (seed, size)
                n += 1
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                self.error = e.errno
            else:
                self.unexpected = e


def write_all(fd, data):
    """Writes data as programs do, again after a short write, until all of
    it is written or a write() fails; returns the bytes accepted and the
    OSError or None. (A write() larger than the server's largest WRITE is
    cut in several: it returns short when a later part finds the disk
    full.)"""
    accepted = 0
    try:
        while accepted < len(data):
            accepted += os.write(fd, data[accepted:])
    except OSError as e:
        return accepted, e
    return accepted, None


def fill(root):
    writers = [Writer(root, i) for i in range(WRITERS)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=300)
        t.check(not w.is_alive(), f'writer {w.index} still writing after 300 s on a {FS_SIZE >> 20} MiB disk')
        t.check(w.unexpected is None, f'writer {w.index} failed with {w.unexpected}, not ENOSPC')
        t.check(w.error is not None, f'writer {w.index} stopped without an error')
    synced = {}
    for w in writers:
        synced.update(w.synced)
    total = sum(size for _, size in synced.values())
    print(f'{len(synced)} files, {total >> 20} MiB fsync\'d before ENOSPC', flush=True)
    t.check(total > FS_SIZE // 4, f'only {total} bytes fit on a {FS_SIZE} byte disk')
    return synced


def verify(root, synced, what):
    for name, (seed, size) in sorted(synced.items()):
        t.check_bytes(t.read_file(os.path.join(root, name)), t.random_bytes(size, seed), f'{what}: {name}')


def run():
    t.require_fuse()
    with t.Store('enospc', init=False) as store:
        fs = make_small_fs(store)
        store.path = os.path.join(fs, 'store')
        store.run('init')
        store.create('vol')

        with store.mount('vol') as m:
            synced = fill(m.path)
            # Reads stay possible, and metadata operations get a clear error.
            verify(m.path, synced, 'fsync\'d data on the full disk')
            t.expect_errno([errno.ENOSPC], t.write_file, m.p('one-more'), t.random_bytes(4 * MiB, 1),
                           fsync=True, what='a write on the full disk')
            # Every write() reaches the server before it returns: the full
            # disk fails a write() itself, never a later close() that few
            # check; the file holds what it held and what write() accepted,
            # and truncating it back works on the full disk.
            name = min(synced)
            seed, size = synced[name]
            extra = t.random_bytes(4 * MiB, 3)
            fd = os.open(m.p(name), os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
            try:
                accepted, error = write_all(fd, extra)
                t.check(error is not None and error.errno == errno.ENOSPC,
                        f'appending 4 MiB without fsync on the full disk: {accepted} bytes accepted, '
                        f'then {error or "no error"}, not ENOSPC')
                t.check_bytes(t.read_file(m.p(name)), t.random_bytes(size, seed) + extra[:accepted],
                              f'{name} after appending to it failed on the full disk')
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
            verify(m.path, {name: synced[name]}, 'a file cut back to its size on the full disk')
            # Unlinking works on the full disk; its space comes back once
            # reaped, while the subvolume stays mounted.
            for name in synced:
                os.unlink(m.p(name))
            t.fsync_dir(m.path)
            store.reap()
            t.check(free_bytes(fs) > FS_SIZE // 2, f'only {free_bytes(fs)} bytes free after unlinking and reaping')
            t.write_file(m.p('after-reap'), t.random_bytes(4 * MiB, 2), fsync=True)
            t.check_bytes(t.read_file(m.p('after-reap')), t.random_bytes(4 * MiB, 2), 'a file written after the reap')

        store.fsck()
        store.delete('vol', reap=False)
        store.reap()
        usage = store.usage()
        t.check_equal(usage['data_bytes'], 0, 'data bytes after deleting everything and reaping')
        t.check(free_bytes(fs) > FS_SIZE // 2, f'only {free_bytes(fs)} bytes free after the reap')

        # The store works normally again, without repair.
        store.create('again')
        with store.mount('again') as m:
            synced = fill(m.path)
        with store.mount('again') as m:
            verify(m.path, synced, 'fsync\'d data after a remount')
        store.fsck()
        subprocess.run(['sync'])


t.main(run)
