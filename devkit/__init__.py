"""Embedded servers (PostgreSQL, nats-server, an SQS endpoint) and the demo: for `./dev demo`,
the tests and the benchmarks. Production code (core/, connectors/, spark/) never imports this."""
