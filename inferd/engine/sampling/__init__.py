"""From logits to tokens: the sampler, its filters and penalties, logprobs, grammar masks."""
