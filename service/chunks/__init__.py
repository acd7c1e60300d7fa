"""The chunk design between the state and the estimates: a chunk's life (`lifecycle`), the
plan of one step of the request loop (`plan`) and what a chunk reports (`report`).  Pure: no I/O."""
