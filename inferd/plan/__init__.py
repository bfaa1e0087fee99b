"""Capacity planning: how fast a model runs on given hardware, how many users at what latency,
with which precision and parallelism, at what power and cost (`inferd plan`); and the check of
those predictions against inferd's own engine on this machine (`inferd plan --check`).

    from inferd.plan.machine_peaks import machine_peaks
    peaks = machine_peaks()          # measured once per machine, then cached
    peaks.memory_bandwidth_bytes_s, peaks.flops_s["q4_k"]

One concept per module: machine_peaks (this machine's limits), hardware_profiles (published
limits of named devices), interconnects, roofline (a step's time and its bound), step_model (the
per-machine fit of overheads), candidates / predict (precisions x parallelism, latency, SLOs,
power, cost), check (predicted against measured), report (text and JSON).
"""
