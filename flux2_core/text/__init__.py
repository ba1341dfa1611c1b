"""Prompts -> conditioning: the tokenizers (``tokenizer``: Qwen's BPE, HF folders; ``tekken``: Mistral's),
the decoder-only language models cut to their last tapped layer (``decoder``), Qwen3 for klein (``qwen3``),
Mistral Small 3.x for dev (``mistral``), and the encoder both load into (``encoder``)."""
