import os
import time

import pytest

from tests.workers.reward import scorers
from verl.utils.reward_score.scorer_process import ScorerSpec
from verl.workers.reward_manager.pool import ScorerLoadError, ScoringPool

SCORERS = scorers.__file__


def call(text, truth="a"):
    return {"data_source": "t", "solution_str": text, "ground_truth": truth, "extra_info": None}


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a killed child that was reaped is gone; a zombie would still answer, so check its state
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split()[2] != "Z"


def test_inline_pool_catches_errors():
    pool = ScoringPool(ScorerSpec(kind="callable", fn=scorers.compute_score), num_workers=0)
    out = pool.map([call("a"), call("b"), call("raise")])
    assert [o.status for o in out] == ["ok", "ok", "error"]
    assert [o.value for o in out[:2]] == [1.0, 0.0]
    assert "scorer exploded" in out[2].message
    pool.close()


def test_process_pool_scores_in_order_with_kwargs():
    spec = ScorerSpec(kind="file", path=SCORERS, name="compute_score", kwargs={"extra": 1})
    with ScoringPool(spec, num_workers=2, timeout_s=5) as pool:
        out = pool.map([call("a"), call("b"), call("dict")] * 20)
    assert [o.value for o in out[:3]] == [1.0, 0.0, {"score": 0.5, "acc": False, "pred": "x", "extra": 1}]
    assert all(o.status == "ok" for o in out)


def test_hang_times_out_and_the_process_is_replaced():
    spec = ScorerSpec(kind="file", path=SCORERS, name="compute_score")
    with ScoringPool(spec, num_workers=1, timeout_s=0.5) as pool:
        old_pid = pool.pids[0]
        start = time.monotonic()
        out = pool.map([call("a"), call("hang"), call("a"), call("b")])
        elapsed = time.monotonic() - start
        assert [o.status for o in out] == ["ok", "timeout", "ok", "ok"]
        assert [out[0].value, out[2].value, out[3].value] == [1.0, 1.0, 0.0]
        assert "0.5s" in out[1].message
        assert "scorers.py" in out[1].message and "compute_score" in out[1].message  # where it hung
        assert elapsed < 45, elapsed  # bounded by the timeout (and the stack dump), not the 60 s sleep
        assert pool.pids[0] != old_pid and not alive(old_pid)
        assert pool.map([call("a")])[0].value == 1.0  # the replacement works


def test_crash_is_an_error_and_the_process_is_replaced():
    spec = ScorerSpec(kind="file", path=SCORERS, name="compute_score")
    with ScoringPool(spec, num_workers=1, timeout_s=5) as pool:
        out = pool.map([call("die"), call("a")])
    assert out[0].status == "error" and "exit code 3" in out[0].message
    assert out[1].status == "ok" and out[1].value == 1.0


def test_close_stops_every_process():
    pool = ScoringPool(ScorerSpec(), num_workers=2)
    pids = pool.pids
    assert pool.map([{"data_source": "arith", "solution_str": "2", "ground_truth": "2"}])[0].value == 1.0
    pool.close()
    assert not any(alive(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.map([call("a")])


def test_a_scorer_that_cannot_load_fails_loudly(tmp_path):
    (tmp_path / "broken.py").write_text("raise ImportError('missing dependency')\n")
    with (
        ScoringPool(
            ScorerSpec(kind="file", path=str(tmp_path / "broken.py"), name="f"), num_workers=1
        ) as pool,
        pytest.raises(ScorerLoadError, match="missing dependency"),
    ):
        pool.map([call("a")])


def test_unpicklable_callable_needs_inline_mode():
    with pytest.raises(ValueError, match="num_workers=0"):
        ScoringPool(ScorerSpec(kind="callable", fn=lambda **kw: 1.0), num_workers=1)
    pool = ScoringPool(ScorerSpec(kind="callable", fn=lambda **kw: 1.0), num_workers=0)
    assert pool.map([call("a")])[0].value == 1.0


def test_module_level_callable_runs_in_processes():
    with ScoringPool(ScorerSpec(kind="callable", fn=scorers.compute_score), num_workers=1) as pool:
        assert [o.value for o in pool.map([call("a"), call("z")])] == [1.0, 0.0]


def test_processes_exit_when_the_driver_dies_mid_call(tmp_path):
    """A driver killed without close(), while a scorer hangs: the scorer process still ends."""
    import subprocess
    import sys

    driver = tmp_path / "driver.py"
    driver.write_text(
        "import os, threading, time\n"
        "from verl.utils.reward_score.scorer_process import ScorerSpec\n"
        "from verl.workers.reward_manager.pool import ScoringPool\n"
        f"pool = ScoringPool(ScorerSpec(kind='file', path={SCORERS!r}, name='compute_score'), num_workers=1, timeout_s=60)\n"
        "pool.wait_ready()\n"
        "print(pool.pids[0], flush=True)\n"
        "call = {'data_source': 't', 'solution_str': 'hang', 'ground_truth': 'a'}\n"
        "threading.Thread(target=pool.map, args=([call],), daemon=True).start()\n"
        "time.sleep(0.5)\n"
        "os._exit(0)\n"
    )
    out = subprocess.run([sys.executable, str(driver)], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.strip())
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(child)
