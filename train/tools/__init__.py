"""What stands apart from the training engine: the benchmark (``bench``), deviceless compile reports for TPU / GPU
targets (``compile``, ``compile_finetune``, ``targets``), the decode roofline, HLO reading, the GPU checks and the
notebooks' helper."""
