"""MicroAverage as Chainer v7.8.1 documents it: the ratio of the sums of a
numerator and a denominator over the trigger's interval, then a reset."""
import pytest

from minichain import reporter, serializers
from minichain.training import extension, extensions
from tests.training._util import make_trainer


def _counts(trainer):
    """Iteration i reports i right out of 2i + 1; iteration 3 nothing."""
    i = trainer.updater.iteration
    if i != 3:
        reporter.report({'main/correct': i, 'main/total': 2 * i + 1})


def test_the_ratio_of_the_sums_per_interval_then_a_reset(tmp_path):
    micro = extensions.MicroAverage('main/correct', 'main/total',
                                    'main/micro', trigger=(2, 'iteration'))
    assert micro.priority == extension.PRIORITY_EDITOR
    trainer = make_trainer(tmp_path, stop=(6, 'iteration'))
    trainer.extend(_counts, name='counts',
                   priority=extension.PRIORITY_WRITER)
    trainer.extend(micro)
    seen = []  # a reader, as LogReport: after the editor
    trainer.extend(lambda t: seen.append(t.observation.get('main/micro')),
                   name='seen')
    trainer.run()
    # (1 + 2) / (3 + 5); iteration 3 reports nothing, and is skipped with
    # its trigger: (4) / (9) at iteration 4; (5 + 6) / (11 + 13). Not the
    # mean of the ratios.
    assert seen == [None, pytest.approx(3 / 8), None, pytest.approx(4 / 9),
                    None, pytest.approx(11 / 24)]


def test_the_sums_so_far_survive_a_snapshot(tmp_path):
    micro = extensions.MicroAverage('c', 't', 'r', trigger=(2, 'iteration'))
    micro._numerator, micro._denominator = 3.0, 8.0
    serializers.save_npz(str(tmp_path / 'm.npz'), micro)
    again = extensions.MicroAverage('c', 't', 'r')
    serializers.load_npz(str(tmp_path / 'm.npz'), again)
    assert (again._numerator, again._denominator) == (3.0, 8.0)
