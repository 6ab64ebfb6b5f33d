"""Training room: everything that knows about devices, time and the disk.

    loop.py     fit: data -> method -> steps -> checkpoints, metrics, kNN monitor
    step.py     train_step: one optimizer step, shared by fit, the benchmarks and the tests
    guards.py   non-finite guard, collapse monitor, signal stop
    rundir.py   the run directory: markers, metric log, generator states
    optim.py    SGD / LARS / AdamW and the per-step lr schedule
    faults.py   fault-injection hooks of the reliability tests (no-ops by default)
"""
