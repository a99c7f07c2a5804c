"""Hardening suite: each failure a probe of the receiver, the collector and the CLI once found, reproduced.

1. nothing acknowledged is lost at shutdown: test_shutdown_and_memory, test_collect_sigterm, test_receiver_limits;
   after kill -9, --reingest: test_collect_crash
2. memory is bounded in bytes: test_shutdown_and_memory (flood), test_receiver_limits (429, per-trace bytes)
3. bad values get an answer and keep the trace: test_bad_values, test_receiver_fuzz, test_receiver_limits (gzip,
   Content-Length, gRPC INVALID_ARGUMENT)
4. bad files at the command line: test_cli_inputs; every file argument of every command, fuzzed: test_cli_fuzz
5. ``sql`` reads only the store: test_cli_inputs
6. contention (listen backlog, concurrent slots, a port already taken): test_receiver_limits; root on_end
   latency under an 8-thread flood is timed by benchmarks/span_processor.py --flood-threads 8 (no timed tests)
7. secrets redacted before anything is written or sent: test_redaction

``python -m benchmarks.hardening_probe`` runs the same probes at their original sizes and prints the table.
"""
