"""bench/gpu_check.sh's plan, on the CPU: the stage limits add up to less
than the budget, the ResNet-50 stage comes right after the device probe,
and a plan over budget is refused (the script is run, with --dry-run)."""
import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, 'bench', 'gpu_check.sh')
STAGE = re.compile(r'^  (\S+) +(\d+) s  (.+)$')


def _dry_run(script=SCRIPT):
    return subprocess.run(['bash', script, '--dry-run'], capture_output=True,
                          text=True, timeout=60)


def _plan(out):
    stages = [STAGE.match(line).groups() for line in out.splitlines()
              if STAGE.match(line)]
    budget = int(re.search(r'budget (\d+) s;', out).group(1))
    grace = int(re.search(r'may take (\d+) s more', out).group(1))
    overhead = int(re.search(r'(\d+) s between stages', out).group(1))
    total = int(re.search(r'total (\d+) s with kill grace', out).group(1))
    return stages, budget, grace, overhead, total


def test_the_stage_limits_add_up_to_less_than_the_budget():
    res = _dry_run()
    assert res.returncode == 0, res.stdout + res.stderr
    stages, budget, grace, overhead, total = _plan(res.stdout)
    assert total == overhead + sum(int(s) + grace for _, s, _ in stages)
    assert total <= budget, res.stdout
    assert 'within budget' in res.stdout
    # a loan's command runs at most 10 minutes, start-up not counted
    assert budget < 600


def test_resnet_comes_right_after_the_probe_and_every_stage_is_planned():
    stages, _, _, _, _ = _plan(_dry_run().stdout)
    names = [n for n, _, _ in stages]
    assert names[:3] == ['environment', 'probe', 'resnet'], names
    assert names.index('warm') < min(names.index(n) for n in (
        'nccl', 'nccl2', 'tests', 'train'))  # the kernel cache, up front
    assert len(set(names)) == len(names)
    with open(SCRIPT) as f:
        text = f.read()
    for name in names:  # every planned stage runs (or is skipped) by name
        assert re.search(r'\b(stage|skip) {}\b'.format(re.escape(name)),
                         text) or name == 'probe', name


def test_a_plan_over_budget_is_refused(tmp_path):
    with open(SCRIPT) as f:
        text = f.read()
    over = tmp_path / 'gpu_check.sh'
    over.write_text(re.sub(r'^BUDGET=\d+', 'BUDGET=300', text, flags=re.M))
    res = _dry_run(str(over))
    assert res.returncode == 2, res.stdout
    assert 'OVER BUDGET by' in res.stderr


def test_keep_going_is_the_default():
    with open(SCRIPT) as f:
        text = f.read()
    assert re.search(r'^KEEP_GOING=1$', text, flags=re.M)
    assert '--stop-on-failure) KEEP_GOING=0' in text
