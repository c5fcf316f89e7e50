#!/usr/bin/env python3
# SPDX-License-Identifier: LGPL-2.1-or-later
"""Every benchmark of bench/ in its --smoke mode: each one runs to the end,
exits 0 and prints its final table. A benchmark that cannot run here exits
77 and says why: that one is skipped (the test too, when all are). The
numbers of a smoke run mean nothing; this only keeps the benchmarks
working."""

import os
import re
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cowbox_test as t  # noqa: E402

TIMEOUT = 600       # seconds for one benchmark; together they take about 2 minutes


def benchmarks(root, tool, build, scratch):
    """(name, argv, what its final table must contain: regular expressions)."""
    bench = os.path.join(root, 'bench')
    return [
        ('snapshot-delete',
         [os.path.join(bench, 'snapshot-delete'), '--smoke', '--tool', tool, '--dir', scratch],
         [r'^results: median and worst', r'^cowbox snapshot ', r'^side by side \(medians\):',
          r'^growth from ']),
        ('store-speed',
         [os.path.join(bench, 'store-speed'), '--smoke', '--tool', tool, '--dir', scratch,
          '--hasher', os.path.join(build, 'bench', 'hash-speed')],
         [r'^final table:', r'^target +\| cowbox +\| other +\| ratio +\| target +\| result',
          r'^1\. metadata walk, cold .*\| (met|MISSED by)', r'^7\. mount, full tree .*\| (met|MISSED by)',
          r'^9\. checksums, share of a cold read .*\| (met|MISSED by)',
          r'^\d+ targets met, \d+ missed']),
        ('reap-impact',
         [os.path.join(bench, 'reap-impact'), '--smoke', '--tool', tool, '--dir', scratch],
         [r'^target +\| cowbox +\| ratio +\| target +\| result',
          r'^foreground latency p99 .*\| (met|MISSED by)', r'^reaper rate .*\| (met|MISSED by)',
          r'^\d+ targets met, \d+ missed']),
        ('snapshot-dirty',
         [os.path.join(bench, 'snapshot-dirty'), '--smoke', '--tool', tool, '--dir', scratch],
         [r'^target +\| cowbox +\| other +\| ratio +\| target +\| result',
          r'^snapshot, unflushed data .*\| (met|MISSED by)', r'^\d+ targets met, \d+ missed']),
        ('inode-scale',
         [os.path.join(bench, 'inode-scale'), '--smoke', '--tool', tool, '--dir', scratch,
          '--filler', os.path.join(build, 'bench', 'fill-inodes')],
         [r'^target +\| cowbox +\| target +\| result', r'^snapshot, 20,000 files .*\| (met|MISSED by)',
          r'^server open files, 20,000 files .*\| (met|MISSED)', r'^\d+ targets met, \d+ missed']),
        ('images',
         [os.path.join(bench, 'images'), '--smoke', '--tool', tool, '--dir', scratch],
         [r'^operation +median +worst +MiB/s', r'^cowbox receive ', r'^btrfs send -p ',
          r'^stream sizes: ']),
        ('deep-stack',
         [os.path.join(bench, 'deep-stack'), '--smoke', '--tool', tool, '--dir', scratch],
         [r'^results: median \(worst\) of ', r'^  \d+ layers deep: ', r'^  folded by a reap: ']),
        ('daemon-cycles',
         [os.path.join(bench, 'daemon-cycles'), '--smoke', '--build', build, '--dir', scratch],
         [r'^operation +median +worst +per second', r'^cowbox run ', r'^cowbox snapshot ', r'^cowbox rm ',
          r'^cowbox workspace ', r'^target: cowbox snapshot <= 10 ms: (met|MISSED by)']),
    ]


def smoke(name, argv, patterns):
    print(f'$ {" ".join(argv)}', flush=True)
    r = t.run_command(argv, expect=None, timeout=TIMEOUT)
    print(f'{name}: exit status {r.code} after {r.seconds:.1f}s', flush=True)
    if r.code == t.EXIT_SKIP:
        reason = (r.out.strip() or r.err.strip() or 'no reason given').splitlines()[-1]
        t.skip(f'{name} cannot run here: {reason}')
    t.check(r.code == 0, f'{name} failed:\n{r.describe()}')
    for pattern in patterns:
        t.check(re.search(pattern, r.out, re.MULTILINE),
                f'{name} printed no line matching {pattern!r} (its final table):\n{r.describe()}')
    # The table itself, for the log.
    lines = r.out.rstrip().splitlines()
    print('\n'.join(lines[-40:]), flush=True)


def run():
    t.require_fuse()
    root = t.source_root()
    tool = t.tool()
    build = os.environ.get('COWBOX_BUILD_ROOT')
    t.check(build, 'COWBOX_BUILD_ROOT is not set: run the tests with meson test')
    with t.temporary_directory('bench-smoke') as scratch:
        sub = t.Subtests()
        ran = []
        todo = benchmarks(root, tool, build, scratch)
        for name, argv, patterns in todo:
            def one(name=name, argv=argv, patterns=patterns):
                smoke(name, argv, patterns)
                ran.append(name)
            sub.run(name, one)
        sub.check()
        if not ran:
            t.skip('no benchmark could run here')
        print(f'{len(ran)} of {len(todo)} benchmarks ran: {", ".join(ran)}', flush=True)


if __name__ == '__main__':
    t.main(run)
