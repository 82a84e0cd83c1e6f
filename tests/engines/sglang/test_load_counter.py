"""The linker's layer counter times the forward's wait on each load batch: what a store hit
cost its request, apart from the load's own length (which overlaps the scheduler preparing
the batch)."""

from __future__ import annotations

import logging
import re
import threading
import time

import pytest

from .conftest import SGLANG_MISSING

pytest.importorskip("sglang", reason=SGLANG_MISSING)

from radixlink.integrations.sglang.load_counter import TimedLoadCounter  # noqa: E402

from .harness import FULL  # noqa: E402

PROMPT = list(range(5000, 5040))  # 10 pages of 4


def test_the_forward_s_wait_on_a_load_batch_is_timed_once() -> None:
    """The forward's waits on a batch's layers add up until ``pop_waited`` takes them; a
    forward with no batch in flight (none, or one already finished) records nothing, and
    ``reset`` forgets what was not taken."""
    counter = TimedLoadCounter(2)
    index = counter.update_producer()
    counter.set_consumer(index)

    def land() -> None:
        time.sleep(0.1)
        counter.complete(index, 0)
        counter.complete(index, 1)

    lander = threading.Thread(target=land)
    lander.start()
    counter.wait_until(0)
    counter.wait_until(1)
    lander.join()
    waited = counter.pop_waited(index)
    assert 0.08 <= waited < 5.0
    assert counter.pop_waited(index) == 0.0
    assert counter.finish(index)
    counter.wait_until(0)  # NOTE: a decode step keeps the finished batch's index
    counter.set_consumer(-1)
    counter.wait_until(1)
    assert counter.pop_waited(index) == 0.0 and counter.pop_waited(-1) == 0.0
    second = counter.update_producer()
    counter.set_consumer(second)
    counter.complete(second, 0)
    counter.wait_until(0)
    counter.reset()
    assert counter.pop_waited(second) == 0.0


def test_a_finished_load_batch_logs_how_long_the_forward_waited(
        file_url: str, nodes, caplog: pytest.LogCaptureFixture) -> None:
    """Each load batch the scheduler finishes logs one line with the forward's wait on it,
    beside the load's own line with its thread's CPU time (``bench sglang`` reads both)."""
    a, b = nodes(FULL, file_url, 1), nodes(FULL, file_url, 2)
    a.serve(PROMPT)
    a.wait_offloads()
    restore = b.admit(PROMPT, "r-wait")
    with caplog.at_level(logging.INFO, logger="radixlink"):
        b.run_batch([restore])
    assert not restore.failed
    text = caplog.text
    waits = re.findall(r"radixlink load batch (\d+): the forward waited ([\d.]+) s on it", text)
    loads = re.findall(r"radixlink load batch (\d+): \d+ pages, \d+ bytes; read, verified and "
                       r"landed in ([\d.]+) s \(([\d.]+) s on its thread's CPU", text)
    assert len(waits) == 1 and len(loads) == 1 and waits[0][0] == loads[0][0]
    assert 0.0 <= float(waits[0][1]) <= float(loads[0][1]) + 0.05
    assert 0.0 < float(loads[0][2]) <= float(loads[0][1]) + 0.01
