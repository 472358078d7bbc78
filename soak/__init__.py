"""A fault-injecting soak run of every shared backend: ``python -m soak`` (``nox -s soak``), not part of the tests.

For a set time, several writer processes append to and read from a few shared sessions while faults are
injected (loopback-proxy cuts, black holes and outages, restarts of private server instances, SIGKILL of
writer processes). A checker then reads the whole history back and verifies every acknowledged append is
present exactly once and whole, each writer's order is kept, and nothing a reader saw has gone. It prints a
table per backend and exits 1 when anything was lost, duplicated, reordered or torn.
"""
