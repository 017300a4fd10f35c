"""qkv.attention releases the GIL while it computes."""

import os
import statistics
import threading
import time

import numpy as np
import pytest

import qkv


def scaled_rows(n, took, seconds):
    """The row count on which a call that took `took` s on n rows takes about `seconds`
    (time grows as n^2), at most 8192."""
    return min(8192, int(n * max(1.0, seconds / took) ** 0.5))


def long_inputs(seconds=0.3):
    """Inputs on which one single-threaded call takes about `seconds` (sized by measuring)."""
    rng = np.random.default_rng(0)
    n = 256
    while True:
        q = rng.standard_normal((4, n, 64)).astype(np.float32)
        start = time.perf_counter()
        qkv.attention(q, q, q, threads=1)
        took = time.perf_counter() - start
        if took >= seconds / 4 or n >= 8192:
            q = rng.standard_normal((4, scaled_rows(n, took, seconds), 64)).astype(np.float32)
            return q, q.copy(), q.copy()
        n *= 2


def count_for(seconds):
    """How far a pure-Python counter gets in `seconds` with the GIL to itself."""
    count = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        count += 1
    return count


def counter_during_a_call(q, k, v):
    """One single-threaded qkv.attention call while a pure-Python counter thread runs: the
    call's seconds and the counter before and after it."""
    counter = [0]
    stop = threading.Event()

    def count():
        c = 0
        while not stop.is_set():
            c += 1
            counter[0] = c

    span = {}

    def call():
        span["before"] = counter[0]
        start = time.perf_counter()
        qkv.attention(q, k, v, threads=1)
        span["seconds"] = time.perf_counter() - start
        span["after"] = counter[0]

    counter_thread = threading.Thread(target=count)
    counter_thread.start()
    time.sleep(0.05)
    worker = threading.Thread(target=call)
    worker.start()
    worker.join()
    stop.set()
    counter_thread.join()
    return span


@pytest.mark.serial
def test_other_threads_run_during_a_call():
    """A counter thread advances while another thread is inside qkv.attention: were the GIL
    held, it could advance only for the switch interval (5 ms) at the call's edges, a few per
    cent of the 0.3 s call; the bar is a quarter of its solo rate over the call's time. Serial
    (python.serial, alone on the machine): the counter needs a core of its own, and beside
    another test's processes on 2 cores it once made 0.21 of its solo rate with the GIL free."""
    q, k, v = long_inputs(0.3)
    # The inputs were sized by timing one call; on a shared machine that call may have run
    # slowly and this one fast. A call under 0.1 s is too short for the bar (the switch
    # interval at its edges would be a large part of it): it is run again on larger inputs.
    for _ in range(4):
        span = counter_during_a_call(q, k, v)
        if span["seconds"] >= 0.1 or q.shape[1] >= 8192:
            break
        q = np.random.default_rng(1).standard_normal(
            (4, scaled_rows(q.shape[1] + 1, span["seconds"], 0.3), 64)).astype(np.float32)
        k, v = q.copy(), q.copy()

    solo = count_for(0.1) / 0.1  # the same loop's rate, roughly, holding the GIL alone
    during = span["after"] - span["before"]
    expected = solo * span["seconds"]
    assert span["seconds"] >= 0.1, f"a call on {q.shape} took only {span['seconds']:.3f} s"
    assert during > 0.25 * expected, (
        f"counter advanced {during} during a {span['seconds']:.3f} s call; alone it makes "
        f"{expected:.0f} in that time")


@pytest.mark.serial
def test_two_threads_take_the_time_of_one():
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip(f"needs 2 CPUs, os.sched_getaffinity gives {cpus}")
    q, k, v = long_inputs(0.3)

    def one():
        qkv.attention(q, k, v, threads=1)

    def timed(work):
        start = time.perf_counter()
        work()
        return time.perf_counter() - start

    def both():
        threads = [threading.Thread(target=one) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def qkv_two_threads():
        # The same two calls' work in one call on qkv's own two threads: what two free cores
        # give without Python in the way (reported when the bar is missed).
        qkv.attention(q2, k2, v2, threads=2)

    q2, k2, v2 = (np.concatenate([a, a]) for a in (q, k, v))

    def measure():
        # Five of each, interleaved, so that a busy moment on the machine falls on all; compared
        # by their medians: the fastest of five single calls once came at a moment of the host's
        # clock 1.6x faster than the other four, and a best-of-five bar measured that moment.
        single, pair, baseline = [], [], []
        for _ in range(5):
            single.append(timed(one))
            pair.append(timed(both))
            baseline.append(timed(qkv_two_threads))
        return tuple(statistics.median(t) for t in (pair, single, baseline))

    # Up to three measurements, the first that meets the bar passing: on a shared host one set of
    # medians missed it by noise (1.52x, qkv's own two threads at 1.23x). A GIL held through the
    # call makes every set about 2x, so the retries cannot pass it.
    busy = 0
    for _ in range(3):
        pair_time, single_time, baseline_time = measure()
        if pair_time <= 1.5 * single_time:
            return
        if baseline_time > 1.5 * single_time:
            # qkv's own two threads could not do two calls' work in the time of one either: the
            # second core was busy (a shared machine), so the bar cannot be measured now. With
            # two free cores and the GIL held, `baseline` stays near one call and the assert
            # below fails.
            busy += 1
    if busy == 3:
        pytest.skip(f"the second core is busy: qkv's own two threads took {baseline_time:.3f} s "
                    f"for two calls' work, one call {single_time:.3f} s")
    assert pair_time <= 1.5 * single_time, (
        f"two Python threads took {pair_time:.3f} s, one call {single_time:.3f} s; qkv's own "
        f"two threads took {baseline_time:.3f} s for the same work")
