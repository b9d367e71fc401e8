import io

from minichain.training import extensions
from tests.training._util import make_trainer


def test_prints_header_once_and_one_row_per_entry(tmp_path):
    out = io.StringIO()
    trainer = make_trainer(tmp_path, stop=(2, 'epoch'))
    log_report = extensions.LogReport()
    trainer.extend(log_report)
    trainer.extend(extensions.PrintReport(
        ['epoch', 'iteration', 'main/loss', 'missing'], out=out))
    trainer.run()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3
    assert lines[0].split() == ['epoch', 'iteration', 'main/loss', 'missing']
    assert lines[0].startswith('epoch       iteration   main/loss')
    for line, entry in zip(lines[1:], log_report.log):
        fields = line.split()
        assert fields[:2] == [str(entry['epoch']), str(entry['iteration'])]
        assert fields[2] == '{:g}'.format(entry['main/loss'])
        assert len(fields) == 3  # the missing entry is blank
        assert line[24:34].strip() == fields[2]  # 10-wide columns, 2 apart


def test_owned_log_report_and_resume_do_not_reprint(tmp_path):
    out = io.StringIO()
    report = extensions.PrintReport(
        ['iteration'], log_report=extensions.LogReport(
            trigger=(1, 'iteration'), filename=None), out=out)
    trainer = make_trainer(tmp_path, stop=(3, 'iteration'))
    trainer.extend(report)
    trainer.run()
    assert out.getvalue().split() == ['iteration', '1', '2', '3']
    from minichain.serializers import DictionarySerializer, NpzDeserializer
    saver = DictionarySerializer()
    saver.save(trainer)
    out2 = io.StringIO()
    resumed = make_trainer(tmp_path, stop=(5, 'iteration'))
    resumed.extend(extensions.PrintReport(
        ['iteration'], log_report=extensions.LogReport(
            trigger=(1, 'iteration'), filename=None), out=out2))
    NpzDeserializer(saver.target).load(resumed)
    resumed.run()
    assert out2.getvalue().split() == ['iteration', '4', '5']
