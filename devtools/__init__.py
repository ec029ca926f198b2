"""Development tools shared by the test suite and the benchmarks (not shipped): throwaway
PostgreSQL servers (:mod:`devtools.pg`), a TCP proxy that injects network faults
(:mod:`devtools.fault_proxy`) and bulk trigger seeding for scale runs (:mod:`devtools.scale_seed`).
The suite reaches them through tests/support; the benchmarks import them directly."""
