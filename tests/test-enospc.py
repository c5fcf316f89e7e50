#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""A full disk: the store lives on a small ext4 file system on a loop file.
Several writers fill it through the mount until writes or fsyncs fail with
ENOSPC; a write() on the full disk fails itself, not a later close();
everything fsync'd before reads back intact, also after a remount;
unlinking and deleting work on the full disk; after a reap the space is back
and writing works again, with no repair; fsck finds the store consistent.
When another program fills the disk, the store gives back the reserve file
it keeps for that, and still opens, deletes and reaps, and cuts a large
file with SQLite's temporary directory on the full disk; on a disk a user
filled, the store (root) removes files with root's share of it."""

import errno
import os
import shutil
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402

FS_SIZE = 64 * MiB
WRITERS = 3
CHUNK = 256 * KiB


def make_small_fs(store, name='fs', root_percent=0):
    t.require_root('mounts an ext4 file system on a loop file')
    t.require_program('mkfs.ext4')
    image = os.path.join(store.tmp, f'{name}.img')
    with open(image, 'wb') as f:
        f.truncate(FS_SIZE)
    # By default no blocks kept for root: what another program (root)
    # fills is all there is, as on a disk of users' files.
    t.run_command(['mkfs.ext4', '-q', '-F', '-m', str(root_percent), image])
    fs = store.new_dir(name)
    r = t.run_command(['mount', '-o', 'loop', image, fs], expect=None)
    if r.code != 0:
        t.skip(f'cannot mount a loop file here: {r.err.strip()}')
    return fs


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
            # statfs does not count the room the store keeps back, which
            # no write may use: tools that check before they write (dpkg,
            # git) would be told that 4 MiB fit.
            st = os.statvfs(m.path)
            t.check(st.f_bavail * st.f_frsize < 4 * MiB,
                    f'statfs says {st.f_bavail * st.f_frsize} bytes are available on the full disk, '
                    f'where a write of 4 MiB failed')
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
            t.check(t.free_bytes(fs) > FS_SIZE // 2, f'only {t.free_bytes(fs)} bytes free after unlinking and reaping')
            t.write_file(m.p('after-reap'), t.random_bytes(4 * MiB, 2), fsync=True)
            t.check_bytes(t.read_file(m.p('after-reap')), t.random_bytes(4 * MiB, 2), 'a file written after the reap')

        store.fsck()
        store.delete('vol', reap=False)
        store.reap()
        usage = store.usage()
        t.check_equal(usage['data_bytes'], 0, 'data bytes after deleting everything and reaping')
        t.check(t.free_bytes(fs) > FS_SIZE // 2, f'only {t.free_bytes(fs)} bytes free after the reap')

        # The store works normally again, without repair.
        store.create('again')
        with store.mount('again') as m:
            synced = fill(m.path)
        with store.mount('again') as m:
            verify(m.path, synced, 'fsync\'d data after a remount')
        store.fsck()
        store.delete('again', reap=False)
        store.reap()

        test_filled_by_others(store, fs)
        test_temporary_files(store, fs)
        test_unsynced_writers(store, fs)
        test_remove_on_full_disk(store, fs)
        subprocess.run(['sync'])
    test_filled_by_a_user()


def test_filled_by_others(store, fs):
    """Another program fills the disk: the store gives back its reserve
    file, so that what a mount accepted before is committed, and the store
    still opens, deletes and reaps (a fold, which copies a layer, waits for
    the space); it takes the reserve again once there is room."""
    reserve = os.path.join(store.path, 'reserve')
    t.check(os.path.isfile(reserve), 'the store keeps a reserve file while there is room')
    reserve_size = os.stat(reserve).st_blocks * 512
    t.check(reserve_size >= 4 * MiB, f'the reserve file holds {reserve_size} bytes')
    t.check_equal(store.usage().get('reserve_bytes'), os.stat(reserve).st_size, 'usage: reserve_bytes')

    # A fold to come of a layer larger than the reserve (large xattrs live
    # in the layer's database).
    store.create('base')
    attrs = {f'x{i}': t.random_bytes(60 * KiB, 100 + i) for i in range(100)}
    with store.mount('base') as m:
        for name, value in attrs.items():
            t.write_file(m.p(name), name.encode())
            os.setxattr(m.p(name), 'user.big', value)
    store.snapshot('base', 'base-snap')
    store.delete('base-snap', reap=False)
    store.reap()        # drops the snapshot's layer: base's two layers are left to fold
    store.create('big')
    with store.mount('big') as m:
        t.write_file(m.p('data'), t.random_bytes(16 * MiB, 7), fsync=True)

    # Written before the disk fills, committed after: with the reserve.
    store.create('live')
    unsynced = t.random_bytes(MiB, 8)
    with store.mount('live') as m:
        fd = os.open(m.p('unsynced'), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            t.check_equal(os.write(fd, unsynced), MiB, 'a write before the disk fills')
            filler = t.fill_file_system(fs)
            try:
                os.fsync(fd)
            except OSError as e:
                os.unlink(filler)
                t.fail(f'fsync of a write accepted before another program filled the disk: {e}')
        finally:
            os.close(fd)
        time.sleep(0.2)     # the server looks at the free space at most every 100 ms
        t.expect_errno(errno.ENOSPC, t.write_file, m.p('more'), b'x' * 100, what='a new file on the full disk')
    try:
        t.check_equal(store.names(), ['base', 'big', 'live'], 'subvolumes listed on a disk another program filled')
        t.check(not os.path.exists(reserve), 'the reserve file is still there on the full disk')
        t.check_equal(store.usage().get('reserve_bytes'), 0, 'usage on the full disk: reserve_bytes')
        store.delete('big', reap=False)
        r = store.run('reap', '--wait')
        t.check(t.free_bytes(fs) >= 8 * MiB, f'only {t.free_bytes(fs)} bytes free after deleting and reaping '
                f'16 MiB on the full disk:\n{r.describe()}')
        with store.mount('base', readonly=True) as m:
            for name, value in attrs.items():
                t.check_bytes(os.getxattr(m.p(name), 'user.big'), value, f'base: the xattr of {name}')
    finally:
        os.unlink(filler)
    store.reap()
    store.names()
    t.check(os.path.isfile(reserve), f'no reserve file with {t.free_bytes(fs)} bytes free')
    t.check(os.stat(reserve).st_blocks * 512 >= reserve_size,
            f'the reserve file made again holds {os.stat(reserve).st_blocks * 512} bytes, not {reserve_size}')
    with store.mount('base') as m:
        for name, value in attrs.items():
            t.check_bytes(os.getxattr(m.p(name), 'user.big'), value, f'base after its fold: the xattr of {name}')
    with store.mount('live') as m:
        t.check_bytes(t.read_file(m.p('unsynced')), unsynced, 'the file fsync\'d on the full disk, remounted')
    store.fsck()



def test_unsynced_writers(store, fs):
    """Two mounts of two subvolumes, written at once without fsync until
    write() fails: neither process sees what the other holds in memory, yet
    everything write() accepted commits, and reads back after a remount."""
    files, errors = [{}, {}], [None, None]

    def writer(i, root):
        for n in range(100000):
            seed = 1000 * (i + 1) + n
            try:
                with open(os.path.join(root, f'f{n}'), 'wb') as f:
                    f.write(t.random_bytes(60 * KiB, seed))
            except OSError as e:
                errors[i] = e
                return
            files[i][f'f{n}'] = seed

    for i in range(2):
        store.create(f'unsynced{i}')
    with store.mount('unsynced0') as a, store.mount('unsynced1') as b:
        threads = [threading.Thread(target=writer, args=(i, m.path)) for i, m in enumerate((a, b))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        for i, m in enumerate((a, b)):
            t.check(files[i], f'writer {i} wrote nothing')
            t.check(errors[i] and errors[i].errno == errno.ENOSPC, f'writer {i} stopped with {errors[i]}, not ENOSPC')
            try:
                t.fsync_dir(m.path)
                for name in files[i]:
                    fd = os.open(m.p(name), os.O_RDONLY)
                    try:
                        os.fsync(fd)
                    finally:
                        os.close(fd)
            except OSError as e:
                t.fail(f'mount {i}: a commit of what write() accepted failed: {e}')
    for i in range(2):
        with store.mount(f'unsynced{i}', readonly=True) as m:
            for name, seed in sorted(files[i].items()):
                t.check_bytes(t.read_file(m.p(name)), t.random_bytes(60 * KiB, seed), f'unsynced{i}/{name}')
        store.delete(f'unsynced{i}', reap=False)
    store.reap()
    store.fsck()


def test_remove_on_full_disk(store, fs):
    """rm -rf of a tree of a layer below, on a disk another program filled:
    each removal adds a row that hides the name below. Removals go on
    while the reserve allows, then fail with ENOSPC, never EIO; each one
    that succeeded stays done after a remount; the store checks clean, and
    deletes and reaps."""
    store.create('names')
    long = 'n' * 200
    paths = []
    with store.mount('names') as m:
        for d in range(16):
            os.mkdir(m.p(f'd{d}'))
            for i in range(1000):
                paths.append(f'd{d}/{long}{i}')
                open(m.p(paths[-1]), 'wb').close()
    store.snapshot('names', 'names-snap', readonly=True)
    filler = t.fill_file_system(fs)
    try:
        failed = set()
        with store.mount('names') as m:
            for path in paths:
                try:
                    os.unlink(m.p(path))
                except OSError as e:
                    t.check_equal(errno.errorcode.get(e.errno), 'ENOSPC', f'unlink of {path[:20]}...: the error')
                    failed.add(path)
            t.fsync_dir(m.path)
        print(f'{len(paths) - len(failed)} of {len(paths)} names removed on the full disk', flush=True)
        t.check(len(failed) < len(paths), 'no name could be removed with the reserve given back')
        with store.mount('names', readonly=True) as m:
            left = {os.path.join(d, n) for d in os.listdir(m.path) for n in os.listdir(m.p(d))}
        t.check_equal(len(left), len(failed), 'names left after a remount')
        t.check(left == failed, 'the names left are those whose removal failed')
        store.fsck()
        store.delete('names', reap=False)
        store.delete('names-snap', reap=False)
        store.run('reap', '--wait')
    finally:
        os.unlink(filler)
    store.reap()
    store.fsck()


FILL_AS_USER = """
import errno, os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
size = 4 << 20
while size >= 4096:
    try:
        os.posix_fallocate(fd, os.fstat(fd).st_size, size)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        size //= 2
os.fsync(fd)
"""


def test_filled_by_a_user():
    """A user (not root) fills a disk that keeps blocks for root, also the
    reserve file the store gave back: the store's server, root, removes
    the names of a layer below with root's share of the disk, and the
    store deletes and reaps."""
    if not shutil.which('setpriv'):
        print('SKIP: a disk a user filled: setpriv not found', flush=True)
        return
    with t.Store('enospc-user', init=False) as store:
        fs = make_small_fs(store, 'user-fs', root_percent=10)
        store.path = os.path.join(fs, 'store')
        store.run('init')
        store.create('names')
        names = [f'{"n" * 200}{i}' for i in range(3000)]
        with store.mount('names') as m:
            for name in names:
                open(m.p(name), 'wb').close()
        store.snapshot('names', 'names-snap', readonly=True)
        public = os.path.join(fs, 'public')
        os.mkdir(public)
        os.chmod(public, 0o1777)
        filler = os.path.join(public, 'filler')
        fill = ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', sys.executable, '-c',
                FILL_AS_USER, filler]
        t.run_command(fill)
        store.names()           # the store gives its reserve back
        t.run_command(fill)     # and the user takes it
        st = os.statvfs(fs)
        t.check(st.f_bavail * st.f_frsize < MiB and st.f_bfree * st.f_frsize > 4 * MiB,
                f'a disk a user filled: {st.f_bavail * st.f_frsize} bytes free for users, '
                f'{st.f_bfree * st.f_frsize} for root')
        with store.mount('names') as m:
            for name in names:
                os.unlink(m.p(name))
            t.fsync_dir(m.path)
        with store.mount('names', readonly=True) as m:
            t.check_equal(os.listdir(m.path), [], 'names left after removing all on a disk a user filled')
        store.delete('names', reap=False)
        store.delete('names-snap', reap=False)
        store.run('reap', '--wait')
        store.fsck()
        os.unlink(filler)


def test_temporary_files(store, fs):
    """A file of 4,096 blocks cut to nothing on a disk another program
    filled, with the server's temporary directory on that disk (as when
    /var/tmp and the store share the root file system): undoing a change
    that fails must not need a temporary file of its own."""
    tmp = os.path.join(fs, 'tmp')
    os.mkdir(tmp)
    block = t.random_bytes(64 * KiB, 9)    # the same block: stored once
    store.create('huge')
    with store.mount('huge', env={'TMPDIR': tmp}) as m:
        with open(m.p('file'), 'wb') as f:
            for i in range(4096):
                f.write(block)
                if i % 64 == 63:        # what is dirty in memory holds its room on the disk
                    f.flush()
                    os.fsync(f.fileno())
        filler = t.fill_file_system(fs)
        try:
            os.truncate(m.p('file'), 0)
            t.fsync_dir(m.path)
        except OSError as e:
            t.fail(f'cutting a file of 4,096 blocks to nothing on the full disk: {e}')
        finally:
            os.unlink(filler)
    with store.mount('huge', readonly=True) as m:
        t.check_equal(os.stat(m.p('file')).st_size, 0, 'the size of the file cut on the full disk')
    store.delete('huge', reap=False)
    store.reap()
    store.fsck()


t.main(run)
