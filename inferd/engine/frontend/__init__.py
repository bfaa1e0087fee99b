"""The front ends around a core: requests in (InputProcessor), outputs out (OutputProcessor),
LLMEngine offline, the async clients a server holds."""
