"""stratameter's statistics core: pure numpy/scipy, no I/O.

Modules: `sketch` (bounded mergeable score summary), `strata` (boundaries and
assignment), `allocation` (which strata the next labels go to), `estimator`
(stratified precision, variance, intervals, Neyman oracle), `wilson` (the
default interval's arithmetic, on broadcast arrays), `oracle` (the
Jeffreys oracle: the honest floor of labels), `stopping`
(Bennett & Carvalho's T-round rule), `calibration` (scores to probabilities).
The service, the simulator and the tests share this one implementation.
"""
