#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Send streams against the real btrfs tools, on btrfs on a loop file.

A tree with every kind of file is sent by `btrfs send`, in full and then
incrementally after renames, deletions, overwrites, reflink clones and
changes of modes, owners and xattrs, and received by cowbox: every image
must be identical to its btrfs snapshot. The other way round, cowbox sends
each image (version 1; version 2 with compressed data; zstd-framed) in full
and incrementally, `btrfs receive --dump` parses every stream, and `btrfs
receive` must rebuild identical trees. A writable snapshot taken from the
first image keeps its content while the next version is received."""

import os
import random
import struct
import subprocess
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import stream_test as st  # noqa: E402


def compare_image(store, name, reference):
    with store.mount(name) as m:
        t.assert_trees_equal(reference, m.path, f'image {name} against its btrfs snapshot')


def change_tree(root):
    """The changes between the first and the second version."""
    os.rename(os.path.join(root, 'src/lib/deep'), os.path.join(root, 'moved-deep'))
    os.rename(os.path.join(root, 'large.bin'), os.path.join(root, 'src/large-renamed.bin'))
    os.unlink(os.path.join(root, 'fifo'))
    os.unlink(os.path.join(root, 'hardlink-a'))
    with open(os.path.join(root, 'large.c'), 'r+b') as f:
        f.seek(70000)
        f.write(b'an overwrite in the middle' * 100)
    subprocess.run(['cp', '--reflink=always', os.path.join(root, 'src/large-renamed.bin'),
                    os.path.join(root, 'reflinked.bin')], check=True)
    with open(os.path.join(root, 'reflinked.bin'), 'r+b') as f:
        f.seek(1 << 20)
        f.write(b'changed after the clone')
    os.truncate(os.path.join(root, 'block-aligned'), 100000)
    os.truncate(os.path.join(root, 'sparse'), 12 * t.MiB)
    os.chmod(os.path.join(root, 'suid'), 0o700)
    os.chown(os.path.join(root, 'src'), 33, 33)
    os.removexattr(os.path.join(root, 'large.c'), 'user.comment')
    os.setxattr(os.path.join(root, 'large.c'), 'user.new', b'new value')
    os.mkdir(os.path.join(root, 'new-dir'))
    t.write_file(os.path.join(root, 'new-dir/new-file'), b'new\n')
    os.link(os.path.join(root, 'new-dir/new-file'), os.path.join(root, 'src/link-to-new'))
    os.unlink(os.path.join(root, 'link-to-dir'))
    os.mkdir(os.path.join(root, 'link-to-dir'))   # a symlink replaced by a directory


def check_dump(path):
    r = st.btrfs('receive', '--dump', '-f', path)
    if not any(line.startswith(('subvol', 'snapshot')) for line in r.out.splitlines()):
        t.fail(f'btrfs receive --dump printed no subvolume for {path}:\n{r.out[-2000:]}')


def check_sparse(store, fs, out):
    """A file of 64 TiB with 4 KiB of data at 1 TiB is sent as its blocks,
    not its size; an increment that punches a block out of a file and cuts
    the large one to 32 TiB sends the hole and the size. btrfs receives
    both alike."""
    big, block = 64 << 40, 64 * t.KiB
    dense = t.random_bytes(3 * block, 5)
    store.create('sparse')
    with store.mount('sparse') as m:
        with open(m.p('big'), 'wb') as f:
            f.truncate(big)
            os.pwrite(f.fileno(), b'x' * 4096, 1 << 40)
        t.write_file(m.p('dense'), dense)
    store.snapshot('sparse', 's1', readonly=True)
    with store.mount('sparse') as m:
        os.truncate(m.p('big'), big // 2)
        fd = os.open(m.p('dense'), os.O_RDWR)
        try:
            t.fallocate(fd, t.FALLOC_FL_PUNCH_HOLE | t.FALLOC_FL_KEEP_SIZE, block, block)
        finally:
            os.close(fd)
    store.snapshot('sparse', 's2', readonly=True)
    dest = os.path.join(fs, 'recv-sparse')
    os.mkdir(dest)
    for name, parent in (('s1', None), ('s2', 's1')):
        store.run('send', *(['-p', parent] if parent else []), '-f', out(f'{name}.sparse'), name)
        t.check(os.path.getsize(out(f'{name}.sparse')) < 1 << 20, f'the stream of {name}: '
                f'{os.path.getsize(out(f"{name}.sparse"))} bytes')
        st.btrfs('receive', '-f', out(f'{name}.sparse'), dest)
    for name, size, punched in (('s1', big, False), ('s2', big // 2, True)):
        root = os.path.join(dest, name)
        t.check_equal(os.stat(os.path.join(root, 'big')).st_size, size, f'{name}/big: its size in btrfs')
        with open(os.path.join(root, 'big'), 'rb') as f:
            t.check_equal(os.pread(f.fileno(), 8192, (1 << 40) - 4096), bytes(4096) + b'x' * 4096,
                          f'{name}/big: around its data at 1 TiB, in btrfs')
        want = dense[:block] + bytes(block) + dense[2 * block:] if punched else dense
        t.check_bytes(t.read_file(os.path.join(root, 'dense')), want, f'{name}/dense in btrfs')


# security.capability of cap_net_raw, effective (struct vfs_cap_data, revision 2).
CAPABILITY = struct.pack('<IIIII', 0x02000001, 1 << 13, 0, 0, 0)


def check_cleared_by_receive(store, fs, out):
    """What btrfs receive's own calls clear is sent again in an increment:
    the capability of a file whose data changed (a write clears it), and
    the setuid bit of a file whose owner changed (a chown clears it)."""
    store.create('capw')
    with store.mount('capw') as m:
        t.write_file(m.p('cap'), t.random_bytes(100000, 31))
        os.setxattr(m.p('cap'), 'security.capability', CAPABILITY)
        t.write_file(m.p('suid'), b'#!/bin/sh\n')
        os.chmod(m.p('suid'), 0o4755)
    store.snapshot('capw', 'cap0', readonly=True)
    with store.mount('capw') as m:
        with open(m.p('cap'), 'r+b') as f:
            f.seek(12288)
            f.write(t.random_bytes(4096, 32))
        os.setxattr(m.p('cap'), 'security.capability', CAPABILITY)
        os.chown(m.p('suid'), 5, 5)
        os.chmod(m.p('suid'), 0o4755)
    store.snapshot('capw', 'cap1', readonly=True)
    dest = os.path.join(fs, 'recv-cap')
    os.mkdir(dest)
    store.run('send', '-f', out('cap0'), 'cap0')
    store.run('send', '-p', 'cap0', '-f', out('cap1'), 'cap1')
    for name in ('cap0', 'cap1'):
        st.btrfs('receive', '-f', out(name), dest)
        got = os.path.join(dest, name)
        t.check_bytes(os.getxattr(os.path.join(got, 'cap'), 'security.capability'), CAPABILITY,
                      f'the capability of {name}/cap received by btrfs')
        t.check_equal(os.stat(os.path.join(got, 'suid')).st_mode & 0o7777, 0o4755,
                      f'the mode of {name}/suid received by btrfs')


def acl(*entries):
    """A POSIX ACL as the kernel's xattr holds it: (tag, perm, id) entries."""
    return struct.pack('<I', 2) + b''.join(struct.pack('<HHI', *e) for e in entries)


NO_ID = 0xffffffff
ACCESS_ACL = acl((0x01, 6, NO_ID), (0x02, 6, 1000), (0x04, 4, NO_ID), (0x10, 6, NO_ID), (0x20, 4, NO_ID))
DEFAULT_ACL = acl((0x01, 7, NO_ID), (0x04, 5, NO_ID), (0x08, 7, 1001), (0x10, 7, NO_ID), (0x20, 5, NO_ID))


def check_acls(store, fs, out):
    """POSIX ACLs of a btrfs tree (a root file system has them) are
    received, kept and sent back as they were; a mount, which does not
    enforce them, neither lists them nor changes the modes."""
    vol = os.path.join(fs, 'aclvol')
    st.btrfs('subvolume', 'create', vol)
    t.write_file(os.path.join(vol, 'f'), b'shared with user 1000\n')
    os.mkdir(os.path.join(vol, 'd'))
    os.setxattr(os.path.join(vol, 'f'), 'system.posix_acl_access', ACCESS_ACL)
    os.setxattr(os.path.join(vol, 'd'), 'system.posix_acl_default', DEFAULT_ACL)
    modes = {name: os.stat(os.path.join(vol, name)).st_mode for name in ('f', 'd')}
    st.btrfs('subvolume', 'snapshot', '-r', vol, os.path.join(fs, 'acl'))
    st.btrfs('send', '-q', '-f', out('acl.btrfs'), os.path.join(fs, 'acl'))
    store.run('receive', '-f', out('acl.btrfs'))
    with store.mount('acl', readonly=True) as m:
        for name in ('f', 'd'):
            t.check_equal(os.stat(m.p(name)).st_mode, modes[name], f'the mode of {name}, which has an ACL')
            t.check_equal([x for x in os.listxattr(m.p(name)) if 'posix_acl' in x], [],
                          f'the ACLs a mount lists for {name}')
    store.run('send', '-f', out('acl.cowbox'), 'acl')
    dest = os.path.join(fs, 'recv-acl')
    os.mkdir(dest)
    st.btrfs('receive', '-f', out('acl.cowbox'), dest)
    got = os.path.join(dest, 'acl')
    t.check_bytes(os.getxattr(os.path.join(got, 'f'), 'system.posix_acl_access'), ACCESS_ACL,
                  'the access ACL of f, sent back')
    t.check_bytes(os.getxattr(os.path.join(got, 'd'), 'system.posix_acl_default'), DEFAULT_ACL,
                  'the default ACL of d, sent back')
    store.run('subvolume', 'delete', 'acl')


def run():
    t.require_fuse()
    with t.Store('images-btrfs') as store, st.btrfs_loop(store) as fs:
        vol = os.path.join(fs, 'vol')
        st.btrfs('subvolume', 'create', vol)
        st.make_every_kind(vol)
        st.btrfs('subvolume', 'snapshot', '-r', vol, os.path.join(fs, 'v1'))
        change_tree(vol)
        st.set_all_times(vol, random.Random(2))
        st.btrfs('subvolume', 'snapshot', '-r', vol, os.path.join(fs, 'v2'))
        refs = {'v1': os.path.join(fs, 'v1'), 'v2': os.path.join(fs, 'v2')}

        streams = store.new_dir('streams')

        def out(name):
            return os.path.join(streams, name)

        # btrfs -> cowbox, versions 1 and 2 (with compressed extents).
        st.btrfs('send', '-q', '-f', out('v1.btrfs'), refs['v1'])
        st.btrfs('send', '-q', '-p', refs['v1'], '-f', out('v2.btrfs'), refs['v2'])
        store.run('receive', '-f', out('v1.btrfs'))
        compare_image(store, 'v1', refs['v1'])

        # A task's writable snapshot of v1 keeps working while v2 arrives.
        store.snapshot('v1', 'task')
        with store.mount('task') as task:
            t.write_file(task.p('task-output'), b'written by the task')
            store.run('receive', '-f', out('v2.btrfs'))
            t.check_equal(t.read_file(task.p('task-output')), b'written by the task', 'the task\'s own file')
            t.check(os.path.exists(task.p('large.bin')), 'the task still sees v1 (large.bin)')
            os.unlink(task.p('task-output'))
            t.assert_trees_equal(refs['v1'], task.path, 'the task snapshot of v1 after v2 was received')
        compare_image(store, 'v2', refs['v2'])

        # Version 2 with compressed extents, from a compress=zstd mount.
        subprocess.run(['mount', '-o', 'remount,compress=zstd', fs], check=True)
        zvol = os.path.join(fs, 'zvol')
        st.btrfs('subvolume', 'create', zvol)
        st.make_every_kind(zvol, seed=3)
        subprocess.run(['sync'], check=True)
        st.btrfs('subvolume', 'snapshot', '-r', zvol, os.path.join(fs, 'z1'))
        st.btrfs('send', '-q', '--proto', '2', '--compressed-data', '-f', out('z1.btrfs'), os.path.join(fs, 'z1'))
        store.run('receive', '-f', out('z1.btrfs'))
        compare_image(store, 'z1', os.path.join(fs, 'z1'))

        # Encoded writes compressed with zlib and LZO; two subvolumes in
        # one input, back to back as `btrfs send A B` writes them.
        for algo in ('zlib', 'lzo'):
            d = os.path.join(fs, f'{algo}vol')
            st.btrfs('subvolume', 'create', d)
            st.btrfs('property', 'set', d, 'compression', algo)
            t.write_file(os.path.join(d, 'text'), st.source_text(random.Random(4), 3 * t.MiB + 100))
            t.write_file(os.path.join(d, 'small'), b'short')
            subprocess.run(['sync'], check=True)
            st.btrfs('subvolume', 'snapshot', '-r', d, os.path.join(fs, algo))
        dumps = ''
        with open(out('two.btrfs'), 'wb') as both:
            for algo in ('zlib', 'lzo'):
                st.btrfs('send', '-q', '--proto', '2', '--compressed-data', '-f', out(algo), os.path.join(fs, algo))
                dumps += st.btrfs('receive', '--dump', '-f', out(algo)).out
                with open(out(algo), 'rb') as one:
                    both.write(one.read())
        t.check('compression=1,' in dumps and 'compression=3,' in dumps,
                'btrfs sent encoded writes with zlib and LZO:\n' +
                '\n'.join(line for line in dumps.splitlines() if 'write' in line)[:3000])
        r = store.json('receive', '-f', out('two.btrfs'))
        t.check_equal(sorted(r), ['lzo', 'zlib'], 'images received from a stream of two subvolumes')
        for algo in ('zlib', 'lzo'):
            compare_image(store, algo, os.path.join(fs, algo))
        r = store.run('receive', '-f', out('two.btrfs'), 'one-name', expect=1)
        t.check('more than one subvolume' in r.err, f'a name for a stream of two:\n{r.describe()}')
        t.check('one-name' not in store.names(), 'nothing left of a refused stream of two')

        # cowbox -> btrfs: full and incremental, v1, v2 with compressed
        # data, zstd-framed; btrfs receive --dump parses every stream.
        for label, opts, framed in (('p1', [], False), ('p2', ['--proto', '2', '--compressed-data'], False),
                                    ('zst', ['--zstd'], True)):
            dest = os.path.join(fs, f'recv-{label}')
            os.mkdir(dest)
            for name, parent in (('v1', None), ('v2', 'v1')):
                path = out(f'{name}.{label}')
                store.run('send', *opts, *(['-p', parent] if parent else []), '-f', path, name)
                if framed:
                    raw = path + '.raw'
                    t.run_command(['zstd', '-q', '-d', '-f', path, '-o', raw])
                    path = raw
                check_dump(path)
                st.btrfs('receive', '-f', path, dest)
                t.assert_trees_equal(refs[name], os.path.join(dest, name),
                                     f'{name} sent by cowbox ({label}) and received by btrfs')

        # And back: what btrfs received from cowbox, sent by btrfs,
        # received by another cowbox store, is still the same tree.
        st.btrfs('send', '-q', '-f', out('rt1'), os.path.join(fs, 'recv-p1', 'v1'))
        st.btrfs('send', '-q', '-p', os.path.join(fs, 'recv-p1', 'v1'), '-f', out('rt2'),
                 os.path.join(fs, 'recv-p1', 'v2'))
        with t.Store('images-btrfs-back') as other:
            other.run('receive', '-f', out('rt1'), 'back1')
            other.run('receive', '-f', out('rt2'), 'back2')
            compare_image(other, 'back2', refs['v2'])

        check_sparse(store, fs, out)
        check_cleared_by_receive(store, fs, out)
        check_acls(store, fs, out)

        # The incremental stream carries the change, not the tree.
        full = os.path.getsize(out('v1.p1'))
        inc = os.path.getsize(out('v2.p1'))
        print(f'stream sizes: full {full}, incremental {inc} (btrfs: {os.path.getsize(out("v2.btrfs"))})')
        t.check(inc < full / 2, f'incremental stream ({inc} bytes) is not much smaller than the full one ({full})')


if __name__ == '__main__':
    t.main(run)
