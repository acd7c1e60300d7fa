"""`stratameter demo`: the whole loop on one machine.

An embedded Kafka-protocol broker (tansu) and Redis, the service as a
`stratameter run` subprocess, simulated classifiers streaming scores, simulated
reviewers answering label requests from ground truth, and a live terminal view
of each classifier's estimate against the true precision of the reported chunk.

* `scenarios`: the simulated classifiers and the per-chunk ground truth.
* `view`: the figures (random-equivalent labels, the chunks shown) and the summary table.
* `screen`: the live screen (80 columns): the last closed and the open chunk, legend, boundaries.
* `orchestra`: starting and stopping everything, the traffic and the reviewers.
* `launch`: the backends, the service's settings, the service subprocess.
* `command`: the CLI subcommand.
"""
