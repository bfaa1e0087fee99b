"""KV tiers: where a computed KV block goes when it leaves the pool, and where a prompt's blocks
come back from (docs/architecture.md, "Where KV lives")."""
