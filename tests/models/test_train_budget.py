"""models/train_budget.py: the arithmetic, the measurement (with a clock of
the test's own, never the wall clock), the ranks' agreement, the state a
resumed run continues from, and the options that choose a budget."""
import os
import re
import signal
import subprocess
import sys
import time
import types

import numpy
import pytest

from minichain.serializers import DictionarySerializer, NpzDeserializer
from minichain.training import extensions
from models import train_budget, train_resnet50
from models.train_budget import Length, TimeBudget, plan
from models.train_data import UserError
from tests.dist._launch import mpi_command
from tests.models._snapshots import assert_same_model, snapshots
from tests.models.test_train_resnet50 import SMALL, finish, launch, run

# seconds a budgeted run of the script may take before the test calls it
# hung: its budget is a few times what 22 iterations take, and a loaded
# machine may be slower later
LONG = 600
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__))))


# -- the arithmetic -----------------------------------------------------------
def test_plan_sets_the_evaluation_and_snapshot_aside():
    # 100 s left after 20 iterations, 1 s an iteration, 10 s to evaluate,
    # 2 s to save: 88 more iterations, then the evaluation and snapshot
    assert plan(100, 20, 1.0, 10, 2, per_epoch=1000) == 108
    # an epoch every 30 iterations: at 30, 60 and 90 too
    # (n = 84: 64 s of iterations and 3 x 12 s)
    assert plan(100, 20, 1.0, 10, 2, per_epoch=30) == 84
    # 0.5 s an iteration: twice as many iterations, where they fit
    assert plan(100, 20, 0.5, 10, 2, per_epoch=1000) == 196


def test_plan_counts_the_snapshots_in_between():
    # every 10 iterations: those at 30, 40, ... 90 (7) besides the last
    assert plan(100, 20, 1.0, 10, 2, 1000, every=(10, 'iteration')) == 94
    # every 20 s of training: 4 in 80 s of iterations
    assert plan(100, 20, 1.0, 10, 2, 1000, every=(20, 'second')) == 100


def test_plan_never_goes_back():
    assert plan(5, 20, 1.0, 10, 2, 1000) == 20  # no time left: stop now
    assert plan(-30, 20, 1.0, 0, 0, 1000) == 20


def test_window_lies_inside_the_warm_up():
    assert train_budget.window(94) == (2, 62)  # MEASURE iterations at most
    assert train_budget.window(47) == (2, 47)  # make train: all the warm-up
    assert train_budget.window(10) == (2, 10)
    assert train_budget.window(4) == (2, 4)
    assert train_budget.window(3) is None


def test_length_is_a_stop_trigger_known_late():
    length = Length()
    at = types.SimpleNamespace(updater=types.SimpleNamespace(iteration=50))
    assert not length(at) and length.get_training_length() is None
    length.total = 50
    assert length(at) and length.get_training_length() == (50, 'iteration')


# -- measuring ----------------------------------------------------------------
class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _trainer(iteration=0):
    return types.SimpleNamespace(
        updater=types.SimpleNamespace(iteration=iteration,
                                      forward_seconds=0.0,
                                      sync_forward=False),
        elapsed_time=0.0)


def _budget(clock, comm=None, lines=None, **kw):
    args = dict(seconds=780, length=Length(), schedule=extensions.
                WarmupDecayShift('lr', 0.1, 22, warmup=50),
                measure=(2, 22), batchsize=32, val_images=10000,
                per_epoch=1000.0, comm=comm, clock=clock,
                out=(lines if lines is not None else []).append,
                age=lambda: 0.0)
    args.update(kw)
    return TimeBudget(**args)


def _iterate(budget, trainer, clock, until, seconds, forward=0.5):
    """Iterations up to ``until``: the first two take 10 and 5 s (one-time
    costs), then ``seconds`` each, ``forward`` of it in the forward pass."""
    while trainer.updater.iteration < until:
        i = trainer.updater.iteration = trainer.updater.iteration + 1
        step = {1: 10.0, 2: 5.0}.get(i, seconds)
        clock.now += step
        trainer.elapsed_time += step
        trainer.updater.forward_seconds += forward
        budget(trainer)


def test_the_length_follows_from_the_measured_speed():
    clock, trainer, lines = _Clock(), _trainer(), []
    budget = _budget(clock, lines=lines)
    budget.initialize(trainer)
    assert trainer.updater.sync_forward  # exact forward times meanwhile
    _iterate(budget, trainer, clock, 21, 2.0)
    assert not budget.fixed and budget.length.get_training_length() is None
    _iterate(budget, trainer, clock, 22, 2.0)
    # iterations 3-22: 2 s each (32 images per rank: 16 img/s), 0.5 s of
    # it forward (1/64 s an image: 156.25 s for 10000 images); 55 s spent,
    # so (780 - 55 - 156.25) / 2 = 284 iterations more
    assert budget.first_speed == 16 and budget.evaluation_seconds() == 0
    assert budget.length.total == budget.schedule.total == 22 + 284
    assert lines == ['time budget 13 min: measured 16.0 img/s over 20 '
                     'iterations -> 9,792 images (306 iterations) in 10 min '
                     '23 s, then about 2 min 36 s to evaluate 10,000 images '
                     '(after 0 s of start-up)']
    # a fifth of the way to it (57 iterations), it plans once more
    assert budget.replan_at == 22 + 57 and not budget.fixed
    assert trainer.updater.sync_forward
    _iterate(budget, trainer, clock, 79, 2.0)  # the same speed, 5% kept
    assert budget.fixed and not trainer.updater.sync_forward
    # 55 + 57 * 2 = 169 s spent; (741 - 169 - 156.25) / 2 = 207 more
    assert budget.length.total == budget.schedule.total == 79 + 207
    assert lines[1].startswith('time budget 13 min: re-planned at iteration '
                               '79 from 16.0 img/s over 57 iterations -> '
                               '9,152 images (286 iterations)')
    _iterate(budget, trainer, clock, 90, 9.0)  # later speeds change nothing
    assert budget.length.total == 286 and len(lines) == 2
    assert budget.summary(777) == (
        'time budget 13 min: 286 iterations from 16.0 img/s measured over 57 '
        'iterations, re-planned at iteration 79 (first 306 from 16.0 img/s); '
        'start-up took 0 s, training and evaluation 12 min 57 s')


def _to_the_end(budget, trainer, clock, speed):
    """Iterate (``speed(i)``: the seconds of iteration i, a quarter of it
    forward) until the length stops the run, then evaluate at the speed
    of the last forward pass; the seconds it all took."""
    while not budget.length(trainer):
        step = speed(trainer.updater.iteration + 1)
        _iterate(budget, trainer, clock, trainer.updater.iteration + 1,
                 step, step / 4)
    return trainer.elapsed_time + 10000 * step / 4 / 32


@pytest.mark.parametrize('later, first_share, share', [
    (1.6, 0.80, 0.95),   # a slow warm-up, then 1.25x faster: it takes more
    (2.4, 1.17, 0.95),   # slower after the warm-up: it takes fewer
    (2.0, 0.99, 0.95),   # the same: 5% kept in reserve
])
def test_the_re_plan_uses_90_to_100_percent_of_the_budget(later, first_share,
                                                          share):
    """Iterations 3-22 take 2 s each, the rest ``later``: the first plan
    alone would use ``first_share`` of the budget; re-planned, training and
    evaluation use ``share`` of it (never more than all)."""
    def speed(i):
        return 2.0 if i <= 22 else later

    first = _budget(_Clock(), seconds=780)
    first.initialize(_trainer())
    _iterate(first, _trainer(), first.clock, 22, 2.0)
    alone = first.length.total
    assert alone == 306

    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock)
    budget.initialize(trainer)
    used = _to_the_end(budget, trainer, clock, speed) / 780
    assert budget.first_total == 306 and budget.fixed
    alone_used = (5 + 20 * 2 + (306 - 22) * later + 10000 * later / 128) / 780
    assert alone_used == pytest.approx(first_share, abs=0.01)
    assert 0.9 <= used <= 1.0 and used == pytest.approx(share, abs=0.01)


def test_a_short_plan_is_not_re_planned():
    # room for 2 iterations after the window: the re-plan would measure
    # both and leave none to correct
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock, seconds=55 + 10000 * 0.5 / 32 + 4)
    budget.initialize(trainer)
    with pytest.warns(UserWarning, match='hardly decays'):
        _iterate(budget, trainer, clock, 22, 2.0)
    assert budget.length.total == 24 and budget.fixed
    assert budget.replan_at is None and 'first' not in budget.summary(1)


def test_the_start_up_counts_against_the_budget():
    clock, trainer, lines = _Clock(), _trainer(), []
    budget = _budget(clock, lines=lines, age=lambda: 40.0)
    budget.initialize(trainer)
    _iterate(budget, trainer, clock, 22, 2.0)
    # 40 s fewer than without a start-up: 20 iterations fewer
    assert budget.length.total == 306 - 20
    assert lines[0].endswith('(after 40 s of start-up)')
    assert 'start-up took 40 s' in budget.summary(700)


class _SlowerPeer:
    """A communicator of two whose other rank is three times as slow."""
    size, rank = 2, 0

    def allgather_obj(self, mine):  # the peer's length: one more
        if isinstance(mine, int):
            return [mine, mine + 1]
        return [mine, tuple(3 * v for v in mine)]


def test_the_slowest_rank_sets_the_pace():
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock, comm=_SlowerPeer())
    budget.initialize(trainer)
    _iterate(budget, trainer, clock, 22, 1.0)
    # the peer: 3 s an iteration, 1.5 s forward, 105 s spent; its shard of
    # the evaluation is 5000 images at 1.5 / 32 s each (234.375 s)
    assert budget.images_per_second() == pytest.approx(64 / 3)
    total = plan(780 - 105, 22, 3.0, 5000 * 1.5 / 32, 0, 1000.0)
    # and whatever else differed, every rank takes the shortest length
    assert budget.length.total == total == 22 + 146


def test_a_short_budget_warns_that_the_rate_hardly_decays():
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock, seconds=120)
    budget.initialize(trainer)
    with pytest.warns(UserWarning, match='the warm-up alone takes 50'):
        _iterate(budget, trainer, clock, 22, 2.0)


def _saved(budget):
    saved = DictionarySerializer()
    budget.serialize(saved)
    return saved.target


def test_a_resumed_run_keeps_the_length_and_does_not_measure():
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock)
    budget.initialize(trainer)
    _iterate(budget, trainer, clock, 80, 2.0)  # re-planned at 79
    saved = _saved(budget)

    lines, later = [], _Clock()
    resumed = _budget(later, lines=lines)
    resumed.serialize(NpzDeserializer(saved))
    assert resumed.length.total == 286 and resumed.fixed
    trainer = _trainer(80)
    resumed.initialize(trainer)
    assert resumed.schedule.total == 286  # before the first update
    assert not trainer.updater.sync_forward
    _iterate(resumed, trainer, later, 90, 50.0)
    assert resumed.length.total == 286 and lines == []
    assert resumed.summary(700).startswith(
        'time budget 13 min: 286 iterations from 16.0 img/s measured over '
        '57 iterations, re-planned at iteration 79 (first 306 from 16.0')


@pytest.mark.parametrize('total', [286, -1])
def test_a_snapshot_from_before_the_re_plan_loads_as_it_ran(total):
    # what the version without the re-plan saved: no stage, no first plan
    saved = {'total': numpy.array(total), 'measured': numpy.array(45),
             'iteration_seconds': numpy.array(90.0),
             'forward_seconds': numpy.array(9.0),
             'startup': numpy.array(12.0)}
    resumed = _budget(_Clock())
    resumed.serialize(NpzDeserializer(saved))
    assert resumed.fixed == (total >= 0) and resumed.measured == 45
    assert resumed.length.total == (None if total < 0 else total)
    assert resumed.first_total is None and resumed.replan_at is None


def test_a_run_resumed_before_its_re_plan_keeps_the_first_plan_and_measures():
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock)
    budget.initialize(trainer)
    _iterate(budget, trainer, clock, 40, 2.0)  # 23-40 measured
    assert budget.measured == 18
    saved = _saved(budget)

    lines, later, trainer = [], _Clock(), _trainer(40)
    resumed = _budget(later, lines=lines)
    resumed.serialize(NpzDeserializer(saved))
    trainer.elapsed_time = 135.0
    resumed.initialize(trainer)
    # the learning rate goes on decaying over the first plan's length
    assert resumed.schedule.total == 306 and not resumed.fixed
    assert trainer.updater.sync_forward
    # iteration 41 carries one-time costs again (not measured); 42-79 do
    trainer.updater.iteration = 41
    later.now += 10
    trainer.elapsed_time += 10
    resumed(trainer)
    _iterate(resumed, trainer, later, 79, 1.0)
    assert resumed.fixed and resumed.measured == 18 + 38
    assert resumed.images_per_second() == pytest.approx(
        56 * 32 / (18 * 2 + 38))
    assert lines[0].startswith('time budget 13 min: re-planned at iteration '
                               '79 from')


def test_a_run_resumed_while_measuring_measures_on():
    clock, trainer = _Clock(), _trainer()
    budget = _budget(clock)
    budget.initialize(trainer)
    _iterate(budget, trainer, clock, 12, 2.0)  # iterations 3-12 measured
    saved = _saved(budget)
    assert not budget.fixed and budget.measured == 10

    resumed, later, trainer = _budget(_Clock()), None, _trainer(12)
    resumed.serialize(NpzDeserializer(saved))
    later = resumed.clock
    resumed.initialize(trainer)
    # iteration 13 carries one-time costs again (not measured); 14-22 do
    trainer.updater.iteration = 13
    later.now += 10
    resumed(trainer)
    _iterate(resumed, trainer, later, 22, 2.0)
    assert resumed.first_speed == 16 and resumed.length.total is not None


# -- the options --------------------------------------------------------------
@pytest.mark.parametrize('argv, budget, epoch', [
    ([], 13.0, None),                                   # the default
    (['--time-budget', '5'], 5.0, None),
    (['--train-subset', '8000'], None, 1.0),            # explicit lengths
    (['--epoch', '2'], None, 2.0),
    (['--iteration', '40'], None, None),
    (['--train-subset', '8000', '--time-budget', '2'], 2.0, None),
    (['--data', 'synthetic'], None, 1.0),               # not Fashion-MNIST
])
def test_an_explicit_length_overrides_the_budget(argv, budget, epoch):
    args = train_resnet50.parse_args(argv)
    assert (args.time_budget, args.epoch) == (budget, epoch)


@pytest.mark.parametrize('argv, message', [
    (['--time-budget', '5', '--iteration', '3'],
     'argument --iteration/-i: not allowed with argument --time-budget'),
    (['--time-budget', '0'], '--time-budget must be > 0, got 0'),
    (['--time-budget', 'nan'], '--time-budget must be > 0, got nan'),
])
def test_bad_budgets_are_one_line(argv, message):
    with pytest.raises(UserError) as e:
        train_resnet50.parse_args(argv)
    assert message in str(e.value) and e.value.status == 2


def test_a_warm_up_too_short_to_measure_is_refused():
    args = train_resnet50.parse_args(['--warmup', '0.001'])
    with pytest.raises(UserError) as e:
        train_resnet50.budget_window(args, 1, 937.5)
    assert str(e.value) == (
        '--time-budget times iterations of the warm-up, but --warmup 0.001 is '
        '1 iteration: give --warmup 0.005 or more (4 iterations), or a length '
        '(--epoch, --iteration)')
    assert train_resnet50.budget_window(args, 94, 937.5) == (2, 62)


# -- ranks --------------------------------------------------------------------
@pytest.mark.mpi
def test_ranks_agree_on_the_slowest_under_mpiexec():
    cmd = mpi_command(2, sys.executable, '-m', 'tests.models._budget_ranks')
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ,
                                                OMP_NUM_THREADS='1'))
    assert done.returncode == 0, done.stdout + done.stderr
    # the ranks' lines may come through mpiexec run together
    chosen = sorted(re.findall(r'rank \d: \d+', done.stdout))
    # rank 1 takes 2 s an iteration, rank 0 1 s: both plan with 2 s
    total = plan(780 - 55, 22, 2.0, 5000 * 0.5 / 32, 0, 1000.0)
    assert chosen == ['rank 0: {}'.format(total), 'rank 1: {}'.format(total)]


# -- the script: planned, re-planned, resumed --------------------------------
def _until_the_length_is_planned(args):
    """Start a budgeted run, stop it (SIGUSR1) once it has printed the
    length it planned first; its banner line and the seconds until then."""
    start, banner = time.monotonic(), ''
    proc = launch(2, args)
    try:
        for line in proc.stdout:
            if re.match(r'time budget .*: measured', line):
                banner = line
                break
    finally:
        seconds = time.monotonic() - start
        proc.send_signal(signal.SIGUSR1)
    rc, out, err = finish(proc, timeout=LONG)
    assert rc == 128 + signal.SIGUSR1 and banner, banner + out + err
    return banner, seconds


def _iterations(line):
    return int(re.search(r'\(([\d,]+) iterations\)', line).group(1)
               .replace(',', ''))


@pytest.mark.mpi
@pytest.mark.slow
def test_time_budget_re_plans_once_and_resumes_exactly(tmp_path):
    """A run under --time-budget plans, re-plans once and stops at the
    second length; resumed from a snapshot after the re-plan, it does not
    measure again and ends with the uninterrupted run's weights, bit for
    bit."""
    common = ['--data', 'synthetic', '--train-subset', '40', '--val-subset',
              '10', '--seed', '3', '--warmup', '3', '--keep', '100'] + \
        SMALL  # 10 iterations an epoch, 30 of warm-up: 3-30 measured
    # A first run with an hour's budget shows what the 30 iterations that
    # plan the length cost here, start-up included; the budget of the run
    # tested leaves room for about 40 more after them.
    banner, seconds = _until_the_length_is_planned(
        common + ['--time-budget', '60', '--out', tmp_path / 'a'])
    step = 4 / float(re.search(r'measured ([\d.]+) img/s', banner).group(1))
    budget = '{:.4f}'.format((1.5 * seconds + 40 * step) / 60)

    b = tmp_path / 'b'
    rc, out, err = run(2, common + ['--time-budget', budget, '--out', b],
                       timeout=LONG)
    assert rc == 0, out + err
    first = re.search(r'time budget .*: measured .*', out).group(0)
    second = re.search(r'time budget .*: re-planned at iteration (\d+) .*',
                       out)
    assert second, out
    replan, total = int(second.group(1)), _iterations(second.group(0))
    assert 30 < replan < total and _iterations(first) > 30, out
    assert 'done: {} iterations'.format(total) in out, out
    after = [i for i in snapshots(b) if replan < i < total]
    assert after, (sorted(snapshots(b)), out)

    c = tmp_path / 'c'
    rc, out, err = run(2, common + ['--time-budget', budget, '--out', c,
                                    '--resume', snapshots(b)[after[0]]],
                       timeout=LONG)
    assert rc == 0, out + err
    assert 'time budget {}: {:,} iterations, as the run that wrote the ' \
        'snapshot chose'.format(train_budget.minutes(float(budget) * 60),
                                total) in out, out
    assert not re.search(r'time budget [^:]*: (measured|re-planned)', out), \
        out  # not again
    assert 'done: {} iterations'.format(total) in out
    assert_same_model(b / 'snapshot_iter_{}'.format(total),
                      c / 'snapshot_iter_{}'.format(total), at_least=50)


def test_the_updater_times_its_forward_passes():
    """train_data.Updater: the forward passes' seconds (what the budget
    estimates the evaluation from) grow with each update, within the
    update's own time, and the update is the one without timing."""
    from minichain import iterators, links as L, optimizers
    from minichain.datasets import TupleDataset
    from models.train_data import Updater

    rng = numpy.random.default_rng(0)
    data = TupleDataset(rng.standard_normal((8, 3)).astype(numpy.float32),
                        numpy.arange(8, dtype=numpy.int32) % 2)
    models = []
    for timed in (True, False):
        weights = numpy.ones((2, 3), numpy.float32)
        model = L.Classifier(L.Linear(3, 2, initialW=weights))
        optimizer = optimizers.SGD(lr=0.1)
        optimizer.setup(model)
        it = iterators.SerialIterator(data, 4, shuffle=False)
        updater = Updater(it, optimizer, seed=(0, 0), images=4,
                          loss_func=None if timed else model)
        start = time.perf_counter()
        updater.update()
        first = updater.forward_seconds
        updater.update()
        took = time.perf_counter() - start
        if timed:
            assert 0 < first < updater.forward_seconds < took
        else:
            assert updater.forward_seconds == 0
        models.append(model.predictor.W.array.copy())
    numpy.testing.assert_array_equal(models[0], models[1])
