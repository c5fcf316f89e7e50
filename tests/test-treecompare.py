#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""The tree comparison that the FUSE tests rely on finds every kind of
difference they claim to check, and the JSON readers accept the shapes
they should. Runs on plain host directories: no store, no FUSE."""

import os
import stat
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402


def build_tree(root):
    os.makedirs(os.path.join(root, 'd', 'e'))
    t.write_file(os.path.join(root, 'd', 'small'), b'hello\n')
    t.write_file(os.path.join(root, 'd', 'e', 'big'), t.random_bytes(300 * t.KiB, 1))
    os.link(os.path.join(root, 'd', 'small'), os.path.join(root, 'hard'))
    os.symlink('d/small', os.path.join(root, 'link'))
    os.mkfifo(os.path.join(root, 'fifo'))
    os.setxattr(os.path.join(root, 'd', 'small'), 'user.k', b'v')
    if os.geteuid() == 0:
        os.mknod(os.path.join(root, 'null'), stat.S_IFCHR | 0o600, os.makedev(1, 3))


def expect_difference(a, b, needle, what):
    diffs = t.compare_trees(a, b)
    t.check(diffs, f'{what}: no difference reported')
    t.check(any(needle in d for d in diffs), f'{what}: no difference mentions {needle!r}: {diffs}')


def mutations():
    """(what, function of the copy's root, text the report must contain)"""
    def content(r):
        p = os.path.join(r, 'd', 'e', 'big')
        with open(p, 'r+b') as f:
            f.seek(200000)
            b = f.read(1)
            f.seek(200000)
            f.write(bytes([b[0] ^ 1]))
        os.utime(p, ns=(os.stat(p).st_atime_ns, os.stat(os.path.join(a_root, 'd', 'e', 'big')).st_mtime_ns))

    def hard_link_broken(r):
        os.unlink(os.path.join(r, 'hard'))
        t.write_file(os.path.join(r, 'hard'), b'hello\n')

    def nested_only(r):
        t.write_file(os.path.join(r, 'd', 'e', 'extra'), b'')

    def dev(r):
        os.unlink(os.path.join(r, 'null'))
        os.mknod(os.path.join(r, 'null'), stat.S_IFCHR | 0o600, os.makedev(1, 5))

    out = [
        ('content', content, 'offset 200000'),
        ('mode', lambda r: os.chmod(os.path.join(r, 'd', 'small'), 0o600), 'mode'),
        ('size', lambda r: os.truncate(os.path.join(r, 'd', 'e', 'big'), 1000), 'size'),
        ('xattr value', lambda r: os.setxattr(os.path.join(r, 'd', 'small'), 'user.k', b'w'), 'xattrs'),
        ('xattr missing', lambda r: os.removexattr(os.path.join(r, 'd', 'small'), 'user.k'), 'xattrs'),
        ('symlink target', lambda r: (os.unlink(os.path.join(r, 'link')),
                                      os.symlink('d/smalL', os.path.join(r, 'link'))), 'target'),
        ('type', lambda r: (os.unlink(os.path.join(r, 'fifo')),
                            t.write_file(os.path.join(r, 'fifo'), b'')), 'type'),
        ('hard link', hard_link_broken, 'links'),
        ('extra entry', nested_only, 'only in'),
        ('missing entry', lambda r: os.unlink(os.path.join(r, 'd', 'e', 'big')), 'only in'),
        ('mtime', lambda r: os.utime(os.path.join(r, 'd', 'small'), ns=(1, 123456789)), 'mtime_ns'),
        ('dir mtime', lambda r: os.utime(os.path.join(r, 'd', 'e'), ns=(1, 123456789)), 'mtime_ns'),
    ]
    if os.geteuid() == 0:
        out.append(('owner', lambda r: os.lchown(os.path.join(r, 'link'), 1234, 5678), 'uid'))
        out.append(('device numbers', dev, 'rdev'))
    return out


a_root = None


def test_json_readers():
    info = {'name': 'a', 'uuid': '0' * 36, 'parent_uuid': None, 'readonly': False,
            'logical_bytes': 1, 'referenced_bytes': 2, 'exclusive_bytes': 3, 'inodes': 4,
            'mounted_by': None}
    for doc in ([info], {'subvolumes': [info]}):
        got = t.json_subvolume_list(doc)
        t.check_equal(len(got), 1, 'subvolumes read')
        t.check_equal(got[0]['parent_uuid'], '', 'parent_uuid of none')
        t.check_equal(got[0]['mounted_by'], 0, 'mounted_by of none')
    t.check_equal(t.json_subvolume({'subvolume': info})['name'], 'a', 'wrapped subvolume')
    usage = {k: 1 for k in t.USAGE_KEYS}
    for doc in ({**usage, 'subvolumes': [{'name': 'a'}]}, {'total': usage, 'subvolumes': [{'name': 'a'}]}):
        t.check_equal(t.json_usage(doc)['logical_bytes'], 1, 'usage logical_bytes')
        t.check_equal(t.json_usage_subvolume(doc, 'a'), {'name': 'a'}, 'usage of one subvolume')
    try:
        t.json_subvolume({'name': 'a'})
    except t.Failure:
        pass
    else:
        t.fail('a subvolume object without its keys was accepted')


def run():
    global a_root
    with t.temporary_directory('treecompare') as tmp:
        a_root = os.path.join(tmp, 'a')
        os.mkdir(a_root)
        build_tree(a_root)
        sub = t.Subtests()
        for i, (what, mutate, needle) in enumerate(mutations()):
            def one():
                b = os.path.join(tmp, f'b{i}')
                t.copy_tree(a_root, b)
                t.assert_trees_equal(a_root, b, 'a fresh copy')
                mutate(b)
                expect_difference(a_root, b, needle, what)
            sub.run(what, one)
        sub.run('json readers', test_json_readers)
        sub.check()


t.main(run)
