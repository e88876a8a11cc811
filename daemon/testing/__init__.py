"""What the tests (tests/) and the benchmarks (bench/) share: the daemon run against a broker
(kafka.py; hold_progress.py runs it with no shard progress committed) and the mixed update
streams made from a data graph (streams.py). They read the samples of a source checkout
(samples/), beside this package's folder."""
