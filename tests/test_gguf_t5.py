"""GGUF files of T5 (v1.0, v1.1), mT5 and umT5 (``general.architecture = "t5"``) and of ``T5EncoderModel``
(``"t5encoder"``), against the transformers models they were written from.

Each file is written here from a tiny random transformers model the way llama.cpp's ``convert_hf_to_gguf.py`` writes
T5, independently of flaxzoo's spec table: tensor names from gguf-py's own ``TensorNameMap``, the first of the shared
embedding tensors as ``token_embd`` and the others skipped, ``output`` only when the head is a tensor of its own, the
metadata keys the converter writes (block counts, widths, heads, key / value lengths, both norm epsilons, the bucket
count, the decoder's start id). A GGUF cannot say the bias's maximum distance: the models take llama.cpp's 128, as
every published T5 does. Then ``from_pretrained(file)`` gives the original model's logits on batches whose sources and
targets are padded (1e-4), unrolled and scanned; transformers' own GGUF loader, given the same v1.1 file and the
settings it does not read (the decoder's depth, the feed-forward), gives flaxzoo's logits.
"""

from __future__ import annotations

import pathlib
import sys

import gguf
import numpy as np
import pytest
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from family_parity import tiered  # noqa: E402
from test_family_t5 import ATOL, build, hf_logits, padded_batch, real_max_difference  # noqa: E402

from flaxzoo.models.io import from_pretrained  # noqa: E402

SHARED = ("shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def write_t5_gguf(path: pathlib.Path, hf: torch.nn.Module, arch: str = "t5") -> pathlib.Path:
    """``hf`` as llama.cpp's converter writes it (float32 tensors, a placeholder vocabulary of its size)."""
    c = hf.config
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_context_length(512)
    writer.add_embedding_length(c.d_model)
    writer.add_feed_forward_length(c.d_ff)
    writer.add_block_count(c.num_layers)
    if arch == "t5":
        writer.add_decoder_block_count(c.num_decoder_layers)
    writer.add_head_count(c.num_heads)
    writer.add_key_length(c.d_kv)
    writer.add_value_length(c.d_kv)
    writer.add_layer_norm_eps(c.layer_norm_epsilon)
    writer.add_relative_attn_buckets_count(c.relative_attention_num_buckets)
    writer.add_layer_norm_rms_eps(c.layer_norm_epsilon)
    if arch == "t5":
        writer.add_decoder_start_token_id(c.decoder_start_token_id)
    tokens = [f"<piece{i}>" for i in range(c.vocab_size)]
    writer.add_tokenizer_model("t5")
    writer.add_token_list(tokens)
    writer.add_token_scores([-float(i) for i in range(len(tokens))])
    writer.add_token_types([gguf.TokenType.NORMAL] * len(tokens))
    writer.add_pad_token_id(0)
    writer.add_eos_token_id(1)
    depth = max(c.num_layers, c.num_decoder_layers if arch == "t5" else 0)  # the converter maps num_layers blocks
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.T5 if arch == "t5" else gguf.MODEL_ARCH.T5ENCODER, depth)
    head = getattr(hf, "lm_head", None)
    own_head = head is not None and head.weight.data_ptr() != hf.shared.weight.data_ptr()
    shared_written = False
    for name, tensor in hf.state_dict().items():
        if name in SHARED:
            if shared_written:
                continue
            name, shared_written = "shared.weight", True
        if name == "lm_head.weight" and not own_head:
            continue
        gguf_name = names.get_name(name, try_suffixes=(".weight",))
        assert gguf_name, name
        writer.add_tensor(gguf_name, tensor.float().numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def sample(vocab: int) -> tuple[np.ndarray, ...]:
    ids, mask = padded_batch(vocab, 3, 9, seed=2)
    target, target_mask = padded_batch(vocab, 3, 6, seed=3)
    return ids, mask, np.where(target_mask == 1, target, 0), target_mask


@pytest.mark.parametrize("case, scan", tiered([("t5-v1.0", False), ("t5-v1.1", True), ("mt5", False),
                                               ("umt5", True)], [("t5-v1.1", True)]))
def test_a_t5_gguf_gives_the_logits_of_the_model_it_was_written_from(case, scan, tmp_path):
    hf = build(case, "ForConditionalGeneration", seed=1, relative_attention_max_distance=128).eval()
    path = write_t5_gguf(tmp_path / f"{case}.gguf", hf)
    model = from_pretrained(str(path), scan_layers=scan)
    ids, mask, target, target_mask = sample(hf.config.vocab_size)
    ours = np.asarray(model(ids, mask, target, target_mask))
    assert real_max_difference(ours, hf_logits(hf, ids, mask, target, target_mask), target_mask) < ATOL
    assert model.config.model_type == ("umt5" if case == "umt5" else "t5")
    assert model.config.tie_word_embeddings == (case == "t5-v1.0")


@pytest.mark.slow
def test_transformers_gguf_loader_reads_the_v1_1_file_as_flaxzoo_does(tmp_path):
    """transformers' GGUF loader reads the decoder's blocks only up to the encoder's depth (equal depths here) and
    not the feed-forward (passed by hand), and leaves an untied model's encoder and decoder embeddings unset (the
    shared table, as its T5 ties them)."""
    hf = build("t5-v1.1", "ForConditionalGeneration", seed=4, relative_attention_max_distance=128,
               num_decoder_layers=2).eval()
    path = write_t5_gguf(tmp_path / "t5.gguf", hf)
    theirs = transformers.AutoModelForSeq2SeqLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, feed_forward_proj="gated-gelu", dense_act_fn="gelu_new",
        is_gated_act=True, tie_word_embeddings=False).eval()
    theirs.encoder.embed_tokens = theirs.decoder.embed_tokens = theirs.shared
    ids, mask, target, target_mask = sample(hf.config.vocab_size)
    ours = np.asarray(from_pretrained(str(path))(ids, mask, target, target_mask))
    assert real_max_difference(ours, hf_logits(theirs, ids, mask, target, target_mask), target_mask) < ATOL


def test_a_t5encoder_gguf_is_the_encoder_alone(tmp_path):
    hf = build("t5-v1.1", "EncoderModel", seed=2, relative_attention_max_distance=128).eval()
    path = write_t5_gguf(tmp_path / "encoder.gguf", hf, arch="t5encoder")
    model = from_pretrained(str(path))
    assert type(model).__name__ == "Seq2SeqEncoderModel"
    ids, mask, _, _ = sample(hf.config.vocab_size)
    with torch.no_grad():
        theirs = hf(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    assert real_max_difference(np.asarray(model(ids, mask).hidden), theirs, mask) < ATOL


def test_the_tokenizer_of_a_t5_gguf_is_refused_with_the_way_out(tmp_path):
    from flaxzoo.models.io.tokenizer import tokenizer_from_gguf

    hf = build("t5-v1.0", "ForConditionalGeneration", relative_attention_max_distance=128)
    path = write_t5_gguf(tmp_path / "t5.gguf", hf)
    with pytest.raises(ValueError, match=r"does not rebuild its tokenizer \(tokenizer.ggml.model='t5'\); expected the "
                                         r"model's Hugging Face tokenizer"):
        tokenizer_from_gguf(path)
