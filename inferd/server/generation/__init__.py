"""What every API's generation shares: a conversation through the engine, prompts to ids, request
fields to SamplingParams, submitting and streaming."""
