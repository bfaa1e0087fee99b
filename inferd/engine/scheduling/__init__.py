"""Which sequences run in the next step and with which KV blocks: requests, the scheduler, the KV
cache manager, the step record."""
