"""Training room: everything that knows about devices, processes, time and the disk.

    plan.py         plan_run: every decision of a run, once; build_run: method, optimizer, data, step context
    loop.py         fit: plan -> build -> steps -> checkpoints, emitting the loop's events
    events.py       the events and the Listener base class
    runlog.py       listener: metric log, progress bar, warnings, collapse watch
    monitor.py      listener: kNN monitor
    faults.py       listener: fault injection of the reliability tests (KONTRAST_FAULTS)
    step.py         train_step: one optimizer step, shared by fit, the benchmarks and the tests
    data_path.py    the memory and the streaming data paths, batches per epoch
    guards.py       non-finite guard, collapse monitor, signal stop
    rundir.py       the run directory: markers, metric log file, generator states
    optim.py        SGD / LARS / AdamW and the per-step lr schedule
    distributed.py  process group, gathers with gradient, global BN, gradients averaged by DDP
    sharding.py     train.shard: parameters, gradients and optimizer state sharded over the ranks (FSDP2)
    launcher.py     kontrast train --nproc N: torchrun's launcher in this process, the fork server, the exit code
    launch.py       what the processes of a launch tell their launcher (input errors, checkpoints on a signal)
"""
