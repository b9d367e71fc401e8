import io
import os
import select
import types

import numpy
import pytest

from minichain.training import extension, extensions
from minichain.training.extensions import progress_bar
from tests.training._util import make_trainer


def test_plain_printer(tmp_path):
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(6, 'iteration'))
    trainer.extend(extensions.ProgressBar(update_interval=2, out=out,
                                          use_tqdm=False))
    trainer.run()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].startswith('iteration 2/6 (33.3%)  iteration 2  ')
    assert 'iters/sec' in lines[0] and 'ETA' in lines[1]
    assert lines[2].startswith('iteration 6/6 (100.0%)')


def test_plain_printer_epochs_and_final_line(tmp_path):
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))  # 10 iterations
    trainer.extend(extensions.ProgressBar(update_interval=4, out=out,
                                          use_tqdm=False))
    trainer.run()
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ['0.83/2', '1.67/2', '2/2']
    assert lines[-1].startswith('epoch 2/2 (100.0%)  iteration 10')


def test_tqdm_bar(tmp_path):
    pytest.importorskip('tqdm')
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(4, 'iteration'))
    trainer.extend(extensions.ProgressBar(update_interval=1, out=out,
                                          use_tqdm=True))
    trainer.run()
    text = out.getvalue()
    assert '4/4' in text and '100%' in text and 'iteration/s' in text
    assert 'iteration 4' not in text  # the bar counts iterations already


def test_tqdm_bar_in_epochs_shows_the_iteration(tmp_path):
    pytest.importorskip('tqdm')
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))  # 10 iterations
    trainer.extend(extensions.ProgressBar(update_interval=5, out=out,
                                          use_tqdm=True))
    trainer.run()
    assert '2/2' in out.getvalue() and 'iteration 10' in out.getvalue()


def test_length_needed_and_interval_checked(tmp_path):
    trainer = make_trainer(tmp_path, stop=lambda t: t.updater.iteration >= 2)
    trainer.extend(extensions.ProgressBar(use_tqdm=False, out=io.StringIO()))
    with pytest.raises(ValueError, match='training_length'):
        trainer.run()
    with pytest.raises(ValueError, match='update_interval'):
        extensions.ProgressBar(update_interval=0)
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=lambda t: t.updater.iteration >= 2)
    trainer.extend(extensions.ProgressBar((4, 'iteration'), 1, out=out,
                                          use_tqdm=False))
    trainer.run()
    assert out.getvalue().splitlines()[-1].startswith('iteration 2/4 (50.0%)')


class _LengthLater:
    """A stop trigger that knows its length (6 iterations) only from
    iteration 3 on, as one that measures the speed first."""

    def __call__(self, trainer):
        return trainer.updater.iteration >= 6

    def get_training_length(self):
        return (6, 'iteration') if self.known else None


def test_a_length_known_later_starts_the_bar_then(tmp_path):
    out = io.StringIO()
    stop = _LengthLater()
    stop.known = False
    trainer = make_trainer(tmp_path, stop=stop)
    bar = extensions.ProgressBar(update_interval=1, out=out, use_tqdm=False)
    trainer.extend(bar)
    trainer.extend(lambda t: setattr(stop, 'known', t.updater.iteration >= 3),
                   name='fix', priority=1000)
    trainer.run()
    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ['3/6', '4/6', '5/6', '6/6']


def _at(iteration, loss, acc):
    return types.SimpleNamespace(
        updater=types.SimpleNamespace(iteration=iteration, epoch_detail=0.5),
        observation={'main/loss': numpy.float32(loss),
                     'main/accuracy': numpy.asarray(acc, numpy.float32)})


def test_entries_are_averaged_and_stay_arrays_until_shown(monkeypatch):
    out = io.StringIO()
    bar = extensions.ProgressBar((20, 'iteration'), update_interval=2,
                                 out=out, use_tqdm=False,
                                 entries=['main/loss', 'main/accuracy'],
                                 images_per_iteration=64)
    clock = iter([10.0, 12.0])  # the first call, then the redraw
    monkeypatch.setattr(progress_bar.time, 'perf_counter',
                        lambda: next(clock))
    bar(_at(1, 2.0, 0.5))
    assert out.getvalue() == ''  # not an interval: nothing read
    # On the GPU a float() of a device scalar waits for the device: the
    # averages must stay arrays, converted only for the text.
    assert all(isinstance(v, (numpy.ndarray, numpy.generic))
               for v in bar._average.values())
    bar(_at(2, 1.0, 1.0))
    # 0.9 * 2.0 + 0.1 * 1.0, 0.9 * 0.5 + 0.1 * 1.0; 64 images in 2 s
    line = out.getvalue()
    assert line.startswith('iteration 2/20 (10.0%)  iteration 2  ')
    assert line.endswith('  loss 1.900  accuracy 0.550  32.0 img/s\n')


def _bar_with_entries(tmp_path):
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(6, 'iteration'))
    trainer.extend(extensions.ProgressBar(
        update_interval=2, out=out, use_tqdm=True, images_per_iteration=5,
        entries=['main/loss', 'main/accuracy']))
    trainer.run()
    return out.getvalue()


def test_tqdm_bar_fits_the_terminal_with_entries(tmp_path, monkeypatch):
    pytest.importorskip('tqdm')
    monkeypatch.setenv('COLUMNS', '60')
    text = _bar_with_entries(tmp_path)
    shown = [s for s in text.replace('\n', '\r').split('\r') if s.strip()]
    assert shown and max(len(s) for s in shown) <= 59, shown
    assert 'iteration/s' not in text  # img/s replaces it
    monkeypatch.setenv('COLUMNS', '200')
    text = _bar_with_entries(tmp_path)
    assert 'loss ' in text and 'accuracy ' in text and 'img/s' in text


def test_print_report_rows_go_above_the_bar(tmp_path):
    pytest.importorskip('tqdm')
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))
    trainer.extend(extensions.LogReport())
    trainer.extend(extensions.PrintReport(['epoch', 'iteration'], out=out))
    trainer.extend(extensions.ProgressBar(update_interval=1, out=out))
    trainer.run()
    lines = out.getvalue().split('\n')
    # what a terminal shows of each line: the text after its last '\r'
    visible = [line.rsplit('\r', 1)[-1].split() for line in lines]
    assert [v for v in visible if v and v[0] in ('epoch', '1', '2')] == [
        ['epoch', 'iteration'], ['1', '5'], ['2', '10']], lines
    assert '%|' in lines[-2].rsplit('\r', 1)[-1]  # the bar's last state


def test_write_without_tqdm(monkeypatch):
    monkeypatch.setattr(progress_bar, '_load_tqdm', lambda: None)
    out = io.StringIO()
    progress_bar.write('a row\n', out)
    assert out.getvalue() == 'a row\n'


def test_bars_show_on_a_terminal_of_unknown_size(tmp_path, monkeypatch):
    # Open MPI gives each rank a pseudo terminal of 0 x 0; tqdm reads that
    # as -1 rows and drew nothing until the bars passed their own height
    pty = pytest.importorskip('pty')
    pytest.importorskip('tqdm')
    master, child = pty.openpty()
    terminal = open(child, 'w', encoding='utf-8', closefd=True)
    monkeypatch.setattr('sys.stdout', terminal)
    monkeypatch.delenv('COLUMNS', raising=False)
    monkeypatch.delenv('LINES', raising=False)
    try:
        trainer = make_trainer(tmp_path, stop=(4, 'iteration'))
        trainer.extend(extensions.ProgressBar(update_interval=1))
        trainer.run()
        iterator = types.SimpleNamespace(dataset=range(4), batch_size=2)
        with progress_bar.BatchProgress(iterator, 'validation') as progress:
            progress.update()
        terminal.flush()
        # a pseudo terminal hands what was written over in pieces: read
        # until nothing more comes (never block)
        chunks = []
        while select.select([master], [], [], 1 if chunks else 5)[0]:
            chunks.append(os.read(master, 1 << 16))
        text = b''.join(chunks).decode()
    finally:
        terminal.close()
        os.close(master)
    assert '/4 [' in text and 'validation:' in text and '/2 [' in text


def test_the_final_rate_leaves_out_the_time_after_the_last_iteration(
        monkeypatch):
    out = io.StringIO()
    bar = extensions.ProgressBar((3, 'iteration'), update_interval=2,
                                 out=out, use_tqdm=False,
                                 images_per_iteration=10)
    now = [0.0]
    monkeypatch.setattr(progress_bar.time, 'perf_counter', lambda: now[0])
    for i in (1, 2, 3):  # one second an iteration
        now[0] = float(i)
        bar(_at(i, 1.0, 1.0))
    now[0] = 100.0  # an evaluation of 97 s
    bar.finalize()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith('iteration 3/3') and last.endswith('10.0 img/s')


def test_the_rate_leaves_out_the_evaluation_that_runs_before_the_bar(
        tmp_path, monkeypatch):
    """In a trainer the Evaluator (a writer) runs before the ProgressBar (a
    reader) at the same iteration: the final rate must not count it."""
    now = [0.0]
    monkeypatch.setattr(progress_bar.time, 'perf_counter', lambda: now[0])
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(4, 'iteration'))
    update = trainer.updater.update

    def one_second_update():
        update()
        now[0] += 1.0
    trainer.updater.update = one_second_update

    @extension.make_extension(trigger=(4, 'iteration'),
                              priority=extension.PRIORITY_WRITER)
    def evaluation(trainer):
        now[0] += 97.0
    trainer.extend(evaluation)
    trainer.extend(extensions.ProgressBar(update_interval=2, out=out,
                                          use_tqdm=False,
                                          images_per_iteration=10))
    trainer.run()
    last = out.getvalue().splitlines()[-1]
    assert last.startswith('iteration 4/4') and last.endswith('10.0 img/s')
