"""`rtj demo` and `rtj bench`: fault rehearsal on the local cluster, and side-by-side benchmarks."""
