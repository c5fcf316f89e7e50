#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Malformed and hostile send streams: each is refused with the byte offset
(where there is one) and the reason, nothing of it is left in the store,
and nothing outside the image is touched. Then a good stream still goes
in, and the store checks out. Images under way are unseen by others, all
named or none, and those of a receive killed in another PID namespace are
kept while it lives and removed after."""

import fcntl
import os
import shutil
import stat
import struct
import subprocess
import sys
import time
import uuid

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import stream_test as st  # noqa: E402
from stream_test import command, command_v2, header, simple_stream  # noqa: E402

UUID = b'\x42' * 16


def mkfile(path):
    return command('mkfile', ('path', path), ('ino', 300))


def cases(outside):
    good = simple_stream('good', body=[mkfile('f'), command('write', ('path', 'f'), ('file_offset', 0),
                                                             ('data', b'content'))])
    end_at = len(good) - len(command('end'))
    bad_crc = bytearray(good)
    bad_crc[40] ^= 0x01
    yield 'empty input', b'', 'empty'
    yield 'zstd: nothing in it', subprocess.run(['zstd', '-q', '-c'], input=b'', capture_output=True,
                                                check=True).stdout, 'empty'
    yield 'not a stream', b'hello world, not a stream at all', 'not a send stream'
    yield 'version 3', header(3) + command('end'), 'version 3'
    yield 'truncated in the header', good[:10], 'truncated'
    yield 'truncated in a command', good[:end_at - 3], 'truncated'
    yield 'no END command', good[:end_at], 'truncated'
    yield 'damaged byte', bytes(bad_crc), 'checksum mismatch'
    yield 'unknown command', simple_stream(body=[command(99, ('path', 'x'))]), 'unknown command 99'
    yield 'unknown attribute', header() + command('subvol', ('path', 'x'), ('uuid', UUID), ('ctransid', 1)) \
        + _raw_command(3, struct.pack('<HH', 77, 1) + b'z') + command('end'), 'unknown attribute'
    yield 'huge command', header() + struct.pack('<IHI', 0x7fffffff, 3, 0), 'allowed'
    yield 'attribute past its command', header() + _raw_command(1, struct.pack('<HH', 15, 500) + b'abc'), \
        'runs past'
    yield 'missing attribute', simple_stream(body=[command('write', ('path', 'f'), ('data', b'x'))]), \
        'without its file_offset'
    yield 'dot-dot path', simple_stream(body=[mkfile('../escape')]), "'..'"
    yield 'dot-dot inside', simple_stream(body=[command('mkdir', ('path', 'd'), ('ino', 5)),
                                                mkfile('d/../../escape')]), "'..'"
    yield 'absolute path', simple_stream(body=[mkfile(outside + '/escape')]), 'absolute'
    yield 'malformed ACL', simple_stream(body=[mkfile('f'), command('set_xattr', ('path', 'f'), (
        'xattr_name', 'system.posix_acl_access'), ('xattr_data', b'\x02\x00\x00\x00\x01'))]), 'Invalid argument'
    yield 'unknown ACL', simple_stream(body=[mkfile('f'), command('set_xattr', ('path', 'f'), (
        'xattr_name', 'system.posix_acl_other'), ('xattr_data', b'\x02\x00\x00\x00'))]), 'not supported'
    yield 'empty component', simple_stream(body=[mkfile('a//b')]), 'empty path component'
    yield 'through a symlink', simple_stream(body=[
        command('symlink', ('path', 'l'), ('ino', 5), ('path_link', outside)), mkfile('l/escape')]), \
        'symbolic link'
    yield 'write through a symlink', simple_stream(body=[
        command('symlink', ('path', 'l'), ('ino', 5), ('path_link', outside + '/victim')),
        command('write', ('path', 'l'), ('file_offset', 0), ('data', b'evil'))]), 'not a regular file'
    yield 'rename out', simple_stream(body=[mkfile('x'), command('rename', ('path', 'x'),
                                                                 ('path_to', '../x'))]), "'..'"
    yield 'directory into itself', simple_stream(body=[
        command('mkdir', ('path', 'a'), ('ino', 5)), command('mkdir', ('path', 'a/b'), ('ino', 6)),
        command('rename', ('path', 'a'), ('path_to', 'a/b/c'))]), 'into itself'
    deep = '/'.join(f'{i}' * 250 for i in range(8))
    yield 'why, after a long path', simple_stream(body=[
        command('mkdir', ('path', deep[:250 * (i + 1) + i]), ('ino', 5 + i)) for i in range(7)] + [
        mkfile(deep), mkfile(deep)]), 'File exists'
    yield 'NUL in a path', simple_stream(body=[mkfile('a\0b')]), 'NUL'
    yield 'missing parent image', header() + command(
        'snapshot', ('path', 'inc'), ('uuid', UUID), ('ctransid', 2), ('clone_uuid', b'\x99' * 16),
        ('clone_ctransid', 1)) + command('end'), '99999999-9999-9999-9999-999999999999'
    yield 'write past the limit', simple_stream(body=[mkfile('f'), command(
        'write', ('path', 'f'), ('file_offset', 2**63 - 2), ('data', b'xyz'))]), 'too large'
    yield 'clone from an unknown subvolume', simple_stream(body=[mkfile('f'), command(
        'clone', ('file_offset', 0), ('clone_len', 10), ('path', 'f'), ('clone_uuid', b'\x77' * 16),
        ('clone_ctransid', 1), ('clone_path', 'g'), ('clone_offset', 0))]), 'not in this store'
    yield 'second subvolume truncated', good + simple_stream('second', body=[mkfile('g')])[:-5], 'truncated'
    yield 'command before the subvolume', header() + mkfile('x') + command('end'), 'before the stream'
    yield 'garbage after the stream', good + b'garbage', 'stream header'
    yield 'two subvolumes of one name', good + simple_stream('good', uuid=b'\x22' * 16, body=[mkfile('g')]), \
        "two subvolumes named 'good'"


def tamper_with_data(stream):
    """Changes the last byte of the first WRITE command's data and fixes
    that command's checksum."""
    pos = 17
    while pos < len(stream):
        length, cmd = struct.unpack_from('<IH', stream, pos)
        if cmd == st.CMD['write']:
            payload = bytearray(stream[pos + 10:pos + 10 + length])
            payload[-1] ^= 0x01
            return stream[:pos] + _raw_command(cmd, bytes(payload)) + stream[pos + 10 + length:]
        pos += 10 + length
    t.fail('no WRITE command in the stream to tamper with')


def _raw_command(cmd, payload):
    h = struct.pack('<IHI', len(payload), cmd, 0)
    return struct.pack('<IHI', len(payload), cmd, st.crc32c(h + payload)) + payload


def zstd_cases(store, tmp):
    """Framed streams: a damaged, a truncated and a tampered one."""
    store.create('src')
    with store.mount('src') as m:
        t.write_file(m.p('data'), t.random_bytes(300000, 5))
    store.snapshot('src', 'img', readonly=True)
    path = os.path.join(tmp, 'img.zst')
    store.run('send', '--zstd', '-f', path, 'img')
    data = open(path, 'rb').read()
    store.run('subvolume', 'delete', 'img')
    store.run('subvolume', 'delete', 'src')
    raw = subprocess.run(['zstd', '-q', '-d', '-c', path], capture_output=True, check=True).stdout
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 0xff
    yield 'zstd: damaged', bytes(flipped), 'damaged'
    yield 'zstd: truncated', data[:len(data) // 2], 'truncated'
    # One byte of file data changed, its command's checksum made right,
    # compressed again: only the digest catches it.
    tampered = tamper_with_data(raw)
    recompressed = subprocess.run(['zstd', '-q', '-c', '--no-check'], input=bytes(tampered),
                                  capture_output=True, check=True).stdout
    yield 'zstd: digest mismatch', recompressed + data[-40:], 'digest'


def check_refused(store, label, data, needle, tmp, outside, via_pipe):
    path = os.path.join(tmp, 'case')
    with open(path, 'wb') as f:
        f.write(data)
    if via_pipe:
        with open(path, 'rb') as f:
            p = subprocess.run([t.tool(), '--store', store.path, 'receive'], stdin=f, capture_output=True,
                               text=True, timeout=60)
        code, err = p.returncode, p.stderr
    else:
        r = store.run('receive', '-f', path, expect=None)
        code, err = r.code, r.err
    how = 'from a pipe' if via_pipe else 'from a file'
    if code != 1:
        t.fail(f'{label} ({how}): exit status {code}, expected 1:\n{err}')
    if needle.lower() not in err.lower():
        t.fail(f'{label} ({how}): the error does not say "{needle}":\n{err}')
    if data and 'failed at byte' not in err and 'empty' not in needle and 'digest' not in needle \
            and 'zstd' not in label:
        t.fail(f'{label} ({how}): the error names no byte offset:\n{err}')
    names = store.names()
    if names:
        t.fail(f'{label} ({how}): left subvolumes behind: {names}')
    if os.listdir(outside):
        t.fail(f'{label} ({how}): wrote outside the image: {os.listdir(outside)}')


def every_command_stream():
    """A version 2 stream that uses every command a receiver must apply."""
    import zlib
    text = b'0123456789abcdef' * 8192          # 128 KiB
    t0 = (1_600_000_000, 123456789)
    body = [
        command('mkdir', ('path', 'd'), ('ino', 10)),
        command('mkfile', ('path', 'd/f'), ('ino', 11)),
        command_v2('write', ('path', 'd/f'), ('file_offset', 0), data=text),
        command('mkfile', ('path', 'g'), ('ino', 12)),
        command('clone', ('file_offset', 0), ('clone_len', 65536), ('path', 'g'), ('clone_uuid', UUID),
                ('clone_ctransid', 7), ('clone_path', 'd/f'), ('clone_offset', 65536)),
        command('fallocate', ('path', 'd/f'), ('fallocate_mode', 3), ('file_offset', 4096), ('size', 4096)),
        command('fileattr', ('path', 'd/f'), ('fileattr', 0x200)),
        command('update_extent', ('path', 'd/f'), ('file_offset', 0), ('size', 10)),
        command('mkfile', ('path', 'z'), ('ino', 13)),
        command_v2('encoded_write', ('path', 'z'), ('file_offset', 0), ('unencoded_file_len', 5000),
                   ('unencoded_len', 6000), ('unencoded_offset', 1000), ('compression', 1),
                   ('encryption', 0), data=zlib.compress(bytes(range(250)) * 24)),
        command('mknod', ('path', 'null'), ('ino', 14), ('rdev', (1 << 8) | 3), ('mode', 0o20644)),
        command('mkfifo', ('path', 'fifo'), ('ino', 15), ('rdev', 0), ('mode', 0o10644)),
        command('mksock', ('path', 'sock'), ('ino', 16), ('rdev', 0), ('mode', 0o140644)),
        command('symlink', ('path', 'sym'), ('ino', 17), ('path_link', '../anywhere')),
        command('link', ('path', 'hard'), ('path_link', 'g')),
        command('rename', ('path', 'g'), ('path_to', 'd/g')),
        command('set_xattr', ('path', 'd/g'), ('xattr_name', 'user.a'), ('xattr_data', b'1')),
        command('set_xattr', ('path', 'd/g'), ('xattr_name', 'user.b'), ('xattr_data', b'2')),
        command('remove_xattr', ('path', 'd/g'), ('xattr_name', 'user.a')),
        command('mkdir', ('path', 'gone'), ('ino', 18)),
        command('mkfile', ('path', 'gone/x'), ('ino', 19)),
        command('unlink', ('path', 'gone/x')),
        command('rmdir', ('path', 'gone')),
        command('truncate', ('path', 'd/f'), ('size', 100000)),
        command('chown', ('path', 'd/g'), ('uid', 1234), ('gid', 5678)),
        command('chmod', ('path', 'd/g'), ('mode', 0o640)),
        command('utimes', ('path', 'd/g'), ('atime', t0), ('mtime', t0), ('ctime', t0)),
    ]
    stream = (header(2) + command('subvol', ('path', 'every'), ('uuid', UUID), ('ctransid', 7))
              + b''.join(body) + command('end'))
    expect_f = bytearray(text[:100000])
    expect_f[4096:8192] = bytes(4096)
    expect_z = (bytes(range(250)) * 24)[1000:6000]
    return stream, bytes(expect_f), text[65536:131072], expect_z, t0


def lzo_literals(data):
    """An LZO1X stream of data as one literal run (16 to 255 + 18 bytes
    more for each zero byte of the length), then the end marker."""
    n = len(data) - 18
    zeros, rest = divmod(n, 255)
    if rest == 0:
        zeros, rest = zeros - 1, 255
    return bytes([0]) + bytes(zeros) + bytes([rest]) + data + b'\x11\0\0'


def check_lzo_past_its_data(store, tmp):
    """btrfs's LZO framing (4 KiB sectors): a segment that ends 2 bytes
    before a sector, whose padding runs past the data's stated total. The
    bytes after the total are not part of the extent: a segment found there
    was decoded, and its length, unchecked, let the decoder read past the
    command's buffer."""
    literals = bytes(range(256)) * 16
    seg = lzo_literals(literals[:4066])
    assert 8 + len(seg) == 4094, len(seg)
    beyond = lzo_literals(b'X' * 100)
    data = struct.pack('<I', 4095) + struct.pack('<I', len(seg)) + seg + b'\0\0' \
        + struct.pack("<I", len(beyond)) + beyond
    body = [mkfile('f'),
            command_v2('encoded_write', ('path', 'f'), ('file_offset', 0), ('unencoded_file_len', 8192),
                       ('unencoded_len', 8192), ('unencoded_offset', 0), ('compression', 3),
                       ('encryption', 0), data=data)]
    stream = header(2) + command('subvol', ('path', 'lzo'), ('uuid', UUID), ('ctransid', 7)) \
        + b''.join(body) + command('end')
    path = os.path.join(tmp, 'lzo')
    with open(path, 'wb') as f:
        f.write(stream)
    store.run('receive', '-f', path)
    with store.mount('lzo') as m:
        t.check_bytes(t.read_file(m.p('f')), literals[:4066] + bytes(8192 - 4066),
                      'f (LZO, padding past the data)')
    store.run('subvolume', 'delete', 'lzo')


def check_huge_sparse_ranges(store, tmp):
    """Clones of, and holes punched in, ranges of a petabyte of a sparse
    file: the work follows the few blocks that hold data, not the size (a
    walk of every 64 KiB block of the range never ended). The clones get
    the source's data and its holes, also over data they had before."""
    size = 2**50
    middle, end = 5 * 2**20, size - 3

    def clone(dst, dst_offset, length, src, src_offset):
        return command('clone', ('file_offset', dst_offset), ('clone_len', length), ('path', dst),
                       ('clone_uuid', UUID), ('clone_ctransid', 7), ('clone_path', src),
                       ('clone_offset', src_offset))

    def write(path, offset, data):
        return command('write', ('path', path), ('file_offset', offset), ('data', data))

    body = [mkfile('f'), command('truncate', ('path', 'f'), ('size', size)), write('f', middle, b'middle'),
            write('f', end, b'end'),
            mkfile('g'), write('g', 0, b'x' * 40000), write('g', 2**40, b'y' * 100), clone('g', 0, size, 'f', 0),
            mkfile('h'), clone('h', 4096, size // 2, 'f', 0),
            command('fallocate', ('path', 'f'), ('fallocate_mode', 3), ('file_offset', 0), ('size', size))]
    path = os.path.join(tmp, 'sparse')
    with open(path, 'wb') as f:
        f.write(simple_stream('sparse', uuid=UUID, body=body))
    store.run('receive', '-f', path, timeout=60)

    def read_at(p, offset, n):
        with open(p, 'rb') as f:
            f.seek(offset)
            return f.read(n)

    with store.mount('sparse', readonly=True) as m:
        t.check_equal(os.path.getsize(m.p('f')), size, 'the size of f, its holes punched')
        t.check_bytes(read_at(m.p('f'), middle - 10, 20) + read_at(m.p('f'), end - 10, 20), bytes(33),
                      'f after its whole range was punched')
        t.check_equal(os.path.getsize(m.p('g')), size, 'the size of g, cloned from f')
        t.check_bytes(read_at(m.p('g'), 0, 40000) + read_at(m.p('g'), 2**40, 100), bytes(40100),
                      'what g held where f has holes')
        t.check_bytes(read_at(m.p('g'), middle - 2, 10) + read_at(m.p('g'), end - 2, 10),
                      b'\0\0middle\0\0' + b'\0\0end', "g's data, cloned from f")
        t.check_equal(os.path.getsize(m.p('h')), 4096 + size // 2, 'the size of h, cloned from f')
        t.check_bytes(read_at(m.p('h'), 0, 4096) + read_at(m.p('h'), 4096 + middle - 2, 10),
                      bytes(4096) + b'\0\0middle\0\0', 'h, cloned from f to another offset in its block')
    store.run('subvolume', 'delete', 'sparse')


def check_increment_in_one_input(store, tmp):
    """An image and an increment on it in one input: the increment finds its
    parent, and clones from it, before either has its name."""
    a, b = b'\xa1' * 16, b'\xb2' * 16
    data = t.random_bytes(65536, 3)
    full = simple_stream('inc-a', uuid=a, body=[mkfile('f')] + [
        command('write', ('path', 'f'), ('file_offset', off), ('data', data[off:off + 32768])) for off in (0, 32768)])
    inc = (header() + command('snapshot', ('path', 'inc-b'), ('uuid', b), ('ctransid', 8), ('clone_uuid', a),
                              ('clone_ctransid', 7))
           + mkfile('g') + command('clone', ('file_offset', 0), ('clone_len', 65536), ('path', 'g'),
                                   ('clone_uuid', a), ('clone_ctransid', 7), ('clone_path', 'f'),
                                   ('clone_offset', 0))
           + command('end'))
    path = os.path.join(tmp, 'increment')
    with open(path, 'wb') as f:
        f.write(full + inc)
    store.run('receive', '-f', path)
    names = store.names()
    t.check('inc-a' in names and 'inc-b' in names, f'images of an input with an increment: {names}')
    with store.mount('inc-b', readonly=True) as m:
        t.check_bytes(t.read_file(m.p('f')), data, 'inc-b/f, from its parent')
        t.check_bytes(t.read_file(m.p('g')), data, 'inc-b/g, cloned from its parent')
    t.check_equal(store.show('inc-b')['received_uuid'], str(uuid.UUID(bytes=b)), 'the received UUID of inc-b')
    for name in ('inc-b', 'inc-a'):
        store.run('subvolume', 'delete', name)


def check_increment_on_another_tree(store, tmp):
    """An increment, or a clone, applies only to the image it was made
    against: read-only, at the transaction the stream names. Against one
    that changed since, or a writable subvolume of that UUID, it is
    refused, and nothing is left behind."""
    a = b'\xa7' * 16
    data = t.random_bytes(8192, 4)
    before = store.names()
    base = simple_stream('tree-a', uuid=a, body=[
        mkfile('f'), command('write', ('path', 'f'), ('file_offset', 0), ('data', data))])
    path = os.path.join(tmp, 'tree-a')
    with open(path, 'wb') as f:
        f.write(base)
    store.run('receive', '-f', path)
    t.check_equal(store.show('tree-a')['stransid'], 7, 'the transaction tree-a was received at')
    store.create('writable')
    writable = store.show('writable')

    def increment(parent, transid, clone_transid=None):
        return (header() + command('snapshot', ('path', 'tree-b'), ('uuid', b'\xb7' * 16), ('ctransid', 9),
                                   ('clone_uuid', parent), ('clone_ctransid', transid))
                + mkfile('g') + command('clone', ('file_offset', 0), ('clone_len', 8192), ('path', 'g'),
                                        ('clone_uuid', a), ('clone_ctransid', clone_transid or 7),
                                        ('clone_path', 'f'), ('clone_offset', 0))
                + command('end'))

    cases = (('an increment on tree-a as it was at another transaction', increment(a, 6), 'changed since'),
             ('an increment on a writable subvolume', increment(uuid.UUID(writable['uuid']).bytes,
                                                               writable['ctransid']), 'not read-only'),
             ('a clone from tree-a at another transaction', increment(a, 7, clone_transid=8), 'changed since'))
    for label, stream, needle in cases:
        path = os.path.join(tmp, 'case')
        with open(path, 'wb') as f:
            f.write(stream)
        r = store.run('receive', '-f', path, expect=1)
        t.check(needle in r.err, f'{label}: the error does not say "{needle}":\n{r.err}')
        t.check_equal(sorted(store.names()), sorted(before + ['tree-a', 'writable']), f'subvolumes after {label}')
    with open(path, 'wb') as f:
        f.write(increment(a, 7))
    store.run('receive', '-f', path)
    with store.mount('tree-b', readonly=True) as m:
        t.check_bytes(t.read_file(m.p('g')), data, 'tree-b/g, cloned from tree-a')
    for name in ('tree-b', 'tree-a', 'writable'):
        store.run('subvolume', 'delete', name)


def check_input_at_offset(store, tmp):
    """A file given as standard input at an offset (after another reader
    took what came before) is the input from there on: the pass that
    applies it reads again from the same place, not from the file's start,
    whose bytes the first pass never checked."""
    before = simple_stream('before-offset', uuid=b'\xc1' * 16)
    after = simple_stream('after-offset', uuid=b'\xc2' * 16, body=[mkfile('f')])
    path = os.path.join(tmp, 'at-offset')
    with open(path, 'wb') as f:
        f.write(before + after)
    names = store.names()
    with open(path, 'rb') as f:
        f.seek(len(before))
        p = subprocess.run([t.tool(), '--store', store.path, 'receive'], stdin=f, capture_output=True, text=True,
                           timeout=60)
    t.check_equal(p.returncode, 0, f'a receive from a file at an offset: {p.stderr}')
    t.check_equal(sorted(set(store.names()) - set(names)), ['after-offset'],
                  'images received from a file at an offset')
    store.run('subvolume', 'delete', 'after-offset')


def check_unfinished_image_unseen(store, tmp):
    """An image whose input is still being read is not yet there for others:
    an increment on it, or a clone from it, is refused (named by its
    received UUID or by its own), and nothing is left once its input turns
    out bad."""
    half = b'\xc3' * 16
    full = simple_stream('half', uuid=half, body=[mkfile('f')])
    before = store.names()
    receiver = subprocess.Popen([t.tool(), '--store', store.path, 'receive'], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        receiver.stdin.write(full)
        receiver.stdin.flush()
        deadline = time.monotonic() + 60
        while not any(s['name'].startswith('.receiving-') and s['readonly'] for s in store.list()):
            t.check(time.monotonic() < deadline, 'the first image of the input was never complete')
            time.sleep(0.05)
        # Named by the UUID the stream gave it, or by the one the store
        # gave it (which a stream sent from the store would name).
        own = [s['uuid'] for s in store.list() if s['name'].startswith('.receiving-')][0]
        for parent in (half, uuid.UUID(own).bytes):
            inc = (header() + command('snapshot', ('path', 'on-half'), ('uuid', b'\xd4' * 16), ('ctransid', 8),
                                      ('clone_uuid', parent), ('clone_ctransid', 7)) + command('end'))
            clone = simple_stream('clone-half', uuid=b'\xd5' * 16, body=[mkfile('g'), command(
                'clone', ('file_offset', 0), ('clone_len', 0), ('path', 'g'), ('clone_uuid', parent),
                ('clone_ctransid', 7), ('clone_path', 'f'), ('clone_offset', 0))])
            for label, stream in (('an increment on', inc), ('a clone from', clone)):
                path = os.path.join(tmp, 'on-half')
                with open(path, 'wb') as f:
                    f.write(stream)
                r = store.run('receive', '-f', path, expect=None)
                t.check(r.code == 1 and 'not in this store' in r.err,
                        f'{label} an image still being received:\n{r.describe()}')
        receiver.stdin.write(b'garbage')
        receiver.stdin.close()
        err = receiver.stderr.read().decode(errors='replace')
        t.check_equal(receiver.wait(60), 1, f'the receive of a bad input: {err}')
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    t.check_equal(store.names(), before, 'subvolumes after both receives')


def check_names_all_or_nothing(store, tmp):
    """An input of two images whose second name is taken by another while
    it is received: the receive fails, and the first image, named already,
    is not left behind either."""
    first = simple_stream('pair-a', uuid=b'\xe5' * 16, body=[mkfile('f')])
    second = simple_stream('pair-b', uuid=b'\xf6' * 16, body=[mkfile('g')])
    end = len(command('end'))
    before = store.names()
    receiver = subprocess.Popen([t.tool(), '--store', store.path, 'receive'], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        receiver.stdin.write(first + second[:-end])
        receiver.stdin.flush()
        deadline = time.monotonic() + 60
        while len([s for s in store.list() if s['name'].startswith('.receiving-')]) < 2:
            t.check(time.monotonic() < deadline, 'the second image of the input was never begun')
            time.sleep(0.05)
        store.create('pair-b')
        receiver.stdin.write(second[-end:])
        receiver.stdin.close()
        err = receiver.stderr.read().decode(errors='replace')
        t.check_equal(receiver.wait(60), 1, f'the receive whose second name was taken: {err}')
        t.check("'pair-b' appeared" in err, f'the error of the receive whose second name was taken:\n{err}')
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    t.check_equal(store.names(), sorted(before + ['pair-b']), 'subvolumes after the receive')
    store.run('subvolume', 'delete', 'pair-b')


def receive_claims(store):
    return sorted(n for n in os.listdir(os.path.join(store.path, 'locks')) if n.startswith('claim-receive-'))


def check_dead_receive_in_pid_namespace(store, tmp):
    """The images under way of a receive in another PID namespace (a
    container sharing the store), whose PID means another process here,
    are kept by other receives while it lives, and removed by the next one
    once it was killed, with its claim. A PID in their names would have
    named this namespace's init, alive: kept for ever."""
    if not shutil.which('unshare') or os.geteuid() != 0:
        print('a receive in another PID namespace: skipped (needs unshare and root)')
        return
    first = simple_stream('ns-a', uuid=b'\x1a' * 16, body=[mkfile('f')])
    second = simple_stream('ns-b', uuid=b'\x1b' * 16, body=[mkfile('g')])
    end = len(command('end'))
    others = []
    for name, marker in (('ns-other', b'\x1c'), ('ns-after', b'\x1d')):
        others.append(os.path.join(tmp, name))
        with open(others[-1], 'wb') as f:
            f.write(simple_stream(name, uuid=marker * 16, body=[mkfile('h')]))
    before = store.names()
    claims_before = receive_claims(store)
    t.check_equal(claims_before, [], 'claims left by the receives before, which ended')
    receiver = subprocess.Popen(['unshare', '--pid', '--fork', '--kill-child', t.tool(), '--store', store.path,
                                 'receive'], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)
    try:
        receiver.stdin.write(first + second[:-end])
        receiver.stdin.flush()
        deadline = time.monotonic() + 60
        while len([n for n in store.names() if n.startswith('.receiving-')]) < 2:
            t.check(time.monotonic() < deadline, 'the second image of the input was never begun')
            time.sleep(0.05)
        under_way = sorted(n for n in store.names() if n.startswith('.receiving-'))
        t.check_equal(len(receive_claims(store)), len(claims_before) + 1, 'claims while a receive runs')

        store.run('receive', '-f', others[0])
        t.check_equal(sorted(n for n in store.names() if n.startswith('.receiving-')), under_way,
                      'the images under way of a live receive in another PID namespace, after another receive')
        receiver.kill()
        receiver.wait(60)
        # --kill-child: the receive itself dies with unshare; its claim
        # goes free when it is gone.
        claim = os.path.join(store.path, 'locks', (set(receive_claims(store)) - set(claims_before)).pop())
        with open(claim) as f:
            while True:
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    t.check(time.monotonic() < deadline, 'the killed receive never let go of its claim')
                    time.sleep(0.05)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait()
    store.run('receive', '-f', others[1])
    t.check_equal(store.names(), sorted(before + ['ns-after', 'ns-other']),
                  'subvolumes once a receive followed the killed one')
    t.check_equal(receive_claims(store), claims_before, 'claims once a receive followed the killed one')
    for name in ('ns-after', 'ns-other'):
        store.run('subvolume', 'delete', name)


def check_every_command(store, tmp):
    stream, expect_f, expect_g, expect_z, t0 = every_command_stream()
    path = os.path.join(tmp, 'every')
    with open(path, 'wb') as f:
        f.write(stream)
    store.run('receive', '-f', path)
    with store.mount('every') as m:
        t.check_bytes(t.read_file(m.p('d/f')), expect_f, 'd/f (write, fallocate punch, truncate)')
        t.check_bytes(t.read_file(m.p('d/g')), expect_g, 'd/g (clone, rename)')
        t.check_bytes(t.read_file(m.p('z')), expect_z, 'z (zlib encoded write)')
        st_g = os.lstat(m.p('d/g'))
        t.check_equal((st_g.st_uid, st_g.st_gid, st_g.st_mode & 0o7777, st_g.st_nlink), (1234, 5678, 0o640, 2),
                      'd/g owner, mode and links')
        t.check_equal(st_g.st_mtime_ns, t0[0] * 10**9 + t0[1], 'd/g mtime')
        t.check_equal(os.listxattr(m.p('d/g')), ['user.b'], 'd/g xattrs')
        t.check_equal(os.lstat(m.p('hard')).st_ino, st_g.st_ino, 'hard is a link of d/g')
        t.check_equal(os.stat(m.p('null')).st_rdev, os.makedev(1, 3), 'null device numbers')
        t.check(stat.S_ISFIFO(os.lstat(m.p('fifo')).st_mode), 'fifo is a FIFO')
        t.check(stat.S_ISSOCK(os.lstat(m.p('sock')).st_mode), 'sock is a socket')
        t.check_equal(os.readlink(m.p('sym')), '../anywhere', 'symlink target')
        t.check(not os.path.exists(m.p('gone')), 'gone was removed')


def run():
    with t.Store('images-malformed') as store:
        tmp = store.new_dir('streams')
        outside = store.new_dir('outside')
        all_cases = list(cases(outside))
        if os.path.exists('/dev/fuse') and os.geteuid() == 0:
            all_cases += list(zstd_cases(store, tmp))
        else:
            print('the zstd cases need FUSE and root to make an image: skipped')
        for label, data, needle in all_cases:
            for via_pipe in (False, True):
                check_refused(store, label, data, needle, tmp, outside, via_pipe)
            print(f'refused: {label}')

        # The store works after all that, and holds nothing of it.
        good = simple_stream('good', body=[mkfile('f'), command('write', ('path', 'f'), ('file_offset', 0),
                                                                 ('data', b'content'))])
        path = os.path.join(tmp, 'good')
        with open(path, 'wb') as f:
            f.write(good)
        store.run('receive', '-f', path)
        t.check_equal(store.names(), ['good'], 'images after receiving a good stream')
        if os.path.exists('/dev/fuse') and os.geteuid() == 0:
            check_every_command(store, tmp)
            store.run('subvolume', 'delete', 'every')
            check_lzo_past_its_data(store, tmp)
            check_huge_sparse_ranges(store, tmp)
            check_increment_in_one_input(store, tmp)
            check_increment_on_another_tree(store, tmp)
        check_input_at_offset(store, tmp)
        check_unfinished_image_unseen(store, tmp)
        check_names_all_or_nothing(store, tmp)
        check_dead_receive_in_pid_namespace(store, tmp)
        r = store.run('receive', '-f', path, expect=1)
        t.check('exists already' in r.err, f'receiving the same image twice:\n{r.describe()}')
        store.reap()
        store.fsck()
        t.check_equal(store.usage()['reclaimable_bytes'], 0, 'reclaimable bytes after the reap')


if __name__ == '__main__':
    t.main(run)
