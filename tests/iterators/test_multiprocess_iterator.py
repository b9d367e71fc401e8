"""MultiprocessIterator: SerialIterator's batches from worker processes."""
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import numpy
import pytest

from minichain import serializers
from minichain.dataset import DatasetMixin
from minichain.datasets import LabeledImageDataset, TransformDataset
from minichain.iterators import MultiprocessIterator, SerialIterator
from minichain.iterators.multiprocess_iterator import TimeoutWarning

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


class Ragged(DatasetMixin):
    """``(image, label, name)``: images whose size grows with the index, so
    that later examples outgrow the shared memory sized from the first."""

    def __init__(self, n, grow=1):
        self.n, self.grow = n, grow

    def __len__(self):
        return self.n

    def get_example(self, i):
        rng = numpy.random.default_rng(i)
        side = 20 + self.grow * i
        return (rng.standard_normal((3, side, side)).astype(numpy.float32),
                numpy.int32(i), {'name': 'x{}'.format(i), 'small': [i] * 3})


class Dies(DatasetMixin):
    """Kills its own process when reading example ``fatal``."""

    def __init__(self, n, fatal):
        self.n, self.fatal = n, fatal

    def __len__(self):
        return self.n

    def get_example(self, i):
        if i == self.fatal:
            os.kill(os.getpid(), signal.SIGKILL)
        return numpy.full(8, i)


class Slow(DatasetMixin):
    """Takes ``seconds`` for each example from ``first`` on."""

    def __init__(self, n, seconds, first=0):
        self.n, self.seconds, self.first = n, seconds, first

    def __len__(self):
        return self.n

    def get_example(self, i):
        if i >= self.first:
            time.sleep(self.seconds)
        return i


def assert_same(got, expected):
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if isinstance(a, numpy.ndarray) or isinstance(b, numpy.ndarray):
            assert type(a) is type(b) and a.dtype == b.dtype
            numpy.testing.assert_array_equal(a, b)
        elif isinstance(a, (tuple, list)):
            assert type(a) is type(b)
            assert_same(a, b)
        elif isinstance(a, dict):
            assert a.keys() == b.keys()
            assert_same(list(a.values()), list(b.values()))
        else:
            assert a == b and type(a) is type(b)


STATE = ('epoch', 'is_new_epoch', 'current_position', 'epoch_detail',
         'previous_epoch_detail')


def assert_in_step(it, ref, n_batches):
    for _ in range(n_batches):
        assert_same(next(it), next(ref))
        for key in STATE:
            assert getattr(it, key) == getattr(ref, key), key


def gone(pids, timeout=20):
    """Whether every process in ``pids`` has ended and been reaped."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(os.path.exists('/proc/{}'.format(p)) for p in pids):
            return True
        time.sleep(0.05)
    return False


def worker_pids(it):
    return it._pool.pids()


@pytest.mark.parametrize('kw', [
    dict(shuffle=True, n_processes=2),
    dict(shuffle=False, n_processes=1, n_prefetch=3),
    dict(shuffle=True, n_processes=3, shared_mem=0),
    dict(shuffle=True, n_processes=2, start_method='fork'),
])
def test_same_batches_and_state_as_serial_iterator(kw):
    data = Ragged(11)
    with MultiprocessIterator(data, 4, seed=7, **kw) as it:
        assert_in_step(it, SerialIterator(data, 4, seed=7,
                                          shuffle=kw['shuffle']), 9)


def test_shared_memory_grows_with_the_examples():
    data = Ragged(12, grow=6)
    with MultiprocessIterator(data, 3, seed=1, n_processes=2) as it:
        assert_in_step(it, SerialIterator(data, 3, seed=1), 8)
        first = 3 * 20 * 20 * 4
        assert it._per_example >= 3 * 86 * 86 * 4 > first


def test_explicit_shared_mem_too_small_warns_once_and_stays_right():
    data = Ragged(6)
    with MultiprocessIterator(data, 3, shuffle=False, n_processes=2,
                              shared_mem=4096) as it:
        with pytest.warns(UserWarning, match='more than shared_mem=4096'):
            assert_in_step(it, SerialIterator(data, 3, shuffle=False), 4)


def test_no_repeat_then_reset_as_an_evaluator_uses_it():
    data = Ragged(7)
    ref = [b for b in SerialIterator(data, 3, repeat=False, shuffle=False)]
    with MultiprocessIterator(data, 3, repeat=False, shuffle=False,
                              n_processes=2, n_prefetch=2) as it:
        for _ in range(2):
            it.reset()
            got = list(it)
            assert len(got) == 3 and it.epoch == 1 and it.is_new_epoch
            for a, b in zip(got, ref):
                assert_same(a, b)
            with pytest.raises(StopIteration):
                next(it)
        it.reset()
        next(it)
        it.reset()  # mid-epoch: the batches read ahead are dropped
        assert_same(next(it), ref[0])


@pytest.mark.parametrize('shuffle', [True, False])
def test_resume_round_trip_with_serial_iterator(tmp_path, shuffle):
    data = Ragged(7)
    reference = [next(it) for it in [SerialIterator(data, 3, shuffle=shuffle,
                                                    seed=5)] for _ in range(9)]
    path = str(tmp_path / 'it.npz')
    with MultiprocessIterator(data, 3, shuffle=shuffle, seed=5,
                              n_processes=2, n_prefetch=2) as it:
        first = [next(it) for _ in range(4)]
        serializers.save_npz(path, it)
        saved = {key: getattr(it, key) for key in STATE}
        serial = SerialIterator(data, 3, shuffle=shuffle, seed=5)
        for _ in range(4):
            next(serial)
        saver = serializers.DictionarySerializer()
        saver.save(serial)
        mine = serializers.DictionarySerializer()
        mine.save(it)
        assert sorted(mine.target) == sorted(saver.target)
        for key, value in saver.target.items():
            numpy.testing.assert_array_equal(mine.target[key], value)
        next(it)  # move on; loading below goes back
        serializers.load_npz(path, it)
        assert_same(first + [next(it) for _ in range(5)], reference)
    for resumed in (MultiprocessIterator(data, 3, shuffle=shuffle,
                                         n_processes=2),
                    SerialIterator(data, 3, shuffle=shuffle)):
        serializers.load_npz(path, resumed)
        for key in STATE:
            assert getattr(resumed, key) == saved[key], key
        assert_same(first + [next(resumed) for _ in range(5)], reference)
        resumed.finalize()


def write_images(folder):
    from PIL import Image
    rng = numpy.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 256, (6, 5, 3), numpy.uint8)).save(
            folder / '{}.png'.format(i))
    (folder / 'bad.png').write_bytes(b'not a png')
    return [('{}.png'.format(i), i) for i in range(2)] + [('bad.png', 9)] + [
        ('{}.png'.format(i), i) for i in range(2, 4)]


def test_corrupt_image_raises_naming_iterator_index_and_file(tmp_path):
    pytest.importorskip('PIL')
    pairs = write_images(tmp_path)
    data = LabeledImageDataset(pairs, tmp_path)
    it = MultiprocessIterator(data, 2, shuffle=False, n_processes=2)
    next(it)
    with pytest.raises(ValueError) as info:
        next(it)
    message = str(info.value)
    assert '\n' not in message
    assert message.startswith('MultiprocessIterator: example 2 of the dataset'
                              ' (worker ')
    assert 'LabeledImageDataset: cannot decode image' in message
    assert 'bad.png' in message
    assert 'Traceback' in str(info.value.__cause__)
    ref = SerialIterator(data, 2, shuffle=False)
    next(ref)
    with pytest.raises(ValueError, match='bad.png'):
        next(ref)
    assert_in_step(it, ref, 1)  # both go on after the failed batch
    it.finalize()


def test_corrupt_image_skipped_with_the_warning_shown_here(tmp_path):
    pytest.importorskip('PIL')
    data = LabeledImageDataset(write_images(tmp_path), tmp_path,
                               on_error='skip')
    with MultiprocessIterator(data, 5, shuffle=False, n_processes=2) as it:
        with pytest.warns(UserWarning, match='bad.png.*skipped'):
            batch = next(it)
    assert batch[2] is None and sum(e is None for e in batch) == 1
    assert int(batch[3][1]) == 2


def test_worker_death_is_one_line_naming_worker_and_example():
    it = MultiprocessIterator(Dies(12, fatal=5), 4, shuffle=False,
                              n_processes=2)
    pids = None
    with pytest.raises(RuntimeError) as info:
        for _ in range(3):
            next(it)
            pids = pids or worker_pids(it)
    message = str(info.value)
    assert '\n' not in message
    assert re.match(r'MultiprocessIterator: worker [01] of 2 \(pid \d+\) ',
                    message)
    assert 'killed by SIGKILL' in message
    assert message.endswith('while reading example 5 of the dataset')
    with pytest.raises(RuntimeError, match='killed by SIGKILL'):
        next(it)  # stays broken
    assert gone(pids)


def test_dataset_that_cannot_be_pickled():
    data = TransformDataset(Ragged(4), lambda x: x)
    it = MultiprocessIterator(data, 2, n_processes=1)
    with pytest.raises(TypeError, match='cannot be sent to the worker proc'):
        next(it)
    with MultiprocessIterator(data, 2, seed=0, n_processes=1,
                              start_method='fork') as it:
        assert_in_step(it, SerialIterator(data, 2, seed=0), 3)


def test_slow_dataset_warns_with_the_examples_being_read():
    # The first batch is quick, so the worker has started (a worker still
    # starting reads nothing yet) when the second one is slow.
    it = MultiprocessIterator(Slow(6, 0.5, first=2), 2, shuffle=False,
                              n_processes=1, dataset_timeout=0.1)
    with warnings.catch_warnings():  # the worker may take 0.1 s to start
        warnings.simplefilter('ignore', TimeoutWarning)
        assert next(it) == [0, 1]
    with pytest.warns(TimeoutWarning, match=r'reading example\(s\) 2'):
        assert next(it) == [2, 3]
    it.finalize()


def test_interrupted_wait_keeps_the_position():
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    it = MultiprocessIterator(Slow(8, 0.5, first=2), 2, shuffle=False,
                              n_processes=2)
    assert next(it) == [0, 1]
    pids = worker_pids(it)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.1)
        with pytest.raises(KeyboardInterrupt):
            next(it)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert gone(pids) and it.current_position == 2
    assert next(it) == [2, 3]  # new workers, same place
    it.finalize()


def test_no_process_left_after_finalize_with_or_gc():
    it = MultiprocessIterator(Ragged(6), 2, n_processes=2)
    next(it)
    pids = worker_pids(it)
    assert len(pids) == 2 and not gone(pids, timeout=0)
    it.finalize()
    assert gone(pids)
    next(it)  # starts new workers where it stopped
    assert it.current_position == 4
    pids = worker_pids(it)
    del it
    gc.collect()
    assert gone(pids)
    with MultiprocessIterator(Ragged(6), 2, n_processes=2) as it:
        next(it)
        pids = worker_pids(it)
    assert gone(pids)


SCRIPT = '''
import multiprocessing.forkserver, os, signal, sys, time
sys.path.insert(0, {root!r})
from minichain.iterators import MultiprocessIterator
from tests.iterators.test_multiprocess_iterator import Slow

if __name__ == '__main__':
    # Ctrl-C as at a terminal: a test run started in the background of a
    # shell (`cmd &`, nohup) inherits SIGINT ignored, and Python then sets
    # no KeyboardInterrupt handler of its own
    signal.signal(signal.SIGINT, signal.default_int_handler)
    it = MultiprocessIterator(Slow(100, 60, first={first}), 2, shuffle=False,
                              n_processes=2)
    next(it)
    pids = it._pool.pids()
    pids.append(multiprocessing.forkserver._forkserver._forkserver_pid)
    print(' '.join(map(str, pids)), flush=True)
    if {how!r} == 'raise':
        raise ValueError('the script fails')
    if {how!r} == 'signal':
        next(it)  # the workers sleep in the dataset; killed meanwhile
'''


@pytest.mark.parametrize('how', ['end', 'raise', 'SIGTERM', 'SIGINT',
                                 'SIGKILL'])
def test_no_process_left_after_the_program_ends(tmp_path, how):
    script = tmp_path / 'job.py'
    slow = how.startswith('SIG')
    script.write_text(textwrap.dedent(SCRIPT.format(
        root=ROOT, first=2 if slow else 100, how='signal' if slow else how)))
    # A temp dir of its own: a program killed by a signal cannot remove
    # multiprocessing's folder there (the forkserver's socket). Short, as
    # AF_UNIX paths are.
    tmp = tempfile.mkdtemp(prefix='mpi-iter-', dir='/tmp' if os.path.isdir(
        '/tmp') else None)
    proc = subprocess.Popen([sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ, TMPDIR=tmp))
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        if slow:
            time.sleep(0.2)
            proc.send_signal(getattr(signal, how))
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    assert len(pids) == 3, err
    assert gone(pids), 'still running: {}'.format(
        [p for p in pids if os.path.exists('/proc/{}'.format(p))])
    if how == 'raise':
        assert 'the script fails' in err and proc.returncode == 1
    if how == 'SIGINT':
        assert 'KeyboardInterrupt' in err
        assert err.count('Traceback') == 1, err  # none from the workers


def test_argument_errors():
    for kw, match in ((dict(batch_size=0), 'batch_size must be an int >= 1'),
                      (dict(n_processes=0), 'n_processes'),
                      (dict(n_prefetch=0), 'n_prefetch'),
                      (dict(shared_mem=-1), 'shared_mem'),
                      (dict(dataset_timeout=0), 'dataset_timeout'),
                      (dict(start_method='thread'), 'start_method')):
        args = dict(batch_size=2)
        args.update(kw)
        with pytest.raises(ValueError, match='MultiprocessIterator: ' + match):
            MultiprocessIterator([1, 2], **args)
    with pytest.raises(ValueError, match='MultiprocessIterator: the dataset '
                       'is empty'):
        next(MultiprocessIterator([], 2))
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        assert 'n_processes=3' in repr(MultiprocessIterator([1], 1,
                                                            n_processes=3))
