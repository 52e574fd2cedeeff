"""LoRA on the packaged SmolLM2-135M-Instruct (its GGUF), continued on the embedded corpus (Python's documentation:
a domain its chat pre-training saw little of), sized for a few minutes on 2 CPU cores.

``python -m flaxzoo.train --config configs/lora_smollm2.py --workdir runs/lora_smollm2`` evaluates validation perplexity at
step 0 (the base model) and at the end; ``--config.lora.rank=0`` trains every parameter instead (full fine-tuning,
the comparison in the README). ``models.from_pretrained("runs/lora_smollm2")`` returns the merged model.
"""

from flaxzoo.models.io.packaged import smollm2_gguf
from flaxzoo.train.config import base_config, data_fields, model_fields


def get_config():
    c = base_config()
    c.init_from = str(smollm2_gguf())
    c.model = model_fields()  # the checkpoint's architecture
    c.steps = 40
    c.log_every = 5
    c.eval_every = 20
    c.eval_batches = 8
    c.eval_at_start = True
    c.checkpoint_every = 20
    c.batch_size = 8
    c.seq_len = 128
    c.optim.lr = 1e-3
    c.optim.warmup_steps = 5
    c.optim.weight_decay = 0.0
    c.lora.rank = 8
    c.lora.alpha = 16.0
    c.lora.targets = "attention,mlp"
    c.data = data_fields(source="embedded")  # tokenizer: init_from's
    c.sample.prompt = "The `print` function"
    c.sample.max_new_tokens = 24
    c.sample.temperature = 0.0
    return c
