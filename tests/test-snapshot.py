#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Snapshots as their users rely on them: isolated both ways, read-only ones
refuse writes, snapshots of snapshots, deleting a subvolume whose blocks a
snapshot shares, snapshots of a subvolume being written, one writable mount
at a time, allocated blocks of files over a snapshot's, space
accounting that the reaper makes good, and counts that leave out files
unlinked while open."""

import errno
import fcntl
import os
import socket
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402

J = os.path.join


def populate(root):
    t.write_file(J(root, 'small.txt'), b'a small file, stored inline\n')
    t.write_file(J(root, 'big.bin'), t.random_bytes(MiB, 1))
    t.write_file(J(root, 'text.txt'), t.pattern_bytes(300 * KiB, 1))
    os.makedirs(J(root, 'dir', 'sub'))
    t.write_file(J(root, 'dir', 'sub', 'leaf'), b'leaf')
    t.write_file(J(root, 'dir', 'gone-later'), t.random_bytes(100 * KiB, 2))
    os.symlink('small.txt', J(root, 'link'))
    os.link(J(root, 'text.txt'), J(root, 'dir', 'hard'))
    os.setxattr(J(root, 'small.txt'), 'user.origin', b'1')
    os.chmod(J(root, 'dir'), 0o750)


def change_origin(root):
    with open(J(root, 'big.bin'), 'r+b') as f:
        f.seek(500 * KiB)
        f.write(b'changed in the origin' * 1000)
    with open(J(root, 'small.txt'), 'ab') as f:
        f.write(b'appended in the origin\n')
    os.unlink(J(root, 'dir', 'gone-later'))
    t.write_file(J(root, 'new-in-origin'), t.random_bytes(200 * KiB, 3))
    os.rename(J(root, 'dir', 'sub'), J(root, 'sub-moved'))
    os.chmod(J(root, 'text.txt'), 0o600)
    os.setxattr(J(root, 'small.txt'), 'user.origin', b'2')
    os.truncate(J(root, 'text.txt'), 100 * KiB)


def change_snapshot(root):
    t.write_file(J(root, 'big.bin'), t.random_bytes(700 * KiB, 4))
    os.mkdir(J(root, 'only-in-snapshot'))
    t.write_file(J(root, 'only-in-snapshot', 'f'), b'snapshot data')
    os.unlink(J(root, 'link'))
    os.symlink('big.bin', J(root, 'link'))
    os.removexattr(J(root, 'small.txt'), 'user.origin')
    os.chown(J(root, 'dir', 'sub', 'leaf'), 1000, 1000)


def assert_manifest(path, expected, what):
    t.assert_manifests_equal(expected, t.manifest(path), what, label_a='expected', label_b='mounted')


def expect_erofs(root):
    """Every kind of change fails with EROFS."""
    e = errno.EROFS
    t.expect_errno(e, t.write_file, J(root, 'new-file'), b'x', what='create')
    t.expect_errno(e, os.open, J(root, 'small.txt'), os.O_WRONLY, what='open for writing')
    t.expect_errno(e, os.truncate, J(root, 'small.txt'), 0, what='truncate')
    t.expect_errno(e, os.mkdir, J(root, 'new-dir'), what='mkdir')
    t.expect_errno(e, os.unlink, J(root, 'small.txt'), what='unlink')
    t.expect_errno(e, os.rmdir, J(root, 'dir', 'sub'), what='rmdir')
    t.expect_errno(e, os.rename, J(root, 'small.txt'), J(root, 'renamed'), what='rename')
    t.expect_errno(e, os.chmod, J(root, 'small.txt'), 0o600, what='chmod')
    t.expect_errno(e, os.chown, J(root, 'small.txt'), 1, 1, what='chown')
    t.expect_errno(e, os.utime, J(root, 'small.txt'), ns=(1, 1), what='utimensat')
    t.expect_errno(e, os.setxattr, J(root, 'small.txt'), 'user.x', b'1', what='setxattr')
    t.expect_errno(e, os.removexattr, J(root, 'small.txt'), 'user.origin', what='removexattr')
    t.expect_errno(e, os.symlink, 'x', J(root, 'new-link'), what='symlink')
    t.expect_errno(e, os.link, J(root, 'small.txt'), J(root, 'new-hard'), what='link')
    t.expect_errno(e, os.mkfifo, J(root, 'new-fifo'), what='mkfifo')


def test_isolation(store, manifests):
    store.create('origin')
    with store.mount('origin') as m:
        populate(m.path)
        manifests['m0'] = t.manifest(m.path)
    store.snapshot('origin', 'snap')
    store.snapshot('origin', 'ro', readonly=True)
    with store.mount('origin') as m:
        assert_manifest(m.path, manifests['m0'], 'the origin right after the snapshots')
        change_origin(m.path)
        manifests['m1'] = t.manifest(m.path)
    with store.mount('snap') as m:
        assert_manifest(m.path, manifests['m0'], 'the snapshot after the origin changed')
        change_snapshot(m.path)
        manifests['m2'] = t.manifest(m.path)
    with store.mount('origin') as m:
        assert_manifest(m.path, manifests['m1'], 'the origin after the snapshot changed')
    with store.mount('snap') as m:
        assert_manifest(m.path, manifests['m2'], 'the snapshot after a remount')


def test_readonly(store, manifests):
    t.check(store.show('ro')['readonly'], 'snapshot -r is not read-only')
    with store.mount('ro') as m:
        assert_manifest(m.path, manifests['m0'], 'the read-only snapshot')
        expect_erofs(m.path)
        assert_manifest(m.path, manifests['m0'], 'the read-only snapshot after refused writes')
    with store.mount('origin', readonly=True) as m:
        expect_erofs(m.path)
    with store.mount('origin') as m:
        assert_manifest(m.path, manifests['m1'], 'the origin after a read-only mount')


def test_snapshot_of_snapshot(store, manifests):
    store.snapshot('snap', 'snap2')
    t.check_equal(store.show('snap2')['parent_uuid'], store.show('snap')['uuid'], 'parent_uuid of a snapshot of a snapshot')
    with store.mount('snap2') as m:
        assert_manifest(m.path, manifests['m2'], 'a snapshot of a snapshot')
        t.write_file(J(m.path, 'only-in-snap2'), b'x')
        os.unlink(J(m.path, 'big.bin'))
    with store.mount('snap') as m:
        assert_manifest(m.path, manifests['m2'], 'a snapshot after its own snapshot changed')
    store.snapshot('ro', 'from-ro')
    with store.mount('from-ro') as m:
        assert_manifest(m.path, manifests['m0'], 'a writable snapshot of a read-only snapshot')
        t.write_file(J(m.path, 'writable'), b'yes')
    with store.mount('ro') as m:
        assert_manifest(m.path, manifests['m0'], 'the read-only snapshot after its writable snapshot changed')


def test_delete_shared(store, manifests):
    """Deleting the origin keeps the blocks the snapshots share with it."""
    store.delete('origin')
    t.check('origin' not in store.names(), 'origin still listed after delete')
    store.reap()
    with store.mount('snap') as m:
        assert_manifest(m.path, manifests['m2'], 'the snapshot after its origin was deleted and reaped')
    with store.mount('ro') as m:
        assert_manifest(m.path, manifests['m0'], 'the read-only snapshot after its origin was deleted and reaped')
    store.run('scrub')
    store.fsck()


def control_sockets(pid):
    """The abstract names of the sockets the process pid listens on."""
    inodes = set()
    for fd in os.listdir(f'/proc/{pid}/fd'):
        try:
            target = os.readlink(f'/proc/{pid}/fd/{fd}')
        except OSError:
            continue
        if target.startswith('socket:['):
            inodes.add(target[8:-1])
    names = []
    with open('/proc/net/unix') as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if len(fields) >= 8 and fields[6] in inodes and fields[7].startswith('@cowbox/'):
                names.append(fields[7][1:])
    return names


def check_control_socket(store, pid):
    """The server's control socket takes snapshots only for those who may
    open the store: root without a descriptor of the store's directory (a
    sandbox's task on the host's network) is refused, and one that says
    nothing does not hold up the snapshots of others."""
    names = control_sockets(pid)
    t.check_equal(len(names), 1, f'control sockets of the server: {names}')
    silent = socket.socket(socket.AF_UNIX)
    silent.connect('\0' + names[0])
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(30)
            sock.connect('\0' + names[0])
            sock.sendall(b'snapshot 0 live-unproven\n')
            t.check_equal(sock.recv(16), b'1\n', 'the reply to a request without the store\'s directory')
    finally:
        silent.close()
    t.check('live-unproven' not in store.names(), 'a snapshot asked for without the store\'s directory')


def test_live_snapshot(store):
    """A snapshot of a subvolume mounted writable and being written holds
    everything fsync'd before it, and nothing written after it."""
    store.create('live')
    synced = t.random_bytes(2 * MiB, 10)
    chunk = 64 * KiB
    stream = t.random_bytes(64 * chunk, 11)
    with store.mount('live') as m:
        t.write_file(J(m.path, 'synced'), synced, fsync=True)
        t.fsync_dir(m.path)
        info = store.show('live')
        t.check_equal(info['mounted_by'], m.pid, 'mounted_by of a mounted subvolume')
        stop = threading.Event()
        written = []

        def writer():
            fd = os.open(J(m.path, 'stream'), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                i = 0
                while not stop.is_set():
                    os.pwrite(fd, stream[(i % 64) * chunk:(i % 64 + 1) * chunk], (i % 64) * chunk)
                    written.append(i)
                    i += 1
            finally:
                os.close(fd)

        th = threading.Thread(target=writer)
        th.start()
        try:
            time.sleep(0.3)
            store.snapshot('live', 'live-snap')
            time.sleep(0.2)
        finally:
            stop.set()
            th.join()
        t.check(written, 'the writer wrote nothing')
        check_control_socket(store, m.pid)
        t.write_file(J(m.path, 'after'), b'written after the snapshot', fsync=True)
        with open(J(m.path, 'synced'), 'r+b') as f:
            f.write(b'changed after the snapshot')
            os.fsync(f.fileno())
    with store.mount('live-snap') as s:
        t.check_bytes(t.read_file(J(s.path, 'synced')), synced, "fsync'd data in a snapshot taken while mounted")
        t.check(not os.path.exists(J(s.path, 'after')), 'a file created after the snapshot is in it')
        if os.path.exists(J(s.path, 'stream')):
            got = t.read_file(J(s.path, 'stream'))
            t.check(len(got) <= len(stream), f'stream is {len(got)} bytes, more than was written')
            for off in range(0, len(got), 4096):
                page = got[off:off + 4096]
                t.check(page == stream[off:off + len(page)] or page == bytes(len(page)),
                        f'stream in the snapshot: the page at {off} is neither the data written nor zeros')


# Writes files given as NAME=SIZE:SEED, says so, and keeps them open until
# its standard input closes, then appends to them. Another process: any
# close of a descriptor, also the close-on-exec of a fork of ours, would
# make the kernel write the file back to the server at once.
UNFLUSHED_WRITER = """
import os, random, sys
fds = []
for arg in sys.argv[2:]:
    name, spec = arg.split('=')
    size, seed = map(int, spec.split(':'))
    fd = os.open(os.path.join(sys.argv[1], name), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
    os.write(fd, random.Random(seed).randbytes(size))
    fds.append(fd)
print('written', flush=True)
sys.stdin.read()
for fd in fds:
    os.write(fd, b'written after the snapshot')
"""


def test_snapshot_of_unflushed(store):
    """Like btrfs, a snapshot holds every write() that returned before it,
    also to files still open and never fsync'd, small and large."""
    store.create('unflushed')
    files = {f'open-{i}': (500 + 331 * i, 20 + i) for i in range(12)}
    files.update({'large-1': (MiB + 123, 40), 'large-2': (4 * MiB, 41)})
    with store.mount('unflushed') as m:
        writer = subprocess.Popen([sys.executable, '-c', UNFLUSHED_WRITER, m.path] +
                                  [f'{name}={size}:{seed}' for name, (size, seed) in files.items()],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            t.check_equal(writer.stdout.readline().strip(), b'written', 'the writer')
            store.snapshot('unflushed', 'unflushed-snap')
        finally:
            writer.stdin.close()
            writer.wait(timeout=60)
        t.check_equal(writer.returncode, 0, 'exit status of the writer')
    with store.mount('unflushed-snap', readonly=True) as s:
        for name, (size, seed) in files.items():
            t.check_bytes(t.read_file(J(s.path, name)), t.random_bytes(size, seed),
                          f'{name}, still open and never fsync\'d, in a snapshot')


def test_snapshot_of_hidden_mount(store):
    """When the server cannot reach its own mount (another file system was
    mounted over it), the snapshot goes on with what reached the server:
    everything fsync'd is in it."""
    store.create('hidden')
    with store.mount('hidden') as m:
        t.write_file(J(m.path, 'synced'), t.random_bytes(70000, 31), fsync=True)
        t.run_command(['mount', '-t', 'tmpfs', '-o', 'size=1M', 'cover', m.path])
        try:
            store.snapshot('hidden', 'hidden-snap')
        finally:
            t.run_command(['umount', m.path])
    with store.mount('hidden-snap', readonly=True) as s:
        t.check_bytes(t.read_file(J(s.path, 'synced')), t.random_bytes(70000, 31),
                      'a fsync\'d file in a snapshot taken while the mount was covered')


def test_snapshot_while_server_starts(store):
    """A server holds the subvolume's lock from before it answers snapshots
    (it loads the layers, drops what files unlinked while open left) until
    after it stops answering them (its last commit). A snapshot asked for
    then waits for it instead of failing because the subvolume is in use.
    Here this process takes the lock as a server does and answers nothing
    for a second."""
    store.create('starting')
    with store.mount('starting') as m:
        t.write_file(m.p('kept'), b'kept', fsync=True)
    sid = store.show('starting')['id']
    with open(os.path.join(store.path, 'locks', f'subvolume-{sid}.lock'), 'r+') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        lock.write(f'{os.getpid()}\n')
        lock.truncate()
        lock.flush()
        snap = subprocess.Popen([t.tool(), '--store', store.path, 'subvolume', 'snapshot', 'starting', 'started'],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1)
        gave_up = snap.poll() is not None
    out, err = snap.communicate(timeout=60)
    t.check(not gave_up, f'the snapshot gave up while the server was starting: {out}{err}')
    t.check_equal(snap.returncode, 0, f'the snapshot once the server let go: {out}{err}')
    with store.mount('started', readonly=True) as m:
        t.check_bytes(t.read_file(m.p('kept')), b'kept', 'a file in the snapshot')
    store.delete('started')


def test_single_writer(store):
    """A subvolume mounted writable cannot be mounted writable again nor
    deleted; both refusals name the process that holds it."""
    store.create('held')
    with store.mount('held') as m:
        pid = m.pid
        other = store.mount('held')
        r = other.mount(expect='fail')
        t.check(str(pid) in r.err, f'the refused mount does not name pid {pid}:\n{r.describe()}')
        r = store.run('subvolume', 'delete', 'held', expect='fail')
        t.check(str(pid) in r.err, f'the refused delete does not name pid {pid}:\n{r.describe()}')
        t.check('held' in store.names(), 'a refused delete removed the subvolume')
        r = store.run('fsck', '--repair', expect=1)
        t.check('a subvolume is mounted' in r.err, f'fsck --repair under a mount:\n{r.describe()}')
        t.write_file(J(m.path, 'still-works'), b'yes')
    t.check_equal(store.show('held')['mounted_by'], 0, 'mounted_by after unmount')
    with store.mount('held') as m:
        t.check_bytes(t.read_file(J(m.path, 'still-works')), b'yes', 'data after the refusals')
    store.delete('held')


def test_read_only_mounts(store):
    """Read-only mounts of an image, or of a writable subvolume, are shared,
    show as mounted, and keep the subvolume from being deleted (a reap would
    take its layers from under them), mounted writable or repaired; a
    snapshot of the writable one is still taken."""
    store.create('ro-src')
    with store.mount('ro-src') as m:
        t.write_file(J(m.path, 'f'), b'kept', fsync=True)
    store.snapshot('ro-src', 'ro-img', readonly=True)
    for name in ('ro-img', 'ro-src'):
        with store.mount(name, readonly=True) as a, store.mount(name, readonly=True) as b:
            t.check(store.show(name)['mounted_by'] in (a.pid, b.pid), f'{name}: mounted_by {store.show(name)}')
            r = store.run('fsck', '--repair', expect=1)
            t.check('a subvolume is mounted' in r.err, f'fsck --repair under read-only mounts:\n{r.describe()}')
            r = store.run('subvolume', 'delete', name, expect='fail')
            t.check(str(b.pid) in r.err or str(a.pid) in r.err, f'the refused delete of {name} names no holder:'
                    f'\n{r.describe()}')
            store.reap()
            t.check_bytes(t.read_file(J(a.path, 'f')), b'kept', f'{name} read after a refused delete and a reap')
            if name == 'ro-src':
                store.mount(name).mount(expect='fail')
                store.snapshot(name, 'ro-src-snap')
    with store.mount('ro-src-snap', readonly=True) as m:
        t.check_bytes(t.read_file(J(m.path, 'f')), b'kept', 'the snapshot taken under read-only mounts')
    for name in ('ro-src-snap', 'ro-img', 'ro-src'):
        store.delete(name)


def test_blocks_through_layers(store):
    """A file cut short and extended again over a snapshot's blocks counts
    only what it still shows (st_blocks, as du adds it up), and the
    snapshot still counts all of its own."""
    block = 64 * KiB
    store.create('layered')
    with store.mount('layered') as m:
        t.write_file(J(m.path, 'f'), t.random_bytes(4 * block, 40), fsync=True)
    store.snapshot('layered', 'layered-snap')
    with store.mount('layered') as m:
        p = J(m.path, 'f')
        os.truncate(p, block)
        os.truncate(p, 4 * block)
        t.check_bytes(t.read_file(p), t.random_bytes(4 * block, 40)[:block] + bytes(3 * block),
                      'cut short and extended over a snapshot')
        used = os.stat(p).st_blocks * 512
        t.check(block <= used <= block + 8 * KiB,
                f'st_blocks of a file cut to one block over a snapshot of four: {used} bytes')
    with store.mount('layered') as m:
        used = os.stat(J(m.path, 'f')).st_blocks * 512
        t.check(block <= used <= block + 8 * KiB, f'the same after a remount: {used} bytes')
    with store.mount('layered-snap', readonly=True) as s:
        used = os.stat(J(s.path, 'f')).st_blocks * 512
        t.check(4 * block <= used <= 4 * block + 8 * KiB, f'st_blocks of the snapshot\'s file: {used} bytes')


def test_space(store):
    """Exclusive and referenced bytes as snapshots come and go, reclaimable
    bytes after delete, and the space back on disk after reap --wait."""
    size = 8 * MiB
    store.create('fat')
    with store.mount('fat') as m:
        t.write_file(J(m.path, 'data'), t.random_bytes(size, 20), fsync=True)
    info = store.show('fat')
    print(f'  fat: {info}')
    t.check(size <= info['logical_bytes'] <= size + 64 * KiB, f'logical bytes {info["logical_bytes"]} for {size}')
    t.check(info['exclusive_bytes'] >= 0.95 * size, f'exclusive bytes {info["exclusive_bytes"]} for {size} of random data')
    t.check(info['referenced_bytes'] >= info['exclusive_bytes'],
            f'referenced {info["referenced_bytes"]} < exclusive {info["exclusive_bytes"]}')

    store.snapshot('fat', 'fat-snap')
    for name in ('fat', 'fat-snap'):
        i = store.show(name)
        t.check(i['exclusive_bytes'] < MiB, f'{name}: exclusive bytes {i["exclusive_bytes"]} while all is shared')
        t.check(i['referenced_bytes'] >= 0.95 * size, f'{name}: referenced bytes {i["referenced_bytes"]}')
    store.delete('fat-snap', reap=False)
    store.reap()
    t.check(store.show('fat')['exclusive_bytes'] >= 0.95 * size,
            f'fat: exclusive bytes {store.show("fat")["exclusive_bytes"]} after its only snapshot was reaped')

    before = store.usage()
    disk_before = t.disk_usage(store.path)
    store.delete('fat', reap=False)
    pending = store.usage()
    print(f'  usage before delete: {before}\n  after delete: {pending}')
    t.check(pending['reclaimable_bytes'] >= 0.95 * size,
            f'reclaimable bytes {pending["reclaimable_bytes"]} after deleting {size} bytes of random data')
    store.reap()
    after = store.usage()
    disk_after = t.disk_usage(store.path)
    print(f'  after reap: {after}\n  on disk: {disk_before} -> {disk_after}')
    t.check_equal(after['reclaimable_bytes'], 0, 'reclaimable bytes after reap --wait')
    t.check(after['data_bytes'] <= before['data_bytes'] - 0.9 * size,
            f'data bytes {before["data_bytes"]} -> {after["data_bytes"]} after reaping {size} bytes')
    t.check(disk_after <= disk_before - 0.6 * size,
            f'the store uses {disk_before} -> {disk_after} bytes on disk after reaping {size} bytes')


def test_space_of_a_tree(store):
    """Exclusive bytes in a tree of snapshots, one deleted but not reaped:
    those of a layer that one live subvolume alone reaches, and show, which
    asks about one subvolume's layers, agrees with list, which counts every
    stack at once."""
    sizes = {'a': MiB, 'b': 2 * MiB, 'c': 3 * MiB, 'd': MiB // 2}

    def write(name, what):
        with store.mount(name) as m:
            t.write_file(J(m.path, what), t.random_bytes(sizes[what], ord(what)), fsync=True)

    store.create('tree')
    write('tree', 'a')
    store.snapshot('tree', 'tree-image', readonly=True)
    write('tree', 'b')
    store.snapshot('tree', 'tree-2')
    write('tree-2', 'c')
    store.snapshot('tree-2', 'tree-3')
    write('tree', 'd')
    store.snapshot('tree-image', 'tree-clone')
    store.delete('tree-3', reap=False)

    listed = {s['name']: s for s in store.list() if s['name'].startswith('tree')}
    for name, entry in listed.items():
        t.check_equal(store.show(name), entry, f'show and list of {name}')
    for name, own in (('tree', 'd'), ('tree-2', 'c'), ('tree-image', None), ('tree-clone', None)):
        exclusive = listed[name]['exclusive_bytes']
        low, high = (0.95 * sizes[own], sizes[own] + 256 * KiB) if own else (0, 64 * KiB)
        t.check(low <= exclusive <= high, f'{name}: exclusive bytes {exclusive}, expected {low:.0f}..{high}')
    for name in listed:
        store.delete(name, reap=False)
    store.reap()


def test_open_unlinked(store):
    """A file unlinked while still open when snapshots are taken is in
    neither snapshot's counts, nor, once closed, in the subvolume's; it
    reads and writes through its descriptor meanwhile, and fsck finds every
    subvolume's counters exact."""
    store.create('orph')
    held = t.random_bytes(300 * KiB, 21)
    with store.mount('orph') as m:
        t.write_file(J(m.path, 'stays'), b'a' * 5000, fsync=True)
        t.write_file(J(m.path, 'held'), held, fsync=True)
        fd = os.open(J(m.path, 'held'), os.O_RDWR)
        try:
            os.unlink(J(m.path, 'held'))
            store.snapshot('orph', 'orph-ro', readonly=True)
            store.snapshot('orph', 'orph-rw')
            os.pwrite(fd, b'z' * 70000, 400 * KiB)
            t.check_bytes(os.pread(fd, 600 * KiB, 0), held + bytes(100 * KiB) + b'z' * 70000,
                          'a file unlinked while open, written after snapshots')
        finally:
            os.close(fd)
        t.write_file(J(m.path, 'new'), b'b' * 100, fsync=True)
        t.fsync_dir(m.path)
    # The root counts, as on any file system.
    for name, counts in (('orph', (3, 5100)), ('orph-ro', (2, 5000)), ('orph-rw', (2, 5000))):
        info = store.show(name)
        t.check_equal((info['inodes'], info['logical_bytes']), counts, f'{name}: inodes and logical bytes')
    store.fsck()
    store.delete('orph-ro', reap=False)
    store.delete('orph-rw', reap=False)
    store.reap()
    store.fsck()
    t.check_equal((store.show('orph')['inodes'], store.show('orph')['logical_bytes']), (3, 5100),
                  'orph after its snapshots were folded away: inodes and logical bytes')


def test_store_moved(store):
    """A store moved while one of its subvolumes is mounted: the server
    keeps writing into its own store, never into another made at the old
    path (it reaches its layers through its own descriptor)."""
    store.create('moved')
    store.snapshot('moved', 'moved-snap')   # its next layer is made at its next write
    old_path = store.path
    with store.mount('moved') as m:
        os.rename(old_path, old_path + '-moved')
        try:
            t.run_command([t.tool(), '--store', old_path, 'init'])
            for name in ('a', 'b'):
                t.run_command([t.tool(), '--store', old_path, 'subvolume', 'create', name])
            layers = J(old_path, 'layers')
            before = {n: t.read_file(J(layers, n)) for n in os.listdir(layers)}
            t.write_file(J(m.path, 'written-after-the-move'), b'mine', fsync=True)
            t.fsync_dir(m.path)
            after = {n: t.read_file(J(layers, n)) for n in os.listdir(layers)}
            t.check(after == before, 'the layers of a store made where a mounted store was moved from changed')
            t.run_command([t.tool(), '--store', old_path, 'fsck'])
        finally:
            m.unmount()
            subprocess.run(['rm', '-rf', '--', old_path], check=True)
            os.rename(old_path + '-moved', old_path)
    with store.mount('moved', readonly=True) as m:
        t.check_equal(t.read_file(J(m.path, 'written-after-the-move')), b'mine',
                      'a file written through the mount of a store moved meanwhile')
    store.fsck()


def run():
    t.require_fuse()
    with t.Store('snapshot') as store:
        manifests = {}
        sub = t.Subtests()
        sub.run('isolation both ways', test_isolation, store, manifests)
        if sub.failed:
            sub.check()
        sub.run('read-only', test_readonly, store, manifests)
        sub.run('snapshot of a snapshot', test_snapshot_of_snapshot, store, manifests)
        sub.run('delete while a snapshot shares blocks', test_delete_shared, store, manifests)
        sub.run('snapshot while mounted and written', test_live_snapshot, store)
        sub.run('snapshot of writes never fsync\'d', test_snapshot_of_unflushed, store)
        sub.run('snapshot while the mount is covered', test_snapshot_of_hidden_mount, store)
        sub.run('snapshot while the server starts', test_snapshot_while_server_starts, store)
        sub.run('one writable mount, delete refused while mounted', test_single_writer, store)
        sub.run('read-only mounts are shared, and refuse a delete', test_read_only_mounts, store)
        sub.run('allocated blocks through layers', test_blocks_through_layers, store)
        sub.run('space accounting and reap', test_space, store)
        sub.run('space of a tree of snapshots', test_space_of_a_tree, store)
        sub.run('snapshots while a file is unlinked but open', test_open_unlinked, store)
        sub.run('a store moved while mounted', test_store_moved, store)
        sub.check()


t.main(run)
