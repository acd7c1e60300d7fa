"""`stratameter bench`: ingestion throughput of one service instance (Kafka -> state in
Redis) next to a bare aiokafka consumer reading the same records, and the Redis memory
a classifier's state takes at two stream lengths.  See `stratameter.bench.core`."""
