"""Where a core runs and how the front end talks to it: its own process (ZeroMQ in, a pipe out) or
a thread here; the CoreClient contract."""
