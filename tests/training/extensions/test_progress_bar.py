import io

import pytest

from minichain.training import extensions
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
    assert '4/4' in text and '100%' in text and 'iteration 4' in text


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
