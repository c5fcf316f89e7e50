#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""POSIX semantics through a real FUSE mount of a subvolume: what builds,
package managers and git rely on, and a kernel cache that never shows stale
data after a change through the mount. Ends by remounting and checking that
everything written is still there, and that a signal stops the server as an
unmount would."""

import errno
import hashlib
import mmap
import os
import signal
import socket
import stat
import subprocess
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
from cowbox_test import KiB, MiB  # noqa: E402

J = os.path.join


def zeros(n):
    return bytes(n)


def pread_all(fd, size, offset=0):
    out = bytearray()
    while len(out) < size:
        chunk = os.pread(fd, size - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def open_rw(path, flags=0, mode=0o644):
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | flags, mode)


# --------------------------------------------------------------------------


def test_regular(d):
    p = J(d, 'f')
    t.write_file(p, b'hello')
    t.check_bytes(t.read_file(p), b'hello', 'small file')
    fd = open_rw(p)
    try:
        os.pwrite(fd, b'XY', 100)
        expect = b'hello' + zeros(95) + b'XY'
        t.check_equal(os.fstat(fd).st_size, 102, 'size after a write past the end')
        t.check_bytes(pread_all(fd, 200), expect, 'gap after a write past the end')
        os.pwrite(fd, b'J', 1)
        expect = b'hJllo' + expect[5:]
        t.check_bytes(pread_all(fd, 200), expect, 'overwrite in place')
        os.ftruncate(fd, 10000)
        t.check_equal(os.fstat(fd).st_size, 10000, 'size after growing ftruncate')
        t.check_bytes(pread_all(fd, 20000), expect + zeros(10000 - len(expect)), 'grown file')
        os.ftruncate(fd, 3)
        t.check_bytes(pread_all(fd, 20000), b'hJl', 'shrunk file')
        os.ftruncate(fd, 8192)
        t.check_bytes(pread_all(fd, 20000), b'hJl' + zeros(8189), 'shrunk then grown: old bytes must not come back')
        t.check_bytes(os.pread(fd, 100, 9000), b'', 'read past the end')
    finally:
        os.close(fd)

    # The same across block boundaries (blocks are 64-128 KiB).
    q = J(d, 'big')
    data = t.random_bytes(300 * KiB, 11)
    t.write_file(q, data)
    t.check_bytes(t.read_file(q), data, '300 KiB file')
    os.truncate(q, 70000)
    t.check_equal(os.stat(q).st_size, 70000, 'size after truncate to mid-block')
    os.truncate(q, 300 * KiB)
    expect = data[:70000] + zeros(300 * KiB - 70000)
    t.check_bytes(t.read_file(q), expect, 'truncated mid-block then grown')
    fd = open_rw(q)
    try:
        off = 128 * KiB - 5000
        os.pwrite(fd, b'Z' * 10000, off)
        expect = expect[:off] + b'Z' * 10000 + expect[off + 10000:]
        t.check_bytes(pread_all(fd, len(expect) + 1), expect, 'write across a block boundary')
    finally:
        os.close(fd)
    t.check_bytes(t.read_file(q), expect, 'reopened after a write across a block boundary')
    t.write_file(q, b'short')
    t.check_bytes(t.read_file(q), b'short', 'rewritten with O_TRUNC')
    t.write_file(J(d, 'empty'), b'')
    t.check_equal(os.stat(J(d, 'empty')).st_size, 0, 'empty file size')
    t.check_bytes(t.read_file(J(d, 'empty')), b'', 'empty file')
    t.expect_errno(errno.EEXIST, os.open, q, os.O_CREAT | os.O_EXCL | os.O_WRONLY, what='O_EXCL on an existing file')
    t.expect_errno(errno.ENOENT, os.open, J(d, 'missing'), os.O_RDONLY, what='open of a missing file')
    t.expect_errno(errno.ENAMETOOLONG, t.write_file, J(d, 'n' * 256), b'', what='a 256-byte name')
    t.write_file(J(d, 'n' * 255), b'ok')
    t.check_bytes(t.read_file(J(d, 'n' * 255)), b'ok', 'a 255-byte name')


def test_sparse(d):
    p = J(d, 'sparse')
    fd = open_rw(p)
    try:
        os.lseek(fd, 1 << 30, os.SEEK_SET)
        os.write(fd, b'end')
        os.pwrite(fd, b'mid', 300 * MiB)
        os.fsync(fd)
        st = os.fstat(fd)
        t.check_equal(st.st_size, (1 << 30) + 3, 'sparse file size')
        t.check(st.st_blocks * 512 <= 2 * MiB, f'a 1 GiB sparse file with 6 bytes uses {st.st_blocks * 512} bytes')
        t.check_bytes(os.pread(fd, 64 * KiB, 0), zeros(64 * KiB), 'hole at the start')
        t.check_bytes(os.pread(fd, 4 * KiB, 512 * MiB), zeros(4 * KiB), 'hole in the middle')
        t.check_bytes(os.pread(fd, 10, (1 << 30) - 7), zeros(7) + b'end', 'end of the sparse file')
        t.check_bytes(os.pread(fd, 9, 300 * MiB - 3), zeros(3) + b'mid' + zeros(3), 'data inside a hole')
        # SEEK_DATA and SEEK_HOLE find them, in blocks of 64 KiB, as cp
        # and tar ask to keep a file sparse.
        for whence, off, want in ((os.SEEK_DATA, 0, 300 * MiB), (os.SEEK_HOLE, 0, 0),
                                  (os.SEEK_HOLE, 300 * MiB + 1, 300 * MiB + 64 * KiB),
                                  (os.SEEK_DATA, 300 * MiB + 64 * KiB, 1 << 30),
                                  (os.SEEK_HOLE, 1 << 30, (1 << 30) + 3)):
            t.check_equal(os.lseek(fd, off, whence), want, f'lseek({off}, {"SEEK_DATA" if whence == os.SEEK_DATA else "SEEK_HOLE"})')
        t.expect_errno(errno.ENXIO, os.lseek, fd, (1 << 30) + 3, os.SEEK_DATA, what='SEEK_DATA at the end')
    finally:
        os.close(fd)
    small = J(d, 'small')
    t.write_file(small, b'all data')
    with open(small, 'rb') as f:
        t.check_equal((os.lseek(f.fileno(), 3, os.SEEK_DATA), os.lseek(f.fileno(), 3, os.SEEK_HOLE)), (3, 8),
                      'SEEK_DATA and SEEK_HOLE in a small file')
    st = os.stat(p)
    t.check(st.st_blocks * 512 <= 2 * MiB, f'reopened: the sparse file uses {st.st_blocks * 512} bytes')
    os.unlink(p)  # the check after the remount would read 1 GiB of zeros

    q = J(d, 'extended')
    t.write_file(q, b'x')
    os.truncate(q, 32 * MiB)
    st = os.stat(q)
    t.check_equal(st.st_size, 32 * MiB, 'size after truncate to 32 MiB')
    t.check(st.st_blocks * 512 <= 2 * MiB, f'a file extended by truncate uses {st.st_blocks * 512} bytes')
    with open(q, 'r+b') as f:
        f.seek(16 * MiB)
        t.check_bytes(f.read(8192), zeros(8192), 'hole made by truncate')
        f.seek(20 * MiB)
        f.write(b'island')
    with open(q, 'rb') as f:
        f.seek(20 * MiB - 10)
        t.check_bytes(f.read(26), zeros(10) + b'island' + zeros(10), 'data written into a hole')

    # The largest sizes there are: a stat costs what the file holds, not
    # what its size is (the server once counted blocks in a bitmap as long
    # as the file).
    huge = J(d, 'huge')
    fd = open_rw(huge)
    try:
        os.ftruncate(fd, (1 << 63) - 1)
        t.check_equal(os.fstat(fd).st_blocks, 0, 'st_blocks of a file of 2^63 - 1 bytes never written')
        os.pwrite(fd, b'far', 1 << 62)
        t.check_bytes(os.pread(fd, 5, (1 << 62) - 2), zeros(2) + b'far', 'data at 2^62')
        t.check(0 < os.fstat(fd).st_blocks <= 64 * KiB // 512, f'3 bytes at 2^62 use {os.fstat(fd).st_blocks} blocks')
    finally:
        os.close(fd)
    os.unlink(huge)


def test_copy_file_range(d):
    """copy_file_range() shares whole blocks and copies the rest: the copy
    reads back as the source, aligned or not, also past the source's end."""
    src, dst = J(d, 'src'), J(d, 'dst')
    data = t.random_bytes(3 * MiB + 12345, 41)
    t.write_file(src, data, fsync=True)
    with open(src, 'rb') as fi, open(dst, 'wb') as fo:
        done = 0
        while done < len(data):
            n = os.copy_file_range(fi.fileno(), fo.fileno(), len(data) - done, done, done)
            t.check(n > 0, f'copy_file_range copied nothing at {done}')
            done += n
        t.check_equal(os.copy_file_range(fi.fileno(), fo.fileno(), 100, len(data), len(data)), 0,
                      'copy_file_range past the end of the source')
        n = os.copy_file_range(fi.fileno(), fo.fileno(), 200000, 1000, len(data) + 5)
        t.check_equal(n, 200000, 'an unaligned copy_file_range')
    t.check_bytes(t.read_file(dst), data + zeros(5) + data[1000:201000], 'the copy of copy_file_range')
    with open(src, 'r+b') as f:
        t.expect_errno(errno.EINVAL, os.copy_file_range, f.fileno(), f.fileno(), MiB, 0, 64 * KiB,
                       what='copy_file_range onto an overlapping range of the same file')
    with open(src, 'r+b') as f:
        f.write(b'changed')
    t.check_bytes(t.read_file(dst)[:7], data[:7], 'the copy after its source changed')


def test_partly_written_blocks(d):
    """Writes, truncates and holes inside a block that is still in the
    server's memory: what was never written reads as zeros, before and
    after the fsync that stores it. The kernel's copy of the pages is
    dropped before each read, so that the server answers."""
    def read_back(fd):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return os.pread(fd, 128 * KiB, 0)

    p = J(d, 'partly')
    data = t.random_bytes(5000, 'partly')
    fd = open_rw(p)
    try:
        os.write(fd, data)                      # past the inline size
        os.pwrite(fd, b'far', 60 * KiB)         # the same block, much further on
        expected = data + zeros(60 * KiB - 5000) + b'far'
        t.check_bytes(read_back(fd), expected, 'a block written at its start and near its end')
        os.ftruncate(fd, 2000)
        os.ftruncate(fd, 70000)                 # into the next block
        os.pwrite(fd, b'next', 66000)
        expected = data[:2000] + zeros(64000) + b'next' + zeros(70000 - 66004)
        t.check_bytes(read_back(fd), expected, 'cut short, extended, written past the block')
        t.fallocate(fd, t.FALLOC_FL_PUNCH_HOLE | t.FALLOC_FL_KEEP_SIZE, 1000, 500)
        expected = expected[:1000] + zeros(500) + expected[1500:]
        t.check_bytes(read_back(fd), expected, 'a hole punched in it')
        os.fsync(fd)
        t.check_bytes(read_back(fd), expected, 'after fsync')
    finally:
        os.close(fd)


def test_fallocate(d):
    p = J(d, 'alloc')
    fd = open_rw(p)
    try:
        t.fallocate(fd, 0, 0, MiB)
        t.check_equal(os.fstat(fd).st_size, MiB, 'size after fallocate mode 0')
        t.check_bytes(pread_all(fd, MiB), zeros(MiB), 'fallocated range')
        t.fallocate(fd, t.FALLOC_FL_KEEP_SIZE, MiB, MiB)
        t.check_equal(os.fstat(fd).st_size, MiB, 'size after fallocate KEEP_SIZE')

        data = bytes([0xAB]) * (256 * KiB)
        os.pwrite(fd, data, 0)
        os.ftruncate(fd, 256 * KiB)
        expect = bytearray(data)

        def punch(off, length):
            t.fallocate(fd, t.FALLOC_FL_PUNCH_HOLE | t.FALLOC_FL_KEEP_SIZE, off, length)
            end = min(off + length, len(expect))
            expect[off:end] = zeros(end - off)

        punch(64 * KiB, 64 * KiB)
        t.check_equal(os.fstat(fd).st_size, 256 * KiB, 'size after punching a hole')
        t.check_bytes(pread_all(fd, 512 * KiB), bytes(expect), 'aligned punched hole')
        punch(1000, 4000)
        t.check_bytes(pread_all(fd, 512 * KiB), bytes(expect), 'unaligned punched hole')
        punch(200 * KiB, 200 * KiB)
        t.check_equal(os.fstat(fd).st_size, 256 * KiB, 'size after a punch past the end')
        t.check_bytes(pread_all(fd, 512 * KiB), bytes(expect), 'hole punched past the end')
        t.fallocate(fd, t.FALLOC_FL_ZERO_RANGE, 150 * KiB, 10)
        expect[150 * KiB:150 * KiB + 10] = zeros(10)
        t.check_bytes(pread_all(fd, 512 * KiB), bytes(expect), 'zeroed range')
    finally:
        os.close(fd)
    t.check_bytes(t.read_file(p), bytes(expect), 'reopened after fallocate')
    r = subprocess.run(['fallocate', '-p', '-o', '0', '-l', '4096', p], capture_output=True, text=True)
    t.check(r.returncode == 0, f'fallocate -p (util-linux): {r.stderr}')
    expect[0:4096] = zeros(4096)
    t.check_bytes(t.read_file(p), bytes(expect), 'after fallocate -p')


def test_append(d):
    p = J(d, 'log')
    fd1 = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    fd2 = os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
    expect = b''
    try:
        for i in range(60):
            chunk = bytes([65 + i % 26]) * ((i * 373) % 5000 + 1)
            os.write(fd1 if i % 2 else fd2, chunk)
            expect += chunk
    finally:
        os.close(fd1)
        os.close(fd2)
    t.check_bytes(t.read_file(p), expect, 'O_APPEND from two descriptors')
    fd = os.open(p, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, b'head')
    finally:
        os.close(fd)
    t.check_bytes(t.read_file(p), b'head' + expect[4:], 'a write without O_APPEND after appends')


def test_mmap(d):
    p = J(d, 'mapped')
    data = t.pattern_bytes(200 * KiB, 3)
    t.write_file(p, data)
    fd = os.open(p, os.O_RDWR | os.O_CLOEXEC)
    try:
        with mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            t.check_bytes(mm[:], data, 'read through mmap')
            mm[0:5] = b'MMAP!'
            mm[70000:70004] = b'WXYZ'
            mm[len(data) - 1:] = b'!'
            mm.flush()
        expect = b'MMAP!' + data[5:70000] + b'WXYZ' + data[70004:-1] + b'!'
        t.check_bytes(pread_all(fd, len(data) + 10), expect, 'read() after writes through MAP_SHARED')
        with mmap.mmap(fd, len(data), mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            os.pwrite(fd, b'after', 1000)
            t.check_bytes(mm[1000:1005], b'after', 'a mapping sees a later write()')
        with mmap.mmap(fd, len(data), mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE) as mm:
            mm[0:7] = b'private'
        expect = expect[:1000] + b'after' + expect[1005:]
    finally:
        os.close(fd)
    t.check_bytes(t.read_file(p), expect, 'reopened after mmap (MAP_PRIVATE writes stay private)')


def test_directories(d):
    os.makedirs(J(d, 'a', 'b', 'c'))
    t.check_equal(os.listdir(J(d, 'a')), ['b'], 'listing of a/')
    t.check_equal(os.listdir(J(d, 'a', 'b', 'c')), [], 'listing of an empty directory')
    os.mkdir(J(d, 'm'), 0o750)
    t.check_equal(stat.S_IMODE(os.stat(J(d, 'm')).st_mode), 0o750, 'mode of a new directory')
    t.expect_errno(errno.EEXIST, os.mkdir, J(d, 'a'), what='mkdir of an existing name')
    t.expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rmdir, J(d, 'a'), what='rmdir of a non-empty directory')
    t.expect_errno(errno.EISDIR, os.unlink, J(d, 'a'), what='unlink of a directory')
    t.write_file(J(d, 'file'), b'x')
    t.expect_errno(errno.ENOTDIR, os.rmdir, J(d, 'file'), what='rmdir of a file')
    t.expect_errno(errno.ENOTDIR, os.mkdir, J(d, 'file', 'sub'), what='mkdir under a file')
    t.expect_errno(errno.EINVAL, os.rename, J(d, 'a'), J(d, 'a', 'b', 'inside'), what='rename into itself')
    t.expect_errno(errno.EISDIR, os.open, J(d, 'a'), os.O_WRONLY, what='open of a directory for writing')
    os.rmdir(J(d, 'a', 'b', 'c'))
    t.check(not os.path.exists(J(d, 'a', 'b', 'c')), 'a removed directory still exists')

    # Many entries, of many name lengths: every one listed once.
    big = J(d, 'many')
    os.mkdir(big)
    names = {f'{i:05d}-' + 'n' * (i % 200) for i in range(1500)}
    for name in names:
        os.close(os.open(J(big, name), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    listed = os.listdir(big)
    t.check_equal(len(listed), len(set(listed)), 'entries listed twice')
    t.check(set(listed) == names, f'listing of 1500 entries: {len(names - set(listed))} missing, '
            f'{len(set(listed) - names)} unexpected')
    with os.scandir(big) as it:
        t.check(all(e.is_file(follow_symlinks=False) for e in it), 'readdir types of regular files')
    for name in sorted(names)[::2]:
        os.unlink(J(big, name))
    t.check_equal(set(os.listdir(big)), set(sorted(names)[1::2]), 'listing after deleting half')

    # Changed while it is read, as rm -r and find -delete do: every entry
    # there from start to end is listed exactly once, in one pass.
    kept = set(os.listdir(big))
    seen, added = [], 0
    with os.scandir(big) as it:
        for e in it:
            seen.append(e.name)
            if len(seen) % 3 == 0:
                os.unlink(e.path)
            if len(seen) % 50 == 0:
                t.write_file(J(big, f'added-{added}'), b'')
                added += 1
    seen_kept = [name for name in seen if name in kept]
    t.check_equal(len(seen_kept), len(set(seen_kept)), 'entries listed twice while the directory changed')
    t.check(set(seen_kept) == kept, f'listing while the directory changed: {len(kept - set(seen_kept))} '
            'entries missing')
    t.check_equal(set(os.listdir(big)), (kept - set(seen[2::3])) | {f'added-{i}' for i in range(added)},
                  'listing after unlinks and creates during a listing')

    # More directories read at once than the server keeps listings of, each
    # changed while read, and too large for one getdents: each goes on
    # where it stopped.
    dirs = [J(d, f'interleaved-{k}') for k in range(20)]
    entry_names = [f'entry-{i:04d}-' + 'x' * 40 for i in range(700)]
    for path in dirs:
        os.mkdir(path)
        for name in entry_names:
            os.close(os.open(J(path, name), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    iters = [os.scandir(path) for path in dirs]
    seen = [[] for _ in dirs]
    try:
        while any(iters):
            for k, it in enumerate(iters):
                if it is None:
                    continue
                e = next(it, None)
                if e is None:
                    it.close()
                    iters[k] = None
                    continue
                seen[k].append(e.name)
                if len(seen[k]) % 2 == 0:
                    os.unlink(e.path)
    finally:
        for it in iters:
            if it is not None:
                it.close()
    for k, path in enumerate(dirs):
        t.check_equal(sorted(seen[k]), entry_names,
                      f'entries of {os.path.basename(path)} read while it changed, among others')


def test_symlinks(d):
    link = J(d, 'l')
    os.symlink('target-file', link)
    t.check_equal(os.readlink(link), 'target-file', 'readlink')
    st = os.lstat(link)
    t.check(stat.S_ISLNK(st.st_mode), 'lstat of a symlink is not a symlink')
    t.check_equal(st.st_size, len('target-file'), 'size of a symlink')
    t.expect_errno(errno.ENOENT, os.stat, link, what='stat of a dangling symlink')
    t.write_file(J(d, 'target-file'), b'through the link')
    t.check_bytes(t.read_file(link), b'through the link', 'read through a symlink')
    long_target = '/'.join(['segment'] * 500)[:4000]
    os.symlink(long_target, J(d, 'long'))
    t.check_equal(os.readlink(J(d, 'long')), long_target, 'a 4000-byte symlink target')
    os.mkdir(J(d, 'dir'))
    t.write_file(J(d, 'dir', 'inside'), b'')
    os.symlink('dir', J(d, 'dirlink'))
    t.check_equal(os.listdir(J(d, 'dirlink')), ['inside'], 'listing through a symlink to a directory')
    os.symlink('../target-file', J(d, 'dir', 'up'))
    t.check_bytes(t.read_file(J(d, 'dir', 'up')), b'through the link', 'relative symlink with ..')
    os.symlink('loop-b', J(d, 'loop-a'))
    os.symlink('loop-a', J(d, 'loop-b'))
    t.expect_errno(errno.ELOOP, os.open, J(d, 'loop-a'), os.O_RDONLY, what='open of a symlink loop')
    t.expect_errno(errno.EEXIST, os.symlink, 'x', link, what='symlink over an existing name')


def test_hard_links(d):
    a, b, c = J(d, 'a'), J(d, 'b'), J(d, 'sub', 'c')
    os.mkdir(J(d, 'sub'))
    t.write_file(a, b'shared content')
    os.link(a, b)
    sa, sb = os.stat(a), os.stat(b)
    t.check_equal((sa.st_nlink, sb.st_nlink), (2, 2), 'link counts after link()')
    t.check_equal(sa.st_ino, sb.st_ino, 'inode of two hard links')
    os.link(b, c)
    t.check_equal(os.stat(a).st_nlink, 3, 'link count after a link in another directory')
    with open(b, 'r+b') as f:
        f.write(b'SHARED')
    t.check_bytes(t.read_file(a), b'SHARED content', 'write through one link read through another')
    t.check_bytes(t.read_file(c), b'SHARED content', 'read through the third link')
    os.chmod(c, 0o600)
    t.check_equal(stat.S_IMODE(os.stat(a).st_mode), 0o600, 'mode change through another link')
    os.unlink(a)
    t.check_equal(os.stat(b).st_nlink, 2, 'link count after unlinking one link')
    t.check_bytes(t.read_file(b), b'SHARED content', 'content after unlinking one link')
    t.expect_errno(errno.EPERM, os.link, J(d, 'sub'), J(d, 'dirlink'), what='hard link to a directory')
    t.expect_errno(errno.EEXIST, os.link, b, c, what='link onto an existing name')
    os.symlink('b', J(d, 'sym'))
    os.link(J(d, 'sym'), J(d, 'sym2'), follow_symlinks=False)
    t.check(os.path.islink(J(d, 'sym2')), 'a hard link to a symlink is not a symlink')
    t.check_equal(os.lstat(J(d, 'sym')).st_ino, os.lstat(J(d, 'sym2')).st_ino, 'inode of linked symlinks')
    os.rename(b, c)  # both names of one inode: nothing happens
    t.check(os.path.exists(b) and os.path.exists(c), 'rename between two links of one inode removed a name')


def test_rename(d):
    w = lambda name, data: t.write_file(J(d, name), data)  # noqa: E731
    r = lambda name: t.read_file(J(d, name))  # noqa: E731
    w('a', b'A')
    os.rename(J(d, 'a'), J(d, 'b'))
    t.check(not os.path.exists(J(d, 'a')), 'the old name exists after rename')
    t.check_bytes(r('b'), b'A', 'content under the new name')

    w('c', b'C')
    ino = os.stat(J(d, 'c')).st_ino
    os.rename(J(d, 'c'), J(d, 'b'))
    t.check_bytes(r('b'), b'C', 'rename over an existing file')
    t.check_equal(os.stat(J(d, 'b')).st_ino, ino, 'inode after rename over a file')

    w('x', b'X')
    t.expect_errno(errno.EEXIST, t.renameat2, J(d, 'x'), J(d, 'b'), t.RENAME_NOREPLACE,
                   what='RENAME_NOREPLACE onto an existing name')
    t.check_bytes(r('x') + r('b'), b'XC', 'both files after a refused RENAME_NOREPLACE')
    t.renameat2(J(d, 'x'), J(d, 'y'), t.RENAME_NOREPLACE)
    t.check_bytes(r('y'), b'X', 'RENAME_NOREPLACE onto a new name')
    t.check(not os.path.exists(J(d, 'x')), 'the old name exists after RENAME_NOREPLACE')

    iy, ib = os.stat(J(d, 'y')).st_ino, os.stat(J(d, 'b')).st_ino
    t.renameat2(J(d, 'y'), J(d, 'b'), t.RENAME_EXCHANGE)
    t.check_bytes(r('y') + r('b'), b'CX', 'contents after RENAME_EXCHANGE')
    t.check_equal((os.stat(J(d, 'y')).st_ino, os.stat(J(d, 'b')).st_ino), (ib, iy), 'inodes after RENAME_EXCHANGE')
    os.mkdir(J(d, 'dir'))
    t.write_file(J(d, 'dir', 'inside'), b'in')
    t.renameat2(J(d, 'y'), J(d, 'dir'), t.RENAME_EXCHANGE)
    t.check(os.path.isdir(J(d, 'y')) and os.path.isfile(J(d, 'dir')), 'types after exchanging a file and a directory')
    t.check_bytes(t.read_file(J(d, 'y', 'inside')), b'in', 'content of an exchanged directory')
    t.expect_errno(errno.ENOENT, t.renameat2, J(d, 'b'), J(d, 'missing'), t.RENAME_EXCHANGE,
                   what='RENAME_EXCHANGE with a missing name')

    os.mkdir(J(d, 'empty'))
    os.mkdir(J(d, 'full'))
    t.write_file(J(d, 'full', 'f'), b'')
    os.mkdir(J(d, 'mover'))
    t.write_file(J(d, 'mover', 'm'), b'moved')
    t.expect_errno((errno.ENOTEMPTY, errno.EEXIST), os.rename, J(d, 'mover'), J(d, 'full'),
                   what='rename of a directory over a non-empty one')
    os.rename(J(d, 'mover'), J(d, 'empty'))
    t.check_bytes(t.read_file(J(d, 'empty', 'm')), b'moved', 'directory renamed over an empty one')
    t.expect_errno(errno.EISDIR, os.rename, J(d, 'b'), J(d, 'full'), what='rename of a file over a directory')
    t.expect_errno(errno.ENOTDIR, os.rename, J(d, 'full'), J(d, 'b'), what='rename of a directory over a file')

    os.makedirs(J(d, 'p1', 'deep'))
    t.write_file(J(d, 'p1', 'deep', 'leaf'), b'leaf')
    os.mkdir(J(d, 'p2'))
    os.rename(J(d, 'p1', 'deep'), J(d, 'p2', 'moved'))
    t.check_bytes(t.read_file(J(d, 'p2', 'moved', 'leaf')), b'leaf', 'a file inside a directory moved across directories')
    t.check_equal(os.listdir(J(d, 'p1')), [], 'the old parent after a move')
    os.rename(J(d, 'b'), J(d, 'b'))
    t.check_bytes(r('b'), b'X', 'rename onto itself')


def test_xattrs(d):
    p = J(d, 'f')
    t.write_file(p, b'')
    os.setxattr(p, 'user.a', b'1')
    t.check_equal(os.getxattr(p, 'user.a'), b'1', 'getxattr')
    big = bytes(range(256)) * 15 + b'\0tail'
    os.setxattr(p, 'user.big', big)
    os.setxattr(p, 'user.empty', b'')
    t.check_equal(os.getxattr(p, 'user.big'), big, 'a 3845-byte binary xattr')
    t.check_equal(os.getxattr(p, 'user.empty'), b'', 'an empty xattr')
    t.check_equal(sorted(n for n in os.listxattr(p) if n.startswith('user.')),
                  ['user.a', 'user.big', 'user.empty'], 'listxattr')
    t.expect_errno(errno.EEXIST, os.setxattr, p, 'user.a', b'2', os.XATTR_CREATE, what='XATTR_CREATE on an existing name')
    t.expect_errno(errno.ENODATA, os.setxattr, p, 'user.nope', b'2', os.XATTR_REPLACE,
                   what='XATTR_REPLACE on a missing name')
    os.setxattr(p, 'user.a', b'replaced', os.XATTR_REPLACE)
    t.check_equal(os.getxattr(p, 'user.a'), b'replaced', 'replaced xattr')
    os.removexattr(p, 'user.a')
    t.expect_errno(errno.ENODATA, os.getxattr, p, 'user.a', what='getxattr after removexattr')
    t.expect_errno(errno.ENODATA, os.removexattr, p, 'user.a', what='removexattr of a missing name')
    t.check('user.a' not in os.listxattr(p), 'listxattr after removexattr')
    os.mkdir(J(d, 'dir'))
    for i in range(50):
        os.setxattr(J(d, 'dir'), f'user.k{i:02d}', f'value {i}'.encode())
    t.check_equal(sorted(n for n in os.listxattr(J(d, 'dir')) if n.startswith('user.')),
                  [f'user.k{i:02d}' for i in range(50)], '50 xattrs on a directory')
    t.check_equal(os.getxattr(J(d, 'dir'), 'user.k42'), b'value 42', 'one of 50 xattrs')
    os.setxattr(p, 'trusted.cowbox', b'root only')
    t.check_equal(os.getxattr(p, 'trusted.cowbox'), b'root only', 'a trusted.* xattr')
    # Names as ext4 takes them: a namespace it knows, and a name after it.
    for name, err in (('foo', errno.EOPNOTSUPP), ('bogus.x', errno.EOPNOTSUPP), ('system.foo', errno.EOPNOTSUPP),
                      ('user.', errno.EINVAL)):
        t.expect_errno(err, os.setxattr, p, name, b'x', what=f'setxattr of the name {name!r}')
    t.check_equal(sorted(n for n in os.listxattr(p) if not n.startswith(('user.', 'trusted.', 'security.'))), [],
                  'names of xattrs refused')
    # Names fill the list listxattr() returns (64 KiB) and no further.
    many = J(d, 'many')
    t.write_file(many, b'')
    added = 0
    for i in range(400):
        try:
            os.setxattr(many, f'user.{i:03d}' + 'n' * 240, b'')
        except OSError as e:
            t.check_equal(e.errno, errno.ENOSPC, 'setxattr of a name past the list\'s room')
            break
        added += 1
    names = os.listxattr(many)
    t.check(200 < added < 400 and len(names) == added, f'{added} long xattr names set, {len(names)} listed')


def test_attributes(d):
    p = J(d, 'f')
    t.write_file(p, b'data')
    for mode in (0o4755, 0o2711, 0o600, 0o000, 0o777):
        os.chmod(p, mode)
        t.check_equal(oct(stat.S_IMODE(os.stat(p).st_mode)), oct(mode), f'mode after chmod {oct(mode)}')
    os.mkdir(J(d, 'sticky'))
    os.chmod(J(d, 'sticky'), 0o1777)
    t.check_equal(oct(stat.S_IMODE(os.stat(J(d, 'sticky')).st_mode)), '0o1777', 'sticky directory mode')
    os.chown(p, 1234, 5678)
    st = os.stat(p)
    t.check_equal((st.st_uid, st.st_gid), (1234, 5678), 'owner after chown')
    os.symlink('f', J(d, 'l'))
    os.chown(J(d, 'l'), 4321, 8765, follow_symlinks=False)
    st = os.lstat(J(d, 'l'))
    t.check_equal((st.st_uid, st.st_gid), (4321, 8765), 'owner of a symlink after lchown')
    t.check_equal(os.stat(p).st_uid, 1234, 'lchown changed the target')

    atime, mtime = 1_600_000_000_123_456_789, 1_500_000_000_987_654_321
    os.utime(p, ns=(atime, mtime))
    st = os.stat(p)
    t.check_equal((st.st_atime_ns, st.st_mtime_ns), (atime, mtime), 'times after utimensat (ns)')
    os.utime(J(d, 'l'), ns=(atime + 1, mtime + 1), follow_symlinks=False)
    t.check_equal(os.lstat(J(d, 'l')).st_mtime_ns, mtime + 1, 'mtime of a symlink')
    t.check_equal(os.stat(p).st_mtime_ns, mtime, 'utimensat on a symlink changed its target')
    before = time.time_ns()
    os.utime(p)
    st = os.stat(p)
    t.check(before - 2_000_000_000 <= st.st_mtime_ns <= time.time_ns() + 2_000_000_000,
            f'utime(now) set mtime {st.st_mtime_ns}, now is {time.time_ns()}')

    old = 1_000_000_000 * 10**9
    os.utime(p, ns=(old, old))
    ctime0 = os.stat(p).st_ctime_ns
    with open(p, 'r+b') as f:
        f.write(b'new')
    st = os.stat(p)
    t.check(st.st_mtime_ns > old, 'a write did not update mtime')
    t.check(st.st_ctime_ns >= ctime0, 'a write moved ctime back')
    os.utime(p, ns=(old, old))
    os.truncate(p, 100)
    t.check(os.stat(p).st_mtime_ns > old, 'truncate did not update mtime')
    os.utime(d, ns=(old, old))
    t.write_file(J(d, 'new-entry'), b'')
    t.check(os.stat(d).st_mtime_ns > old, 'creating an entry did not update the directory mtime')

    # open(O_TRUNC) and ftruncate() change mtime also when the size stays:
    # make's ': > stamp' touches its stamp that way.
    stamp = J(d, 'stamp')
    t.write_file(stamp, b'')
    os.utime(stamp, ns=(old, old))
    os.close(os.open(stamp, os.O_WRONLY | os.O_TRUNC))
    t.check(os.stat(stamp).st_mtime_ns > old, 'open(O_TRUNC) of an empty file did not update mtime')
    os.utime(stamp, ns=(old, old))
    fd = os.open(stamp, os.O_WRONLY)
    os.ftruncate(fd, 0)
    os.close(fd)
    t.check(os.stat(stamp).st_mtime_ns > old, 'ftruncate() to the same size did not update mtime')

    # Before 1970, with a fraction; and past what the store keeps (years
    # 1677 to 2262), clamped as ext4 clamps to its own range.
    for ns in (-1_500_000_000, -315_619_199_750_000_000, -1):
        os.utime(p, ns=(ns, ns))
        st = os.stat(p)
        t.check_equal((st.st_atime_ns, st.st_mtime_ns), (ns, ns), f'times of {ns} ns')
    os.utime(p, ns=(10_413_792_000 * 10**9, -11_676_096_000 * 10**9))    # 2300 and 1600
    st = os.stat(p)
    t.check_equal((st.st_atime_ns, st.st_mtime_ns), (2**63 - 1, -2**63), 'times past what is kept, clamped')


def test_attributes_before_writeback(d):
    """What cp -a does: create the file 0600, write it, then set owner,
    times and mode while the data may still be in the kernel's cache; the
    write-back that follows changes none of them."""
    p = J(d, 'copied')
    data = t.random_bytes(700 * KiB, 12)
    atime, mtime = 1_400_000_000_111_111_111, 1_300_000_000_222_222_222
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fchown(fd, 1000, 1000)
        os.setxattr(fd, 'user.copied', b'1')
        os.utime(fd, ns=(atime, mtime))
        os.fchmod(fd, 0o644)
    finally:
        os.close(fd)

    def check(when):
        st = os.stat(p)
        t.check_equal(oct(stat.S_IMODE(st.st_mode)), '0o644', f'mode {when}')
        t.check_equal((st.st_uid, st.st_gid), (1000, 1000), f'owner {when}')
        t.check_equal(st.st_mtime_ns, mtime, f'mtime {when}')
        t.check_equal(st.st_size, len(data), f'size {when}')

    check('after close')
    t.check_bytes(t.read_file(p), data, 'content')
    os.sync()
    check('after sync')
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    check('after fsync')


def test_cp_a(d):
    """cp -a (which sets modes through the system.posix_acl_access xattr
    where it can) copies modes, owners, times, xattrs and hard links."""
    with t.temporary_directory('posix-cp') as src:
        tree = J(src, 'tree')
        os.makedirs(J(tree, 'sub', 'deeper'))
        for name, mode in (('a', 0o644), ('b', 0o640), ('c', 0o755), ('sub/d', 0o600), ('sub/deeper/e', 0o444)):
            t.write_file(J(tree, name), t.pattern_bytes(5000 + len(name), mode), mode=mode)
            os.chmod(J(tree, name), mode)
        os.chmod(J(tree, 'sub'), 0o750)
        os.chmod(J(tree, 'sub', 'deeper'), 0o711)
        os.chown(J(tree, 'b'), 1000, 100)
        os.link(J(tree, 'a'), J(tree, 'sub', 'a-link'))
        os.symlink('../a', J(tree, 'sub', 'a-sym'))
        os.setxattr(J(tree, 'c'), 'user.kept', b'yes')
        r = subprocess.run(['cp', '-a', tree, J(d, 'tree')], capture_output=True, text=True)
        t.check(r.returncode == 0, f'cp -a into the mount: {r.stderr}')
        t.assert_trees_equal(tree, J(d, 'tree'), 'a tree and its copy by cp -a')


def test_permissions(d):
    """default_permissions and allow_other: other users reach the mount, and
    the kernel enforces modes."""
    os.chmod(os.path.dirname(d), 0o755)
    os.chmod(d, 0o755)
    t.write_file(J(d, 'secret'), b'secret', mode=0o600)
    t.write_file(J(d, 'public'), b'public', mode=0o644)
    os.chmod(J(d, 'secret'), 0o600)
    os.chmod(J(d, 'public'), 0o644)
    os.mkdir(J(d, 'shared'))
    os.chmod(J(d, 'shared'), 0o777)

    def as_nobody(fn):
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
                code = fn()
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    def read(name):
        try:
            t.read_file(J(d, name))
            return 0
        except OSError as e:
            return e.errno

    t.check_equal(as_nobody(lambda: read('public')), 0, 'another user reading a 0644 file')
    t.check_equal(errno.errorcode.get(as_nobody(lambda: read('secret'))), 'EACCES',
                  'another user reading a 0600 file')

    def create():
        try:
            t.write_file(J(d, 'shared', 'mine'), b'x')
            return 0
        except OSError as e:
            return e.errno

    t.check_equal(as_nobody(create), 0, 'another user creating a file in a 0777 directory')
    st = os.stat(J(d, 'shared', 'mine'))
    t.check_equal((st.st_uid, st.st_gid), (65534, 65534), 'owner of a file another user created')


def test_special_files(d):
    os.mknod(J(d, 'null'), stat.S_IFCHR | 0o644, os.makedev(1, 3))
    os.mknod(J(d, 'loop'), stat.S_IFBLK | 0o600, os.makedev(7, 0))
    st = os.lstat(J(d, 'null'))
    t.check(stat.S_ISCHR(st.st_mode), 'mknod S_IFCHR made no character device')
    t.check_equal((os.major(st.st_rdev), os.minor(st.st_rdev)), (1, 3), 'character device numbers')
    t.check_equal(stat.S_IMODE(st.st_mode), 0o644, 'character device mode')
    st = os.lstat(J(d, 'loop'))
    t.check(stat.S_ISBLK(st.st_mode), 'mknod S_IFBLK made no block device')
    t.check_equal((os.major(st.st_rdev), os.minor(st.st_rdev)), (7, 0), 'block device numbers')

    os.mkfifo(J(d, 'fifo'), 0o640)
    t.check(stat.S_ISFIFO(os.lstat(J(d, 'fifo')).st_mode), 'mkfifo made no FIFO')
    fd = os.open(J(d, 'fifo'), os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.write(fd, b'through the pipe')
        t.check_bytes(os.read(fd, 100), b'through the pipe', 'data through a FIFO')
    finally:
        os.close(fd)

    cwd = os.getcwd()
    os.chdir(d)
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind('sock')
        server.listen(1)
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect('sock')
        conn, _ = server.accept()
        client.sendall(b'hello socket')
        t.check_bytes(conn.recv(100), b'hello socket', 'data through a unix socket bound in the mount')
        for s in (conn, client, server):
            s.close()
    finally:
        os.chdir(cwd)
    t.check(stat.S_ISSOCK(os.lstat(J(d, 'sock')).st_mode), 'a bound unix socket is not a socket file')


def test_statfs(d, store_path):
    st = os.statvfs(d)
    host = os.statvfs(store_path)
    t.check(st.f_bsize > 0 and st.f_frsize > 0, f'block sizes {st.f_bsize}/{st.f_frsize}')
    t.check(st.f_blocks > 0, 'statfs reports no blocks')
    t.check(0 < st.f_bavail <= st.f_bfree <= st.f_blocks,
            f'statfs blocks: total {st.f_blocks}, free {st.f_bfree}, available {st.f_bavail}')
    t.check(st.f_namemax >= 255, f'f_namemax {st.f_namemax}')
    avail = st.f_bavail * st.f_frsize
    host_avail = host.f_bavail * host.f_frsize
    host_total = host.f_blocks * host.f_frsize
    t.check(0.5 * host_avail <= avail <= host_total,
            f'{avail} bytes available in the mount, but {host_avail} free of {host_total} under the store')
    if st.f_files:
        t.check(st.f_ffree <= st.f_files, f'statfs inodes: {st.f_ffree} free of {st.f_files}')
    # Reads leave a file's atime as it is: the mount says so (noatime),
    # for the tools that compare atime with mtime to tell what was read.
    t.check(st.f_flag & os.ST_NOATIME, f'statfs flags {st.f_flag:#x}: the mount does not say noatime')
    path = os.path.join(d, 'atime-probe')
    t.write_file(path, b'read me\n')
    os.utime(path, ns=(10**18, 2 * 10**18))
    t.read_file(path)
    t.check_equal(os.stat(path).st_atime_ns, 10**18, 'atime after a read')
    os.unlink(path)


def test_fsync(d):
    p = J(d, 'f')
    fd = open_rw(p)
    try:
        os.write(fd, t.random_bytes(300 * KiB, 5))
        os.fsync(fd)
        os.write(fd, b'more')
        os.fdatasync(fd)
    finally:
        os.close(fd)
    fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    t.fsync_dir(d)
    t.check_equal(os.stat(p).st_size, 300 * KiB + 4, 'size after fsync')


def test_large_file(d):
    p = J(d, 'large')
    data = t.random_bytes(16 * MiB, 7) + t.pattern_bytes(4 * MiB, 7)
    fd = open_rw(p)
    try:
        view = memoryview(data)
        off = 0
        while off < len(data):
            n = os.write(fd, view[off:off + MiB + 7])
            off += n
    finally:
        os.close(fd)
    want = hashlib.sha256(data).hexdigest()
    t.check_equal(t.sha256_file(p), want, 'sha256 of a 20 MiB file')
    h = hashlib.sha256()
    with open(p, 'rb', buffering=0) as f:
        while True:
            chunk = f.read(100_003)
            if not chunk:
                break
            h.update(chunk)
    t.check_equal(h.hexdigest(), want, 'sha256 of a 20 MiB file read in odd-sized chunks')


def test_unlinked_open(d):
    p = J(d, 'ghost')
    data = t.random_bytes(100 * KiB, 9)
    fd = open_rw(p)
    try:
        os.write(fd, data)
        os.unlink(p)
        t.check_equal(os.fstat(fd).st_nlink, 0, 'link count of an unlinked open file')
        t.check('ghost' not in os.listdir(d), 'an unlinked file is still listed')
        t.expect_errno(errno.ENOENT, os.stat, p, what='stat of an unlinked file')
        t.check_bytes(pread_all(fd, len(data) + 10), data, 'read of an unlinked open file')
        os.pwrite(fd, b'later', 200 * KiB)
        os.fsync(fd)
        t.check_bytes(os.pread(fd, 5, 200 * KiB), b'later', 'write to an unlinked open file')
    finally:
        os.close(fd)
    t.write_file(p, b'a new file of that name')
    t.check_bytes(t.read_file(p), b'a new file of that name', 'a new file under an unlinked name')


def test_cache_staleness(d):
    p = J(d, 'f')
    t.write_file(p, b'old content')
    fd1 = os.open(p, os.O_RDWR | os.O_CLOEXEC)
    fd2 = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    try:
        t.check_bytes(os.pread(fd2, 100, 0), b'old content', 'first read')
        os.pwrite(fd1, b'NEW content, longer', 0)
        t.check_bytes(os.pread(fd2, 100, 0), b'NEW content, longer', 'read through another descriptor')
        t.check_bytes(t.read_file(p), b'NEW content, longer', 'read through a new open')
        t.check_equal(os.fstat(fd2).st_size, 19, 'fstat size after a write through another descriptor')
        t.check_equal(os.stat(p).st_size, 19, 'stat size after a write')
        os.truncate(p, 3)
        t.check_equal(os.fstat(fd2).st_size, 3, 'fstat size after truncate by path')
        t.check_equal(os.stat(p).st_size, 3, 'stat size after truncate')
        t.check_bytes(os.pread(fd2, 100, 0), b'NEW', 'read after truncate')
        os.truncate(p, 10000)
        t.check_equal(os.stat(p).st_size, 10000, 'stat size after extending truncate')
        t.check_bytes(os.pread(fd2, 20000, 0), b'NEW' + zeros(9997), 'read after extending truncate')
    finally:
        os.close(fd1)
        os.close(fd2)

    # Another process writes: this one sees it at once.
    subprocess.run([sys.executable, '-c', f'open({p!r}, "ab").write(b"appended")'], check=True)
    t.check_equal(os.stat(p).st_size, 10008, 'size after another process appended')
    t.check_bytes(t.read_file(p)[-8:], b'appended', 'content another process appended')

    a, b = J(d, 'a'), J(d, 'b')
    t.write_file(a, b'A content')
    ino = os.stat(a).st_ino
    os.rename(a, b)
    t.expect_errno(errno.ENOENT, os.stat, a, what='stat of the old name after rename')
    t.expect_errno(errno.ENOENT, os.open, a, os.O_RDONLY, what='open of the old name after rename')
    t.check_bytes(t.read_file(b), b'A content', 'the new name after rename')
    t.check_equal(os.stat(b).st_ino, ino, 'inode under the new name')

    old_fd = os.open(b, os.O_RDONLY | os.O_CLOEXEC)
    try:
        c = J(d, 'c')
        t.write_file(c, b'C content that replaces it')
        c_ino = os.stat(c).st_ino
        os.rename(c, b)
        t.check_bytes(t.read_file(b), b'C content that replaces it', 'read after rename over')
        t.check_equal(os.stat(b).st_ino, c_ino, 'inode after rename over')
        t.check_equal(os.stat(b).st_size, 26, 'size after rename over')
        t.check_bytes(os.pread(old_fd, 100, 0), b'A content', 'an open descriptor of the replaced file')
    finally:
        os.close(old_fd)

    for i in range(100):
        name = f'entry-{i}'
        t.write_file(J(d, name), b'')
        t.check(name in os.listdir(d), f'readdir misses {name} just created')
        os.unlink(J(d, name))
        t.check(name not in os.listdir(d), f'readdir shows {name} just unlinked')
        os.mkdir(J(d, name))
        t.check(os.path.isdir(J(d, name)), f'{name} is not a directory after unlink and mkdir')
        os.rmdir(J(d, name))

    ghost = J(d, 'ghost')
    t.expect_errno(errno.ENOENT, os.stat, ghost, what='stat of a missing name')
    t.write_file(ghost, b'now here')
    t.check_bytes(t.read_file(ghost), b'now here', 'a name created after a failed lookup')
    os.unlink(ghost)
    t.expect_errno(errno.ENOENT, os.stat, ghost, what='stat after unlink')

    t.write_file(J(d, 'h1'), b'h')
    t.check_equal(os.stat(J(d, 'h1')).st_nlink, 1, 'link count before link()')
    os.link(J(d, 'h1'), J(d, 'h2'))
    t.check_equal(os.stat(J(d, 'h1')).st_nlink, 2, 'link count of the old name after link()')
    os.unlink(J(d, 'h2'))
    t.check_equal(os.stat(J(d, 'h1')).st_nlink, 1, 'link count after unlink of the other name')
    os.chmod(J(d, 'h1'), 0o640)
    t.check_equal(stat.S_IMODE(os.stat(J(d, 'h1')).st_mode), 0o640, 'mode right after chmod')
    os.setxattr(J(d, 'h1'), 'user.fresh', b'1')
    t.check_equal(os.getxattr(J(d, 'h1'), 'user.fresh'), b'1', 'xattr right after setxattr')
    os.removexattr(J(d, 'h1'), 'user.fresh')
    t.expect_errno(errno.ENODATA, os.getxattr, J(d, 'h1'), 'user.fresh', what='xattr right after removexattr')

    # Listings are cached by the kernel: every change through the mount
    # must show in the next listing of each directory it touches.
    x, y = J(d, 'list-x'), J(d, 'list-y')
    os.mkdir(x)
    os.mkdir(y)
    t.write_file(J(x, 'moving'), b'm')

    def listings(what, in_x, in_y):
        t.check_equal(sorted(os.listdir(x)), sorted(in_x), f'listing of list-x {what}')
        t.check_equal(sorted(os.listdir(y)), sorted(in_y), f'listing of list-y {what}')

    listings('at first', ['moving'], [])
    os.rename(J(x, 'moving'), J(y, 'moved'))
    listings('after a rename between them', [], ['moved'])
    os.link(J(y, 'moved'), J(x, 'linked'))
    listings('after a hard link', ['linked'], ['moved'])
    os.symlink('moved', J(y, 'symlink'))
    os.mkdir(J(x, 'subdir'))
    listings('after symlink and mkdir', ['linked', 'subdir'], ['moved', 'symlink'])
    os.unlink(J(x, 'linked'))
    t.write_file(J(x, 'target'), b'to be replaced')
    t.write_file(J(y, 'moved'), b'replaced')
    listings('after unlink and create', ['subdir', 'target'], ['moved', 'symlink'])
    os.rename(J(y, 'moved'), J(x, 'target'))
    listings('after a rename over a name', ['subdir', 'target'], ['symlink'])
    os.rmdir(J(x, 'subdir'))
    os.unlink(J(y, 'symlink'))
    listings('after rmdir and unlink', ['target'], [])
    t.check_bytes(t.read_file(J(x, 'target')), b'replaced', 'content under the name renamed over')


def test_stop_on_signal(m):
    """SIGTERM, SIGINT and SIGHUP end the server at once, as an unmount
    would: it unmounts, exits, and keeps what was written, fsync'd or not.
    One of its threads waits on the FUSE device meanwhile, and must be got
    out of there."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        path = m.p(f'written-before-{sig.name}')
        data = t.random_bytes(256 * KiB, sig.name)
        t.write_file(path, data)
        os.stat(m.path)
        pid = m.pid
        os.kill(pid, sig)
        left = t.wait_gone([pid], 30)
        t.check(not left, f'the server still runs 30 s after {sig.name}')
        t.check(not t.is_mounted(m.path), f'the server ended on {sig.name} but left {m.path} mounted')
        m.mounted = False
        m.mount()
        t.check_bytes(t.read_file(path), data, f'file written before {sig.name}')


def test_background_server(m):
    """mount --background returns once the mount answers, and the server
    it leaves behind is on its own: a session of its own (a terminal's
    hang-up or a job control signal to the caller's group does not reach
    it), in "/" (the caller's directory stays unmountable), its standard
    input and output on /dev/null and its standard error on the store's log
    (a closed terminal or pipe cannot stop it)."""
    pid = m.pid
    t.check(pid != os.getpid(), 'the server is the test itself')
    t.check_equal(os.getsid(pid), pid, f'session of the server {pid}')
    t.check_equal(os.readlink(f'/proc/{pid}/cwd'), '/', f'working directory of the server {pid}')
    for fd in (0, 1):
        t.check_equal(os.readlink(f'/proc/{pid}/fd/{fd}'), '/dev/null', f'descriptor {fd} of the server {pid}')
    t.check_equal(os.readlink(f'/proc/{pid}/fd/2'), os.path.join(m.store.path, 'log'),
                  f'descriptor 2 of the server {pid}')


def test_log_moved_aside(m):
    """A background server appends to the store's log, and past 1 MiB moves
    it to log.old first: the log never grows without bound."""
    log = os.path.join(m.store.path, 'log')
    old = t.pattern_bytes(1024 * 1024 + 1, 9)
    t.write_file(log, old)
    m.remount()
    t.check_equal(t.read_file(log + '.old'), old, 'log.old after a server started with a full log')
    t.check(os.path.getsize(log) < len(old), f'the log is {os.path.getsize(log)} bytes, not new')
    t.check_equal(os.readlink(f'/proc/{m.pid}/fd/2'), log, f'descriptor 2 of the server {m.pid}')
    # Not moved again while it is small.
    m.remount()
    t.check_equal(t.read_file(log + '.old'), old, 'log.old after a server started with a small log')


def test_mount_after_unmount(store):
    """A mount straight after fusermount3 -u: the old server may still be
    making its last commit, and the new one waits for it."""
    store.create('again')
    path = store.new_dir('again')
    for i in range(20):
        store.run('mount', '--background', 'again', path)
        # Unsynced: the unmount leaves the server a commit to make.
        t.write_file(os.path.join(path, f'f{i}'), t.random_bytes(4 * MiB, i))
        subprocess.run(['fusermount3', '-u', path], check=True)
    store.run('mount', '--background', 'again', path)
    try:
        t.check_equal(sorted(os.listdir(path)), sorted(f'f{i}' for i in range(20)), 'files of 20 quick remounts')
    finally:
        subprocess.run(['fusermount3', '-u', path], check=True)


def run():
    t.require_fuse()
    os.umask(0o022)
    with t.Store('posix') as store:
        store.create('posix')
        with store.mount('posix') as m:
            sub = t.Subtests()
            tests = [
                ('regular files', test_regular),
                ('sparse files', test_sparse),
                ('partly written blocks', test_partly_written_blocks),
                ('copy_file_range', test_copy_file_range),
                ('fallocate', test_fallocate),
                ('O_APPEND', test_append),
                ('mmap', test_mmap),
                ('directories', test_directories),
                ('symlinks', test_symlinks),
                ('hard links', test_hard_links),
                ('rename', test_rename),
                ('xattrs', test_xattrs),
                ('chmod, chown, utimensat', test_attributes),
                ('attributes set before write-back', test_attributes_before_writeback),
                ('cp -a', test_cp_a),
                ('permissions for other users', test_permissions),
                ('devices, FIFOs, sockets', test_special_files),
                ('fsync', test_fsync),
                ('20 MiB file', test_large_file),
                ('unlinked open file', test_unlinked_open),
                ('cache staleness', test_cache_staleness),
            ]
            for i, (name, fn) in enumerate(tests):
                d = m.p(f'{i:02d}-{fn.__name__[5:]}')
                os.mkdir(d)
                sub.run(name, fn, d)
            sub.run('statfs', test_statfs, m.path, store.path)
            before = t.manifest(m.path)
            # Everything is still there after an unmount and a new mount, as
            # the server stored it (no kernel cache can answer now).
            m.remount()
            sub.run('persistence across a remount',
                    lambda: t.assert_manifests_equal(before, t.manifest(m.path), 'before and after a remount',
                                                     label_a='before', label_b='after'))
            sub.run('the background server', test_background_server, m)
            sub.run("the store's log moved aside", test_log_moved_aside, m)
            sub.run('a signal stops the server', test_stop_on_signal, m)
        sub.run('a mount straight after an unmount', test_mount_after_unmount, store)
        sub.check()


t.main(run)
