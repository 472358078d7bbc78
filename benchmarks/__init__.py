"""Side-by-side benchmarks: chatkeep beside the raw drivers, measured in the same run (``nox -s bench``)."""
