"""The work behind the one-shot commands, as functions: static matches (`csmd match`, the admin
endpoint's /match), replays of a stream file through the pipeline (`csmd replay`) and estimates
(`csmd estimate`, /estimate). The command line (cli/), the daemon's admin endpoint (service/)
and the benchmarks (bench/) call them; cli/ only parses arguments and prints. What
the command line needs before any work (option defaults) is here, cheap to import."""

# A count-only replay holds no rows per batch, so it takes large batches: the deltas are the same
# whatever the batch size, and the per-batch costs (copy-on-write versions, Python) fall with fewer
# batches (human stream, compiled engine: 9 -> 1.1 us per update from 64 to 4096)
COUNT_ONLY_REPLAY_BATCH = 4096
