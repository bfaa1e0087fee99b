"""The OpenAI API: completions, chat completions, embeddings, models; its request bodies and reply
shapes."""
