"""Hostile input, run as a user runs it (issue 31): each probe starts the
training scripts or a small script of its own in a subprocess, on 2 ranks
where it matters (``python -m minichain.dist.launcher -n 2``), and checks
the exit status, the one line of error, no traceback, nothing left in the
job's temp dir or in /dev/shm, and a snapshot intact where one existed.

Tiny sizes throughout (resnet18 on 8x8 images, 2 iterations, IDX files of
a few dozen images made here): about a minute and a half on two cores.
"""
import textwrap

import numpy
import pytest

from tests.dist._launch import require_mpi
from tests.datasets.test_fashion_mnist import write_idx
from tests.probes._probe import (assert_mpich_files_noted, assert_one_line,
                                 probe)

RESNET = ['-m', 'models.train_resnet50', '--arch', 'resnet18',
          '--image-size', '8', '-b', '2', '--val-batchsize', '4',
          '--val-subset', '4', '--iteration', '2']
MNIST = ['models/train_mnist.py', '--unit', '8']


def idx_folder(tmp_path, labels=None, n=24):
    """Fashion-MNIST's four IDX files, ``n`` training images; ``labels``
    replaces the training labels (any dtype IDX can hold)."""
    folder = tmp_path / 'idx'
    folder.mkdir()
    rng = numpy.random.default_rng(0)
    for split, count in (('train', n), ('t10k', 8)):
        write_idx(str(folder / (split + '-images-idx3-ubyte')),
                  rng.integers(0, 256, (count, 28, 28)).astype(numpy.uint8))
        write_idx(str(folder / (split + '-labels-idx1-ubyte')),
                  (numpy.arange(count) % 10).astype(numpy.uint8))
    if labels is not None:
        write_idx(str(folder / 'train-labels-idx1-ubyte'), labels)
    return folder


def script(tmp_path, text):
    path = tmp_path / 'user_script.py'
    path.write_text(textwrap.dedent(text))
    return path


# 1 -----------------------------------------------------------------------
@pytest.mark.mpi
def test_float_labels_are_one_line_naming_the_file(tmp_path):
    require_mpi()
    labels = (numpy.arange(24) % 10).astype(numpy.float32)
    labels[5] = 9.99
    data = idx_folder(tmp_path, labels)
    got = probe(tmp_path, RESNET + ['--data-dir', data, '--out',
                                    tmp_path / 'out'], ranks=2)
    assert_one_line(got, 'train_resnet50.py: error:',
                    'train-labels-idx1-ubyte holds label 9.99 at index 5',
                    'not whole numbers')
    assert not (tmp_path / 'out').exists()


# 2 -----------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize('how', ['raise', 'stall'])
def test_an_aborted_job_leaves_nothing_behind(tmp_path, how):
    require_mpi()
    user = script(tmp_path, """
        import time
        import numpy
        from minichain import dist
        comm = dist.create_communicator('flat')
        comm.allreduce(numpy.ones(2))
        if comm.rank == 1:
            if '{how}' == 'raise':
                raise RuntimeError('a bug on rank 1')
            time.sleep(60)
        comm.allreduce(numpy.ones(2))
        """.format(how=how))
    got = probe(tmp_path, [user], ranks=2,
                env={'MINICHAIN_STALL_TIMEOUT': '3'})
    assert got.returncode == (1 if how == 'raise' else 70), got
    assert_mpich_files_noted(got)
    assert not got.left, got


# 3 -----------------------------------------------------------------------
@pytest.mark.mpi
def test_a_script_without_main_guard_is_told_about_it(tmp_path):
    require_mpi()
    user = script(tmp_path, """
        import numpy
        from minichain import dist
        from minichain.iterators import MultiprocessIterator
        comm = dist.create_communicator('flat')
        it = MultiprocessIterator(numpy.zeros((8, 2)), 2, n_processes=1)
        print(next(it))
        """)
    got = probe(tmp_path, [user], ranks=2)
    text = got.out + got.err
    assert got.returncode != 0, text
    assert "put the script's code under if __name__ == '__main__':" in text
    assert 'PMI' not in text, text  # MPI did not start in the worker
    assert not got.left, got


# 4 -----------------------------------------------------------------------
def test_a_nan_batch_leaves_the_running_statistics_finite(tmp_path):
    user = script(tmp_path, """
        import numpy
        import minichain
        from minichain import links as L
        bn = L.BatchNormalization(3)
        x = numpy.ones((4, 3), numpy.float32)
        x[:, 0] = numpy.arange(4)
        bn(x)
        x[1, 1] = numpy.nan
        bn(x)
        with minichain.using_config('train', False):
            y = bn(numpy.ones((2, 3), numpy.float32))
        print('finite', bool(numpy.isfinite(bn.avg_mean).all()),
              bool(numpy.isfinite(y.array).all()))
        """)
    got = probe(tmp_path, [user])
    assert got.returncode == 0, got
    assert 'finite True True' in got.out, got
    assert 'batch statistics are not finite (channel 1' in got.err, got


# 5 -----------------------------------------------------------------------
@pytest.mark.mpi
def test_a_plot_that_cannot_be_written_is_one_line_and_the_snapshot_stays(
        tmp_path):
    require_mpi()
    data, out = idx_folder(tmp_path), tmp_path / 'out'
    got = probe(tmp_path, RESNET + ['--data-dir', data, '--out', out],
                ranks=2)
    assert got.returncode == 0, got
    snapshot = out / 'snapshot_iter_2'
    before = snapshot.read_bytes()
    # A plot is some 20 kB: at most 12 kB per file, as on a full disk.
    resumed = RESNET[:-1] + ['4', '--data-dir', data, '--out', out,
                             '--resume', snapshot]
    got = probe(tmp_path, resumed, ranks=2, env={'PROBE_FSIZE': '12000'})
    assert_one_line(got, 'train_resnet50.py: error:', 'PlotReport: cannot '
                    'write the plot: File too large', 'loss.png',
                    'the last good snapshot is {}'.format(snapshot))
    assert snapshot.read_bytes() == before
    assert sorted(p.name for p in out.glob('snapshot*')) == [snapshot.name]


# 6 -----------------------------------------------------------------------
@pytest.mark.mpi
def test_a_slow_rank_is_named_before_the_stall_timeout(tmp_path):
    require_mpi()
    user = script(tmp_path, """
        import time
        import numpy
        from minichain import dist
        comm = dist.create_communicator('flat')
        comm.allreduce(numpy.ones(2))
        if comm.rank == 1:
            time.sleep(2.6)
        comm.allreduce(numpy.ones(2))
        """)
    got = probe(tmp_path, [user], ranks=2, env={
        'MINICHAIN_STALL_WARN': '1', 'MINICHAIN_STALL_TIMEOUT': '60'})
    assert got.returncode == 0, got
    warnings = [line for line in got.err.splitlines() if 'warning' in line]
    assert len(warnings) in (2, 3), got.err
    assert all('for rank 1: no word from it' in w for w in warnings), got.err
    assert not got.left, got


# 7 -----------------------------------------------------------------------
@pytest.mark.mpi
def test_the_multi_node_optimizer_before_setup_says_what_to_call(tmp_path):
    require_mpi()
    user = script(tmp_path, """
        from minichain import dist, optimizers
        comm = dist.create_communicator('flat')
        opt = dist.create_multi_node_optimizer(optimizers.SGD(), comm)
        opt.update(lambda: None)
        """)
    got = probe(tmp_path, [user], ranks=2)
    text = got.out + got.err
    assert got.returncode != 0 and 'cleargrads' not in text, text
    # an uncaught exception in a user's script: the abort hook shows it
    assert ('RuntimeError: multi-node optimizer (SGD).update: call '
            'setup(link) first') in text, text
    assert not got.left, got


# 8, 11 --------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize('option, words', [
    (['--loaderjob', '10000000'], '--loaderjob 10000000 is more than this '
     'machine allows'),
    (['--image-size', '0'], '--image-size must be at least 1, got 0'),
])
def test_training_options_out_of_range_are_one_line(tmp_path, option, words):
    require_mpi()
    got = probe(tmp_path, RESNET + option + ['--data', 'synthetic', '--out',
                                             tmp_path / 'out'], ranks=2)
    assert_one_line(got, 'train_resnet50.py: error:', words)
    assert not (tmp_path / 'out').exists()


# 9 -----------------------------------------------------------------------
@pytest.mark.mpi
@pytest.mark.parametrize('option, words', [
    (['--out', '{tmp}/afile'], 'it is a file, not a folder'),
    (['--device', 'bogus'], '--device bogus: get_device: unknown device'),
    (['-b', '100000', '--epoch', '0.05'], '--batchsize 100000 is larger '
     "than each rank's shard"),
])
def test_train_mnist_bad_options_are_one_line(tmp_path, option, words):
    require_mpi()
    (tmp_path / 'afile').write_text('')
    option = [o.format(tmp=tmp_path) for o in option]
    if '--out' not in option:
        option += ['--out', str(tmp_path / 'out')]
    got = probe(tmp_path, MNIST + option + ['--data-dir',
                                            idx_folder(tmp_path)], ranks=2)
    assert_one_line(got, 'train_mnist.py: error:', words)
    assert not (tmp_path / 'out').exists()


# 10 ----------------------------------------------------------------------
def test_integer_variables_refuse_a_lossy_constant(tmp_path):
    user = script(tmp_path, """
        import numpy
        from minichain import Variable
        v = Variable(numpy.array([1, 2, 3], numpy.int32))
        for f in (lambda: v * 0.5, lambda: v + 0.7):
            try:
                print(f().array)
            except TypeError as e:
                print('refused:', e)
        """)
    got = probe(tmp_path, [user])
    assert got.returncode == 0, got
    lines = got.out.splitlines()
    assert len(lines) == 2 and all(line.startswith('refused: ')
                                   for line in lines), got.out
    assert "mul: the constant 0.5 would change in the Variable's dtype " \
        'int32' in lines[0]


# 11 ----------------------------------------------------------------------
@pytest.mark.mpi
def test_scatter_dataset_of_none_names_the_root(tmp_path):
    require_mpi()
    user = script(tmp_path, """
        import sys
        from minichain import dist
        comm = dist.create_communicator('flat')
        try:
            dist.scatter_dataset(None, comm)
        except TypeError as e:
            # One write per rank: the two ranks print at once, and print's
            # separate writes of its pieces interleaved ('rankrank 1 ...').
            sys.stdout.write('rank {} {}\\n'.format(comm.rank, e))
            sys.stdout.flush()
        """)
    got = probe(tmp_path, [user], ranks=2)
    assert got.returncode == 0, got
    for rank in (0, 1):
        assert ('rank {} scatter_dataset: the dataset on rank 0 (the root) '
                'is None'.format(rank)) in got.out, got.out
    assert not got.left, got


def test_save_npz_into_a_missing_folder_names_the_file(tmp_path):
    user = script(tmp_path, """
        import sys
        from minichain import links as L, serializers
        try:
            serializers.save_npz(sys.argv[1], L.Linear(2, 3))
        except OSError as e:
            print(e)
        """)
    target = tmp_path / 'missing' / 'x.npz'
    got = probe(tmp_path, [user, target])
    assert got.out.strip() == ("[Errno 2] No such file or directory: "
                               "'{}'".format(target)), got
