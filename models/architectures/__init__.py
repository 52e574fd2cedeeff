"""The backbones and heads the families wire, written once, with the Hugging Face table pieces and GGUF readers
they share beside them:

* ``decoder/``: the causal stack (``GPTModel``) and its heads (``GPTForCausalLM``, ``GPTForSequenceClassification``)
  in ``model.py``; the Llama layout's Hugging Face weight table and ``config.json`` fields in ``hf.py``; llama.cpp's
  tensor names and metadata readers in ``gguf.py``.
* ``encoder/``: the bidirectional stack (``BertModel``) and its heads (masked LM, sequence and token classification,
  spans) in ``model.py``; the BERT layout's Hugging Face weight table, heads and ``config.json`` fields in ``hf.py``.

A family (``models/families/<name>/``) is a configuration of one of these plus its own names; no family imports
another.
"""
