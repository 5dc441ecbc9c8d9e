"""The Megatron-core training engine (``strategy=megatron``).

:mod:`.convert` knows the architectures (Hugging Face config -> megatron-core ``TransformerConfig``
and one pipeline stage's ``GPTModel`` on the local layer spec, no Transformer Engine);
:mod:`.hf_weights` moves a full Hugging Face state dict into a rank's shard and streams full
Hugging Face tensors back out; :mod:`.vocab_parallel` computes log-probs and entropy from
vocab-parallel logits; :mod:`.engine` trains the shards. Nothing is imported here, so importing the
package does not import megatron-core.
"""
