"""Changing a model's weights in place: LoRA adapters (``lora``) and int8 weights (``quantize``), both through qwix."""
