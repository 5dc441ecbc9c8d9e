"""The Megatron-core training engine (``strategy=megatron``).

:mod:`.arch` maps a Hugging Face config to megatron-core's ``TransformerConfig`` and builds one
pipeline stage's ``GPTModel`` (the local layer spec, no Transformer Engine); :mod:`.weights` moves a
full Hugging Face state dict into a rank's shard and streams full Hugging Face tensors back out;
:mod:`.vocab_parallel` computes log-probs and entropy from vocab-parallel logits; :mod:`.groups`
makes the process groups; :mod:`.engine` trains the shards behind the ``TrainEngine`` interface.
Nothing is imported here, so importing the package does not import megatron-core.
"""
