import pytest

from minichain.training import extension, extensions
from tests.training._util import make_trainer


def test_observe_lr_is_logged(tmp_path):
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'), lr=0.25)
    log = extensions.LogReport()
    trainer.extend(extensions.observe_lr())
    trainer.extend(extensions.ExponentialShift('lr', 0.5),
                   trigger=(1, 'epoch'))
    trainer.extend(log)
    trainer.run()
    # observe_lr (a writer) reads the rate before the shift changes it
    assert [e['lr'] for e in log.log] == pytest.approx([0.25, 0.125])


def test_observe_value_key_trigger_and_priority(tmp_path):
    ext = extensions.observe_value('iter2', lambda t: 2 * t.updater.iteration)
    assert ext.priority == extension.PRIORITY_WRITER
    assert ext.trigger == (1, 'epoch') and ext.default_name == 'observe_iter2'
    seen = []
    trainer = make_trainer(tmp_path, stop=(3, 'iteration'))
    trainer.extend(ext, trigger=(1, 'iteration'))
    trainer.extend(lambda t: seen.append(t.observation['iter2']), name='s')
    trainer.run()
    assert seen == [2, 4, 6]


def test_observe_lr_of_another_optimizer_name(tmp_path):
    trainer = make_trainer(tmp_path, stop=(1, 'iteration'))
    trainer.extend(extensions.observe_lr('other'), trigger=(1, 'iteration'))
    with pytest.raises(KeyError):
        trainer.run()
