"""Fidelity: did a run measure the emulated network, or the host it ran on?

Every pod of a job shares the host's cores with the kernel's packet work (softirq),
with tailcut itself and with whatever else runs there. When those cores are full, a
job's completion time says more about the host than about the network, and two
transports are compared by their CPU cost. This package gathers the evidence over a
run's training window and turns it into one verdict (network-bound, marginal or
host-bound) that metrics.json, the closing lines, the reports and the TrainingJob's
status carry:

- hostcpu:   the host's CPU over the window (/proc/stat, softirq and steal included)
             and CPU pressure (/proc/pressure/cpu);
- processes: the CPU of the processes that are not the job's;
- links:     for every shaped link end, whether it sent at its configured rate while
             its queue held packets (Mininet-HiFi's check, from sampled qdisc counters);
- verdict:   the thresholds and the judgement, pure, with the evidence named.
"""
