"""Development tools shared by the test suite and the benchmarks (not shipped): throwaway
PostgreSQL servers (:mod:`devtools.pg`), a TCP proxy that injects network faults
(:mod:`devtools.fault_proxy`), bulk trigger seeding for scale runs (:mod:`devtools.scale_seed`) and
an HTTP receiver for notifications (:mod:`devtools.receiver`).
The suite reaches them through tests/support; the benchmarks import them directly."""
