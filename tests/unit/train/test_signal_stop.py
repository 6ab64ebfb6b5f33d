"""The signal flag of a training run (kontrast.train.guards.SignalStop): every rank stops after the same step."""

from __future__ import annotations

import signal

from kontrast.train.guards import SignalStop


def test_a_signal_during_the_ranks_comparison_stops_the_next_step():
    """Two ranks wait in the step's comparison (an all-reduce of the largest signal) when the launcher's SIGTERM lands
    on both: each compared 0, so neither stops after this step, and both must stop after the next. Writing the
    comparison's 0 back over the flag lost the signal on both and the run trained on until torchrun killed it."""
    ranks = [SignalStop(), SignalStop()]
    compared: list[int] = []

    def largest_as_the_signal_lands(value: int) -> int:  # each rank's flag was read; the signal lands in the call
        compared.append(value)
        ranks[len(compared) - 1]._handle(signal.SIGTERM, None)
        return 0 if len(compared) < 2 else max(compared)

    assert [stop.agreed(largest_as_the_signal_lands) for stop in ranks] == [None, None] and compared == [0, 0]

    def largest(value: int) -> int:
        return max(stop.received or 0 for stop in ranks)

    assert [stop.agreed(largest) for stop in ranks] == [signal.SIGTERM, signal.SIGTERM]  # counted at the next step

def test_one_process_stops_on_its_own_flag():
    stop = SignalStop()
    assert stop.agreed() is None
    stop._handle(signal.SIGINT, None)
    assert stop.agreed() == signal.SIGINT
