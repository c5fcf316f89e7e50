# SPDX-License-Identifier: LGPL-2.1-or-later
"""Helpers of the send stream tests: a btrfs file system on a loop file,
trees with every kind of file, random changes to them, and send streams
built by hand (for malformed input)."""

import contextlib
import os
import random
import shutil
import stat
import struct
import subprocess

import cowbox_test as t
from cowbox_test import KiB, MiB

# --------------------------------------------------------------------------
# btrfs on a loop file


@contextlib.contextmanager
def btrfs_loop(store, size_mib=512):
    """A fresh btrfs mounted on a loop file in the store's temporary
    directory; skips the test when this machine cannot make one."""
    t.require_root('mounting btrfs on a loop file')
    t.require_program('mkfs.btrfs')
    t.require_program('btrfs')
    image = os.path.join(store.tmp, 'btrfs.img')
    mnt = store.new_dir('btrfs')
    with open(image, 'wb') as f:
        f.truncate(size_mib * MiB)
    r = subprocess.run(['mkfs.btrfs', '-q', '-f', image], capture_output=True, text=True)
    if r.returncode != 0:
        t.skip(f'mkfs.btrfs failed: {r.stderr.strip()}')
    r = subprocess.run(['mount', '-o', 'loop', image, mnt], capture_output=True, text=True)
    if r.returncode != 0:
        t.skip(f'cannot mount btrfs on a loop file here: {r.stderr.strip()}')
    try:
        yield mnt
    finally:
        subprocess.run(['umount', mnt], capture_output=True)
        if os.path.ismount(mnt):
            subprocess.run(['umount', '-l', mnt], capture_output=True)
        with contextlib.suppress(OSError):
            os.unlink(image)


def btrfs(*args, expect=0, timeout=300):
    return t.run_command(['btrfs'] + [str(a) for a in args], expect=expect, timeout=timeout)


def source_text(rng, size):
    """Bytes that compress like source code."""
    words = ['static', 'int', 'return', 'struct', 'const', 'char', 'if', 'for', 'while', 'void',
             'uint64_t', 'size_t', '{', '}', '(', ')', ';', '=', '->', 'NULL', 'r', 'i', 'n']
    out = []
    n = 0
    while n < size:
        line = ' '.join(rng.choice(words) for _ in range(rng.randint(2, 12))) + '\n'
        out.append(line)
        n += len(line)
    return ''.join(out).encode()[:size]


def set_times(path, rng):
    ns = rng.randint(1_000_000_000, 1_900_000_000) * 10**9 + rng.randint(0, 10**9 - 1)
    os.utime(path, ns=(ns, ns), follow_symlinks=False)


# --------------------------------------------------------------------------
# Trees


def make_every_kind(root, seed=1):
    """A tree with every file type, xattrs, hard links, sparse and large
    files, owners, modes (setuid, sticky) and times."""
    rng = random.Random(seed)
    os.makedirs(os.path.join(root, 'src/lib/deep/deeper'))
    os.makedirs(os.path.join(root, 'empty'))
    os.makedirs(os.path.join(root, 'sticky'))
    for i in range(40):
        d = rng.choice(['src', 'src/lib', 'src/lib/deep', 'src/lib/deep/deeper', ''])
        p = os.path.join(root, d, f'file{i}.c')
        t.write_file(p, source_text(rng, rng.choice([0, 1, 100, 4095, 4096, 4097, 20000, 70000])))
    t.write_file(os.path.join(root, 'large.bin'), t.random_bytes(3 * MiB + 12345, seed))
    t.write_file(os.path.join(root, 'large.c'), source_text(rng, 2 * MiB + 777))
    t.write_file(os.path.join(root, 'block-aligned'), t.random_bytes(256 * KiB, seed + 1))
    with open(os.path.join(root, 'sparse'), 'wb') as f:
        f.seek(5 * MiB)
        f.write(b'middle')
        f.truncate(9 * MiB)
    with open(os.path.join(root, 'sparse-head'), 'wb') as f:
        f.write(b'head' * 1000)
        f.truncate(2 * MiB)
    os.link(os.path.join(root, 'src/file0.c') if os.path.exists(os.path.join(root, 'src/file0.c'))
            else os.path.join(root, 'large.c'), os.path.join(root, 'hardlink-a'))
    os.link(os.path.join(root, 'hardlink-a'), os.path.join(root, 'src/lib/hardlink-b'))
    os.symlink('src/lib', os.path.join(root, 'link-to-dir'))
    os.symlink('/nonexistent/absolute', os.path.join(root, 'dangling'))
    os.symlink('x' * 1000, os.path.join(root, 'long-target'))
    os.mkfifo(os.path.join(root, 'fifo'))
    os.mknod(os.path.join(root, 'socket'), stat.S_IFSOCK | 0o644)
    os.mknod(os.path.join(root, 'null'), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(os.path.join(root, 'loop9'), stat.S_IFBLK | 0o660, os.makedev(7, 9))
    os.mknod(os.path.join(root, 'bigdev'), stat.S_IFCHR | 0o600, os.makedev(259, 70000))
    for name, value in (('user.comment', b'hello'), ('user.empty', b''), ('trusted.bin', bytes(range(256)))):
        os.setxattr(os.path.join(root, 'large.c'), name, value)
    os.setxattr(os.path.join(root, 'src'), 'user.dir', b'on a directory')
    os.setxattr(os.path.join(root, 'fifo'), 'trusted.fifo', b'on a fifo')
    t.write_file(os.path.join(root, 'suid'), b'#!/bin/sh\n', mode=0o755)
    os.chmod(os.path.join(root, 'suid'), 0o4755)
    os.chmod(os.path.join(root, 'sticky'), 0o1777)
    os.chmod(os.path.join(root, 'src/lib'), 0o750)
    os.chown(os.path.join(root, 'src/lib/deep'), 1000, 1000)
    os.chown(os.path.join(root, 'large.bin'), 4242, 77)
    os.chown(os.path.join(root, 'dangling'), 5, 6, follow_symlinks=False)
    set_all_times(root, rng)
    # Before 1970: btrfs keeps the seconds signed, and so must a stream.
    os.utime(os.path.join(root, 'suid'), ns=(-1_500_000_000, -315_619_199_750_000_000))


def set_all_times(root, rng):
    """Random times on everything, directories last (children first)."""
    entries = list(t.walk(root))
    for rel, st in reversed(entries):
        set_times(os.path.join(root, rel), rng)
    set_times(root, rng)


def _pick(rng, root, want):
    found = [rel for rel, st in t.walk(root) if want(st)]
    return rng.choice(found) if found else None


def is_file(st):
    return stat.S_ISREG(st.st_mode)


def is_dir(st):
    return stat.S_ISDIR(st.st_mode)


def random_change(root, rng, reflink=False):
    """One random change: create, delete, rename across directories,
    overwrite part of a file, truncate, change a mode, an owner or an
    xattr, link, clone. Returns what it did, for the log."""
    op = rng.choice(['create', 'create', 'mkdir', 'delete', 'rmtree', 'rename', 'rename-dir',
                     'overwrite', 'overwrite', 'append', 'truncate', 'chmod', 'chown', 'xattr',
                     'rmxattr', 'link', 'symlink', 'clone', 'replace-dir'])
    dirs = [''] + [rel for rel, st in t.walk(root) if is_dir(st)]
    name = f'n{rng.randrange(10**6)}'
    target_dir = rng.choice(dirs)
    new = os.path.join(root, target_dir, name)
    if op == 'create':
        size = rng.choice([0, 10, 4000, 5000, 65536, 70000, 300000])
        t.write_file(new, source_text(rng, size) if rng.random() < 0.5 else t.random_bytes(size, rng.randrange(99)))
        return f'create {new} ({size} bytes)'
    if op == 'mkdir':
        os.mkdir(new)
        return f'mkdir {new}'
    if op == 'symlink':
        os.symlink(rng.choice(['..', 'a/b', name]), new)
        return f'symlink {new}'
    if op in ('delete', 'rmtree', 'rename', 'rename-dir', 'replace-dir'):
        want = is_dir if op in ('rmtree', 'rename-dir', 'replace-dir') else (lambda st: not is_dir(st))
        rel = _pick(rng, root, want)
        if rel is None:
            return f'{op}: nothing to do'
        path = os.path.join(root, rel)
        if op == 'delete':
            os.unlink(path)
        elif op == 'rmtree':
            shutil.rmtree(path)
        elif op == 'replace-dir':
            shutil.rmtree(path)
            t.write_file(path, b'was a directory')
        else:
            if op == 'rename-dir' and (new + '/').startswith(path + '/'):
                return f'{op}: would move {rel} into itself'
            os.rename(path, new)
        return f'{op} {rel} -> {new}'
    rel = _pick(rng, root, is_file)
    if rel is None:
        return f'{op}: no file'
    path = os.path.join(root, rel)
    size = os.path.getsize(path)
    if op in ('overwrite', 'append'):
        with open(path, 'r+b') as f:
            off = size if op == 'append' else rng.randrange(size + 1)
            f.seek(off)
            n = rng.choice([1, 100, 4096, 65536, 100000])
            f.write(t.random_bytes(n, rng.randrange(10**6)))
        return f'{op} {rel} at {off}, {n} bytes'
    if op == 'truncate':
        new_size = rng.choice([0, size // 2, size + 70000, 4096])
        os.truncate(path, new_size)
        return f'truncate {rel} to {new_size}'
    if op == 'chmod':
        os.chmod(path, rng.choice([0o600, 0o644, 0o755, 0o4755, 0o640]))
        return f'chmod {rel}'
    if op == 'chown':
        os.chown(path, rng.randrange(3000), rng.randrange(3000))
        return f'chown {rel}'
    if op == 'xattr':
        os.setxattr(path, f'user.k{rng.randrange(5)}', t.random_bytes(rng.randrange(200), 3))
        return f'xattr {rel}'
    if op == 'rmxattr':
        for n in os.listxattr(path):
            if n.startswith('user.'):
                os.removexattr(path, n)
                return f'rmxattr {rel} {n}'
        return f'rmxattr {rel}: none'
    if op == 'link':
        os.link(path, new)
        return f'link {rel} -> {new}'
    # clone: a copy that shares the blocks where the file system can
    if reflink:
        subprocess.run(['cp', '--reflink=always', path, new], check=True)
    else:
        shutil.copyfile(path, new)
    return f'clone {rel} -> {new}'


# --------------------------------------------------------------------------
# Streams built by hand


def crc32c(data, crc=0):
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc


CMD = {name: i for i, name in enumerate(
    ['unspec', 'subvol', 'snapshot', 'mkfile', 'mkdir', 'mknod', 'mkfifo', 'mksock', 'symlink',
     'rename', 'link', 'unlink', 'rmdir', 'set_xattr', 'remove_xattr', 'write', 'clone',
     'truncate', 'chmod', 'chown', 'utimes', 'end', 'update_extent', 'fallocate', 'fileattr',
     'encoded_write'])}
ATTR = {name: i for i, name in enumerate(
    ['unspec', 'uuid', 'ctransid', 'ino', 'size', 'mode', 'uid', 'gid', 'rdev', 'ctime', 'mtime',
     'atime', 'otime', 'xattr_name', 'xattr_data', 'path', 'path_to', 'path_link', 'file_offset',
     'data', 'clone_uuid', 'clone_ctransid', 'clone_path', 'clone_offset', 'clone_len',
     'fallocate_mode', 'fileattr', 'unencoded_file_len', 'unencoded_len', 'unencoded_offset',
     'compression', 'encryption'])}
U32_ATTRS = ('fallocate_mode', 'compression', 'encryption')


def tlv(attr, value):
    if isinstance(value, str):
        value = value.encode()
    elif isinstance(value, tuple):       # a time: seconds, nanoseconds
        value = struct.pack('<QI', *value)
    elif isinstance(value, int):
        value = struct.pack('<I' if attr in U32_ATTRS else '<Q', value)
    return struct.pack('<HH', ATTR[attr], len(value)) + value


def command(cmd, *attrs, crc=None):
    payload = b''.join(tlv(a, v) for a, v in attrs)
    header = struct.pack('<IHI', len(payload), CMD[cmd] if isinstance(cmd, str) else cmd, 0)
    if crc is None:
        crc = crc32c(header + payload)
    return struct.pack('<IHI', len(payload), CMD[cmd] if isinstance(cmd, str) else cmd, crc) + payload


def command_v2(cmd, *attrs, data=b''):
    """A version 2 command whose DATA attribute runs to its end."""
    payload = b''.join(tlv(a, v) for a, v in attrs) + struct.pack('<H', ATTR['data']) + data
    h = struct.pack('<IHI', len(payload), CMD[cmd], 0)
    return struct.pack('<IHI', len(payload), CMD[cmd], crc32c(h + payload)) + payload


def header(version=1):
    return b'btrfs-stream\0' + struct.pack('<I', version)


def simple_stream(name='hand', uuid=b'\x11' * 16, body=()):
    """A stream of one subvolume: SUBVOL, the body's commands, END."""
    return (header() + command('subvol', ('path', name), ('uuid', uuid), ('ctransid', 7))
            + b''.join(body) + command('end'))
