#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Random changes, sent as increments: for each seed, a tree is made in a
subvolume and changed at random in rounds (create, delete, rename across
directories, overwrite parts, truncate, change modes, owners and xattrs,
hard links); after each round a read-only snapshot is sent as an
increment on the one before, received by a second store, and the two
images must be identical. Where btrfs can be mounted, `btrfs receive`
applies the same streams and must rebuild the same trees.

COWBOX_RANDOM_SEEDS (default 6), COWBOX_RANDOM_ROUNDS (3) and
COWBOX_RANDOM_CHANGES (20) make it longer; COWBOX_RANDOM_SEED=N runs one
seed. The seed is printed on failure."""

import contextlib
import os
import random
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402
import stream_test as st  # noqa: E402


def initial_tree(root, rng):
    for d in ('a', 'a/b', 'c', 'c/d/e'):
        os.makedirs(os.path.join(root, d), exist_ok=True)
    for i in range(25):
        d = rng.choice(['', 'a', 'a/b', 'c', 'c/d/e'])
        size = rng.choice([0, 50, 4000, 5000, 70000, 200000])
        t.write_file(os.path.join(root, d, f'f{i}'), st.source_text(rng, size))
    os.symlink('a/b', os.path.join(root, 'link'))
    t.write_file(os.path.join(root, 'linked'), st.source_text(rng, 9000))
    os.link(os.path.join(root, 'linked'), os.path.join(root, 'a', 'second-name'))


def one_seed(seed, store_a, store_b, btrfs_dir, rounds, changes):
    rng = random.Random(seed)
    work = f'work{seed}'
    store_a.create(work)
    with store_a.mount(work) as m:
        initial_tree(m.path, rng)
    versions = [f's{seed}v0']
    store_a.snapshot(work, versions[0], readonly=True)
    streams = store_a.new_dir(f'streams{seed}')

    path = os.path.join(streams, 'v0')
    store_a.run('send', '-f', path, versions[0])
    store_b.run('receive', '-f', path)
    if btrfs_dir:
        st.btrfs('receive', '-f', path, btrfs_dir)

    for k in range(1, rounds + 1):
        log = []
        with store_a.mount(work) as m:
            for _ in range(changes):
                log.append(st.random_change(m.path, rng))
        versions.append(f's{seed}v{k}')
        store_a.snapshot(work, versions[-1], readonly=True)
        path = os.path.join(streams, f'v{k}')
        proto = ['--proto', '2'] if rng.random() < 0.5 else []
        store_a.run('send', *proto, '-p', versions[-2], '-f', path, versions[-1])
        store_b.run('receive', '-f', path)
        with store_a.mount(versions[-1]) as ma, store_b.mount(versions[-1]) as mb:
            diffs = t.compare_trees(ma.path, mb.path)
            if btrfs_dir:
                st.btrfs('receive', '-f', path, btrfs_dir)
                diffs += [f'btrfs: {d}' for d in t.compare_trees(ma.path, os.path.join(btrfs_dir, versions[-1]))]
        if diffs:
            t.fail(f'seed {seed}, round {k}: the received image differs:\n  ' + '\n  '.join(diffs[:30]) +
                   '\nchanges of the round:\n  ' + '\n  '.join(log))
    print(f'seed {seed}: {rounds} increments of {changes} changes each received identically', flush=True)


def run():
    t.require_fuse()
    seeds = t.env_int('COWBOX_RANDOM_SEEDS', 6)
    rounds = t.env_int('COWBOX_RANDOM_ROUNDS', 3)
    changes = t.env_int('COWBOX_RANDOM_CHANGES', 20)
    one = os.environ.get('COWBOX_RANDOM_SEED')
    seed_list = [int(one)] if one else list(range(1, seeds + 1))
    with t.Store('images-random-a') as a, t.Store('images-random-b') as b:
        with contextlib.ExitStack() as stack:
            btrfs_dir = None
            try:
                fs = stack.enter_context(st.btrfs_loop(a))
                btrfs_dir = os.path.join(fs, 'received')
                os.mkdir(btrfs_dir)
            except t.Skip as e:
                print(f'without btrfs: {e}', flush=True)
            for seed in seed_list:
                one_seed(seed, a, b, btrfs_dir, rounds, changes)
        b.fsck()


if __name__ == '__main__':
    t.main(run)
