"""`pzq bench`: every protocol's rate measurement against a fresh local server.

native.py   --protocol pzq (the default): the phases, the no-storage ceiling, the table
phpmq.py    --protocol phpmq: the same phases through the PHPMQ gateway, and send-then-consume
mqks.py     --protocol mqks: publish -> consume -> ack with manual ack
emqp.py     --protocol emqp: trivial jobs through a real eventmq JobManager, vs eventmq's router
spark.py    --protocol spark: rows/s through the Spark connector (snapshot, stream, sink)
phases.py   one phase: producer and consumer processes, their figures
workers.py  the native producer, consumer, echo server and forwarder processes
server.py   a `pzq serve` on a temp store and free ports: start, wait until it answers, stop
report.py   percentiles, medians, the table, JSON and the latency plot
"""
