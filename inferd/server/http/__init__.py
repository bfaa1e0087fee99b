"""HTTP plumbing every route shares: auth, CORS, limits, admission, drain, errors, SSE,
access log."""
